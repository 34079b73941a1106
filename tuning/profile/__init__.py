"""Profilers on one timeline: GPU (NVML), host and per-thread CPU, model busy over time,
op and launch statistics, and a diagnosis computed from them."""

from .busy import BusySeries, busy_series
from .diagnose import Diagnosis, Signals, diagnose
from .gpu import GpuSampler, GpuSeries
from .host import HostSampler, HostSeries
from .ops import OpStats, op_stats
from .recorder import Profile, Recorder, profile_pipeline

__all__ = ["BusySeries", "busy_series", "Diagnosis", "Signals", "diagnose", "GpuSampler", "GpuSeries",
           "HostSampler", "HostSeries", "OpStats", "op_stats", "Profile", "Recorder", "profile_pipeline"]
