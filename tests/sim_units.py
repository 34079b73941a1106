"""A device profile of round numbers for hand-computed expectations in the simulator's tests."""

from __future__ import annotations

from tuning.sim.profiles import DeviceProfile


def unit_device(**changes) -> DeviceProfile:
    """1 TFLOP/s fp32 (2 in half), 1 GB/s, 10 us launches, 5 us replays, 1 us minimum kernel, no efficiency loss."""
    base = dict(name="unit", kind="estimate", description="round numbers for hand computation",
                peak_flops={"fp32": 1e12, "bf16": 2e12, "fp16": 2e12}, flops_efficiency=1.0, mem_bandwidth=1e9,
                bandwidth_efficiency=1.0, mem_bytes=1e9, launch_s=10e-6, graph_replay_s=5e-6, min_kernel_s=1e-6,
                h2d_pinned_bps=1e9, h2d_pageable_bps=0.5e9, copy_latency_s=0.0)
    base.update(changes)
    return DeviceProfile(**base)
