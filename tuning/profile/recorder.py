"""One recorder around a workload: GPU, host and per-thread samplers on one monotonic clock,
joined afterwards with the workload's own spans into one result and one diagnosis.

    with Recorder() as rec:
        result = pipeline.run(...)
    profile = rec.join(result)
    profile.diagnosis, profile.to_frame("threads")
"""

from __future__ import annotations

import math
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from tuning.base import clock as _clock
from tuning.knobs import Knobs
from tuning.profile.busy import BusySeries, busy_series, device_busy_figures
from tuning.profile.diagnose import Diagnosis, Signals, diagnose
from tuning.profile.gpu import GpuSampler, GpuSeries
from tuning.profile.host import HostSampler, HostSeries
from tuning.profile.ops import OpStats

SAMPLER_THREADS = (GpuSampler.thread_name, HostSampler.thread_name)


class Workload(Protocol):
    """What a driver's result gives the recorder (offline runs and load tests both do)."""

    knobs: Knobs
    t_window_start: float
    t_end: float

    @property
    def model_busy(self) -> float: ...

    def spans(self) -> list[tuple[float, float]]: ...

    def batch_sizes(self) -> list[int]: ...

    def wait_for_input_s(self) -> float: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass
class Profile:
    """Every signal of one recorded workload on the shared clock, and the diagnosis."""

    gpu: GpuSeries
    host: HostSeries
    busy: BusySeries
    workload: Any
    signals: Signals
    diagnosis: Diagnosis
    t_start: float
    t_end: float
    ops: OpStats | None = None
    warnings: list[str] = field(default_factory=list)

    def to_frame(self, signal: str) -> pd.DataFrame:
        """One signal as a frame: gpu, host, threads, busy, requests or batches (times relative to the start)."""
        frames = {
            "gpu": self.gpu.to_frame, "host": self.host.to_frame, "threads": self.host.threads_frame,
            "busy": self.busy.to_frame, "requests": self.workload.to_frame,
            "batches": getattr(self.workload, "batches_frame", lambda: pd.DataFrame()),
        }
        if signal not in frames:
            raise ValueError(f"signal={signal!r} is not recorded; choose one of {', '.join(frames)}")
        frame = frames[signal]().copy()
        for col in ("t", "t_done", "t_ready", "t_received", "t_infer_start", "t_infer_end"):
            if col in frame:
                frame[col] = frame[col] - self.t_start
        return frame

    def top_threads(self, n: int = 8) -> list[dict[str, Any]]:
        return self.host.top_threads(n)

    def summary(self) -> dict[str, Any]:
        work = self.workload.summary()
        gpu = self.gpu.summary()
        return {
            "diagnosis": self.diagnosis.as_dict(),
            "threads": self.top_threads(),
            "gpu": gpu,
            "host": self.host.summary(),
            # the contract's figures, the workload's own (tuning.base.contract)
            **{key: work.get(key) for key in ("qps", "p50_ms", "p99_ms", "model_busy", "device_busy", "device")},
            "stages": work.get("stages"),
            # device busy under its one meaning (a kernel sum), NVML's util.gpu beside it under its own name
            "device_busy_figures": device_busy_figures(self.signals.device_busy, gpu.get("sm_util_mean")),
            "busy_over_time": {"window_s": self.busy.window_s, "min": _nan_none(self.busy.busy, np.min),
                               "max": _nan_none(self.busy.busy, np.max)},
            "ops": self.ops.summary() if self.ops else None,
            "workload": {k: v for k, v in work.items() if k not in ("stages",)},
            "warnings": self.warnings,
        }


def _nan_none(values: np.ndarray, fn) -> float | None:
    return float(fn(values)) if len(values) else None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


class Recorder:
    """Starts every sampler around a workload (one clock), then :meth:`join` makes one :class:`Profile`."""

    def __init__(self, interval: float = 0.5, gpu: bool = True, host: bool = True,
                 clock: _clock.Clock | None = None, nvml: Any = None, busy_window_s: float | None = None,
                 device: int | str | None = None):
        """``device``: the CUDA device index (or GPU UUID) the workload runs on, mapped to NVML by UUID;
        None: the CUDA device in use when CUDA is initialised, else every GPU. Where this process has no CUDA
        (and no NVML is injected) no GPU is expected: an absent NVML is the machine's normal state, kept in the
        GPU series' reason without a warning (the device banner already says what runs)."""
        self.clock = clock or _clock.now
        self.interval = interval
        expected = nvml is not None or device is not None or _cuda_available()
        self.gpu_sampler = GpuSampler(interval, self.clock, nvml, device=device, warn=expected) if gpu else None
        self.host_sampler = HostSampler(interval) if host else None
        self.busy_window_s = busy_window_s or max(interval, 0.5)
        self._stack: ExitStack | None = None
        self._caught: Any = None
        self.t_start = self.t_end = math.nan

    def __enter__(self) -> "Recorder":
        self._stack = ExitStack()
        self._caught = self._stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always", RuntimeWarning)
        for sampler in (self.gpu_sampler, self.host_sampler):
            if sampler is not None:
                self._stack.enter_context(sampler)
        self.t_start = self.clock()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.t_end = self.clock()
        self._stack.__exit__(*exc)  # the samplers see an interrupt, so they stop at once
        for w in self._caught or []:  # re-emit, so callers still see them
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def join(self, workload: Workload, ops: OpStats | None = None) -> Profile:
        """Join the samplers' series with the workload's spans; classify the measured window."""
        gpu = self.gpu_sampler.series if self.gpu_sampler else GpuSeries(False, "GPU sampling not requested")
        if getattr(workload, "device", {}).get("kind") == "simulated":
            gpu = _simulated_series(workload, self.t_start, self.t_end, self.interval)
        host = self.host_sampler.series if self.host_sampler else HostSeries()
        t0 = getattr(workload, "t_window_start", self.t_start)
        t1 = getattr(workload, "t_end", self.t_end)
        busy = busy_series(workload.spans(), self.t_start, self.t_end, self.busy_window_s)
        signals = window_signals(workload, host, gpu, t0, t1, ops)
        notes = [str(w.message) for w in (self._caught or [])]
        return Profile(gpu, host, busy, workload, signals, diagnose(signals), self.t_start, self.t_end, ops, notes)


def window_signals(workload: Workload, host: HostSeries, gpu: GpuSeries, t0: float, t1: float,
                   ops: OpStats | None = None) -> Signals:
    """The numbers the diagnosis reads, restricted to the measured window ``[t0, t1]``."""
    window = max(t1 - t0, 1e-9)
    spans = [(a, b) for a, b in workload.spans() if b > t0]
    sizes = workload.batch_sizes()
    threads = host.threads_frame()
    # the input side's threads: not the samplers, not the serving model executor (and its native pool)
    input_side = ~threads.name.isin(SAMPLER_THREADS) & ~threads.name.str.startswith("model-executor")
    threads = threads[(threads.t >= t0) & (threads.t <= t1 + host_slack(host)) & input_side]
    max_cpu, max_name, max_wait = math.nan, "", math.nan
    if len(threads):
        # the thread that wanted the most CPU: used + waited in the run queue (schedstat), where known
        per = threads.groupby(["pid", "tid", "name"])[["cpu_percent", "wait_percent"]].mean()
        demand = per.cpu_percent + per.wait_percent.fillna(0.0)
        top = demand.idxmax()
        max_cpu, max_name = float(per.cpu_percent[top]), str(top[2])
        max_wait = float(per.wait_percent[top]) if per.wait_percent.notna().any() else math.nan
    hf = host.to_frame()
    hf = hf[(hf.t >= t0) & (hf.t <= t1 + host_slack(host))]
    gf = gpu.to_frame()
    gf = gf[(gf.t >= t0) & (gf.t <= t1)]
    power = (gf.power_w / gf.power_limit_w).dropna() if len(gf) else pd.Series(dtype=float)
    model_busy = float(workload.model_busy)
    device_busy = float(getattr(workload, "device_busy", math.nan))
    if not math.isfinite(device_busy):
        calls = sum(1 for a, b in spans if b <= t1 + 1e-9)
        device_busy = kernel_busy(calls, window, model_busy, ops)
    launch_share = ops.launch_share if ops else math.nan
    timeline = getattr(workload, "device_timeline", None)
    if getattr(workload, "device", {}).get("kind") == "simulated" and timeline is not None:
        # from the cost model's own figures (not the stand-in's sleep overshoot): the share of the calls'
        # predicted time the device did not compute, what capture could save at most
        launch_share = timeline.totals(t0, t1).launch_share
    return Signals(
        model_busy=model_busy, device_busy=device_busy,
        wait_for_input_share=min(workload.wait_for_input_s() / window, 1.0),
        wait_for_model_share=_share(workload, "wait_for_model_s", window),
        median_span_ms=float(np.median([(b - a) * 1000 for a, b in spans])) if spans else math.nan,
        mean_batch=float(np.mean(sizes)) if sizes else math.nan,
        max_thread_cpu=max_cpu, max_thread_name=max_name, max_thread_wait=max_wait,
        process_cpu=float(hf.cpu_percent.mean()) if len(hf) else math.nan,
        disk_mb_s=float((hf.read_mb_s + hf.write_mb_s).mean()) if len(hf) else math.nan,
        launch_share=launch_share,
        gpu_util=float(gf.sm_util.mean()) if len(gf) else math.nan,
        gpu_power_frac=float(power.mean()) if len(power) else math.nan,
        batch_size_knob=workload.knobs.batch_size, dtype_knob=workload.knobs.dtype,
        padding_knob=workload.knobs.padding,
    )


def kernel_busy(calls: int, window_s: float, model_busy: float, ops: OpStats | None) -> float:
    """Device busy as one definition everywhere (:data:`tuning.profile.busy.DEVICE_BUSY_IS`): the share of wall
    time with a kernel running, here the profiler's kernel sum per call times the calls in the window over the
    window (a call stretched by a contended host runs no more kernel time), at most the model's busy share. NaN
    without a CUDA profile: NVML's ``util.gpu`` is not it (one tiny kernel in a period reads 100%), and it stays
    beside it as ``gpu_util`` under its own name."""
    if ops is None or ops.kernels_per_batch <= 0 or not window_s > 0:
        return math.nan
    return min(calls * ops.busy_ms_per_batch / 1000 / window_s, model_busy)


def _simulated_series(workload: Any, t0: float, t1: float, interval: float) -> GpuSeries:
    """The GPU section of a run on the simulated device: its timeline sampled like NVML, labelled."""
    from tuning.profile.simulated import simulated_gpu_series
    from tuning.sim import load_profile

    profile = load_profile(workload.knobs.sim_profile)
    return simulated_gpu_series(workload.device_timeline, profile, t0, t1, interval)


def host_slack(host: HostSeries) -> float:
    return 0.0 if not host.samples else 1.0  # the last sample lands just after the window closes


def _share(workload: Any, method: str, window: float) -> float:
    fn = getattr(workload, method, None)
    return min(fn() / window, 1.0) if fn else math.nan


