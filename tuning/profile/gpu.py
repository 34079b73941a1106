"""Accelerator trend sampling through NVML (the ``pynvml`` module of ``nvidia-ml-py``).

Per GPU and interval: kernel-active and memory-controller utilization, memory used/total,
power draw and its enforced limit, SM clock, temperature, and this process's own SM
utilization where NVML offers it. No NVML library, no GPU, or an NVML failure: a warning
with the reason and a series without made-up numbers (a metric a GPU does not support,
e.g. utilization on a MIG slice, is NaN).

Which GPU: NVML numbers GPUs its own way, ignoring ``CUDA_VISIBLE_DEVICES``; the sampler
maps this process's CUDA device to NVML by UUID (the device in use when CUDA is already
initialised, or the one passed as ``device=``). Only when no CUDA device is known does it
watch every GPU NVML sees.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pandas as pd

from tuning.base import clock as _clock
from tuning.profile.sampler import PeriodicSampler


@dataclass
class GpuSample:
    """One NVML reading of one GPU.

    ``sm_util`` is NVML's ``util.gpu``: the percent of the sample period in which at least one
    kernel was running (any process), not the share of SMs busy; a single small kernel
    keeps it at 100. ``mem_util``: percent of the period the memory controller was busy.
    ``power_w``: ``nvmlDeviceGetPowerUsage``, on Ampere and Hopper a 1 s moving average, so
    it lags short bursts. ``gpu``: NVML's index of the GPU (not the CUDA index).
    """

    t: float
    gpu: int
    name: str
    sm_util: float
    mem_util: float
    mem_used_mb: float
    mem_total_mb: float
    power_w: float
    power_limit_w: float
    sm_clock_mhz: float
    temp_c: float
    proc_sm_util: float  # this process's SM utilization (NaN where NVML gives none)


_DTYPES = {f.name: ("float64" if f.type == "float" else "int64" if f.type == "int" else "object") for f in fields(GpuSample)}


@dataclass
class GpuSeries:
    """GPU samples on the shared clock; ``available``/``reason`` say why it may be empty."""

    available: bool
    reason: str | None
    samples: list[GpuSample] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([asdict(s) for s in self.samples], columns=list(_DTYPES))
        return frame.astype(_DTYPES)

    def summary(self) -> dict[str, Any]:
        frame = self.to_frame()
        out: dict[str, Any] = {"available": self.available, "reason": self.reason, "devices": self.devices,
                               "samples": len(frame)}
        if len(frame):
            for col in ("sm_util", "power_w", "mem_used_mb", "proc_sm_util"):
                values = frame[col].dropna()
                out[f"{col}_mean"] = float(values.mean()) if len(values) else None
            power = (frame["power_w"] / frame["power_limit_w"]).dropna()
            out["power_frac_mean"] = float(power.mean()) if len(power) else None
        return out


def _norm_uuid(uuid: Any) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def cuda_uuid(index: int) -> str:
    """The UUID of this process's CUDA device ``index`` (after ``CUDA_VISIBLE_DEVICES``)."""
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


def current_cuda_device() -> int | None:
    """This process's CUDA device when CUDA is already initialised here (None otherwise: starting
    CUDA only to pick a GPU to watch would take GPU memory from a CPU run)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


def load_nvml():
    """The ``pynvml`` module, or an ImportError that says what to install."""
    try:
        import pynvml
    except ImportError:
        raise ImportError("the pynvml module is missing; pip install nvidia-ml-py") from None
    return pynvml


class GpuSampler(PeriodicSampler):
    """Samples this process's GPU through NVML; pass ``nvml=`` a stand-in module in tests.

    ``device``: a CUDA device index of this process, or a GPU/MIG UUID; None: the CUDA device
    in use if CUDA is initialised, else every GPU NVML sees. ``pid``: the process whose own SM
    utilization ``proc_sm_util`` reports (default: this one; another one to watch a service).
    """

    thread_name = "gpu-sampler"

    def __init__(self, interval: float = 0.5, clock: _clock.Clock | None = None, nvml: Any = None,
                 device: int | str | None = None, pid: int | None = None, warn: bool = True):
        """``warn``: say why when sampling is off (a RuntimeWarning); False where no GPU is expected (a
        process without CUDA): the reason stays in ``series.reason``, and a mid-run NVML error still warns."""
        super().__init__(interval, clock)
        self._nvml = nvml
        self.warn = warn
        self.device = device
        self.pid = pid or os.getpid()
        self.series = GpuSeries(False, "not started")
        self._handles: list[Any] = []
        self._indices: list[int] = []
        self._last_proc_ts: dict[int, int] = {}

    def _unavailable(self, reason: str) -> bool:
        if self.warn:
            warnings.warn(f"GPU sampling off: {reason}", RuntimeWarning, stacklevel=3)
        self.series = GpuSeries(False, reason)
        return False

    def start(self) -> bool:
        try:
            nvml = self._nvml or load_nvml()
            self._nvml = nvml
            nvml.nvmlInit()
        except ImportError as exc:
            return self._unavailable(str(exc))
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return self._unavailable(f"NVML could not start ({type(exc).__name__}: {exc}); no NVIDIA driver or GPU here")
        try:
            target = self._target_uuid()
            count = nvml.nvmlDeviceGetCount()
            chosen = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
            if target is not None:
                chosen = [(i, h) for i, h in chosen if _norm_uuid(nvml.nvmlDeviceGetUUID(h)) == _norm_uuid(target)]
                if not chosen and count:  # a MIG slice is not among the whole GPUs: ask NVML by its UUID
                    chosen = self._by_uuid(target)
                if not chosen and count:
                    self._shutdown()
                    return self._unavailable(f"NVML has no GPU with UUID {target} (CUDA device {self.device!r})")
            if not chosen:
                self._shutdown()
                return self._unavailable("NVML found no GPU")
            self._indices = [i for i, _ in chosen]
            self._handles = [h for _, h in chosen]
            names = [self._text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
            if target is not None:
                names = [f"{n} ({self._text(nvml.nvmlDeviceGetUUID(h))})" for n, h in zip(names, self._handles)]
        except Exception as exc:
            self._shutdown()
            return self._unavailable(f"NVML error listing GPUs ({type(exc).__name__}: {exc})")
        self.series = GpuSeries(True, None, [], names)
        return True

    def _target_uuid(self) -> str | None:
        """The UUID to watch: ``device`` as given, or this process's CUDA device; None: every GPU."""
        device = self.device if self.device is not None else current_cuda_device()
        if device is None:
            return None
        return device if isinstance(device, str) else cuda_uuid(int(device))

    def _by_uuid(self, target: str) -> list[tuple[int, Any]]:
        get = getattr(self._nvml, "nvmlDeviceGetHandleByUUID", None)
        for prefix in ("MIG-", "GPU-", ""):
            try:
                return [(-1, get((prefix + _norm_uuid(target)).encode()))] if get else []  # -1: a MIG slice
            except Exception:
                continue
        return []

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _optional(self, fn, *args: Any) -> float:
        """A metric this GPU may not support: NaN instead of a made-up number."""
        try:
            return float(fn(*args))
        except Exception as exc:
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc):
                return math.nan
            raise

    def _proc_util(self, index: int, handle: Any) -> float:
        nvml = self._nvml
        try:
            stats = nvml.nvmlDeviceGetProcessUtilization(handle, self._last_proc_ts.get(index, 0))
        except Exception:  # not supported, or no sample for this process since last time
            return math.nan
        mine = [s for s in stats if getattr(s, "pid", None) == self.pid]
        if stats:
            self._last_proc_ts[index] = max(getattr(s, "timeStamp", 0) for s in stats)
        return float(max(s.smUtil for s in mine)) if mine else math.nan

    def _utilization(self, handle: Any) -> tuple[float, float]:
        """(kernel-active %, memory-controller %); NaN where unsupported (MIG slices)."""
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        except Exception as exc:
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc):
                return math.nan, math.nan
            raise
        return float(util.gpu), float(util.memory)

    def sample(self, t: float) -> bool:
        nvml = self._nvml
        try:
            for k, (i, h) in enumerate(zip(self._indices, self._handles)):
                kernel_util, mem_util = self._utilization(h)
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                self.series.samples.append(GpuSample(
                    t, i, self.series.devices[k], kernel_util, mem_util,
                    mem.used / 2**20, mem.total / 2**20,
                    self._optional(nvml.nvmlDeviceGetPowerUsage, h) / 1000,
                    self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, h) / 1000,
                    self._optional(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                    self._optional(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                    self._proc_util(i, h),
                ))
            return True
        except Exception as exc:
            # Keep the real samples taken so far; take no more. Never invent a reading.
            reason = f"NVML error mid-run after {len(self.series.samples)} samples ({type(exc).__name__}: {exc})"
            warnings.warn(f"GPU sampling stopped: {reason}", RuntimeWarning, stacklevel=2)
            self.series.reason = reason
            return False

    def process_memory(self) -> dict[int, float]:
        """MB of GPU memory ``pid`` holds per GPU (NVML index) where NVML lists it among the compute
        processes; empty when it lists it nowhere (no GPU work, or another pid namespace)."""
        out: dict[int, float] = {}
        get = getattr(self._nvml, "nvmlDeviceGetComputeRunningProcesses", None)
        if not self.series.available or get is None:
            return out
        for i, h in zip(self._indices, self._handles):
            try:
                procs = get(h)
            except Exception:
                continue
            used = [getattr(p, "usedGpuMemory", None) for p in procs if getattr(p, "pid", None) == self.pid]
            if used:
                out[i] = sum(u for u in used if isinstance(u, (int, float))) / 2**20
        return out

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass

    def finish(self) -> None:
        if self.series.available:
            self._shutdown()
