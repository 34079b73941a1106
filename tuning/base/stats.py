"""Small statistics helpers shared by every result (percentiles on raw samples, on demand)."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 95, 99)


def known_median(values: Iterable[float | None]) -> float:
    """The median of the known values (None and NaN skipped; infinity, a failed outcome's latency, kept); NaN
    when none is known."""
    known = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return float(np.median(known)) if known else math.nan


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


def stage_ledger(records: Sequence[object], stages: Sequence[str]) -> pd.DataFrame:
    """Per-stage p50/p99/mean (ms) over records with ``<stage>_ms`` fields, and each stage's share of
    the p50 sum (``share``) and of the p99 sum (``share_p99``)."""
    rows = []
    for stage in stages:
        s = summarize(getattr(r, f"{stage}_ms") for r in records)
        rows.append({"stage": stage, "p50_ms": s["p50"], "p99_ms": s["p99"], "mean_ms": s["mean"]})
    frame = pd.DataFrame(rows).set_index("stage")
    frame["share"] = frame["p50_ms"] / frame["p50_ms"].sum() if len(records) else math.nan
    frame["share_p99"] = frame["p99_ms"] / frame["p99_ms"].sum() if len(records) else math.nan
    return frame


def ledger_dict(frame: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """A ledger frame as JSON-ready ``{stage: {p50_ms, p99_ms, share, share_p99}}``."""
    return {stage: {"p50_ms": clean(row.p50_ms), "p99_ms": clean(row.p99_ms), "share": clean(row.share),
                    "share_p99": clean(row.share_p99)} for stage, row in frame.iterrows()}
