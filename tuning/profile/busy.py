"""Model busy % over time from inference spans: the device-agnostic utilization.

Model busy is the share of wall time inside the model call, host work included. On CUDA the
engine synchronises before and after each forward, so a span runs from the first kernel
launch to the end of the last kernel: host launch time plus device time, not device time.
A launch-bound model's model busy reads near 100% while the device idles; device busy (NVML, kernel
time, or the simulated device's timeline) is the other utilization (see ``diagnose``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

DEVICE_BUSY_IS = "the share of wall time with a kernel running: kernel sum / wall (a profiler's, or the cost model's)"
NVML_UTIL_IS = ("NVML's util.gpu: the share of its sample periods in which any kernel ran (reads above the kernel sum "
                "for short kernels); not device busy")


def device_busy_figures(kernel_busy: float, nvml_util_percent: float | None = None) -> dict[str, object]:
    """Device busy under one definition (:data:`DEVICE_BUSY_IS`), with NVML's utilization beside it under its own
    name: ``device_busy`` is the kernel-sum share (NaN when no profiler or cost model gave one), ``nvml_util_gpu``
    NVML's share (NaN without NVML), and ``device_busy_source`` says which one a reader has where only NVML is
    known (a service watched from outside): ``"nvml util.gpu (not a kernel sum)"``."""
    kernel = float(kernel_busy) if kernel_busy is not None else math.nan
    nvml = float(nvml_util_percent) / 100 if nvml_util_percent is not None else math.nan
    if math.isfinite(kernel):
        source = "kernel sum"
    elif math.isfinite(nvml):
        source = "nvml util.gpu (not a kernel sum)"
    else:
        source = "unknown"
    return {"device_busy": kernel, "nvml_util_gpu": nvml, "device_busy_source": source}


@dataclass
class BusySeries:
    """Per window: its start (shared clock, s) and the busy fraction inside it."""

    t: np.ndarray
    busy: np.ndarray
    window_s: float

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"t": self.t.astype(float), "busy": self.busy.astype(float)})


def busy_series(spans: Sequence[tuple[float, float]], t0: float, t1: float, window_s: float) -> BusySeries:
    """Fraction of each ``window_s`` window between ``t0`` and ``t1`` covered by ``spans``."""
    if window_s <= 0:
        raise ValueError(f"window_s={window_s!r} must be > 0 seconds")
    if t1 <= t0:
        return BusySeries(np.zeros(0), np.zeros(0), window_s)
    edges = np.arange(t0, t1, window_s)
    busy = np.zeros(len(edges))
    for start, end in spans:
        start, end = max(start, t0), min(end, t1)
        if end <= start:
            continue
        first, last = int((start - t0) // window_s), int((end - t0) // window_s)
        for i in range(first, min(last, len(edges) - 1) + 1):
            lo, hi = edges[i], min(edges[i] + window_s, t1)
            busy[i] += max(0.0, min(end, hi) - max(start, lo))
    widths = np.minimum(edges + window_s, t1) - edges
    return BusySeries(edges, np.clip(busy / widths, 0.0, 1.0), window_s)
