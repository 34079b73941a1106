"""One chip, one set of efficiencies (issue 59, deliver 2): cards built on the same chip (the H100 SXM and the H200
are both GH100) share its fitted efficiencies, floors and attention kernels; only what the datasheets give per card
(clocks, so peaks; bandwidth; memory) differs. For the same work no card is predicted faster than one with at least
its compute and bandwidth. TF32 comes from the bf16 fit by the datasheet ratio unless it was measured, and says so."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tuning.base.assets import DEVICE_PROFILES, shipped_profiles
from tuning.sim import embedded_model_profile, holdout, load_profile, predict
from tuning.sim.profiles import CHIP_FIELDS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DTYPES = ("fp32", "tf32", "bf16", "fp16")


def committed_work() -> list[tuple[int, int, str, str]]:
    """Every (batch, length, dtype, mode) a committed GPU run timed or the next run plans (bench/results), in every
    dtype, eager and replayed."""
    shapes = {(p["batch"], p["length"]) for r in holdout.load_runs(RESULTS) for p in holdout.measured_points(r)}
    plan = RESULTS / "whatif_predictions.json"
    if plan.is_file():
        shapes |= {(p["batch"], p["length"]) for p in json.loads(plan.read_text())["points"]}
    assert len(shapes) >= 9
    return [(b, t, d, m) for (b, t) in sorted(shapes) for d in ("fp32", "tf32", "bf16") for m in ("eager", "cuda_graph")]


def at_least(a, b) -> bool:
    """Card ``a`` has at least ``b``'s compute in every dtype (datasheet peak times the fitted efficiency) and at
    least its bandwidth, and runs the same work: no more kernels (the attention backend's) and no slower per-kernel
    floor. Floors and backends are what differ between chips (the A100's and L4's floors are estimates below the
    GH100's measured ones, and their attention backend runs no extra kernel), so a card of another chip with a
    lower floor is not 'at most as fast'; two cards of one chip share them."""
    def rate(p, d):
        return p.flops_for(d) * p.gemm_efficiency.get(d, p.flops_efficiency)
    return (all(rate(a, d) >= rate(b, d) for d in DTYPES) and a.mem_bandwidth >= b.mem_bandwidth
            and a.bandwidth_efficiency >= b.bandwidth_efficiency
            and a.min_kernel_s <= b.min_kernel_s and a.min_kernel_for("cuda_graph") <= b.min_kernel_for("cuda_graph")
            and a.attention_extra_kernels <= b.attention_extra_kernels)


def test_the_h100_and_h200_share_the_gh100_fit():
    h100, h200 = load_profile("h100-sxm-estimate"), load_profile("h200-sxm-estimate")
    assert h100.chip == h200.chip == "gh100"
    for key in CHIP_FIELDS:
        assert getattr(h100, key) == getattr(h200, key), key
        assert h100.sources[key] == h200.sources[key], key
    # what the datasheets give per card
    assert h100.mem_bandwidth < h200.mem_bandwidth and h100.mem_bytes < h200.mem_bytes
    assert h100.peak_flops == h200.peak_flops  # the same GH100 at the same boost clock


def test_a_card_file_never_overrides_its_chips_fit():
    for path in sorted(DEVICE_PROFILES.glob("*.json")):
        raw = json.loads(path.read_text())
        if raw.get("chip"):
            assert not set(CHIP_FIELDS) & set(raw), (path.name, sorted(set(CHIP_FIELDS) & set(raw)))


def test_no_card_is_predicted_faster_than_one_with_at_least_its_compute_and_bandwidth():
    """Finding 2: the H100 profile predicted 0.64-0.76x the H200's time in graph mode."""
    minilm = embedded_model_profile()
    profiles = [load_profile(n) for n in shipped_profiles()]
    work = committed_work()
    checked, pairs = 0, set()
    for slow, fast in itertools.permutations(profiles, 2):
        if not at_least(fast, slow):
            continue
        for batch, length, dtype, mode in work:
            f = predict(minilm, fast, batch, length, dtype, mode, host_dispatch_s=8e-6)
            s = predict(minilm, slow, batch, length, dtype, mode, host_dispatch_s=8e-6)
            assert f.call_s <= s.call_s * (1 + 1e-9), (fast.name, slow.name, batch, length, dtype, mode,
                                                        f.call_s, s.call_s)
            checked += 1
        pairs.add((fast.name, slow.name))
    assert ("h200-sxm-estimate", "h100-sxm-estimate") in pairs, pairs  # one chip, more bandwidth: never slower
    assert checked >= len(work)


def test_tf32_on_hopper_is_the_bf16_fit_at_the_datasheet_ratio():
    """Finding 3: TF32 kept 0.55 of its peak while bf16 was fitted at 0.307."""
    h200 = load_profile("h200-sxm-estimate")
    assert h200.gemm_efficiency["tf32"] == h200.gemm_efficiency["bf16"]
    assert "tf32" in h200.sources["gemm_efficiency"] and "datasheet" in h200.sources["gemm_efficiency"]
    minilm = embedded_model_profile()
    bf16 = predict(minilm, h200, 128, 256, "bf16", "cuda_graph", host_dispatch_s=8e-6).call_s
    tf32 = predict(minilm, h200, 128, 256, "tf32", "cuda_graph", host_dispatch_s=8e-6).call_s
    assert tf32 / bf16 >= 1.8  # half the tensor-core rate, twice the bytes


def test_calibrate_without_tf32_sweeps_derives_tf32_from_bf16_and_says_so():
    """Finding 3: a calibrated profile without TF32 sweeps silently took fp32's rate for TF32."""
    from tuning.sim.calibrate import Point, calibrate

    minilm = embedded_model_profile()
    truth = load_profile("h200-sxm-estimate")
    points = [Point(b, t, "bf16", "cuda_graph",
                    predict(minilm, truth, b, t, "bf16", "cuda_graph", host_dispatch_s=8e-6).call_s * 1e3)
              for b, t in ((1, 64), (8, 64), (32, 128), (64, 128), (16, 256), (64, 256))]
    profile, _ = calibrate(points, minilm, "cuda", "fit", device_name="NVIDIA H200", host_dispatch_s=8e-6,
                           host_dispatch_kind="model")
    ratio = truth.flops_for("tf32") / truth.flops_for("bf16")
    assert profile.peak_flops["tf32"] == pytest.approx(profile.peak_flops["bf16"] * ratio)
    assert "tf32: bf16's fitted rate x the datasheet's TF32/bf16 ratio" in profile.sources["peak_flops"]


def test_a_profile_without_a_tf32_rate_says_where_its_tf32_comes_from():
    from tuning.sim.profiles import DeviceProfile

    gpu = load_profile("l4-estimate").as_dict()
    gpu["peak_flops"] = {k: v for k, v in gpu["peak_flops"].items() if k != "tf32"}
    with pytest.raises(ValueError, match="tf32"):
        DeviceProfile(**gpu).flops_for("tf32")
    cpu = DeviceProfile(**{**gpu, "synchronous": True})  # a CPU has no TF32 units: torch runs fp32
    assert cpu.flops_for("tf32") == cpu.peak_flops["fp32"]
