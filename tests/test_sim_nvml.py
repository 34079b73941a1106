"""NVML as NVML reads (issue 59, deliver 4): the simulated device reports device busy (the kernel sum) under that
name and an NVML util.gpu computed the way NVML samples it (the share of sample periods in which any kernel ran),
so a starved device (short kernels spread over the wall time) reads a low kernel sum and a far higher util.gpu, as
a real one does; the two never stand in for each other."""

from __future__ import annotations

import math

import pytest

from tuning.profile.busy import device_busy_figures
from tuning.profile.simulated import simulated_gpu_series
from tuning.sim import load_profile
from tuning.sim.timeline import DeviceTimeline


def starved(timeline: DeviceTimeline, seconds: float = 2.0, call_s: float = 0.01, kernel_s: float = 0.0012) -> None:
    """Calls back to back, each ``call_s`` of wall with ``kernel_s`` of kernels in it: a launch-bound device."""
    t = 0.0
    while t < seconds - 1e-12:
        timeline.add(t, t + call_s, kernel_s, call_s, 1e9)
        t += call_s


def test_a_starved_device_reads_a_low_kernel_sum_and_a_high_util_gpu():
    timeline = DeviceTimeline(bin_s=0.01)
    starved(timeline)
    assert timeline.busy_share(0.0, 2.0) == pytest.approx(0.12)  # device busy: the kernel sum
    assert timeline.active_share(0.0, 2.0) == pytest.approx(1.0)  # every sample period saw a kernel
    series = simulated_gpu_series(timeline, load_profile("h200-sxm-estimate"), 0.0, 2.0, 0.5)
    utils = [s.sm_util for s in series.samples]
    assert len(utils) == 4 and all(u == pytest.approx(100.0) for u in utils), utils
    figures = device_busy_figures(timeline.busy_share(0.0, 2.0), sum(utils) / len(utils))
    assert figures["device_busy"] == pytest.approx(0.12) and figures["nvml_util_gpu"] == pytest.approx(1.0)


def test_util_gpu_counts_the_periods_with_a_kernel_not_their_length():
    timeline = DeviceTimeline(bin_s=0.01)
    timeline.add(0.0, 0.0, 0.0, 0.0, 0.0)  # the timeline starts at 0
    for i in range(50):  # the first second: one 1 ms call every 20 ms, inside a period; the second: idle
        timeline.add(i * 0.02 + 0.004, i * 0.02 + 0.005, 0.001, 0.001, 1e9)
    timeline.add(1.995, 2.0, 0.0, 0.0, 0.0)  # the timeline reaches 2 s
    assert timeline.busy_share(0.0, 1.0) == pytest.approx(0.05)
    assert timeline.active_share(0.0, 1.0) == pytest.approx(0.5)
    assert timeline.active_share(1.0, 2.0) == pytest.approx(0.0)
    assert timeline.active_share(0.0, 2.0) == pytest.approx(0.25)
    assert math.isnan(timeline.active_share(1.0, 1.0))


def test_the_simulated_series_says_it_is_not_an_nvml_reading():
    timeline = DeviceTimeline(bin_s=0.01)
    starved(timeline, 1.0)
    series = simulated_gpu_series(timeline, load_profile("h200-sxm-estimate"), 0.0, 1.0, 0.5)
    assert "not an NVML reading" in series.reason and "sample period" in series.reason
