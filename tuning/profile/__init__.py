"""Profilers on one timeline: GPU (NVML), host and per-thread CPU, model busy over time,
op and launch statistics, and a diagnosis computed from them."""

from tuning.profile.busy import BusySeries, busy_series
from tuning.profile.diagnose import Diagnosis, Signals, diagnose
from tuning.profile.gpu import GpuSampler, GpuSeries
from tuning.profile.host import HostSampler, HostSeries
from tuning.profile.ops import OpStats, op_stats
from tuning.profile.recorder import Profile, Recorder

__all__ = ["BusySeries", "busy_series", "Diagnosis", "Signals", "diagnose", "GpuSampler", "GpuSeries",
           "HostSampler", "HostSeries", "OpStats", "op_stats", "Profile", "Recorder"]
