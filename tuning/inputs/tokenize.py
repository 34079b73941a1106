"""Record -> text -> token ids -> padded batch tensors.

Two tokenizers give identical ids for the embedded model's vocabulary:

* ``NaiveWordPiece``: pure-Python BERT tokenization, one record at a time, with
  Python-loop padding and tensor building: the slow path the investigation starts from;
* ``FastTokenizer``: the Rust ``tokenizers`` library, batched, with numpy padding.

Both truncate to ``max_length`` (``[CLS]`` and ``[SEP]`` included) and report per
request whether they did, so truncation is counted, never silent.

Where they could disagree (``tests/test_tokenizer_fuzz.py`` compares them on generated
Unicode text), the naive one follows the Rust one, the model's own tokenizer:

* unassigned code points (category Cn): the Rust normalizer's "other" test covers Cc, Cf, Co
  and Cs only, so it keeps them (they become ``[UNK]``); so does the naive one;
* CJK Extension E: the Rust normalizer isolates CJK characters from U+2B920, not from U+2B820
  as Google's BERT does, so the first 256 characters of Extension E stay inside their word;
  the naive one uses the same ranges;
* lone surrogates (JSON allows ``"\\ud800"``): the Rust library refuses a batch holding one;
  both drop them, as the normalizer drops every other Cs character;
* documented, not fixed: Unicode version skew. Python's ``unicodedata`` (14.0 on Python 3.11)
  is newer than the Rust tokenizer's category tables, so about 500 characters added since
  (marks, punctuation and format characters of recent scripts: U+07FD, U+061D, U+0890,
  U+2E55-U+2E5D, ...) or re-categorised (U+166D So, U+1734 Mc, U+111C9 Mn) are letters to the
  Rust tokenizer (so ``[UNK]`` with their word) but stripped, isolated or dropped by the naive
  one. Only characters of the categories in :data:`UNICODE_SKEW_CATEGORIES` can be affected;
  a text without such characters gets the same ids from both.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    import pandas as pd

CLS, SEP, PAD, UNK = "[CLS]", "[SEP]", "[PAD]", "[UNK]"


@dataclass(frozen=True)
class Tokenized:
    """One request's token ids (with ``[CLS]``/``[SEP]``) and whether they were cut."""

    ids: list[int]
    n_tokens: int  # before truncation, special tokens included
    truncated: bool


class Tokenizer(Protocol):
    """What the pipeline needs from a tokenizer; bring your own by implementing this."""

    pad_id: int

    def encode_batch(self, texts: Sequence[str]) -> list[Tokenized]: ...

    def build_batch(self, encoded: Sequence[Tokenized], length: int) -> tuple[torch.Tensor, torch.Tensor]: ...


# --- the naive, pure-Python WordPiece --------------------------------------------------------

# The Rust BertNormalizer's ranges: 0x2B920 (not BERT's 0x2B820) starts the Extension E range.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)

# Categories whose characters may be seen differently by the two tokenizers when Python's Unicode
# tables know a character (or its new category) that the Rust tokenizer's older tables do not.
UNICODE_SKEW_CATEGORIES = frozenset({"Mn", "Mc", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Cf", "So"})
_OTHER = frozenset({"Cc", "Cf", "Co", "Cs"})  # the Rust normalizer's "other": not Cn (unassigned)
_SURROGATES = re.compile("[\ud800-\udfff]")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_control(ch: str) -> bool:
    # Matches the Rust tokenizers' BertNormalizer: Cc, Cf, Co, Cs except \t \n \r (unassigned kept).
    return ch not in "\t\n\r" and unicodedata.category(ch) in _OTHER


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class NaiveWordPiece:
    """BERT basic tokenization + greedy longest-match WordPiece, in plain Python.

    Normalisation follows the model's ``tokenizer.json`` (BertNormalizer with lowercase and,
    hence, accent stripping; CJK characters split; punctuation isolated).
    """

    def __init__(self, vocab: dict[str, int], max_length: int = 256, max_chars_per_word: int = 100):
        self.vocab = vocab
        self.max_length = max_length
        self.max_chars_per_word = max_chars_per_word
        self.cls_id, self.sep_id, self.pad_id, self.unk_id = (vocab[t] for t in (CLS, SEP, PAD, UNK))

    @classmethod
    def from_vocab_file(cls, path: str | Path, max_length: int = 256) -> "NaiveWordPiece":
        with open(path, encoding="utf-8") as fh:
            vocab = {line.rstrip("\n"): i for i, line in enumerate(fh)}
        return cls(vocab, max_length)

    def normalize(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if ch in "\t\n\r" or ch.isspace():
                out.append(" ")
            elif _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        decomposed = unicodedata.normalize("NFD", "".join(out))
        stripped = "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")
        return "".join(ch.lower() for ch in stripped)  # per character, like the Rust normalizer

    def pre_tokenize(self, text: str) -> list[str]:
        words = []
        for chunk in text.split():
            current = []
            for ch in chunk:
                if _is_punctuation(ch):
                    if current:
                        words.append("".join(current))
                        current = []
                    words.append(ch)
                else:
                    current.append(ch)
            if current:
                words.append("".join(current))
        return words

    def wordpiece(self, word: str) -> list[int]:
        if len(word) > self.max_chars_per_word:
            return [self.unk_id]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            found = None
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    found = self.vocab[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            pieces.append(found)
            start = end
        return pieces

    def encode(self, text: str) -> Tokenized:
        ids: list[int] = []
        for word in self.pre_tokenize(self.normalize(text)):
            ids.extend(self.wordpiece(word))
        n_tokens = len(ids) + 2
        keep = self.max_length - 2
        return Tokenized([self.cls_id] + ids[:keep] + [self.sep_id], n_tokens, len(ids) > keep)

    def encode_batch(self, texts: Sequence[str]) -> list[Tokenized]:
        return [self.encode(t) for t in texts]

    def build_batch(self, encoded: Sequence[Tokenized], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad with per-element Python loops and build the tensors from nested lists (the slow path)."""
        rows, masks = [], []
        for item in encoded:
            row, mask = [], []
            for i in range(length):
                if i < len(item.ids):
                    row.append(item.ids[i])
                    mask.append(1)
                else:
                    row.append(self.pad_id)
                    mask.append(0)
            rows.append(row)
            masks.append(mask)
        return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.long)


# --- the fast, batched tokenizer ---------------------------------------------------------------

class FastTokenizer:
    """The ``tokenizers`` library on the model's ``tokenizer.json``, batched, with numpy padding.

    The shipped ``tokenizer.json`` pads every input to 128 and truncates at 128; both are
    switched off here and done by this class at ``max_length`` instead.
    """

    def __init__(self, tokenizer_file: str | Path, max_length: int = 256):
        from tokenizers import Tokenizer as _RustTokenizer

        self._tok = _RustTokenizer.from_file(str(tokenizer_file))
        self._tok.no_padding()
        self._tok.no_truncation()
        self.max_length = max_length
        self.cls_id, self.sep_id, self.pad_id = (self._tok.token_to_id(t) for t in (CLS, SEP, PAD))

    def encode_batch(self, texts: Sequence[str]) -> list[Tokenized]:
        keep = self.max_length - 2
        out = []
        texts = list(texts)
        try:
            encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        except TypeError:
            # a lone surrogate (JSON allows "\ud800") is not valid Unicode and the Rust library
            # refuses the whole batch; drop them, as the normalizer drops every Cs character
            texts = [_SURROGATES.sub("", t) if isinstance(t, str) else t for t in texts]
            encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        for enc in encodings:
            ids = enc.ids
            out.append(Tokenized([self.cls_id, *ids[:keep], self.sep_id], len(ids) + 2, len(ids) > keep))
        return out

    def build_batch(self, encoded: Sequence[Tokenized], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.full((len(encoded), length), self.pad_id, dtype=np.int64)
        lengths = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
        for row, item in enumerate(encoded):
            ids[row, : lengths[row]] = item.ids
        mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
        return torch.from_numpy(ids), torch.from_numpy(mask)


# --- padding ---------------------------------------------------------------------------------

def pad_length(lengths: Sequence[int], padding: str, max_length: int, buckets: Sequence[int]) -> int:
    """The padded length of a batch whose longest (truncated) request has ``max(lengths)`` tokens."""
    longest = max(lengths)
    if padding == "dynamic":
        return longest
    if padding == "fixed":
        return max_length
    if padding == "bucket":
        return next(b for b in buckets if b >= longest)
    raise ValueError(f"padding={padding!r} is not allowed; allowed: dynamic | fixed | bucket")


def group_by_length(lengths: Sequence[float], batch_size: int, window: int) -> list[list[int]]:
    """Index batches in which requests of similar length are together.

    Requests are taken in arrival order ``window`` at a time (bounding how far one can be
    reordered), sorted by length inside the window and cut into batches of ``batch_size``.
    """
    batches: list[list[int]] = []
    for start in range(0, len(lengths), window):
        chunk = sorted(range(start, min(start + window, len(lengths))), key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return batches


# --- naive vs fast, side by side -------------------------------------------------------------

@dataclass
class TokenizerComparison:
    """Per tokenizer: seconds to encode and pad the same texts, and whether the ids agree."""

    texts: int
    seconds: dict[str, float]  # tokenizer -> encode + build_batch time for all texts
    mismatches: list[int]  # indices of texts whose ids differ between the tokenizers

    @property
    def ids_identical(self) -> bool:
        return not self.mismatches

    @property
    def speedup(self) -> float:
        """naive time / fast time."""
        return self.seconds["naive"] / self.seconds["fast"] if self.seconds.get("fast") else float("nan")

    def to_frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame([{"tokenizer": name, "records": self.texts, "seconds": s,
                              "us_per_record": s / max(self.texts, 1) * 1e6, "ids_identical": self.ids_identical}
                             for name, s in self.seconds.items()])


def compare_tokenizers(texts: Sequence[str], max_length: int = 256, batch_size: int = 16,
                       model_dir: str | Path | None = None) -> TokenizerComparison:
    """Encode and pad ``texts`` with the naive and the fast tokenizer (same batches); time each
    and check that they give the same ids."""
    import time

    from tuning.base.assets import tokenizer_files

    vocab, tokenizer_json = tokenizer_files(model_dir)
    tokenizers = {"naive": NaiveWordPiece.from_vocab_file(vocab, max_length),
                  "fast": FastTokenizer(tokenizer_json, max_length)}
    seconds, ids = {}, {}
    for name, tok in tokenizers.items():
        t0 = time.perf_counter()
        out: list[Tokenized] = []
        for start in range(0, len(texts), batch_size):
            encoded = tok.encode_batch(texts[start:start + batch_size])
            tok.build_batch(encoded, max(len(e.ids) for e in encoded))
            out.extend(encoded)
        seconds[name] = time.perf_counter() - t0
        ids[name] = [e.ids for e in out]
    mismatches = [i for i, (a, b) in enumerate(zip(ids["naive"], ids["fast"])) if a != b]
    return TokenizerComparison(len(texts), seconds, mismatches)
