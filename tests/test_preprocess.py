import pytest
import torch

from tuning.base.assets import tokenizer_files
from tuning.inputs.readers import load_texts
from tuning.inputs.tokenize import FastTokenizer, NaiveWordPiece, group_by_length, pad_length


@pytest.fixture(scope="module")
def tokenizers():
    vocab, tokenizer_json = tokenizer_files()
    return NaiveWordPiece.from_vocab_file(vocab), FastTokenizer(tokenizer_json)


def test_naive_and_fast_agree_on_every_shipped_record(tokenizers):
    naive, fast = tokenizers
    texts = load_texts()
    a, b = naive.encode_batch(texts), fast.encode_batch(texts)
    assert [x.ids for x in a] == [y.ids for y in b]
    assert [x.truncated for x in a] == [y.truncated for y in b]
    assert sum(x.truncated for x in a) > 0, "some shipped records exceed the 256-token limit"
    for lo in range(0, 64, 16):
        batch_a, batch_b = a[lo:lo + 16], b[lo:lo + 16]
        length = max(len(x.ids) for x in batch_a)
        for ta, tb in zip(naive.build_batch(batch_a, length), fast.build_batch(batch_b, length)):
            assert torch.equal(ta, tb)


def test_naive_tokenizer_details(tokenizers):
    naive, fast = tokenizers
    for text in ["Crème Brûlée, 50% OFF!!", "非常好的耳机", "unboxingzzzz 😀 USB-C", "x" * 150, "tab\there\u200bzero"]:
        assert naive.encode(text).ids == fast.encode_batch([text])[0].ids, text
    assert naive.encode("x" * 150).ids[1] == naive.unk_id  # over-long word -> [UNK]


def test_truncation_is_counted_not_silent(tokenizers):
    naive, fast = tokenizers
    long = "word " * 400
    for tok in (naive, fast):
        enc = tok.encode_batch([long])[0]
        assert enc.truncated and len(enc.ids) == 256 and enc.n_tokens == 402 and enc.ids[-1] == 102


def test_pad_length_per_strategy():
    buckets = (32, 64, 128, 256)
    assert pad_length([10, 40], "dynamic", 256, buckets) == 40
    assert pad_length([10, 40], "fixed", 256, buckets) == 256
    assert pad_length([10, 40], "bucket", 256, buckets) == 64
    assert pad_length([64], "bucket", 256, buckets) == 64
    with pytest.raises(ValueError, match="padding='zig'"):
        pad_length([1], "zig", 256, buckets)


def test_group_by_length_is_bounded_and_complete():
    lengths = [5, 100, 6, 90, 7, 95, 200, 1]
    batches = group_by_length(lengths, batch_size=2, window=4)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert batches[:2] == [[0, 2], [3, 1]]  # window 1: indices 0-3 sorted by length
    assert all(max(b) - min(b) < 4 for b in batches)  # never reordered beyond its window
