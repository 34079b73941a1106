"""Identifiability before labels (issue 59, deliver 3): ``calibrate`` gives each parameter a bootstrap interval over
the points; one whose interval spans more than 2x, or that sits at a bound, is labelled "not identified" and keeps
its prior; the per-kernel floor comes from the profiler's kernel durations where a run has them. On the committed
H200 runs the unlabelled fit gave a graph replay of 160-177 us (the estimate: 6 us) and a floor of 0.48-0.56 us (the
profiler's mean kernel: 2.32 us), both called fitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuning.sim import embedded_model_profile, holdout, load_profile, predict
from tuning.sim.calibrate import NOT_IDENTIFIED, Point, calibrate, profiler_floor, unidentified

ROOT = Path(__file__).resolve().parents[1]
H200 = load_profile("h200-sxm-estimate")


@pytest.fixture(scope="module")
def runs():
    return {r.name: r for r in holdout.load_runs(ROOT / "bench" / "results")}


@pytest.mark.parametrize("name", ["gpu_check_h200", "gpu_check_h200_run3"])
def test_the_committed_runs_replay_and_floor_are_not_passed_off_as_fitted(runs, name):
    run = runs[name]
    floor = profiler_floor(run.data["steps"]["launch_budget"])
    assert floor == pytest.approx(2.32e-6, rel=0.02)
    profile, _ = calibrate(holdout.calibration_points(run), embedded_model_profile(), "cuda", "fit",
                           device_name="NVIDIA H200", host_dispatch_s=8e-6, host_dispatch_kind="model",
                           kernel_floor_s=floor)
    assert profile.min_kernel_s == pytest.approx(floor)
    assert "profiler" in profile.sources["min_kernel_s"]
    replay_ok = 0.5 <= profile.graph_replay_s / H200.graph_replay_s <= 2.0
    assert replay_ok or "graph_replay_s" in unidentified(profile), (profile.graph_replay_s,
                                                                    profile.sources["graph_replay_s"])
    for key in ("launch_s", "graph_replay_s", "mem_bandwidth", "peak_flops"):
        assert "bootstrap" in profile.sources[key], (key, profile.sources[key])


def test_a_parameter_the_points_cannot_tell_keeps_its_prior():
    """Graph points at batch 1 only: every kernel at its floor, so bf16's rate cannot be told from them."""
    minilm = embedded_model_profile()
    points = [Point(1, t, "bf16", g, predict(minilm, H200, 1, t, "bf16", g, host_dispatch_s=8e-6).call_s * 1e3)
              for t in (16, 32, 64) for g in ("eager", "cuda_graph")]
    profile, _ = calibrate(points, minilm, "cuda", "fit", device_name="NVIDIA H200", host_dispatch_s=8e-6,
                           host_dispatch_kind="model")
    assert "peak_flops" in unidentified(profile)
    assert NOT_IDENTIFIED in profile.sources["peak_flops"]
    prior = H200.flops_for("bf16") * H200.gemm_efficiency["bf16"]
    assert profile.peak_flops["bf16"] == pytest.approx(prior)


def test_points_that_determine_a_parameter_get_it_with_a_narrow_interval():
    """Points made by a card the fit's own (flat) form describes exactly: up to 128x256, compute shows."""
    minilm = embedded_model_profile()
    flat = H200.replace(sm_count=0, gemm_efficiency={}, flops_efficiency=0.4, graph_min_kernel_s=None)
    shapes = [(b, t) for b in (1, 8, 32, 128) for t in (64, 256)]
    points = [Point(b, t, "bf16", g, predict(minilm, flat, b, t, "bf16", g, host_dispatch_s=8e-6).call_s * 1e3)
              for b, t in shapes for g in ("eager", "cuda_graph")]
    profile, _ = calibrate(points, minilm, "cuda", "fit", device_name="NVIDIA H200", host_dispatch_s=8e-6,
                           host_dispatch_kind="model")
    assert "peak_flops" not in unidentified(profile), profile.sources["peak_flops"]
    assert "bootstrap interval" in profile.sources["peak_flops"]
    assert profile.peak_flops["bf16"] == pytest.approx(H200.flops_for("bf16") * 0.4, rel=0.05)
