"""A simulated GPU sampler: the recorder's GPU section from the stand-in's device timeline.

Sampled at the recorder's interval on the shared clock, like NVML would be: SM utilization is
the share of each interval the simulated device computed (what NVML's ``utilization.gpu``
reads: the share of time a kernel ran), memory is the model's weights plus the largest
activation seen so far, power is interpolated between the profile's idle and maximum draw.
The series is labelled simulated in its device name and reason.
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
    series = GpuSeries(True, f"simulated device ({profile.source}); not an NVML reading", devices=[name])
    if timeline is None or t1 <= t0 or interval <= 0:
        return series
    total_mb = profile.mem_bytes / 2**20
    peak_mem = 0.0
    for end in np.arange(t0 + interval, t1 + interval / 2, interval):
        start = end - interval
        util = min(timeline.totals(start, end).busy / interval, 1.0) * 100
        peak_mem = max(peak_mem, timeline.memory_peak(start, end))
        power = (profile.idle_power_w + (profile.max_power_w - profile.idle_power_w) * util / 100
                 if math.isfinite(profile.idle_power_w) and math.isfinite(profile.max_power_w) else math.nan)
        series.samples.append(GpuSample(
            t=float(end), gpu=0, name=name, sm_util=util, mem_util=math.nan, mem_used_mb=peak_mem / 2**20,
            mem_total_mb=total_mb, power_w=power, power_limit_w=profile.max_power_w, sm_clock_mhz=math.nan,
            temp_c=math.nan, proc_sm_util=util))
    return series
