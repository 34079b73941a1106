"""Operator and launch statistics under ``torch.profiler``, and the launch-overhead budget.

Per batch: operators (and kernels on CUDA) launched, their duration distribution, the
share shorter than a threshold (fragmentation), and launches x per-launch cost against
busy time: the most that graph capture could save, predicted before capturing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ..stats import clean, summarize


@dataclass
class OpStats:
    device: str
    batches: int
    batch_shape: tuple[int, int]
    ops_per_batch: float
    kernels_per_batch: float  # 0 on CPU
    busy_ms_per_batch: float
    launch_cost_us: float
    short_threshold_us: float
    durations_us: list[float] = field(repr=False, default_factory=list)  # per launch (kernels on CUDA, ops on CPU)
    top_ops: list[dict[str, Any]] = field(default_factory=list)

    @property
    def launches_per_batch(self) -> float:
        return self.kernels_per_batch if self.device == "cuda" else self.ops_per_batch

    @property
    def short_share(self) -> float:
        """Share of launches shorter than ``short_threshold_us`` (fragmentation)."""
        if not self.durations_us:
            return math.nan
        return float(np.mean(np.asarray(self.durations_us) < self.short_threshold_us))

    @property
    def launch_overhead_ms(self) -> float:
        return self.launches_per_batch * self.launch_cost_us / 1000

    @property
    def launch_share(self) -> float:
        """launches x per-launch cost / busy time: the upper bound of what capture could save."""
        return min(self.launch_overhead_ms / self.busy_ms_per_batch, 1.0) if self.busy_ms_per_batch > 0 else math.nan

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"duration_us": self.durations_us})

    def summary(self) -> dict[str, Any]:
        d = summarize(self.durations_us)
        return {
            "device": self.device, "batches": self.batches, "batch_shape": list(self.batch_shape),
            "ops_per_batch": self.ops_per_batch, "kernels_per_batch": self.kernels_per_batch,
            "busy_ms_per_batch": clean(self.busy_ms_per_batch), "launch_cost_us": clean(self.launch_cost_us),
            "duration_us": {k: clean(v) for k, v in d.items()}, "short_threshold_us": self.short_threshold_us,
            "short_share": clean(self.short_share), "launch_overhead_ms": clean(self.launch_overhead_ms),
            "launch_share": clean(self.launch_share), "top_ops": self.top_ops,
        }


def launch_cost_us(device: torch.device, repeats: int = 2000) -> float:
    """Measured cost of issuing one tiny operator on ``device`` (dispatch + launch), in µs."""
    x = torch.zeros(1, device=device)
    out = torch.empty_like(x)
    for _ in range(50):
        torch.add(x, 1, out=out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.add(x, 1, out=out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / repeats * 1e6


def op_stats(runner: Callable, input_ids: torch.Tensor, attention_mask: torch.Tensor, batches: int = 5,
             short_threshold_us: float = 10.0) -> OpStats:
    """Profile ``batches`` forwards of ``runner`` on one batch already on its device."""
    device = input_ids.device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode():
        runner(input_ids, attention_mask)  # warm
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(batches):  # busy time without the profiler's own overhead
            runner(input_ids, attention_mask)
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1000
        with profile(activities=activities) as prof:
            for _ in range(batches):
                runner(input_ids, attention_mask)
            if cuda:
                torch.cuda.synchronize(device)
    events = prof.events()
    top_level = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None
                 and e.name.startswith("aten::")]
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    if cuda:
        durations = [e.time_range.elapsed_us() for e in kernels]
        busy_ms = sum(durations) / 1000 / batches
    else:
        durations = [e.cpu_time_total for e in top_level]
        busy_ms = wall_ms / batches
    by_name: dict[str, list[float]] = {}
    for e, d in zip(kernels if cuda else top_level, durations):
        by_name.setdefault(e.name, []).append(d)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]
    top_ops = [{"name": n, "calls_per_batch": len(v) / batches, "total_us_per_batch": sum(v) / batches,
                "median_us": float(np.median(v))} for n, v in top]
    return OpStats(device.type, batches, tuple(input_ids.shape), len(top_level) / batches,
                   len(kernels) / batches, busy_ms, launch_cost_us(device), short_threshold_us, durations, top_ops)
