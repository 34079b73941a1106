"""The optimization ladder's knobs: planner, half precision, graph modes, batch sweep."""

import itertools
import json

import numpy as np
import pytest
import torch

from tests.cli_run import run_cli
from tests.helpers import TinyModel
from tuning.experiments.precision import precision_report
from tuning.experiments.sweeps import batch_sweep
from tuning.inputs.buckets import padded_to_buckets, padding_waste, plan_buckets
from tuning.knobs import Knobs
from tuning.runtime.engine import Engine
from tuning.runtime.graphs import CudaGraphRunner
from tuning.runtime.model import random_minilm


def _brute_force(lengths, k):
    values = sorted(set(lengths))
    best = None
    for combo in itertools.combinations(values[:-1], k - 1):
        buckets = tuple(combo) + (values[-1],)
        cost = int(padded_to_buckets(np.asarray(lengths), buckets).sum())
        best = min(best or (cost, buckets), (cost, buckets))
    return best


@pytest.mark.parametrize("seed,k", [(0, 2), (1, 3), (2, 4)])
def test_planner_is_optimal_against_brute_force(seed, k):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 60, size=80).tolist()
    planned = plan_buckets(lengths, k)
    cost = int(padded_to_buckets(np.asarray(lengths), planned).sum())
    assert len(planned) == k and planned[-1] == max(lengths)
    assert cost == _brute_force(lengths, k)[0]


def test_planner_edges_and_errors():
    assert plan_buckets([10, 10, 10], 4) == (10,)
    assert plan_buckets([3, 9, 17], 2, multiple_of=8) in ((8, 24), (16, 24))
    with pytest.raises(ValueError, match="k=0"):
        plan_buckets([1, 2], 0)
    with pytest.raises(ValueError, match="empty"):
        plan_buckets([], 2)


def test_padding_waste_report():
    lengths = [10] * 15 + [200]
    report = padding_waste(lengths, batch_size=16, max_length=256, k=2)
    dynamic = report.row("arrival-dynamic")
    assert dynamic.padded_tokens == 16 * 200  # one long request pads the whole batch
    assert report.row("arrival-fixed").padded_tokens == 16 * 256
    # the planner keeps its own top bucket (Knobs.bucket_lengths adds max_length for longer inputs)
    assert report.planned == (10, 200)
    # one batch of 16 holds the long request whatever the strategy: grouping cannot beat that here
    planned = report.row("grouped-planned")
    assert planned.padded_tokens == 16 * 200 and (report.table.padded_over_real >= 1).all()


def test_half_precision_report_on_cpu():
    texts = ["a short one", "Crème brûlée 非常好 😀", "word " * 300, "USB-C charger, 65 W, works fine!"]
    report = precision_report(texts, dtypes=("bf16", "fp16"))
    frame = report.to_frame().set_index("dtype")
    assert frame.loc["bf16", "min_cosine"] > 0.999 and frame.loc["bf16", "mean_cosine"] <= 1.0 + 1e-6
    if not torch.cuda.is_available():
        assert "refused" in frame.loc["fp16", "status"] and "bf16" in frame.loc["fp16", "status"]


def _fake_capture(calls):
    """Stands in for CUDA capture on a CPU: 'replay' re-runs the model on the static buffers."""
    def capture(fn, ids, mask):
        calls.append(tuple(ids.shape))
        out = fn(ids, mask)

        def replay():
            out.copy_(fn(ids, mask))
        return out, replay
    return capture


def test_graph_runner_buffers_padding_and_equality_with_eager():
    model = random_minilm()
    calls = []
    runner = CudaGraphRunner(model, torch.device("cpu"), batch_sizes=(4,), capture_fn=_fake_capture(calls))
    ids = torch.randint(1000, 5000, (3, 16))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    with torch.inference_mode():
        eager = model(ids, mask)
        replayed = runner(ids, mask)  # ragged: 3 rows padded to the captured 4
        again = runner(ids[:2], mask[:2])
    assert calls == [(4, 16)]  # captured once per (batch, length)
    assert replayed.shape == (3, 384) and torch.allclose(replayed, eager, atol=1e-5)
    assert torch.allclose(again, eager[:2], atol=1e-5)
    with pytest.raises(ValueError, match="larger than every captured"):
        runner(torch.ones(5, 16, dtype=torch.long), torch.ones(5, 16, dtype=torch.long))


def test_cuda_graph_refused_without_cuda_with_the_fix():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="graph='compile'"):
        Engine(Knobs(graph="cuda_graph", padding="bucket"), TinyModel())
    with pytest.raises(ValueError, match="padding='bucket'"):
        Knobs(graph="cuda_graph", padding="dynamic")
    with pytest.raises(ValueError, match="CUDA"):
        CudaGraphRunner(TinyModel(), torch.device("cpu"))


@pytest.mark.slow
def test_compile_mode_matches_eager_and_reports_compile_time():
    knobs = Knobs(graph="compile", padding="bucket", buckets=(16,), max_length=32, batch_size=2, dtype="fp32")
    model = random_minilm()
    engine = Engine(knobs, model)
    compile_s = engine.warmup(shapes=[(2, 16)], repeats=1)
    ids = torch.randint(1000, 5000, (2, 16))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        assert torch.allclose(engine.runner(ids, mask), model(ids, mask), atol=1e-4)
    assert compile_s > 0 and engine.compile_s == compile_s


def test_batch_sweep_knee_and_oom_point():
    """Durations are injected (a fake timer the runner advances), so the knee is exact: the margin between
    8 and 16 is 0.0 ms, which real sleeps on a busy machine could not keep."""
    from tuning.base.clock import FakeClock

    cost = {1: 10.0, 2: 12.0, 4: 16.0, 8: 30.0, 16: 60.0}
    timer = FakeClock()

    def runner(ids, mask):
        if ids.shape[0] == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        timer.advance(cost[ids.shape[0]] / 1000)

    result = batch_sweep(runner, torch.device("cpu"), [1, 2, 4, 8, 16, 32], length=8, repeats=3, warmup=1,
                         timer=timer)
    frame = result.to_frame().set_index("batch_size")
    assert frame.loc[32, "status"] == "oom" and "out of memory" in frame.loc[32, "error"]
    assert (frame.drop(32).status == "ok").all() and frame.loc[16, "memory_mb"] > 0
    # per sample: 10, 6, 4, 3.75, 3.75 -> knee (within 5% of best) at 8; gain 4->8 is 6% and 8->16 is 0%
    ok = frame.drop(32)
    assert ok.per_batch_ms.tolist() == pytest.approx(list(cost.values()))
    assert ok.per_sample_ms.tolist() == pytest.approx([10.0, 6.0, 4.0, 3.75, 3.75])
    assert ok.iqr_ms.tolist() == pytest.approx([0.0] * 5, abs=1e-9) and (ok.rounds == 5).all()
    assert result.knee == 8 and result.diminishing == 8
    with pytest.raises(ValueError, match="sizes"):
        batch_sweep(runner, torch.device("cpu"), [0])


@pytest.mark.slow
def test_cli_sweep_batch_and_plan_json():
    out = run_cli("sweep", "batch", "--sizes", "1,2,4", "--length", "16", "--repeats", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [p["batch_size"] for p in data["points"]] == [1, 2, 4] and data["knee"] in (1, 2, 4)
    out = run_cli("plan", "--preset", "tuned", "--k", "3", "--limit", "300", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["planned_buckets"]) == 3
    wastes = {s["key"]: s["waste"] for s in data["strategies"]}
    assert wastes["grouped-dynamic"] <= wastes["grouped-planned"] < wastes["arrival-dynamic"] < wastes["arrival-fixed"]
    bad = run_cli("sweep", "batch", "--sizes", "a,b")
    assert bad.returncode == 2 and "comma-separated" in bad.stderr


def test_gpu_check_cpu_side(tmp_path):
    """The GPU check's logic on a CPU: eager runs, cuda_graph is refused with the fix, the JSON is complete."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sizes = {"batches": (1, 2), "lengths": (8,), "repeats": 2, "sweep_sizes": (1, 2), "sweep_length": 8}
    steps = ("points", "launch_budget", "engine_run_pinned", "graph_runner_padded", "sweep_eager", "sweep_cuda_graph")
    result = module.run_check(tmp_path, 300, device_name="cpu", sizes=sizes, steps=steps)
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["complete"] and written["steps"].keys() == result["steps"].keys() == set(steps)
    assert "random" in result["env"]["weights"]
    modes = {(r["mode"], r.get("batch")): r for r in result["rows"]}
    assert modes[("eager", 2)]["status"] == "ok" and modes[("eager", 2)]["min_cosine_vs_fp32"] > 0.999
    assert modes[("cuda_graph", None)]["status"].startswith("refused")
    steps_out = result["steps"]
    assert "graph='compile'" in steps_out["sweep_cuda_graph"]["status"]
    assert steps_out["launch_budget"]["eager"]["ops_per_batch"] > 0
    assert steps_out["graph_runner_padded"]["status"] == "ok" and steps_out["sweep_eager"]["status"] == "ok"
    assert not result["nvml"]["available"] and result["nvml"]["reason"]
