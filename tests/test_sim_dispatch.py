"""The host's part of a launch (issue 25, deliver 2): this host's dispatch per op + the profile's driver constant,
and a stand-in host part that lets other Python threads run the way torch's bindings do."""

from __future__ import annotations

import json
import time

import pytest
import torch

from tests.sim_units import unit_device
from tuning.sim import ModelProfile, SimulatedDevice, SimulatedModel, embedded_model_profile, load_profile, predict
from tuning.sim.calibrate import Point, calibrate, read_sweeps
from tuning.sim.dispatch import HostPart, host_dispatch_s


def _launches(n: int, flops: float = 0.0) -> ModelProfile:
    """``n`` launching operators of ``flops`` each and no bytes (zero device time at flops=0 and min_kernel_s=0)."""
    return ModelProfile(name=f"{n}ops", ops=["k"] * n, launches=[True] * n, flops=[[flops, 0, 0, 0]] * n,
                        float_bytes=[[0, 0, 0, 0]] * n, other_bytes=[[0, 0, 0, 0]] * n, param_bytes_fp32=0,
                        output_dim=3)


def test_a_slower_host_dispatch_predicts_more_host_time():
    model, dev = embedded_model_profile(), load_profile("h200-sxm-estimate")
    fast = predict(model, dev, 1, 16, "bf16", "eager", host_dispatch_s=1e-6)
    slow = predict(model, dev, 1, 16, "bf16", "eager", host_dispatch_s=8e-6)
    assert slow.host_s > fast.host_s and slow.call_s > fast.call_s
    assert slow.host_s - fast.host_s == pytest.approx(fast.launches * 7e-6)
    assert slow.device_s == fast.device_s  # the host's speed is not the device's
    graph_fast = predict(model, dev, 1, 16, "bf16", "cuda_graph", host_dispatch_s=1e-6)
    graph_slow = predict(model, dev, 1, 16, "bf16", "cuda_graph", host_dispatch_s=8e-6)
    assert graph_slow.host_s - graph_fast.host_s == pytest.approx(graph_fast.launches * 7e-6)


def test_host_time_is_launches_times_dispatch_plus_the_driver_constant():
    dev = unit_device(launch_s=10e-6, graph_replay_s=5e-6, min_kernel_s=1e-6)
    model = _launches(4)
    eager = predict(model, dev, 1, 1, "fp32", "eager", host_dispatch_s=3e-6)
    assert eager.launches == 4 and eager.host_s == pytest.approx(4 * (3e-6 + 10e-6))
    assert eager.dispatch_s == pytest.approx(4 * 3e-6) and eager.driver_s == pytest.approx(4 * 10e-6)
    # the async call: kernels (1 us on the floor) launched every 13 us, the last ends 1 us after its launch
    assert eager.call_s == pytest.approx(4 * 13e-6 + 1e-6)
    graph = predict(model, dev, 1, 1, "fp32", "cuda_graph", host_dispatch_s=3e-6)
    # one replay (dispatch + 5 us) and the runner's 3 copies (2 inputs, 1 output clone), each dispatch + 10 us
    assert graph.launches == 4 and graph.host_s == pytest.approx((3e-6 + 5e-6) + 3 * (3e-6 + 10e-6))
    assert graph.dispatch_s == pytest.approx(4 * 3e-6)
    compiled_graph = predict(model, dev, 1, 1, "fp32", "compile_graph", host_dispatch_s=3e-6)
    assert compiled_graph.host_s == pytest.approx(3e-6 + 5e-6)


def test_the_default_is_this_hosts_dispatch_measured_once():
    first = host_dispatch_s()
    assert 0 < first < 1e-3 and host_dispatch_s() == first  # cached: a busy machine later does not re-measure
    model, dev = _launches(3), unit_device()
    assert predict(model, dev, 1, 1).host_s == pytest.approx(3 * (first + dev.launch_s))
    assert predict(model, dev, 1, 1).dispatch_s == pytest.approx(3 * first)


def _old_profile_json(tmp_path):
    """The H200 profile as a format-1 file without the dispatch split: no ``format_version``, no
    ``host_dispatch_separate`` key, whole host costs of 10 us per launch and 15 us per replay."""
    raw = load_profile("h200-sxm-estimate").as_dict()
    raw.pop("format_version")
    raw.pop("host_dispatch_separate")
    raw["sources"].pop("host_dispatch_separate")
    raw.update(launch_s=10e-6, graph_replay_s=15e-6)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    return path


def test_old_profile_json_loads_with_its_whole_host_costs(tmp_path):
    """A format-1 profile without a ``host_dispatch_separate`` key: its launch_s (10 us) is the whole host cost per
    launch, so no dispatch is added on top."""
    old = load_profile(str(_old_profile_json(tmp_path)))
    assert old.host_dispatch_separate is False
    model = embedded_model_profile()
    cost = predict(model, old, 1, 16, "bf16", "eager", host_dispatch_s=5e-6)
    assert cost.host_s == pytest.approx(cost.launches * 10e-6) and cost.dispatch_s == 0.0
    assert predict(model, old, 1, 16, "bf16", "cuda_graph").host_s == pytest.approx(15e-6 + 3 * 10e-6)
    assert load_profile("h200-sxm-estimate").host_dispatch_separate is True


def _points(truth, dispatch: float) -> list[Point]:
    model = embedded_model_profile()
    return [Point(b, t, d, g, predict(model, truth, b, t, d, g, host_dispatch_s=dispatch).call_s * 1000)
            for b in (1, 4, 16, 64) for t in (32, 128, 256) for d in ("fp32", "bf16") for g in ("eager", "cuda_graph")]


def test_calibration_keeps_the_driver_part_and_records_the_hosts_dispatch(tmp_path):
    """Sweeps on a host whose dispatch is 4 us per op: the fit sees 4 + 7 us per launch, the profile keeps 7."""
    truth = unit_device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                        min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    fitted, worst = calibrate(_points(truth, 4e-6), embedded_model_profile(), "cuda", "fit", host_dispatch_s=4e-6)
    assert worst < 1e-3
    assert fitted.launch_s == pytest.approx(7e-6, rel=0.03)
    assert fitted.graph_replay_s == pytest.approx(20e-6, rel=0.1)
    assert fitted.host_dispatch_separate and "4.000 us" in fitted.sources["host_dispatch_s"]
    # a dispatch larger than the fitted launch: clamped at zero, not negative
    clamped, _ = calibrate(_points(truth, 4e-6), embedded_model_profile(), "cuda", "fit", host_dispatch_s=50e-6)
    assert clamped.launch_s == 0.0 and clamped.graph_replay_s == 0.0
    # the sweeping host's dispatch recorded in the sweep files is the one subtracted
    sweep = {"length": 32, "device": "cpu", "dtype": "fp32", "graph": "eager", "host_dispatch_s": 4e-6,
             "points": [{"batch_size": b, "status": "ok", "per_batch_ms": 1.0 + b} for b in (1, 2, 4, 8)]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    from tuning.sim import calibrate as calibration

    read_sweeps([path])
    assert calibration.LAST_HOST_DISPATCH == 4e-6


def test_an_eager_only_calibration_over_an_old_base_does_not_count_a_dispatch_twice_per_replay(tmp_path):
    """No graph points: graph_replay_s is kept from the base. A format-1 base without the split holds a whole host
    cost (15 us, its host's dispatch included) while the new profile adds this host's dispatch per replay: kept
    as it was, one replay would be charged 15 us + a dispatch. It keeps 15 us less the calibrating dispatch."""
    truth = unit_device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                        min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    eager = [p for p in _points(truth, 4e-6) if p.graph == "eager"]
    old = _old_profile_json(tmp_path)
    fitted, _ = calibrate(eager, embedded_model_profile(), "cuda", "fit", base=str(old), host_dispatch_s=4e-6)
    assert fitted.host_dispatch_separate
    assert fitted.graph_replay_s == pytest.approx(11e-6)
    assert "whole host cost" in fitted.sources["graph_replay_s"]
    new, _ = calibrate(eager, embedded_model_profile(), "cuda", "fit", base="h200-sxm-estimate", host_dispatch_s=4e-6)
    assert new.graph_replay_s == load_profile("h200-sxm-estimate").graph_replay_s  # a split base: kept as it is


def test_the_host_part_costs_what_the_model_charges_and_runs_real_ops(monkeypatch):
    dispatch = host_dispatch_s()
    part = HostPart(40, 40 * 5e-6)
    part.run()
    tries = []
    for _ in range(5):
        t0 = time.thread_time()
        part.run()
        tries.append(time.thread_time() - t0)
    # this thread's CPU: 40 dispatches + 200 us, within the noise of a shared 2-core VM
    assert 0.7 * part.target_s() <= min(tries) <= 1.6 * part.target_s()
    assert part.target_s() == pytest.approx(40 * dispatch + 200e-6)
    calls = []
    real_add = torch.add
    monkeypatch.setattr(torch, "add", lambda *a, **k: calls.append(1) or real_add(*a, **k))
    for k in part.counts():
        calls.clear()
        part._run(k)
        assert len(calls) == k  # one real tiny op before each GIL-free segment; the other launches' dispatch held
    per_launch = HostPart(40, 40 * 5e-6, segment_s=0.0, real_ops="launch")  # as before SEGMENT_S
    per_launch.run()
    calls.clear()
    per_launch.run()
    assert len(calls) == 40  # one real tiny op per launch


class _CountingHash:
    """Stands in for hashlib's sha256 objects: records each update's size (over GIL_FREE_BYTES: GIL-free)."""

    def __init__(self, sizes: list[int]):
        self.sizes = sizes

    def sha256(self) -> "_CountingHash":
        return self

    def update(self, data) -> None:
        self.sizes.append(len(data))


def _releases_per_call(monkeypatch, part: HostPart, calls: int) -> list[int]:
    """GIL-free updates (more than GIL_FREE_BYTES) in each of ``calls`` runs of ``part`` (tuned first)."""
    from tuning.sim import dispatch

    part.run()  # tunes with the real hashlib
    sizes: list[int] = []
    monkeypatch.setattr(dispatch, "hashlib", _CountingHash(sizes))
    per_call = []
    for _ in range(calls):
        sizes.clear()
        part.run()
        per_call.append(sum(n > dispatch.GIL_FREE_BYTES for n in sizes))
    monkeypatch.undo()
    return per_call


def test_the_host_part_releases_the_gil_once_per_segment_of_host_time(monkeypatch):
    """Beside a busy Python thread every GIL-free segment hands it the GIL and costs the call up to the 5 ms switch
    interval to get it back: the part releases it about once per SEGMENT_S of host time (calibrated on the real
    eager forward's hand-offs), not after every launch (100 a call: 0.27 ms calls stretched 2,000x)."""
    from tuning.sim.dispatch import SEGMENT_S, min_released_s
    from tuning.sim.standin import host_part

    assert 0.5e-3 <= SEGMENT_S <= 10e-3
    # an eager 1x16 call on a fast host (1 us a launch beside a 2.65 us driver part): a host part far shorter than
    # a segment releases once every few calls
    device = SimulatedDevice(load_profile("h200-sxm-estimate").replace(launch_s=2.65e-6), embedded_model_profile(),
                             host_dispatch_s=1e-6)
    short = host_part(device.cost(1, 16, "bf16", "eager"))
    assert short.target_s() < SEGMENT_S and short.segments_per_call == pytest.approx(short.target_s() / SEGMENT_S)
    releases = _releases_per_call(monkeypatch, short, 60)
    assert max(releases) == 1 and abs(sum(releases) - 60 * short.segments_per_call) <= 1
    # a host part of 5.3 segments: 5 or 6 a call, 53 in 10 calls
    long_ = HostPart(75, 5.3 * 1e-3 - 75 * host_dispatch_s(), segment_s=1e-3)
    assert long_.segments_per_call == pytest.approx(5.3)
    releases = _releases_per_call(monkeypatch, long_, 10)
    assert set(releases) <= {5, 6} and sum(releases) == 53
    # no segment shorter than the shortest GIL-free burn
    tiny = HostPart(4, 3.5 * min_released_s(), segment_s=1e-9)
    assert tiny.segments_per_call == 3
    assert _releases_per_call(monkeypatch, tiny, 3) == [3, 3, 3]


def test_graph_runners_refuse_in_one_wording_and_captured_shapes_are_a_set():
    from tuning.base.refusals import batch_too_large, uncaptured_shape

    device = SimulatedDevice(unit_device(mem_bytes=1e12), _launches(2), host_dispatch_s=0.0)
    graph = SimulatedModel(device, "fp32", "cuda_graph", captured_batches=(4,))
    ids = torch.ones((4, 8), dtype=torch.long)
    graph(ids, ids)
    assert graph.graphs == {(4, 8)}
    graph.seal()
    with pytest.raises(ValueError) as late:
        graph(torch.ones((4, 16), dtype=torch.long), torch.ones((4, 16), dtype=torch.long))
    assert str(late.value) == uncaptured_shape((4, 16), {(4, 8)})
    with pytest.raises(ValueError) as big:
        graph.shape_cost_batch(5)
    assert str(big.value) == batch_too_large(5, (4,))


def test_segment_s_is_the_committed_bench_calibration():
    """SEGMENT_S comes from bench/standin_gil.py's real forward (its wall alone / its hand-offs beside a busy thread):
    the committed result ran with it and derives a segment within the run-to-run spread of this shared VM."""
    from pathlib import Path

    from tuning.sim.dispatch import SEGMENT_S

    data = json.loads((Path(__file__).resolve().parents[1] / "bench" / "results" / "standin_gil.json").read_text())
    assert data["segment_s_used"] == SEGMENT_S
    derived = data["derived_segment_ms"] / 1e3
    assert derived / 1.6 <= SEGMENT_S <= derived * 1.6, (SEGMENT_S, derived)
