"""Experiments one variable at a time: the batch-size sweep at fixed shapes, with its knee.

Per batch size: per-batch and per-sample latency (median of repeats), memory (CUDA peak
allocated, or process RSS on a CPU), and an out-of-memory point recorded as such while
the sweep goes on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import psutil
import torch

from .stats import clean

KNEE_TOLERANCE = 0.05  # "within 5% of the best" and "marginal gain under 5%"


@dataclass
class BatchSweepResult:
    length: int
    device: str
    dtype: str
    graph: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def _ok(self) -> pd.DataFrame:
        frame = self.to_frame()
        return frame[frame.status == "ok"] if len(frame) else frame

    @property
    def knee(self) -> int | None:
        """Smallest batch whose per-sample cost is within 5% of the best measured."""
        ok = self._ok()
        if ok.empty:
            return None
        best = ok.per_sample_ms.min()
        return int(ok[ok.per_sample_ms <= best * (1 + KNEE_TOLERANCE)].batch_size.min())

    @property
    def diminishing(self) -> int | None:
        """First batch after which doubling (the next size) cuts per-sample cost by less than 5%."""
        ok = self._ok().sort_values("batch_size")
        per, sizes = ok.per_sample_ms.to_list(), ok.batch_size.to_list()
        for i in range(len(per) - 1):
            if (per[i] - per[i + 1]) / per[i] < KNEE_TOLERANCE:
                return int(sizes[i])
        return int(sizes[-1]) if sizes else None

    def summary(self) -> dict[str, Any]:
        return {"length": self.length, "device": self.device, "dtype": self.dtype, "graph": self.graph,
                "knee": self.knee, "diminishing_returns_at": self.diminishing,
                "points": [{k: clean(v) if isinstance(v, float) else v for k, v in r.items()} for r in self.rows]}


def _memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return psutil.Process().memory_info().rss / 2**20


def batch_sweep(runner: Callable, device: torch.device, sizes: Sequence[int], length: int = 64,
                repeats: int = 5, warmup: int = 2, dtype: str = "fp32", graph: str = "eager",
                make_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None) -> BatchSweepResult:
    """Time ``runner`` at each batch size with inputs of ``length`` tokens (real tokens, no padding)."""
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"sizes={list(sizes)!r} must be positive integers, e.g. 1,2,4,8,16,32")
    make_batch = make_batch or (lambda b, n: (torch.randint(1000, 20000, (b, n), device=device),
                                              torch.ones((b, n), dtype=torch.long, device=device)))
    result = BatchSweepResult(length, device.type, dtype, graph)
    for size in sorted(sizes):
        row: dict[str, Any] = {"batch_size": size, "length": length}
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ids, mask = make_batch(size, length)
            times = []
            with torch.inference_mode():
                for i in range(warmup + repeats):
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    runner(ids, mask)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if i >= warmup:
                        times.append((time.perf_counter() - t0) * 1000)
            per_batch = float(np.median(times))
            row.update(status="ok", per_batch_ms=per_batch, per_sample_ms=per_batch / size,
                       throughput=size / per_batch * 1000, iqr_ms=float(np.subtract(*np.percentile(times, [75, 25]))),
                       memory_mb=_memory_mb(device))
        except torch.OutOfMemoryError as exc:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            row.update(status="oom", per_batch_ms=math.nan, per_sample_ms=math.nan, throughput=math.nan,
                       iqr_ms=math.nan, memory_mb=_memory_mb(device), error=str(exc).splitlines()[0][:200])
        result.rows.append(row)
    return result


def run_batch_sweep(knobs, sizes: Sequence[int], length: int = 64, repeats: int = 5, engine=None) -> BatchSweepResult:
    """The batch sweep for a knob set's model, device, dtype and graph mode."""
    from .engine import Engine

    engine = engine or Engine(knobs)
    if knobs.graph != "eager":
        engine.warmup([(s, length) for s in sorted(sizes)])
    return batch_sweep(engine.runner, engine.device, sizes, length, repeats, dtype=engine.knobs.dtype,
                       graph=engine.knobs.graph)
