"""A simulated GPU sampler: the recorder's GPU section from the stand-in's device timeline.

Sampled at the recorder's interval on the shared clock, like NVML would be. SM utilization is computed the way
NVML's ``utilization.gpu`` samples: the share of its sample periods in which any kernel ran
(:meth:`~tuning.sim.timeline.DeviceTimeline.active_share`), which reads far above the kernel sum for short kernels
spread over a call; the kernel sum is device busy, reported by the workload under that name, never here. Memory is
the model's weights plus the largest activation seen so far; power is interpolated between the profile's idle and
maximum draw by the kernel sum (the work done). The series is labelled simulated in its device name and reason.
"""

from __future__ import annotations

import math

import numpy as np

from tuning.profile.gpu import GpuSample, GpuSeries
from tuning.sim.profiles import DeviceProfile
from tuning.sim.timeline import DeviceTimeline


def simulated_gpu_series(timeline: DeviceTimeline | None, profile: DeviceProfile, t0: float, t1: float,
                         interval: float) -> GpuSeries:
    """One sample per ``interval`` from ``t0`` to ``t1``, each covering the interval before it."""
    name = f"simulated {profile.name}"
    period = timeline.bin_s if timeline is not None else math.nan
    series = GpuSeries(True, f"simulated device ({profile.source}); not an NVML reading: util.gpu is the share of "
                       f"{period * 1e3:g} ms sample periods with any kernel, as NVML samples", devices=[name])
    if timeline is None or t1 <= t0 or interval <= 0:
        return series
    total_mb = profile.mem_bytes / 2**20
    peak_mem = 0.0
    for end in np.arange(t0 + interval, t1 + interval / 2, interval):
        start = end - interval
        util = timeline.active_share(start, end) * 100
        busy = timeline.busy_share(start, end)
        peak_mem = max(peak_mem, timeline.memory_peak(start, end))
        power = (profile.idle_power_w + (profile.max_power_w - profile.idle_power_w) * busy
                 if math.isfinite(profile.idle_power_w) and math.isfinite(profile.max_power_w) else math.nan)
        series.samples.append(GpuSample(
            t=float(end), gpu=0, name=name, sm_util=util, mem_util=math.nan, mem_used_mb=peak_mem / 2**20,
            mem_total_mb=total_mb, power_w=power, power_limit_w=profile.max_power_w, sm_clock_mhz=math.nan,
            temp_c=math.nan, proc_sm_util=util))
    return series
