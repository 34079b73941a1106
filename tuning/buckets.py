"""Bucketing planner: from the observed token-length histogram, the ``k`` bucket lengths that
minimise padded tokens, and the padding waste of every strategy.

``k`` is also the number of shapes to compile or capture. Waste is reported as
``padded / real`` (1.0: no padding) and ``waste = padded / real - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd


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


@dataclass
class WasteReport:
    table: pd.DataFrame  # one row per strategy
    planned: tuple[int, ...]

    def to_frame(self) -> pd.DataFrame:
        return self.table


def padding_waste(lengths: Sequence[int], batch_size: int = 16, max_length: int = 256, k: int = 4,
                  current_buckets: Sequence[int] | None = None) -> WasteReport:
    """Padded tokens / real tokens for dynamic (arrival order), fixed, and bucket padding."""
    arr = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    real = int(arr.sum())
    rows = []
    batch_max = [int(arr[i:i + batch_size].max()) for i in range(0, len(arr), batch_size)]
    dynamic = sum(m * len(arr[i * batch_size:(i + 1) * batch_size]) for i, m in enumerate(batch_max))
    rows.append(("dynamic (arrival order)", batch_size, dynamic, len(set(batch_max))))
    rows.append((f"fixed ({max_length})", batch_size, max_length * len(arr), 1))
    planned = plan_buckets(arr, k)
    planned = planned[:-1] + (max(planned[-1], max_length),) if planned[-1] < max_length else planned
    rows.append((f"planned buckets k={k} {list(planned)}", batch_size, int(padded_to_buckets(arr, planned).sum()),
                 len(planned)))
    if current_buckets:
        cur = tuple(b for b in current_buckets if b < max_length) + (max_length,)
        rows.append((f"knob buckets ({len(cur)} shapes)", batch_size, int(padded_to_buckets(arr, cur).sum()), len(cur)))
    frame = pd.DataFrame(rows, columns=["strategy", "batch_size", "padded_tokens", "shapes"])
    frame["real_tokens"] = real
    frame["padded_over_real"] = frame["padded_tokens"] / real
    frame["waste"] = frame["padded_over_real"] - 1
    return WasteReport(frame, planned)


def observed_lengths(limit: int | None = None, max_length: int = 256, data=None) -> list[int]:
    """Token lengths ([CLS]/[SEP] included, truncated) of the shipped records, via the fast tokenizer."""
    from .data import DEFAULT_DATA, load_texts
    from .model import tokenizer_files
    from .preprocess import FastTokenizer

    tok = FastTokenizer(tokenizer_files()[1], max_length)
    return [len(e.ids) for e in tok.encode_batch(load_texts(data or DEFAULT_DATA, limit))]
