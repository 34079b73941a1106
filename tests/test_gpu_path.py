"""The GPU paths, driven on a CPU: fake capture, fake compile, fake NVML, synthetic signals."""

import dataclasses
import functools

import pytest
import torch

from tests.helpers import TinyModel
from tuning.experiments.sweeps import batch_sweep, run_batch_sweep
from tuning.knobs import Knobs
from tuning.runtime import graphs
from tuning.runtime.engine import Engine
from tuning.runtime.graphs import CudaGraphRunner


def _replaying_capture(log):
    """Stands in for CUDA capture: 'replay' re-runs the model on the static buffers, logging each shape it runs."""
    def capture(fn, ids, mask):
        log.append(("capture", tuple(ids.shape)))
        out = fn(ids, mask)

        def replay():
            log.append(("replay", tuple(ids.shape)))
            out.copy_(fn(ids, mask))
        return out, replay
    return capture


def _graph_engine(monkeypatch, log, **knobs):
    """An Engine on the CPU whose knobs say cuda_graph, capturing with the stand-in."""
    monkeypatch.setattr(graphs, "CudaGraphRunner", functools.partial(CudaGraphRunner, capture_fn=_replaying_capture(log)))
    engine = Engine(Knobs(device="cpu", padding="bucket", buckets=(8,), max_length=16, **knobs), TinyModel())
    engine.knobs = dataclasses.replace(engine.knobs, device="cuda", graph="cuda_graph")
    engine.runner = engine.make_runner()
    return engine


# -- issue 15 item 1: the batch sweep under graph='cuda_graph' ---------------------------------------------------


def test_batch_sweep_under_cuda_graph_captures_and_replays_each_size_exactly(monkeypatch):
    log = []
    engine = _graph_engine(monkeypatch, log, batch_size=2)
    result = run_batch_sweep(engine.knobs, [1, 2, 4, 8], length=8, repeats=2, engine=engine)
    assert (result.to_frame().status == "ok").all(), result.to_frame()
    captured = sorted(shape for kind, shape in log if kind == "capture")
    assert captured == [(1, 8), (2, 8), (4, 8), (8, 8)]  # one graph per swept size, none padded up
    replayed = {shape for kind, shape in log if kind == "replay"}
    assert replayed == set(captured)
    assert result.graph == "cuda_graph"


# -- issue 16 item 7: the batch sweep interleaves its sizes over rounds ----------------------------------------


class _LoadedMachine:
    """A fake clock and a runner whose cost per row is fixed, doubled while another process loads the machine."""

    def __init__(self, per_row_ms, busy_until_ms):
        self.now_ms = 0.0
        self.per_row_ms = per_row_ms
        self.busy_until_ms = busy_until_ms
        self.order = []

    def timer(self):
        return self.now_ms / 1000

    def runner(self, ids, mask):
        rows = ids.shape[0]
        self.order.append(rows)
        slow = 2.0 if self.now_ms < self.busy_until_ms else 1.0
        self.now_ms += self.per_row_ms[rows] * rows * slow


def test_batch_sweep_interleaves_sizes_so_a_slow_spell_does_not_pick_the_knee():
    # per sample: 16 and 32 cost the same, 64 is 10% worse; the machine is slow for the first 400 ms
    machine = _LoadedMachine({16: 1.0, 32: 1.0, 64: 1.1}, busy_until_ms=400)
    result = batch_sweep(machine.runner, torch.device("cpu"), [16, 32, 64], length=8, repeats=3, warmup=1,
                         rounds=5, timer=machine.timer)
    frame = result.to_frame().set_index("batch_size")
    assert result.knee == 16, frame
    assert frame.loc[64, "per_sample_ms"] == pytest.approx(1.1)
    assert frame.loc[16, "rounds"] == 5 and len(frame.loc[16, "round_ms"]) == 5
    # every size is visited once per round, the order alternating (ABBA) so drift hits all sizes alike
    timed = [rows for rows in machine.order[3:]]
    visits = [timed[i] for i in range(0, len(timed), 4)]  # one re-warm call then 3 timed per visit
    assert visits == [16, 32, 64, 64, 32, 16, 16, 32, 64, 64, 32, 16, 16, 32, 64]


# -- issue 15 item 2: launch-bound is not saturated; device busy decides saturation --------------------------------

import importlib  # noqa: E402

dg = importlib.import_module("tuning.profile.diagnose")


def test_launch_bound_batch_one_on_an_idle_device_is_not_saturated():
    # batch 1 on an idle H200: the host is inside the model call 95% of the time, launching kernels
    s = dg.Signals(model_busy=0.95, wait_for_input_share=0.02, median_span_ms=3.0, mean_batch=1.0,
                   launch_share=0.8, device_busy=0.12, batch_size_knob=1, dtype_knob="fp16", padding_knob="bucket")
    d = dg.diagnose(s)
    assert d.kind == "fragmented", d
    assert any("launch overhead" in r for r in d.reasons)
    assert "cuda_graph" in d.next_step and "reduce-overhead" in d.next_step
    assert d.evidence["device_busy"] == 0.12


def test_saturated_reads_device_busy_when_known_and_model_busy_otherwise():
    host_bound = dg.diagnose(dg.Signals(model_busy=0.95, wait_for_input_share=0.02, mean_batch=16.0, device_busy=0.2))
    assert host_bound.kind == "fragmented" and any("device busy 20%" in r for r in host_bound.reasons), host_bound
    busy = dg.diagnose(dg.Signals(model_busy=0.95, wait_for_input_share=0.02, mean_batch=16.0, device_busy=0.9))
    assert busy.kind == "saturated" and any("device busy 90%" in r for r in busy.reasons), busy
    unknown = dg.diagnose(dg.Signals(model_busy=0.95, wait_for_input_share=0.02, mean_batch=16.0))
    assert unknown.kind == "saturated" and any("model busy 95%" in r for r in unknown.reasons), unknown


def test_a_starved_launch_bound_run_is_starved_first():
    s = dg.Signals(model_busy=0.3, wait_for_input_share=0.6, max_thread_cpu=99.0, max_thread_name="loader",
                   launch_share=0.8, device_busy=0.05)
    assert dg.diagnose(s).kind == "starved"


def test_busy_docs_say_which_busy_is_which():
    from tuning.profile import busy

    assert "device busy" in dg.Signals.__doc__ and "model busy" in dg.Signals.__doc__
    assert "not device time" in busy.__doc__


# -- issue 15 item 3: the launch budget counts host launch calls and is bounded by measured wall time -------------

from types import SimpleNamespace  # noqa: E402

from torch.autograd import DeviceType  # noqa: E402

from tuning.profile.ops import HOST_LAUNCH_CALLS, stats_from_events  # noqa: E402


def _event(name, device_type, us, parent=None):
    return SimpleNamespace(name=name, device_type=device_type, cpu_parent=parent, cpu_time_total=us,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def _cuda_events(batches, kernels, kernel_us, launch_name, launches):
    events = []
    for _ in range(batches):
        op = _event("aten::linear", DeviceType.CPU, 50.0)
        events.append(op)
        events += [_event(launch_name, DeviceType.CPU, 4.0, parent=op) for _ in range(launches)]
        events += [_event("sm90_gemm", DeviceType.CUDA, kernel_us) for _ in range(kernels)]
        events.append(_event("cudaMemcpyAsync", DeviceType.CPU, 3.0, parent=op))
    return events


def test_launch_budget_is_bounded_by_wall_time_not_clamped():
    # eager at batch 1: 100 kernels of 5 us (0.5 ms) launched one by one, 2 ms of wall time per batch
    events = _cuda_events(3, kernels=100, kernel_us=5.0, launch_name="cudaLaunchKernel", launches=100)
    stats = stats_from_events(events, batches=3, batch_shape=(1, 64), device="cuda", wall_ms=3 * 2.0,
                              launch_cost_us=20.0)
    assert stats.launches_per_batch == 100 and stats.kernels_per_batch == 100
    assert stats.busy_ms_per_batch == pytest.approx(0.5) and stats.wall_ms_per_batch == pytest.approx(2.0)
    # 100 x 20 us = 2 ms of launches, but only 2 - 0.5 = 1.5 ms of the wall is not kernel time
    assert stats.launch_share == pytest.approx(0.75)
    assert stats.summary()["wall_ms_per_batch"] == pytest.approx(2.0)


def test_kernels_replayed_from_a_graph_are_not_launches():
    events = _cuda_events(3, kernels=100, kernel_us=5.0, launch_name="cudaGraphLaunch", launches=1)
    stats = stats_from_events(events, batches=3, batch_shape=(1, 64), device="cuda", wall_ms=3 * 0.6,
                              launch_cost_us=20.0)
    assert stats.kernels_per_batch == 100 and stats.launches_per_batch == 1
    # the wall a replayed graph leaves outside its kernels (0.6 - 0.5 ms): its replay and copies, the most left to save
    assert stats.launch_share == pytest.approx(0.1 / 0.6)
    assert {"cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"} <= set(HOST_LAUNCH_CALLS)


# -- issue 15 item 4: torch.compile sees no new shape inside the measured window, or says so -----------------------


def test_compile_pads_ragged_batches_and_reports_shapes_compiled_after_warmup(monkeypatch):
    seen = []

    def fake_compile(model, dynamic=None, mode=None, **kwargs):
        def compiled(ids, mask):
            seen.append(tuple(ids.shape))
            return model(ids, mask)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = TinyModel()
    engine = Engine(Knobs(device="cpu", graph="compile", padding="bucket", buckets=(8,), max_length=16, batch_size=4),
                    model)
    engine.warmup()
    assert sorted(set(seen)) == [(4, 8), (4, 16)]
    seen.clear()
    ids = torch.randint(1000, 5000, (3, 8))
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    with torch.inference_mode():
        out = engine.runner(ids, mask)  # the ragged last batch
        assert seen == [(4, 8)]  # padded to the compiled size: not a new shape, no recompile
        assert out.shape == (3, 8) and torch.allclose(out, model(ids, mask))
        with pytest.warns(RuntimeWarning, match="new shape"):
            engine.runner(torch.ones(4, 12, dtype=torch.long), torch.ones(4, 12, dtype=torch.long))
    assert engine.runner.recompiles == 1 and engine.runner.late_shapes == [(4, 12)]
    assert engine.runner.padded_rows_share == pytest.approx(1 / 7)


def test_a_graph_runner_refuses_to_capture_inside_the_measured_window(monkeypatch):
    log = []
    engine = _graph_engine(monkeypatch, log, batch_size=4)
    engine.warmup()
    assert sorted(shape for kind, shape in log if kind == "capture") == [(4, 8), (4, 16)]
    with pytest.raises(ValueError, match="warm-up"):
        engine.runner(torch.ones(4, 12, dtype=torch.long), torch.ones(4, 12, dtype=torch.long))
    assert engine.runner.late_shapes == [(4, 12)]


# -- issue 15 item 5: the torch floor covers the APIs used (recompile_limit: 2.7, torch.OutOfMemoryError: 2.5) -----


def test_torch_floor_covers_the_apis_the_gpu_path_uses():
    import re
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parent.parent
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.fullmatch(r"torch>=(\d+)\.(\d+)", d.replace(" ", "")) for d in deps if d.startswith("torch"))
    assert floor and (int(floor[1]), int(floor[2])) >= (2, 7), deps


def test_cublas_allocation_failure_is_an_out_of_memory_outcome():
    from tuning.runtime.engine import Item, PreparedBatch

    class CublasFails(torch.nn.Module):
        def forward(self, ids, mask):
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    engine = Engine(Knobs(device="cpu"), CublasFails())
    ids = torch.ones(2, 8, dtype=torch.long)
    out = engine.run(PreparedBatch([Item(0), Item(1)], ids, torch.ones_like(ids), 0.0, 0.0, 0.0, padded_length=8))
    assert out.error and "out of memory" in out.error and "batch_size" in out.error


# -- issue 15 item 6: graph pools are reserved memory; cuBLAS allocation failures are OOM points -------------------


def test_sweep_reports_peak_reserved_memory_and_records_cublas_alloc_failure_as_oom(monkeypatch):
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 100 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 300 * 2**20)  # graph pools live here

    def runner(ids, mask):
        if ids.shape[0] == 8:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    result = batch_sweep(runner, torch.device("cuda"), [2, 8, 4], length=4, repeats=1, warmup=1, rounds=2,
                         graph="cuda_graph", make_batch=lambda b, n: (torch.ones(b, n, dtype=torch.long),) * 2)
    frame = result.to_frame().set_index("batch_size")
    assert frame.loc[2, "memory_mb"] == 300 and frame.loc[4, "status"] == "ok"
    assert frame.loc[8, "status"] == "oom" and "CUBLAS_STATUS_ALLOC_FAILED" in frame.loc[8, "error"]
    assert "reserved" in result.summary()["memory"]


# -- issue 15 item 7: NVML watches this process's GPU (by UUID); MIG's NOT_SUPPORTED is NaN, not the end -----------


from tests.fake_nvml import FakeNvml, NVMLError_NotSupported  # noqa: E402
from tuning.profile import gpu as gpu_mod  # noqa: E402
from tuning.profile.recorder import Recorder  # noqa: E402


class _NodeNvml(FakeNvml):
    """Four GPUs with UUIDs; utilization 10, 20, 30, 40 %."""

    def __init__(self, **kw):
        super().__init__(devices=4, **kw)

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}{h}{h}{h}aaaa-0000-0000-0000-00000000000{h}".encode()


def test_nvml_watches_the_cuda_device_of_this_process_by_uuid(monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,3: this process's cuda:1 is the node's GPU 3
    monkeypatch.setattr(gpu_mod, "cuda_uuid", lambda index: {0: "2222aaaa-0000-0000-0000-000000000002",
                                                            1: "3333aaaa-0000-0000-0000-000000000003"}[index])
    with gpu_mod.GpuSampler(0.1, nvml=_NodeNvml(), device=1) as sampler:
        pass  # the window's first and last readings
    frame = sampler.series.to_frame()
    assert len(frame) >= 2 and set(frame.gpu) == {3} and (frame.sm_util == 40).all()
    assert len(sampler.series.devices) == 1 and "GPU-3333" in sampler.series.devices[0]
    with Recorder(0.1, nvml=_NodeNvml(), device=0) as rec:
        pass
    assert set(rec.gpu_sampler.series.to_frame().gpu) == {2}


def test_nvml_device_not_found_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setattr(gpu_mod, "cuda_uuid", lambda index: "ffffffff-0000-0000-0000-000000000000")
    with pytest.warns(RuntimeWarning, match="no GPU with UUID"):
        with gpu_mod.GpuSampler(0.1, nvml=_NodeNvml(), device=0) as sampler:
            pass
    assert not sampler.series.available and "ffffffff" in sampler.series.reason


class _MigNvml(FakeNvml):
    def nvmlDeviceGetUtilizationRates(self, h):
        raise NVMLError_NotSupported("Not Supported")


def test_utilization_not_supported_on_mig_is_nan_and_sampling_goes_on(recwarn):
    with gpu_mod.GpuSampler(0.1, nvml=_MigNvml(devices=1)) as sampler:
        pass  # the window's first and last readings
    frame = sampler.series.to_frame()
    assert len(frame) >= 2 and frame.sm_util.isna().all() and frame.mem_util.isna().all()
    assert (frame.mem_used_mb == 2048).all() and sampler.series.reason is None
    assert not [w for w in recwarn if "stopped" in str(w.message)]
    assert "kernel" in gpu_mod.GpuSample.__doc__ and "1 s" in gpu_mod.GpuSample.__doc__


# -- issue 15 item 8: the profiler is initialised before capture, or the eager model is profiled -------------------

from tuning.experiments import profiled as profiled_mod  # noqa: E402
from tuning.profile import ops as ops_mod  # noqa: E402


@pytest.mark.parametrize("ready_before_capture", [False, True])
def test_ops_profile_graph_replays_only_when_the_profiler_was_ready_before_capture(monkeypatch, ready_before_capture):
    monkeypatch.setattr(graphs, "_PROFILER_READY", ready_before_capture)
    engine = _graph_engine(monkeypatch, [], batch_size=2)
    engine.warmup()
    profiled = []
    monkeypatch.setattr(ops_mod, "op_stats", lambda runner, ids, mask, batches=5: profiled.append(runner) or "stats")
    result = SimpleNamespace(batches=[SimpleNamespace(ok=2, padded_length=8)])
    assert profiled_mod._ops_for(SimpleNamespace(engine=engine), result) == "stats"
    assert profiled == [engine.runner if ready_before_capture else engine.model]


# -- issue 15 item 9: padding waste counts the rows graphs compute ---------------------------------------------------


def test_padding_waste_counts_rows_padded_up_to_the_compiled_batch(monkeypatch):
    from tuning.offline.pipeline import Pipeline

    monkeypatch.setattr(torch, "compile", lambda model, dynamic=None, mode=None, **kw: model)
    knobs = Knobs(num_workers=0, batch_size=4, tokenizer="fast", padding="bucket", buckets=(16,), max_length=32,
                  graph="compile", device="cpu")
    pipeline = Pipeline(knobs, model=TinyModel())
    result = pipeline.run(["a few words here"] * 10, keep_embeddings=False)
    measured = [b for b in result.batches if not b.warmup]
    assert sorted(b.ok for b in measured) == [2, 4, 4]  # one ragged batch, padded to 4 rows by the runner
    real = sum(b.real_tokens for b in measured)
    assert result.padding_waste == pytest.approx(sum(4 * b.padded_length for b in measured) / real - 1)


# -- gpu_check: JSON under --out after every point, the budget checked inside steps --------------------------------


def _gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_writes_after_every_point_and_stops_at_its_budget(tmp_path):
    import json

    gc = _gpu_check()
    report = gc.Report(tmp_path / "out", budget_s=1000)
    report.row(mode="eager", batch=1, status="ok", median_ms=1.5)
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"][0]["median_ms"] == 1.5
    report.budget_s = 0
    with pytest.raises(gc.OutOfTime):
        report.check("the next point")
    data = gc.run_check(tmp_path / "spent", budget_s=0, device_name="cpu", quick=True)
    written = json.loads((tmp_path / "spent" / "gpu_check.json").read_text())
    assert written["complete"] and written["env"]["form"] == "reduced"
    assert written["steps"] and all(s["status"].startswith("skipped") for s in written["steps"].values())
    assert data["steps"].keys() == written["steps"].keys()


# -- issue 59 deliver 6: the next GPU run as a plan, its budget shown by a dry run on the simulated device ------

def test_a_plan_point_out_of_range_is_refused_by_name(tmp_path):
    import json

    gc = _gpu_check()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"points": [{"mode": "cuda_graph", "batch": 0, "length": 256, "dtype": "bf16"}]}))
    with pytest.raises(ValueError, match="batch"):
        gc.load_plan(path)
    path.write_text(json.dumps({"points": [{"mode": "graph", "batch": 8, "length": 256, "dtype": "bf16"}]}))
    with pytest.raises(ValueError, match="mode in"):
        gc.load_plan(path)


def test_a_plan_runs_end_to_end_on_the_simulated_device_and_says_so(tmp_path):
    gc = _gpu_check()
    plan = {"name": "tiny", "repeats": 2, "host_cost_lengths": [16],
            "points": [{"mode": "cuda_graph", "batch": 4, "length": 32, "dtype": "tf32"},
                       {"mode": "eager", "batch": 4, "length": 32, "dtype": "bf16"}],
            "kernel_sum": [{"mode": "cuda_graph", "batch": 4, "length": 32, "dtype": "bf16"}]}
    data = gc.run_check(tmp_path, budget_s=120, device_name="sim", steps=("plan_points", "plan_kernel_sum"),
                        plan=plan, sim_profile="h100-sxm-estimate")
    assert data["env"]["simulated"] and data["env"]["name"] == "simulated h100-sxm-estimate"
    rows = [r for r in data["rows"] if r.get("source") == "plan"]
    assert [(r["mode"], r["dtype"], r["status"], r["simulated"]) for r in rows] == [
        ("cuda_graph", "tf32", "ok", True), ("eager", "bf16", "ok", True)]
    kernel = data["steps"]["plan_kernel_sum"]["shapes"]["cuda_graph bf16 4x32"]
    assert kernel["simulated"] and kernel["kernels_per_batch"] > 0 and kernel["busy_ms_per_batch"] > 0
    assert data["budget"]["estimate_s"] >= data["budget"]["simulated_elapsed_s"]


def test_the_committed_plan_fits_five_minutes_on_its_dry_runs():
    """The dry runs of bench/plans/whatif-next.json on the simulated H100 and H200 (bench/results/whatif_plan_dryrun_*)
    timed every point of the plan, and their budget for the real card is within 5 minutes."""
    import json
    from pathlib import Path

    gc = _gpu_check()
    root = Path(__file__).resolve().parents[1]
    plan = gc.load_plan(root / "bench" / "plans" / "whatif-next.json")
    wanted = sorted((p["mode"], p["batch"], p["length"], p["dtype"]) for p in plan["points"])
    for card in ("h100", "h200"):
        data = json.loads((root / "bench" / "results" / f"whatif_plan_dryrun_{card}" / "gpu_check.json").read_text())
        assert data["env"]["simulated"] and data["env"]["plan"]["points"] == plan["points"]
        done = sorted((r["mode"], r["batch"], r["length"], r["dtype"]) for r in data["rows"]
                      if r.get("source") == "plan" and r["status"] == "ok")
        assert done == wanted, card
        assert data["steps"]["host_cost"]["status"] == "ok" and data["steps"]["plan_kernel_sum"]["status"] == "ok"
        assert data["budget"]["within_limit"] and data["budget"]["estimate_s"] <= 300, data["budget"]


def test_the_predictions_of_the_next_run_are_committed_for_exactly_its_points():
    import json
    import subprocess
    from pathlib import Path

    gc = _gpu_check()
    root = Path(__file__).resolve().parents[1]
    plan = gc.load_plan(root / "bench" / "plans" / "whatif-next.json")
    data = json.loads((root / "bench" / "results" / "whatif_predictions.json").read_text())
    assert data["simulated"] is True and len(data["model_commit"]) == 40
    known = subprocess.run(["git", "cat-file", "-t", data["model_commit"]], cwd=root, capture_output=True, text=True)
    assert known.returncode != 0 or known.stdout.strip() == "commit"  # a shallow copy may lack it; never another kind
    key = ("mode", "batch", "length", "dtype")
    assert [tuple(p[k] for k in key) for p in data["points"]] == [tuple(p[k] for k in key) for p in plan["points"]]
    for p in data["points"]:
        h200, h100 = p["h200-sxm-estimate"], p["h100-sxm-estimate"]
        assert h200["call_ms"] > 0 and h100["call_ms"] >= h200["call_ms"]  # one chip, less bandwidth
