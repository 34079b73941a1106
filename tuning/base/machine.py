"""The machine a result was made on, recorded with every result, and the hardware facts presets depend on.

:func:`machine_info` is the ``machine`` block of every ``--json`` result, ``environment.json``, the report's
header and every ``bench/results/*.json``: the CPU (model, vendor, the instruction sets that decide precision
and speed, torch's CPU capability), physical and logical cores, torch's intra- and inter-op threads, the load
average and, where ``/proc/stat`` shows it, the share of CPU time stolen by the hypervisor; on a GPU the card,
driver and clocks. :func:`native_bf16` decides the ``tuned`` preset's precision; :func:`intra_op_threads` sizes
torch's threads from the cores the tool's own load generators leave free.
"""

from __future__ import annotations

import math
import os
import platform
from typing import Any, Mapping

# The instruction sets that decide a CPU forward's precision and speed: AVX2 (every x86 server of a decade),
# AVX-512, and native bf16 (AVX512-BF16 dot products, AMX tiles). Without native bf16 a bf16 forward is emulated
# (converted to fp32 and back around every operator), so it runs several times slower than fp32 rather than faster;
# bench/presets.py times the tuned preset against the other precision on the machine it runs on.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
RESERVED_CORES_ENV = "TUNING_RESERVED_CORES"  # cores the tool's other processes take (set for the ones it spawns)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name(info: Mapping[str, str] | None = None) -> str:
    """The CPU model (``/proc/cpuinfo``'s model name, or ``info``'s), else what :mod:`platform` says."""
    info = _cpuinfo() if info is None else info
    return info.get("model name") or platform.processor() or platform.machine()


def cpu_flags(info: Mapping[str, str] | None = None) -> dict[str, bool]:
    """Which of :data:`CPU_FLAGS` this CPU has (all False where ``/proc/cpuinfo`` has no flags line)."""
    flags = set((info if info is not None else _cpuinfo()).get("flags", "").split())
    return {flag: flag in flags for flag in CPU_FLAGS}


def torch_cpu_capability() -> str | None:
    """torch's own word on the CPU's vector unit (``AVX2``, ``AVX512``, ``DEFAULT``...), None without torch."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an old torch without the call
        return None


def native_bf16(flags: Mapping[str, bool] | None = None) -> bool:
    """True where this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else flags
    return any(flags.get(f) for f in NATIVE_BF16_FLAGS)


_TORCH_DEFAULT_THREADS: int | None = None  # torch's own count (OMP_NUM_THREADS, physical cores), read once


def _cpu_quota() -> int | None:
    """The container's CPU quota in whole cores (cgroup v2 ``cpu.max``), None when unlimited or unknown."""
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, -(-int(quota) // int(period)))


def usable_cores() -> int:
    """The cores this process's threads may use: the fewest of its affinity, the container's CPU quota and
    torch's own default thread count (physical cores, or ``OMP_NUM_THREADS`` when set; read once, before this
    package sets it), at least 1."""
    global _TORCH_DEFAULT_THREADS
    try:
        counts = [len(os.sched_getaffinity(0))]
    except (AttributeError, OSError):
        counts = [os.cpu_count() or 1]
    quota = _cpu_quota()
    if quota:
        counts.append(quota)
    if _TORCH_DEFAULT_THREADS is None:
        try:
            import torch

            _TORCH_DEFAULT_THREADS = torch.get_num_threads()
        except ImportError:
            _TORCH_DEFAULT_THREADS = 0
    if _TORCH_DEFAULT_THREADS:
        counts.append(_TORCH_DEFAULT_THREADS)
    return max(1, min(counts))


def reserved_cores() -> int:
    """Cores taken by the processes the tool started beside this one (``TUNING_RESERVED_CORES``, default 0)."""
    try:
        return max(0, int(os.environ.get(RESERVED_CORES_ENV, "0")))
    except ValueError:
        return 0


def intra_op_threads(reserved: int = 0, cores: int | None = None) -> int:
    """torch's intra-op threads that do not oversubscribe the cores: the usable cores less those kept busy by load
    generators the tool started (``reserved``, and :func:`reserved_cores` for a process spawned beside one), at
    least 1: a thread that shares its core with a busy process waits for it, and the forward's other threads wait at
    every operator's join for the slowest one, so one thread per free core beats more (bench/threads.py,
    bench/results/threads.json). Helpers that mostly wait (loader workers, an idle client) are not counted."""
    cores = usable_cores() if cores is None else cores
    return max(1, cores - reserved_cores() - max(0, reserved))


def busy_elsewhere(load1: float | None = None, own_threads: int = 0, cores: int | None = None) -> str | None:
    """A sentence when other processes already keep the cores busy (the 1-minute load average above what
    this process's ``own_threads`` explain), else None."""
    if load1 is None:
        if not hasattr(os, "getloadavg"):
            return None
        load1 = os.getloadavg()[0]
    cores = usable_cores() if cores is None else cores
    if load1 - own_threads >= 0.75 * cores:
        return (f"another process keeps the cores busy (load average {load1:.1f} on {cores} cores): "
                "expect slower and noisier figures, and fewer threads for torch to share")
    return None


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float:
    """The steal share between two :func:`steal_ticks` readings (NaN when either is missing or no time passed)."""
    if start is None or end is None or end[1] <= start[1]:
        return math.nan
    return (end[0] - start[0]) / (end[1] - start[1])


def steal_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies from ``/proc/stat``'s cpu line; :func:`steal_share` of two readings is the share of
    CPU time the hypervisor gave to other guests in between (None where it has no steal column)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    return values[7], sum(values[:8])


def _gpu() -> dict[str, Any] | None:
    """The first CUDA card, its driver and clocks (NVML), None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    gpu: dict[str, Any] = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gpu.update(driver=pynvml.nvmlSystemGetDriverVersion(),
                   sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                   max_sm_clock_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                   mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
    except Exception as exc:  # no NVML: the card's name is still known
        gpu["nvml"] = f"unavailable ({type(exc).__name__})"
    return gpu


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


class MachineWatch:
    """The machine block of one run: facts at the start, load average and steal at the start and the end.

    ``watch = MachineWatch()`` when the run starts; ``watch.info()`` when it ends."""

    def __init__(self) -> None:
        self.load_at_start = _load()
        self._steal_at_start = steal_ticks()
        self.busy_at_start = busy_elsewhere(self.load_at_start[0]) if self.load_at_start else None

    def info(self) -> dict[str, Any]:
        info = machine_info()
        info["load_average_at_start"] = self.load_at_start
        info["load_average_at_end"] = _load()
        info["busy_elsewhere_at_start"] = self.busy_at_start
        share = steal_share(self._steal_at_start, steal_ticks())
        if math.isfinite(share):
            info["steal_share"] = round(share, 4)
        return info


def machine_info() -> dict[str, Any]:
    """The facts of this machine (see the module's docstring); the load average is read now."""
    info = _cpuinfo()
    flags = cpu_flags(info)
    try:
        import psutil

        physical, logical = psutil.cpu_count(logical=False), psutil.cpu_count()
    except ImportError:
        physical, logical = None, os.cpu_count()
    threads: tuple[int | None, int | None] = (None, None)
    try:
        import torch

        threads = (torch.get_num_threads(), torch.get_num_interop_threads())
    except ImportError:
        pass
    steal = steal_ticks()
    return {
        "cpu": {"model": cpu_name(info),
                "vendor": info.get("vendor_id"), "arch": platform.machine(), "flags": flags,
                "native_bf16": native_bf16(flags), "torch_capability": torch_cpu_capability()},
        "cores_physical": physical, "cores_logical": logical, "cores_usable": usable_cores(),
        "torch_intra_op_threads": threads[0], "torch_inter_op_threads": threads[1],
        "load_average": _load(),
        "steal_share_since_boot": round(steal[0] / steal[1], 4) if steal and steal[1] else None,
        "gpu": _gpu(),
        "python": platform.python_version(),
    }


def same_machine(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str | None:
    """None when two machine blocks describe the same kind of machine; else a sentence saying how they differ
    (print it beside any comparison of their results)."""
    if not a or not b:
        return "one of the two results records no machine: they may come from different machines"
    diffs = []
    for what, get in (("CPU", lambda m: (m.get("cpu") or {}).get("model")),
                      ("native bf16", lambda m: (m.get("cpu") or {}).get("native_bf16")),
                      ("cores", lambda m: m.get("cores_usable")),
                      ("GPU", lambda m: (m.get("gpu") or {}).get("name"))):
        if get(a) != get(b):
            diffs.append(f"{what} {get(a)!r} vs {get(b)!r}")
    return ("different machines: " + "; ".join(diffs)) if diffs else None


def machine_line(info: Mapping[str, Any]) -> str:
    """One line for a report's header: CPU, native bf16 or not, cores, torch threads, load, GPU."""
    cpu = info.get("cpu") or {}
    flags = [f for f, on in (cpu.get("flags") or {}).items() if on]
    gpu = info.get("gpu") or {}
    load = info.get("load_average_at_start") or info.get("load_average")
    parts = [f"{cpu.get('model')} ({'native bf16' if cpu.get('native_bf16') else 'no native bf16'}; "
             f"{' '.join(flags) or 'no avx2'}; torch {cpu.get('torch_capability')})",
             f"{info.get('cores_physical')} physical / {info.get('cores_logical')} logical cores",
             f"torch threads {info.get('torch_intra_op_threads')} intra-op, {info.get('torch_inter_op_threads')} inter-op"]
    if load:
        end = info.get("load_average_at_end")
        parts.append(f"load average {load[0]:.1f}" + (f" -> {end[0]:.1f}" if end else ""))
    if info.get("busy_elsewhere_at_start"):
        parts.append(str(info["busy_elsewhere_at_start"]))
    if info.get("steal_share"):
        parts.append(f"steal {100 * info['steal_share']:.1f}%")
    if gpu.get("name"):
        parts.append(f"GPU {gpu['name']} (driver {gpu.get('driver', '?')}, SM {gpu.get('sm_clock_mhz', '?')} MHz)")
    return "machine: " + "; ".join(parts)
