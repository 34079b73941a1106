"""Bucketing planner: from the observed token-length histogram, the ``k`` bucket lengths that
minimise padded tokens, and the padding waste of every strategy.

``k`` is also the number of shapes to compile or capture. Waste is reported as
``padded / real`` (1.0: no padding) and ``waste = padded / real - 1``, the same definition as
:attr:`tuning.offline.pipeline.PipelineResult.padding_waste`. Every strategy is scored by simulating
the batches the offline pipeline itself would form (:func:`simulate_padding`: its batch size,
grouping window, grouping key and padding rule), not by padding each request on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from tuning.inputs.tokenize import group_by_length, pad_length
from tuning.knobs import Knobs


def plan_buckets(lengths: Sequence[int], k: int, multiple_of: int = 1) -> tuple[int, ...]:
    """The ``k`` bucket lengths minimising total padded tokens when each request pads to the
    smallest bucket that holds it (exact dynamic programme over the distinct lengths).

    ``multiple_of`` rounds candidate lengths up (e.g. 8 for tensor-core friendly shapes).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an integer >= 1 (the number of bucket lengths)")
    if not len(lengths):
        raise ValueError("lengths is empty: run some requests first")
    arr = np.asarray(lengths, dtype=np.int64)
    if multiple_of > 1:
        arr = -(-arr // multiple_of) * multiple_of
    values, counts = np.unique(arr, return_counts=True)
    n = len(values)
    k = min(k, n)
    cum = np.concatenate([[0], np.cumsum(counts)])

    def cost(i: int, j: int) -> int:  # requests with values[i..j] all padded to values[j]
        return int(values[j] * (cum[j + 1] - cum[i]))

    inf = float("inf")
    best = np.full((k + 1, n), inf)
    choice = np.zeros((k + 1, n), dtype=np.int64)
    for j in range(n):
        best[1, j] = cost(0, j)
    for b in range(2, k + 1):
        for j in range(n):
            for i in range(b - 1, j + 1):  # last bucket covers values[i..j]
                c = best[b - 1, i - 1] + cost(i, j)
                if c < best[b, j]:
                    best[b, j], choice[b, j] = c, i
    bounds, j, b = [], n - 1, k
    while b >= 1:
        bounds.append(int(values[j]))
        if b == 1:
            break
        j, b = int(choice[b, j]) - 1, b - 1
    return tuple(sorted(bounds))


def padded_to_buckets(lengths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    edges = np.asarray(sorted(buckets))
    idx = np.searchsorted(edges, lengths, side="left")
    if (idx >= len(edges)).any():
        raise ValueError(f"a length of {int(lengths.max())} does not fit the largest bucket {edges[-1]}")
    return edges[idx]


def grouping_of(knobs: Knobs) -> str | None:
    """How the offline loader groups requests by length for ``knobs``: ``'tokens'``, ``'bytes'`` or
    None (arrival order). ``padding='bucket'`` groups by ``group_by``; ``padding='dynamic'`` groups
    by exact token count when ``group_by='tokens'`` (and pads each batch to its longest)."""
    if knobs.padding == "bucket":
        return knobs.group_by
    if knobs.padding == "dynamic" and knobs.group_by == "tokens":
        return "tokens"
    return None


@dataclass
class SimulatedPadding:
    """The batches the offline pipeline would form (input positions, 0-based) and their padding."""

    batches: list[list[int]]
    padded_lengths: list[int]  # per batch (0: a batch with no valid input)
    real_tokens: int
    padded_tokens: int

    @property
    def padding_waste(self) -> float:
        """``padded / real - 1``, as :attr:`tuning.offline.pipeline.PipelineResult.padding_waste`."""
        return self.padded_tokens / self.real_tokens - 1 if self.real_tokens else float("nan")

    @property
    def shapes(self) -> int:
        """Distinct padded lengths the model sees (shapes to compile or capture for these inputs)."""
        return len({n for n in self.padded_lengths if n})


def simulate_padding(lengths: Sequence[int], knobs: Knobs, sizes: Sequence[int] | None = None) -> SimulatedPadding:
    """The offline pipeline's batches for ``knobs`` and their padded tokens, without running anything.

    ``lengths``: per input in arrival order, its token count with ``[CLS]``/``[SEP]`` (0 for an
    input that fails); ``sizes``: per input, its line size in bytes (needed to group by bytes).
    Same batch size, window, grouping and padding rule as :meth:`tuning.offline.pipeline.Pipeline.loader`
    and the collate step, so the waste equals the run's.
    """
    k = knobs
    arr = [min(int(n), k.max_length) for n in lengths]
    grouping = grouping_of(k)
    window = max(k.bucket_window, k.batch_size)
    if grouping is None:
        batches = [list(range(i, min(i + k.batch_size, len(arr)))) for i in range(0, len(arr), k.batch_size)]
    elif grouping == "tokens":
        batches = group_by_length(arr, k.batch_size, window)
    else:
        if sizes is None or len(sizes) != len(arr):
            raise ValueError("group_by='bytes' groups by line size: pass sizes, one per input (bytes of each line)")
        batches = group_by_length(list(sizes), k.batch_size, window)
    padded_lengths, real, padded = [], 0, 0
    for batch in batches:
        ok = [arr[i] for i in batch if arr[i] > 0]
        length = pad_length(ok, k.padding, k.max_length, k.bucket_lengths) if ok else 0
        padded_lengths.append(length)
        real += sum(ok)
        padded += length * len(ok)
    return SimulatedPadding(batches, padded_lengths, real, padded)


@dataclass
class WasteReport:
    table: pd.DataFrame  # one row per strategy, keyed by ``key``
    planned: tuple[int, ...]
    knobs: Knobs | None = field(default=None, repr=False)

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def row(self, key: str) -> pd.Series:
        """One strategy's row: ``arrival-dynamic``, ``arrival-fixed``, ``grouped-dynamic``,
        ``grouped-planned``, ``bytes-planned``, ``knob-buckets`` or ``knobs``."""
        rows = self.table[self.table["key"] == key]
        if rows.empty:
            raise KeyError(f"no strategy {key!r}; have {', '.join(self.table['key'])}")
        return rows.iloc[0]


def _settings(base: Knobs, changed: Knobs) -> str:
    """The ``--set`` flags that turn ``base`` into ``changed``."""
    parts = []
    for name in ("padding", "group_by", "buckets"):
        value = getattr(changed, name)
        if value != getattr(base, name) or name == "padding":
            parts.append(f"--set {name}={','.join(map(str, value)) if isinstance(value, tuple) else value}")
    return " ".join(parts)


def padding_waste(lengths: Sequence[int], batch_size: int = 16, max_length: int = 256, k: int = 4,
                  current_buckets: Sequence[int] | None = None, *, window: int = 256,
                  sizes: Sequence[int] | None = None, knobs: Knobs | None = None) -> WasteReport:
    """Padded tokens of each strategy on the pipeline's own batches of ``lengths`` (arrival order).

    Rows: arrival order with dynamic and with fixed padding; grouped by tokens with dynamic
    padding (each batch padded to its longest) and with the ``k`` planned buckets; grouped by
    bytes with the planned buckets (when ``sizes`` are given); the knob buckets; and ``knobs``
    as set (when given: its batch size, window, max_length and buckets are used for every row).
    A length of 0 marks an input that fails (it takes a batch slot but no tokens).
    """
    base = knobs if knobs is not None else Knobs(
        batch_size=batch_size, max_length=max_length, bucket_window=window,
        **({"buckets": tuple(current_buckets)} if current_buckets else {}))
    arr = np.minimum(np.asarray(lengths, dtype=np.int64), base.max_length)
    valid = arr[arr > 0]
    if not valid.size:
        raise ValueError("lengths has no valid input: run some requests first")
    planned = plan_buckets(valid, k)
    planned_knob = tuple(sorted({max(b, 3) for b in planned}))  # the buckets knob takes lengths >= 3
    rows: list[tuple[str, str, Knobs]] = [
        ("arrival-dynamic", "arrival order, dynamic padding", base.replace(padding="dynamic", group_by="bytes")),
        ("arrival-fixed", f"arrival order, fixed padding ({base.max_length})", base.replace(padding="fixed")),
        ("grouped-dynamic", "grouped by tokens, dynamic padding", base.replace(padding="dynamic", group_by="tokens")),
        ("grouped-planned", f"grouped by tokens, planned buckets k={k} {list(planned)}",
         base.replace(padding="bucket", group_by="tokens", buckets=planned_knob)),
    ]
    if sizes is not None:
        rows.append(("bytes-planned", f"grouped by bytes, planned buckets k={k}",
                     base.replace(padding="bucket", group_by="bytes", buckets=planned_knob)))
    if current_buckets or knobs is not None:
        rows.append(("knob-buckets", f"grouped by tokens, knob buckets ({len(base.bucket_lengths)} lengths)",
                     base.replace(padding="bucket", group_by="tokens")))
    if knobs is not None:
        rows.append(("knobs", "the knobs as set", knobs))
    out: list[dict[str, Any]] = []
    for key, label, variant in rows:
        if grouping_of(variant) == "bytes" and sizes is None:
            continue
        sim = simulate_padding(arr, variant, sizes)
        out.append({"key": key, "strategy": label, "settings": _settings(base, variant),
                    "batch_size": variant.batch_size, "window": variant.bucket_window, "batches": len(sim.batches),
                    "shapes": sim.shapes, "padded_tokens": sim.padded_tokens, "real_tokens": sim.real_tokens})
    frame = pd.DataFrame(out)
    frame["padded_over_real"] = frame["padded_tokens"] / frame["real_tokens"]
    frame["waste"] = frame["padded_over_real"] - 1
    return WasteReport(frame, planned, knobs)


def observed_inputs(data: str | Path | None = None, limit: int | None = None,
                    max_length: int = 256) -> tuple[list[int], list[int]]:
    """Per line of a JSONL file, as the offline pipeline sees it: its token length (``[CLS]``/``[SEP]``
    included, truncated; 0 for a line that fails) and its size in bytes (what ``group_by='bytes'`` sorts)."""
    from tuning.base.assets import DEFAULT_DATA, tokenizer_files
    from tuning.inputs.readers import check_limit, parse_line, require_file
    from tuning.inputs.records import Record, format_record
    from tuning.inputs.tokenize import FastTokenizer

    check_limit(limit)
    raws, sizes = [], []
    with require_file(data or DEFAULT_DATA).open("rb") as fh:
        for raw in fh:
            if limit is not None and len(sizes) >= limit:
                break
            sizes.append(len(raw))
            raws.append(raw.rstrip(b"\r\n"))
    slots, texts = [], []
    for i, raw in enumerate(raws):
        rec = parse_line(raw, i + 1)
        if isinstance(rec, (Record, str)):  # a record, or a line with a text field
            slots.append(i)
            texts.append(format_record(rec) if isinstance(rec, Record) else rec)
    lengths = [0] * len(raws)
    for i, enc in zip(slots, FastTokenizer(tokenizer_files()[1], max_length).encode_batch(texts)):
        lengths[i] = len(enc.ids)
    return lengths, sizes


def observed_lengths(limit: int | None = None, max_length: int = 256, data=None) -> list[int]:
    """Token lengths ([CLS]/[SEP] included, truncated) of the shipped records, via the fast tokenizer."""
    from tuning.base.assets import DEFAULT_DATA, tokenizer_files
    from tuning.inputs.readers import load_texts
    from tuning.inputs.tokenize import FastTokenizer

    tok = FastTokenizer(tokenizer_files()[1], max_length)
    return [len(e.ids) for e in tok.encode_batch(load_texts(data or DEFAULT_DATA, limit))]
