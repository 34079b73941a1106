"""Operator and launch statistics under ``torch.profiler``, and the launch-overhead budget.

Per batch: operators (and kernels on CUDA) launched, their duration distribution, the
share shorter than a threshold (fragmentation), and the launch budget: the most that graph
capture could save, predicted before capturing. Launches are the host's launch calls
(``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaGraphLaunch``...; operators on a CPU),
not device kernels: a replayed graph runs many kernels from one launch. The budget, on CUDA, is
the wall time per batch (measured without the profiler) that is not kernel time: capture cannot
save time the device spends computing, and it removes the host's launches, whose real cost per
operator is several times a tiny op's. On a CPU it is launches x the measured cost of one tiny
op. Either way it is a prediction (an upper bound), labelled so beside the figure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tuning.base.stats import clean, summarize

# CUDA runtime/driver calls that launch work from the host (one each, whatever they run)
HOST_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                     "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch")


LAUNCH_SHARE_IS = {  # what OpStats.launch_share is, per device kind: written beside the figure
    "cuda": "predicted: the most graph capture could save, the share of the wall time per batch with no kernel "
            "running (wall measured without the profiler, less the profiler's kernel sum); a bound, not a measured saving",
    "cpu": "predicted: launches x one tiny op's measured cost / wall time per batch; a bound, not a measured saving",
}


@dataclass
class OpStats:
    device: str
    batches: int
    batch_shape: tuple[int, int]
    ops_per_batch: float
    kernels_per_batch: float  # device kernels (0 on CPU); replayed graph kernels included
    busy_ms_per_batch: float  # kernel time on CUDA, wall time on a CPU
    launch_cost_us: float
    short_threshold_us: float
    durations_us: list[float] = field(repr=False, default_factory=list)  # per kernel on CUDA, per op on CPU
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    wall_ms_per_batch: float = math.nan  # measured without the profiler
    host_launches_per_batch: float = math.nan  # CUDA: host launch calls (HOST_LAUNCH_CALLS)

    @property
    def launches_per_batch(self) -> float:
        """Host launch calls per batch on CUDA (operators on a CPU)."""
        if self.device == "cuda":
            return self.host_launches_per_batch if not math.isnan(self.host_launches_per_batch) else self.kernels_per_batch
        return self.ops_per_batch

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
        """The most capture could save, as a share of wall time per batch (a bound predicted from this
        profile, not a measured saving).

        On CUDA: the share of the wall time per batch (measured without the profiler) in which no kernel runs,
        (wall - kernel sum) / wall: a replayed graph still runs every kernel, and its host side is one replay, so
        what capture can remove is the host time the kernels do not cover, whatever each launch costs (a tiny op's
        launch cost times the launches read a third of the saving that graph replay measured on real cards, because
        a real operator's host path costs several tiny launches). On a CPU, where busy is the wall: launches x
        the tiny op's cost / wall. Without a wall time, busy time stands in for it.
        """
        wall = self.wall_ms_per_batch if not math.isnan(self.wall_ms_per_batch) else self.busy_ms_per_batch
        if not wall > 0:
            return math.nan
        if self.device == "cuda" and not math.isnan(self.wall_ms_per_batch):
            saving = max(wall - self.busy_ms_per_batch, 0.0)
        else:
            saving = self.launch_overhead_ms
        return min(max(saving / wall, 0.0), 1.0)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"duration_us": self.durations_us})

    def summary(self) -> dict[str, Any]:
        d = summarize(self.durations_us)
        return {
            "device": self.device, "batches": self.batches, "batch_shape": list(self.batch_shape),
            "ops_per_batch": self.ops_per_batch, "kernels_per_batch": self.kernels_per_batch,
            "launches_per_batch": clean(float(self.launches_per_batch)),
            "busy_ms_per_batch": clean(self.busy_ms_per_batch), "wall_ms_per_batch": clean(self.wall_ms_per_batch),
            "launch_cost_us": clean(self.launch_cost_us),
            "duration_us": {k: clean(v) for k, v in d.items()}, "short_threshold_us": self.short_threshold_us,
            "short_share": clean(self.short_share), "launch_overhead_ms": clean(self.launch_overhead_ms),
            "launch_share": clean(self.launch_share), "launch_share_is": LAUNCH_SHARE_IS.get(self.device, LAUNCH_SHARE_IS["cpu"]),
            "top_ops": self.top_ops,
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


def stats_from_events(events: Iterable[Any], batches: int, batch_shape: tuple[int, int], device: str,
                      wall_ms: float, launch_cost_us: float, short_threshold_us: float = 10.0) -> OpStats:
    """:class:`OpStats` from profiler events (``prof.events()``) of ``batches`` forwards taking ``wall_ms``."""
    events = list(events)
    cuda = device == "cuda"
    top_level = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None
                 and e.name.startswith("aten::")]
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    launches = [e for e in events if e.device_type == DeviceType.CPU and e.name in HOST_LAUNCH_CALLS]
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
    return OpStats(device, batches, tuple(batch_shape), len(top_level) / batches, len(kernels) / batches, busy_ms,
                   launch_cost_us, short_threshold_us, durations, top_ops, wall_ms_per_batch=wall_ms / batches,
                   host_launches_per_batch=len(launches) / batches if cuda else math.nan)


def op_stats(runner: Callable, input_ids: torch.Tensor, attention_mask: torch.Tensor, batches: int = 5,
             short_threshold_us: float = 10.0) -> OpStats:
    """Profile ``batches`` forwards of ``runner`` on one batch already on its device.

    Wall time per batch is measured first, without the profiler. A CUDA-graph runner must have
    been built after :func:`tuning.runtime.graphs.init_profiler_for_graphs` (its capture calls it).
    """
    device = input_ids.device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode():
        runner(input_ids, attention_mask)  # warm
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(batches):  # wall time without the profiler's own overhead
            runner(input_ids, attention_mask)
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1000
        with profile(activities=activities) as prof:
            for _ in range(batches):
                runner(input_ids, attention_mask)
            if cuda:
                torch.cuda.synchronize(device)
    return stats_from_events(prof.events(), batches, tuple(input_ids.shape), device.type, wall_ms,
                             launch_cost_us(device), short_threshold_us)
