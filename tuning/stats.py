"""Small statistics helpers shared by every result (percentiles on raw samples, on demand)."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation); NaN for no samples."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def summarize(values: Iterable[float]) -> dict[str, float]:
    """count, mean, median, IQR and p50/p90/p95/p99 of raw samples."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": math.nan, "iqr": math.nan, **{f"p{q}": math.nan for q in PERCENTILES}}
    q25, q75 = np.percentile(arr, [25, 75])
    out = {"count": int(arr.size), "mean": float(arr.mean()), "iqr": float(q75 - q25)}
    out.update({f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES})
    return out


def clean(value: float) -> float | None:
    """A float for JSON: NaN and infinities become None."""
    return None if value is None or not math.isfinite(value) else float(value)
