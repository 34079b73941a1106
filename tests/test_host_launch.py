"""The what-if's host cost per launch from the model's own code (issue 25, deliver 2): the miniature, what the engine
charges, what a calibration subtracts and a what-if adds back."""

from __future__ import annotations

import json

import pytest
import torch

from tests.sim_units import unit_device
from tuning import preset
from tuning.runtime.engine import Engine, sim_host_dispatch
from tuning.runtime.model import miniature, random_minilm
from tuning.sim import embedded_model_profile, load_profile, predict
from tuning.sim.calibrate import Point, calibrate, prediction_error, read_sweeps
from tuning.sim.costmodel import record_ops
from tuning.sim.dispatch import MINIATURE_TOKENS, host_dispatch_s, model_dispatch_s


def test_the_miniature_runs_the_models_own_op_sequence():
    """What it times must be the forward's ops, views and launches alike: the same aten ops in the same order, at
    the same shape, as the full model's, and launching the same kernels."""
    full = [(name, launches) for name, launches, *_ in record_ops(random_minilm(), 1, MINIATURE_TOKENS, 1001)]
    small = miniature(random_minilm())
    mini = [(name, launches) for name, launches, *_ in record_ops(small, 1, MINIATURE_TOKENS, 32)]
    assert mini == full and sum(launches for _, launches in mini) >= 70
    assert small.config.hidden_size == 2 and small.config.num_hidden_layers == random_minilm().config.num_hidden_layers
    assert miniature(None).config.num_hidden_layers == 6  # the embedded model's configuration
    assert miniature(torch.nn.Linear(2, 2)) is None  # code this package cannot resize


def test_the_miniature_starts_no_cuda(monkeypatch):
    """fork_rng with its default devices reads every visible GPU's RNG state, which starts a CUDA context on each:
    a simulated engine on a CUDA machine must not."""
    def refuse(*args, **kwargs):
        raise AssertionError("the miniature touched CUDA")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", refuse)
    monkeypatch.setattr(torch.cuda, "set_rng_state", refuse)
    before = torch.random.get_rng_state()
    assert miniature(None) is not None
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG stream is untouched too


def test_the_models_own_code_costs_more_per_launch_than_one_tiny_op():
    """The tiny op (one torch.add on 1-element tensors) was the rule before: 0.9 us here, where the miniature's
    forward costs 7-12 us per launch (modules, views, argument parsing); on the lent H200 hosts the real eager
    forward cost 23-46 us per launch. A module that cannot be rebuilt small gets the tiny op, said to be a bound."""
    threads = torch.get_num_threads()
    small = miniature(None)
    launches = sum(op[1] for op in record_ops(small, 1, MINIATURE_TOKENS, 32))
    seconds, source = model_dispatch_s(small, launches, refresh=True)
    assert torch.get_num_threads() == threads  # the measurement's one thread is given back
    assert seconds >= 2 * host_dispatch_s() and "miniature" in source and "launched kernel" in source
    fallback, why = model_dispatch_s(None)
    assert fallback == host_dispatch_s() and "lower bound" in why
    assert sim_host_dispatch(torch.nn.Linear(2, 2)) == (fallback, why)


def test_a_simulated_engine_charges_its_hosts_miniature_per_launch_and_says_so():
    engine = Engine(preset("baseline", device="sim"))
    info = engine.device_info
    seconds, _ = sim_host_dispatch(None)
    assert info["host_dispatch_us"] == pytest.approx(seconds * 1e6, abs=1e-3)
    assert "miniature" in info["host_dispatch_source"]
    cost = engine.sim.cost(1, 16, "bf16", "eager")
    assert cost.host_s == pytest.approx(cost.launches * (seconds + engine.sim.profile.launch_s))


def test_a_profile_fitted_beyond_a_tiny_op_gets_a_tiny_op_back(tmp_path):
    """A format-1 profile JSON without ``host_dispatch`` was fitted beyond one tiny op: adding the miniature to its
    launch_s would count the model's Python twice, so a what-if adds the tiny op."""
    raw = json.loads((load_profile("h200-sxm-estimate").to_json()))
    del raw["host_dispatch"], raw["format_version"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    profile = load_profile(str(old))
    assert profile.host_dispatch == "tiny op"
    engine = Engine(preset("baseline", device="sim", sim_profile=str(old)))
    assert engine.device_info["host_dispatch_us"] == pytest.approx(host_dispatch_s() * 1e6, abs=1e-3)
    assert "tiny op" in engine.device_info["host_dispatch_source"]
    assert load_profile("h200-sxm-estimate").host_dispatch == "model"
    with pytest.raises(ValueError, match="host_dispatch"):
        load_profile("h200-sxm-estimate").replace(host_dispatch="neither")


def _points(truth, dispatch: float) -> list[Point]:
    model = embedded_model_profile()
    return [Point(b, t, d, g, predict(model, truth, b, t, d, g, host_dispatch_s=dispatch).call_s * 1000)
            for b in (1, 4, 16, 64) for t in (32, 128, 256) for d in ("fp32", "bf16") for g in ("eager", "cuda_graph")]


def test_a_calibration_subtracts_the_kind_of_dispatch_a_what_if_adds_back(tmp_path):
    """Sweeps record the miniature (kind ``model``); the fit subtracts it and the profile says so, so a what-if on the
    same host reproduces the measured points. A sweep file without a kind recorded a tiny op."""
    truth = unit_device(peak_flops={"fp32": 20e12, "bf16": 80e12, "fp16": 80e12}, mem_bandwidth=250e9, launch_s=7e-6,
                        min_kernel_s=3e-6, graph_replay_s=20e-6, mem_bytes=24e9)
    points = _points(truth, 9e-6)
    fitted, worst = calibrate(points, embedded_model_profile(), "cuda", "fit", host_dispatch_s=9e-6,
                              host_dispatch_kind="model")
    assert fitted.host_dispatch == "model" and "miniature" in fitted.sources["host_dispatch_s"]
    assert fitted.launch_s == pytest.approx(7e-6, rel=0.03)
    assert prediction_error(embedded_model_profile(), fitted, points, host_dispatch_s=9e-6) < 0.01
    for kind, expected in (({"host_dispatch_kind": "model"}, "model"), ({}, "tiny op")):
        sweep = {"length": 32, "device": "cuda", "dtype": "bf16", "graph": "eager", "host_dispatch_s": 9e-6, **kind,
                 "points": [{"batch_size": p.batch, "status": "ok", "per_batch_ms": p.ms} for p in points
                            if p.length == 32 and p.dtype == "bf16" and p.graph == "eager"]}
        path = tmp_path / f"sweep_{expected.replace(' ', '_')}.json"
        path.write_text(json.dumps(sweep))
        read_sweeps([path])
        profile, _ = calibrate(_points(truth, 9e-6), embedded_model_profile(), "cuda", "fit")
        assert profile.host_dispatch == expected
    with pytest.raises(ValueError, match="host_dispatch_kind"):
        calibrate(points, embedded_model_profile(), "cuda", "fit", host_dispatch_s=9e-6, host_dispatch_kind="x")
