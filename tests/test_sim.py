"""The simulated accelerator: cost formula, calibration, stand-in timing, labels, the starved baseline."""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest
import torch

from tests.sim_units import unit_device
from tuning import preset
from tuning.sim import (
    DeviceChoice,
    ModelProfile,
    SimulatedDevice,
    SimulatedModel,
    device_for,
    embedded_model_profile,
    load_profile,
    predict,
    shipped_profiles,
)
from tuning.sim.calibrate import Point, calibrate, prediction_error, read_sweeps
from tuning.sim.costmodel import fused_groups, measure_model_profile
from tuning.sim.profiles import DeviceProfile


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from tuning.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


_device = unit_device


def _two_op_model() -> ModelProfile:
    """op 0: a matmul of 1e9 FLOPs per B*T and 1e3 bytes; op 1: a view; op 2: a norm moving 1e4 bytes per B*T."""
    zero = [0.0, 0.0, 0.0, 0.0]
    return ModelProfile(name="toy", ops=["aten.mm", "aten.view", "aten.layer_norm"], launches=[True, False, True],
                        flops=[[0, 0, 1e9, 0], zero, zero], float_bytes=[[1e3, 0, 0, 0], zero, [0, 0, 1e4, 0]],
                        other_bytes=[zero, zero, zero], param_bytes_fp32=4e3, output_dim=4)


def test_cost_formula_by_hand():
    model, dev = _two_op_model(), _device()
    c = predict(model, dev, batch=2, length=5, dtype="fp32", graph="eager", host_dispatch_s=0.0)
    # B*T = 10: mm 1e10 FLOP / 1e12 = 10 ms (bytes 1e3/1e9 = 1 us); norm 1e5 B / 1e9 = 100 us; each kernel pays
    # the 1 us floor on top of its work
    floor = 1e-6
    assert c.kernels == 2 and c.launches == 2
    assert c.device_s == pytest.approx(0.010 + 0.0001 + 2 * floor)
    assert c.host_s == pytest.approx(20e-6)
    # async: mm launched at 10 us runs to 10.011 ms; norm launched at 20 us waits for it, then 101 us
    assert c.call_s == pytest.approx(10e-6 + 0.010 + 0.0001 + 2 * floor)
    bf16 = predict(model, dev, 2, 5, "bf16", "eager", host_dispatch_s=0.0)
    assert bf16.device_s == pytest.approx(0.005 + 0.00005 + 2 * floor)  # twice the FLOP/s, half the bytes
    graph = predict(model, dev, 2, 5, "fp32", "cuda_graph", host_dispatch_s=0.0)
    # the runner's 2 input copies (launched at 10 and 20 us, the floor plus 160 B at 1 GB/s each), the replay at
    # 25 us, the output clone (64 B) launched at 35 us after the graph's 10.102 ms
    assert graph.host_s == pytest.approx(5e-6 + 3 * 10e-6)
    assert graph.call_s == pytest.approx(25e-6 + 0.0101 + 2 * floor + floor + 64 / 1e9)
    sync = predict(model, _device(synchronous=True), 2, 5, "fp32", "eager", host_dispatch_s=0.0)
    assert sync.call_s == pytest.approx(20e-6 + 0.0101 + 2 * floor)


def test_launch_bound_call_is_host_time_and_minimum_kernel_applies():
    model, dev = _two_op_model(), _device(launch_s=1e-3, min_kernel_s=50e-6)
    c = predict(model, dev, batch=1, length=1, dtype="fp32", graph="eager", host_dispatch_s=0.0)
    # kernels, each its 50 us floor on top of its work: mm 1e9/1e12 = 1 ms, norm 1e4/1e9 = 10 us; launches at 1 ms
    # and 2 ms: mm ends at 2.05 ms, the norm then runs 60 us
    assert c.device_s == pytest.approx(1e-3 + 10e-6 + 2 * 50e-6)
    assert c.call_s == pytest.approx(2e-3 + 50e-6 + 10e-6 + 50e-6)
    assert c.device_share == pytest.approx((1.11e-3) / (2.11e-3))


def test_compile_fuses_runs_without_flops():
    model = ModelProfile(name="fuse", ops=["mm", "add", "gelu", "mm", "norm"], launches=[True] * 5,
                         flops=[[0, 0, 1, 0], [0] * 4, [0] * 4, [0, 0, 1, 0], [0] * 4],
                         float_bytes=[[1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0], [1, 0, 0, 0], [5, 0, 0, 0]],
                         other_bytes=[[0] * 4] * 5, param_bytes_fp32=0, output_dim=1)
    flops, nbytes, _ = model.per_op(1, 1)
    f, b = fused_groups(model, flops, nbytes)
    assert list(f) == [1, 0, 1, 0] and list(b) == [1, 3, 1, 5]
    assert predict(model, _device(), 1, 1, graph="compile").launches == 4


def test_measured_model_profile_matches_flop_counter_and_fits_exactly():
    from torch.utils.flop_counter import FlopCounterMode

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, ids, mask):
            h = self.lin(self.emb(ids)) * mask.unsqueeze(-1)
            return torch.nn.functional.normalize(h.sum(1), dim=-1)

    model = Tiny()
    profile = measure_model_profile(model, "tiny", grid=((1, 4), (2, 4), (1, 6), (3, 6), (1, 10), (2, 10), (2, 8)))
    ids = torch.full((5, 7), 3)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(ids, torch.ones_like(ids))
    assert profile.totals(5, 7)["flops"] == pytest.approx(counter.get_total_flops(), rel=1e-6)
    assert profile.fit_error < 1e-3
    assert profile.output_dim == 8 and 0 < profile.kernels < len(profile.ops)  # views launch nothing


def test_shipped_minilm_profile_agrees_with_a_fresh_measurement():
    from tuning.runtime.model import random_minilm

    shipped = embedded_model_profile()
    fresh = measure_model_profile(random_minilm(), "fresh",
                                  grid=((1, 8), (2, 8), (1, 16), (2, 16), (1, 12), (3, 12), (2, 4)))
    assert shipped.kernels == fresh.kernels == 75  # 74 before the mask cast counted as a launch
    for b, t in ((1, 32), (16, 128)):
        assert shipped.totals(b, t)["flops"] == pytest.approx(fresh.totals(b, t)["flops"], rel=1e-3)


def test_shipped_profiles_load_with_sources_and_estimate_names():
    names = shipped_profiles()
    assert {"h100-sxm-estimate", "h200-sxm-estimate", "l4-estimate"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.kind == "estimate" and "estimate" in p.name and "estimate" in p.label()
        assert {"peak_flops", "mem_bandwidth", "launch_s"} <= set(p.sources)
    h200 = load_profile("h200-sxm-estimate")
    assert h200.peak_flops["bf16"] == 989e12 and h200.mem_bandwidth == 4.8e12
    assert load_profile("h100-sxm-estimate").mem_bandwidth == 3.35e12


def test_bad_profile_names_the_value_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="sim_profile='nope'.*h200-sxm-estimate"):
        load_profile("nope")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**load_profile().as_dict(), "flops_efficiency": 1.5}))
    with pytest.raises(ValueError, match="flops_efficiency=1.5"):
        load_profile(str(bad))
    with pytest.raises(ValueError, match="sim_profile='nope'"):
        preset("baseline", device="sim", sim_profile="nope").resolve(False)


def _synthetic_points(truth: DeviceProfile, graphs=("eager", "cuda_graph"), sizes=(1, 4, 16, 64), lengths=(32, 128, 256)):
    model = embedded_model_profile()
    return [Point(b, t, d, g, predict(model, truth, b, t, d, g).call_s * 1000)
            for b in sizes for t in lengths for d in ("fp32", "bf16") for g in graphs]


@pytest.fixture
def pinned_dispatch(monkeypatch):
    """The host dispatch a synthetic calibration assumes, pinned: the one this process measures depends on how
    loaded the machine is (a loaded suite failed the fit). The fit across dispatches has a test of its own."""
    import tuning.sim.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_DISPATCH_S", 5e-6)


def test_calibration_recovers_known_parameters(pinned_dispatch):
    truth = _device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                    min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    fitted, worst = calibrate(_synthetic_points(truth), embedded_model_profile(), "cuda", "fit")
    assert worst < 1e-3
    assert fitted.kind == "measured" and not fitted.synchronous
    assert fitted.peak_flops["fp32"] == pytest.approx(20e12, rel=0.02)
    assert fitted.mem_bandwidth == pytest.approx(250e9, rel=0.02)
    assert fitted.launch_s == pytest.approx(7e-6, rel=0.02)
    assert fitted.min_kernel_s == pytest.approx(3e-6, rel=0.05)
    assert fitted.graph_replay_s == pytest.approx(20e-6, rel=0.1)
    held_out = _synthetic_points(truth, sizes=(8, 32), lengths=(96,))
    assert prediction_error(embedded_model_profile(), fitted, held_out) < 0.01


@pytest.mark.parametrize("dispatch_s", [2.5e-6, 5e-6, 2e-5])
def test_calibration_recovers_known_parameters_whatever_the_hosts_dispatch(monkeypatch, pinned_dispatch, dispatch_s):
    """The clean-clone CI run read a worst error of 1.7% (limit 0.1%): the host dispatch the suite measured there
    put the replay behind the copies, and the fit slid to no replay at all (2.5-20 us: replay 0, worst 1.7-2.4%)."""
    import tuning.sim.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_DISPATCH_S", dispatch_s)
    truth = _device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                    min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    fitted, worst = calibrate(_synthetic_points(truth), embedded_model_profile(), "cuda", "fit")
    assert worst < 1e-3
    assert fitted.graph_replay_s == pytest.approx(20e-6, rel=0.1)
    assert fitted.min_kernel_s == pytest.approx(3e-6, rel=0.05)


def test_eager_only_sweeps_on_a_gpu_mark_what_they_cannot_identify(pinned_dispatch):
    """Eager points on an asynchronous device hide device time behind launches: the fit may match them and still
    be wrong about bandwidth, minimum kernel time and replay cost; it must say so instead of passing them off."""
    from tuning.sim.calibrate import unidentified

    truth = _device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                    min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    fitted, _ = calibrate(_synthetic_points(truth, graphs=("eager",)), embedded_model_profile(), "cuda", "eager-only")
    # the FLOP rate too: behind the launches the points cannot tell it (its bootstrap interval is wide)
    assert set(unidentified(fitted)) == {"mem_bandwidth", "min_kernel_s", "graph_replay_s", "peak_flops"}
    with_graphs, _ = calibrate(_synthetic_points(truth), embedded_model_profile(), "cuda", "both", memory_bytes=24e9)
    assert unidentified(with_graphs) == [] and with_graphs.mem_bytes == 24e9


def test_calibration_tolerates_measurement_noise(pinned_dispatch):
    rng = np.random.default_rng(1)
    truth = _device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                    min_kernel_s=3e-6, graph_replay_s=20e-6)
    noisy = [Point(p.batch, p.length, p.dtype, p.graph, p.ms * (1 + rng.normal(0, 0.03)))
             for p in _synthetic_points(truth)]
    fitted, worst = calibrate(noisy, embedded_model_profile(), "cuda", "noisy")
    clean = _synthetic_points(truth, sizes=(8, 32), lengths=(96,))
    assert worst < 0.15 and prediction_error(embedded_model_profile(), fitted, clean) < 0.08


def test_attention_flops_are_counted():
    """FlopCounterMode has no formula for the CPU flash-attention kernel: the profile adds 4*B*H*T*S*D itself."""
    profile = embedded_model_profile()
    flops, _, _ = profile.per_op(8, 256)
    sdpa = [f for op, f in zip(profile.ops, flops) if "scaled_dot_product_attention" in op]
    assert len(sdpa) == 6 and sdpa[0] == pytest.approx(4 * 8 * 12 * 256 * 256 * 32, rel=1e-3)
    from tuning.sim.costmodel import FEATURES

    assert any(abs(c[FEATURES.index("B*T^2")]) > 0 for c in profile.flops)  # a B*T^2 term exists


def test_calibration_from_sweep_files_and_the_cli(tmp_path):
    truth = _device(synchronous=True, peak_flops={"fp32": 50e9, "bf16": 80e9, "fp16": 80e9}, mem_bandwidth=10e9)
    model = embedded_model_profile()
    paths = []
    for length in (16, 64):
        points = [{"batch_size": b, "length": length, "status": "ok",
                   "per_batch_ms": predict(model, truth, b, length).call_s * 1000} for b in (1, 2, 4, 8)]
        points.append({"batch_size": 64, "length": length, "status": "oom", "per_batch_ms": None})
        path = tmp_path / f"sweep{length}.json"
        path.write_text(json.dumps({"length": length, "device": "cpu", "dtype": "fp32", "graph": "eager", "points": points}))
        paths.append(path)
    points, kind = read_sweeps(paths)
    assert len(points) == 8 and kind == "cpu"
    out = tmp_path / "mine.json"
    code, stdout, _ = run_cli(["calibrate", "--from", str(paths[0]), "--from", str(paths[1]), "-o", str(out), "--json"])
    assert code == 0, stdout
    summary = json.loads(stdout)
    assert summary["worst_fit_error"] < 0.02 and summary["fitted"]["synchronous"] is True
    mine = load_profile(str(out))
    assert mine.kind == "measured" and mine.name == "mine"
    code, _, err = run_cli(["calibrate", "--from", str(tmp_path / "missing.json"), "-o", str(out)])
    assert code == 2 and "missing.json" in err


def _timed_device(host_s: float, device_s: float) -> SimulatedDevice:
    """A device and model where one call costs exactly ``host_s`` of launches and ``device_s`` of compute."""
    model = ModelProfile(name="one", ops=["k"], launches=[True], flops=[[device_s * 1e12, 0, 0, 0]],
                         float_bytes=[[0, 0, 0, 0]], other_bytes=[[0, 0, 0, 0]], param_bytes_fp32=0, output_dim=3)
    return SimulatedDevice(_device(launch_s=host_s, min_kernel_s=0.0, mem_bytes=1e12), model, host_dispatch_s=0.0)


def test_stand_in_takes_the_predicted_time():
    device = _timed_device(host_s=0.002, device_s=0.008)
    model = SimulatedModel(device, "fp32", "eager")
    ids = torch.ones((2, 5), dtype=torch.long)
    assert device.cost(2, 5, "fp32", "eager").call_s == pytest.approx(0.010)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        out = model(ids, ids)
        times.append(time.perf_counter() - t0)
    assert float(np.median(times)) == pytest.approx(0.010, abs=0.002)
    assert out.shape == (2, 3) and np.allclose(np.linalg.norm(out.numpy(), axis=1), 1.0, atol=1e-5)
    totals = device.timeline.totals(0.0, time.perf_counter() + 1)
    assert totals.calls == pytest.approx(7) and totals.busy == pytest.approx(7 * 0.008)
    assert totals.launch_share == pytest.approx(0.2)  # 2 ms of launches in each predicted 10 ms call


def test_stand_in_host_part_occupies_its_thread_and_device_part_frees_it():
    device = _timed_device(host_s=0.030, device_s=0.090)
    model = SimulatedModel(device, "fp32", "eager")
    ids = torch.ones((1, 1), dtype=torch.long)
    # relative to a plain 30 ms spin measured just before, so a loaded machine shifts both alike
    cpu0 = time.thread_time()
    device.wait(0.030, spin=True)
    reference = time.thread_time() - cpu0
    cpu0 = time.thread_time()
    model(ids, ids)
    cpu = time.thread_time() - cpu0
    # the 30 ms host part is CPU work (counted in thread CPU time, so preemption stretches it instead of
    # shortening it); the 90 ms device part is not: spinning it would read ~4x
    assert 0.030 <= cpu <= 0.030 + 0.5 * reference, f"call {cpu * 1000:.1f} ms CPU, 30 ms spin {reference * 1000:.1f} ms"

    # short device waits (the H200's batch-1 regime, 0.3 ms) sleep too: after a late wake-up is learnt, the
    # thread must still not spin through them
    short = _timed_device(host_s=0.0, device_s=0.0003)
    short._overshoot = 2e-3  # as if learnt during a burst of load
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(50):
        SimulatedModel(short, "fp32", "eager")(ids, ids)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert cpu < 0.6 * wall, f"{cpu / wall:.0%} of the wall time spent on the CPU for pure device time"
    assert short._overshoot < 1e-3  # it kept learning: the estimate came back down


def test_stand_in_device_part_is_slept_not_spun(monkeypatch):
    """The device part goes to ``time.sleep``, which releases the GIL, so another Python thread runs meanwhile
    (how much it gets beside a call is measured in real time by bench/standin_gil.py); at most the learnt
    lateness of a wake-up is left to spin."""
    from tuning.sim import standin

    slept, asked = [], []
    real_sleep, caller = time.sleep, threading.get_ident()
    # time.sleep is one function for the whole process: count this thread's sleeps only
    monkeypatch.setattr(standin.time, "sleep",
                        lambda s: (slept.append(s) if threading.get_ident() == caller else None) or real_sleep(s))
    ids = torch.ones((1, 1), dtype=torch.long)
    device = _timed_device(host_s=0.0, device_s=0.1)
    device_sleep = device.sleep
    monkeypatch.setattr(device, "sleep", lambda s: asked.append(s) or device_sleep(s))
    SimulatedModel(device, "fp32", "eager")(ids, ids)
    # what is left of the call after its host part, given to time.sleep but for the learnt lateness (at most 2 ms)
    assert asked and sum(asked) > 0.05, asked
    assert sum(slept) >= sum(asked) - 2e-3 - standin.SPIN_TAIL_S, (slept, asked)


def test_stand_in_out_of_memory_is_reported_like_the_real_path():
    from tuning.runtime.engine import is_out_of_memory

    tiny = SimulatedDevice(_device(mem_bytes=1e9), _two_op_model())  # the CUDA context alone takes 0.5 GB
    small = torch.ones((4, 4), dtype=torch.long)
    SimulatedModel(tiny, "fp32", "eager")(small, small)  # fits
    big = torch.ones((4, 10**5), dtype=torch.long)  # the norm moves 1e4 B per token: 4 GB
    with pytest.raises(torch.OutOfMemoryError, match="simulated unit") as info:
        SimulatedModel(tiny, "fp32", "eager")(big, big)
    assert is_out_of_memory(info.value)


def test_graph_modes_cost_the_captured_batch():
    device = SimulatedDevice(load_profile(), embedded_model_profile())
    graph = SimulatedModel(device, "bf16", "cuda_graph", captured_batches=(8, 16))
    assert graph.shape_cost_batch(3) == 8 and graph.shape_cost_batch(9) == 16
    assert SimulatedModel(device, "bf16", "eager", captured_batches=(8,)).shape_cost_batch(3) == 3


def test_device_for_auto_is_cuda_else_the_cpu_and_sim_is_said():
    choice = device_for("auto")  # one meaning of auto everywhere: the device knob's and the CLI's
    assert isinstance(choice, DeviceChoice)
    assert choice.knob == ("cuda" if torch.cuda.is_available() else "cpu") and not choice.simulated
    sim = device_for("sim")
    assert sim.knob == "sim" and sim.simulated and "SIMULATED" in sim.banner
    assert "h200-sxm-estimate" in sim.label and "estimate" in sim.label
    if not torch.cuda.is_available():
        assert device_for("auto", fallback="sim").knob == "sim"
    assert device_for("cpu").knob == "cpu" and not device_for("cpu").simulated
    with pytest.raises(ValueError, match="DEVICE='gpu'"):
        device_for("gpu")


def test_sim_knobs_allow_what_the_device_can_do():
    k = preset("tuned", device="sim", dtype="fp16", graph="cuda_graph", pin_memory=True)
    assert k.resolve(False) == k  # fp16, CUDA graphs and pinned copies are the point on a simulated GPU
    with pytest.raises(ValueError, match="cuda_graph.*dynamic"):
        preset("baseline", device="sim", graph="cuda_graph")


def test_results_on_sim_are_labelled_in_json_and_tables():
    from tuning.offline.pipeline import Pipeline
    from tuning.present.tables import format_run

    result = Pipeline(preset("tuned", device="sim")).run(limit=48)
    summary = result.summary()
    assert summary["device"]["kind"] == "simulated" and summary["device"]["profile"] == "h200-sxm-estimate"
    assert "estimate" in summary["device"]["source"]
    assert 0 < summary["device_busy"] <= summary["model_busy"] <= 1
    assert result.ok == 48
    assert "SIMULATED h200-sxm-estimate" in format_run(result)
    code, stdout, _ = run_cli(["run", "--set", "device=sim", "--limit", "30"])
    assert code == 0 and "SIMULATED" in stdout
    code, stdout, _ = run_cli(["sweep", "batch", "--sizes", "1,2", "--length", "16", "--repeats", "1",
                               "--set", "device=sim", "--json"])
    sweep = json.loads(stdout)
    assert code == 0 and sweep["device_label"] == "simulated h200-sxm-estimate"
    assert sweep["device"]["kind"] == "simulated" and sweep["device"]["profile"] == "h200-sxm-estimate"


def test_real_cpu_results_say_measured():
    from tuning.offline.pipeline import Pipeline
    from tuning.runtime.model import random_minilm

    result = Pipeline(preset("tuned", device="cpu"), model=random_minilm()).run(limit=16)
    assert result.summary()["device"]["kind"] == "cpu"
    assert result.device_busy == pytest.approx(result.model_busy)


@pytest.mark.slow
def test_sim_baseline_is_starved_or_fragmented_with_the_device_mostly_idle():
    """In a fresh process, as ``python -m tuning profile`` runs it: after the file's other tests in this one (a
    clean-clone CI run of 2026-12-02, and here), the loader workers' start-up filled the window (model busy
    16-23%, no thread at 50% yet: read as blocked), while the test alone passed every time."""
    import subprocess
    import sys

    code = """
import json
from tuning import preset
from tuning.experiments.profiled import profile_pipeline
profile = profile_pipeline(preset("baseline", device="sim"), limit=2500, interval=0.1)
s = profile.summary()
print("RESULT " + json.dumps({"kind": profile.diagnosis.kind, "device_busy": profile.signals.device_busy,
                              "model_busy": profile.signals.model_busy, "gpu": s["gpu"], "diagnosis": s["diagnosis"]},
                             default=str))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    r = json.loads(line[len("RESULT "):])
    assert r["kind"] in ("starved", "fragmented"), r["diagnosis"]
    assert r["device_busy"] < 0.30
    assert r["device_busy"] < r["model_busy"]  # launch-bound: host busy, device idle
    assert r["gpu"]["available"] and r["gpu"]["devices"] == ["simulated h200-sxm-estimate"]


def test_tokenizer_files_fall_back_to_the_repository_copies(monkeypatch):
    import tuning.base.assets as model_mod

    installed = model_mod.tokenizer_files()

    def missing():
        raise ModuleNotFoundError("the embedded model is not installed")

    monkeypatch.setattr(model_mod, "embedded_model_dir", missing)
    vocab, tok = model_mod.tokenizer_files()
    assert vocab.parent.name == "assets" and vocab.read_bytes() == installed[0].read_bytes()
    assert tok.read_bytes() == installed[1].read_bytes()


def test_tf32_and_reduce_overhead_change_the_prediction_and_validate():
    device = SimulatedDevice(load_profile(), embedded_model_profile())
    ids = torch.ones((32, 128), dtype=torch.long)
    fp32 = SimulatedModel(device, "fp32", "eager")
    tf32 = SimulatedModel(device, "fp32", "eager", tf32=True)
    assert tf32.dtype == "tf32"
    assert device.cost(32, 128, "tf32", "eager").device_s < device.cost(32, 128, "fp32", "eager").device_s
    default = device.cost(32, 128, "bf16", "compile")
    overhead = SimulatedModel(device, "bf16", "compile", compile_mode="reduce-overhead")
    assert overhead.graph == "compile_graph"
    graphed = device.cost(32, 128, "bf16", "compile_graph")
    assert graphed.launches == 1 and default.kernels == graphed.kernels and graphed.call_s < default.call_s
    fp32(ids, ids), tf32(ids, ids)
    with pytest.raises(ValueError, match="compile_mode='reduce-overhead' only applies with graph='compile'"):
        preset("tuned", compile_mode="reduce-overhead")
    with pytest.raises(ValueError, match="needs CUDA"):
        preset("tuned", graph="compile", compile_mode="reduce-overhead", device="cpu").resolve(False)
    with pytest.warns(UserWarning, match="tf32=True has no effect without CUDA"):
        assert preset("tuned", tf32=True, device="cpu").resolve(False).tf32 is False
    assert preset("tuned", tf32=True, device="sim").resolve(False).tf32 is True


@pytest.mark.slow
def test_gpu_check_fits_a_profile_and_measures_fidelity(tmp_path, monkeypatch):
    """gpu_check's simulated-accelerator steps on a CPU: a profile from the timed points, then sim vs real on a
    shipped profile (never the one fitted on this run, which would judge the run by itself; a CPU has no shipped
    profile, so the test names one, as a card with a profile would find its own)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.fidelity_profile("a CPU") is None  # no shipped profile of this device: the step is skipped
    monkeypatch.setattr(module, "fidelity_profile", lambda card: "h200-sxm-estimate")
    sizes = {"batches": (1, 2, 4), "lengths": (8, 24), "repeats": 2, "fidelity_limits": {"baseline": 8, "tuned": 16}}
    result = module.run_check(tmp_path, 300, device_name="cpu", sizes=sizes,
                              steps=("points", "device_profile", "sim_fidelity"))
    step = result["steps"]["device_profile"]
    assert step["status"] == "ok" and step["points"] == 6
    fitted = load_profile(str(tmp_path / "device_profile.json"))
    assert fitted.kind == "measured" and fitted.synchronous
    runs = result["steps"]["sim_fidelity"]["runs"]
    assert runs["baseline"]["real"]["device"]["kind"] == "cpu"
    assert runs["tuned"]["sim"]["device"]["kind"] == "simulated"
    assert runs["tuned"]["sim"]["device"]["profile"] == "h200-sxm-estimate"  # not this run's own fit
    assert all(math.isfinite(v) and v > 0 for v in result["steps"]["sim_fidelity"]["sim_over_real"].values())


def test_a_thread_waiting_for_a_cpu_is_working_not_blocked():
    """On an oversubscribed host a busy input thread gets less CPU than it asks for; its run-queue wait
    (schedstat) counts toward its demand, so the model's wait for input reads starved, not blocked."""
    from tuning.profile.diagnose import Signals, diagnose

    squeezed = Signals(model_busy=0.2, wait_for_input_share=0.7, max_thread_cpu=35.0, max_thread_name="loader-worker-0",
                       max_thread_wait=40.0)
    verdict = diagnose(squeezed)
    assert verdict.kind == "starved" and "waiting for a free CPU" in " ".join(verdict.reasons)
    idle = Signals(model_busy=0.2, wait_for_input_share=0.7, max_thread_cpu=35.0, max_thread_wait=2.0)
    assert diagnose(idle).kind == "blocked"
    unknown = Signals(model_busy=0.2, wait_for_input_share=0.7, max_thread_cpu=35.0)  # no schedstats: CPU alone
    assert diagnose(unknown).kind == "blocked"


def test_a_synchronous_device_burns_fixed_work_on_the_intra_op_pool(monkeypatch):
    """On a CPU-like profile the call is real matrix work on torch's intra-op threads (GIL released inside
    each op, every core the real model would take, stretched by contention), a fixed amount of it, in about
    as many products as the model has kernels (the GIL changes hands as often as in the real forward). It
    used to spin one Python thread on the wall clock."""
    from tuning.sim.standin import IntraOpBurner

    model = ModelProfile(name="four", ops=["k"] * 4, launches=[True] * 4, flops=[[0.003 * 1e12, 0, 0, 0]] * 4,
                         float_bytes=[[0, 0, 0, 0]] * 4, other_bytes=[[0, 0, 0, 0]] * 4, param_bytes_fp32=0,
                         output_dim=3)
    device = SimulatedDevice(_device(launch_s=0.0, min_kernel_s=0.0, mem_bytes=1e12, synchronous=True), model,
                             host_dispatch_s=0.0)
    burner = device.burner
    assert isinstance(burner, IntraOpBurner) and burner.ops == 4
    threads = torch.get_num_threads()
    # as if a product of r rows took r microseconds on the idle machine
    monkeypatch.setattr(burner, "_unit_s", {(r, threads): r * 1e-6 for r in IntraOpBurner.ROWS})
    mms = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, *rest, **k: mms.append(a.shape[0]) or real_mm(a, *rest, **k))
    monkeypatch.setattr("tuning.sim.standin.spin_cpu", lambda s: pytest.fail("a CPU profile spun a Python thread"))
    cost = device.run(1, 1, "fp32", "eager")
    # 12 ms in about 4 products: 3 ms each, the closest size 4096 rows (4.1 ms): 3 products of 4096
    assert cost.call_s == pytest.approx(0.012) and mms == [4096] * 3
    assert burner.plan(0.0) == (16, 0) and burner.plan(1e-9)[1] == 1  # a call always does some work
    assert burner.plan(0.000256) == (64, 4)  # 4 products of 64 rows = 256 us
    gpu_like = SimulatedDevice(_device(mem_bytes=1e12), model)
    assert gpu_like.burner is None  # an asynchronous device's compute is a sleep: the host is free


def test_slowed_profile_scales_every_device_time_and_refuses_a_bad_factor():
    """A recalibration's slowed profile: with no host dispatch, every call predicts ``factor`` times the time."""
    model = embedded_model_profile()
    fast = load_profile("h200-sxm-estimate")
    slow = fast.slowed(2.5)
    for batch, length, dtype, graph in ((1, 16, "fp32", "eager"), (32, 128, "bf16", "eager"), (8, 64, "fp16", "cuda_graph")):
        a = predict(model, fast, batch, length, dtype, graph, host_dispatch_s=0.0)
        b = predict(model, slow, batch, length, dtype, graph, host_dispatch_s=0.0)
        assert b.call_s == pytest.approx(2.5 * a.call_s, rel=1e-9), (batch, length, dtype, graph)
    assert slow.name == fast.name and slow.mem_bytes == fast.mem_bytes  # the same card, slower
    assert fast.slowed(0.5).launch_s == pytest.approx(fast.launch_s / 2)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="finite factor above 0"):
            fast.slowed(bad)


def test_use_profile_reprices_the_next_calls():
    """A stand-in told a recalibrated profile prices its next calls with it, not with the cached costs."""
    device = _timed_device(host_s=0.0, device_s=0.004)
    assert device.cost(1, 1, "fp32", "eager").call_s == pytest.approx(0.004)
    device.use_profile(device.profile.slowed(3.0))
    assert device.cost(1, 1, "fp32", "eager").call_s == pytest.approx(0.012)
    device.run(1, 1, "fp32", "eager")  # the first call plans its host part
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        device.run(1, 1, "fp32", "eager")
        times.append(time.perf_counter() - t0)
    assert float(np.median(times)) == pytest.approx(0.012, abs=0.003)
    assert device.timeline.totals(0.0, time.perf_counter() + 1).busy == pytest.approx(6 * 0.012)
