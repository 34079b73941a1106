"""The machine recorded with every result, a ``tuned`` preset whose precision follows the hardware, and torch
threads sized so that the tool's own processes never oversubscribe the cores. A CPU with and without native bf16
is faked (flags), so these hold on any machine."""

import contextlib
import io
import json
import math

import pytest

import tuning.base.machine as machine
import tuning.knobs as knobs_mod
from tuning.knobs import preset, preset_note, tuned_precision

AVX2_ONLY = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False, "amx_tile": False}
AMX = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True, "amx_tile": True}


def test_tuned_precision_follows_the_cpu_and_says_why():
    assert tuned_precision("cpu", AVX2_ONLY, cuda=False) == (
        "fp32", "dtype=fp32: this CPU has no native bf16 (no avx512_bf16 or amx_bf16; bf16 would be emulated)")
    assert tuned_precision("cpu", AMX, cuda=False) == ("bf16", "dtype=bf16: this CPU has native bf16 "
                                                              "(avx512_bf16, amx_bf16)")
    assert tuned_precision("auto", AVX2_ONLY, cuda=True) == ("bf16", "dtype=bf16: on CUDA")
    assert tuned_precision("cpu", AVX2_ONLY, cuda=True)[0] == "fp32"  # asked for the CPU: the CPU decides
    assert tuned_precision("sim", AVX2_ONLY, cuda=False)[0] == "bf16"
    assert machine.native_bf16(AVX2_ONLY) is False and machine.native_bf16({"avx512_bf16": True}) is True


@pytest.mark.parametrize("flags,dtype", [(AVX2_ONLY, "fp32"), (AMX, "bf16")])
def test_the_preset_and_its_line_on_a_faked_cpu(monkeypatch, flags, dtype):
    monkeypatch.setattr(machine, "cpu_flags", lambda info=None: dict(flags))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert preset("tuned").dtype == dtype
    assert preset("tuned", dtype="fp16").dtype == "fp16"  # asked for: kept
    assert preset("tuned", device="sim").dtype == "bf16"
    assert preset("baseline").dtype == "fp32" and preset_note("baseline") == ""
    assert preset_note("tuned").startswith(f"dtype={dtype}: this CPU has")
    from tuning.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--preset", "tuned", "--limit", "20"]) == 0
    first = out.getvalue().splitlines()[0]
    assert first.startswith(f"knobs: preset tuned (dtype={dtype}: this CPU has"), first
    assert knobs_mod.PRESETS["tuned"].batch_size == 16  # the rest of the preset is the same on both


def test_intra_op_threads_leave_the_cores_of_workers_and_started_processes(monkeypatch):
    monkeypatch.delenv(machine.RESERVED_CORES_ENV, raising=False)
    assert machine.intra_op_threads(0, cores=2) == 2
    assert machine.intra_op_threads(2, cores=2) == 1  # two loader workers on two cores: one thread, not two
    assert machine.intra_op_threads(1, cores=8) == 7
    monkeypatch.setenv(machine.RESERVED_CORES_ENV, "3")
    assert machine.intra_op_threads(1, cores=8) == 4 and machine.reserved_cores() == 3
    monkeypatch.setenv(machine.RESERVED_CORES_ENV, "nonsense")
    assert machine.reserved_cores() == 0


def test_the_engine_sizes_its_threads_and_a_knob_overrides(monkeypatch):
    import torch

    from tuning.offline.pipeline import Pipeline
    from tuning.runtime.engine import Engine
    from tuning.runtime.model import random_minilm

    monkeypatch.delenv(machine.RESERVED_CORES_ENV, raising=False)
    monkeypatch.setattr(machine, "usable_cores", lambda: 4)
    before = torch.get_num_threads()
    try:
        model = random_minilm()
        assert Engine(preset("baseline"), model).torch_threads == 4
        assert Engine(preset("baseline"), model, reserved_cores=3).torch_threads == 1  # a locust master + 2 workers
        monkeypatch.setenv(machine.RESERVED_CORES_ENV, "1")  # a process spawned beside the tool's own load
        assert Engine(preset("baseline"), model).torch_threads == 3
        monkeypatch.delenv(machine.RESERVED_CORES_ENV)
        # loader workers mostly wait: they take no core (reserving one measured 0.55x and 0.64x here)
        assert Pipeline(preset("baseline", num_workers=3), model=model).engine.torch_threads == 4
        assert Engine(preset("baseline", torch_threads=2), model, reserved_cores=3).torch_threads == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_machine_block_names_the_cpu_and_what_decides_precision():
    info = machine.MachineWatch().info()
    cpu = info["cpu"]
    assert cpu["model"] and set(cpu["flags"]) == set(machine.CPU_FLAGS)
    assert isinstance(cpu["native_bf16"], bool) and cpu["torch_capability"]
    assert info["cores_usable"] >= 1 and info["torch_intra_op_threads"] >= 1
    assert "load_average_at_start" in info and "load_average_at_end" in info
    line = machine.machine_line(info)
    assert line.startswith("machine: ") and cpu["model"] in line


def test_every_json_result_carries_the_machine_block():
    from tuning.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--limit", "20", "--json"]) == 0
    data = json.loads(out.getvalue())
    assert data["machine"]["cpu"]["model"] and "native_bf16" in data["machine"]["cpu"]


def test_two_results_from_different_machines_say_so():
    a = {"cpu": {"model": "AMD EPYC 7B13", "native_bf16": False}, "cores_usable": 2, "gpu": None}
    b = {"cpu": {"model": "Intel Xeon", "native_bf16": True}, "cores_usable": 2, "gpu": None}
    assert machine.same_machine(a, dict(a)) is None
    said = machine.same_machine(a, b)
    assert said.startswith("different machines: CPU 'AMD EPYC 7B13' vs 'Intel Xeon'; native bf16 False vs True")
    assert "may come from different machines" in machine.same_machine(None, b)


def test_busy_elsewhere_is_said_only_beyond_what_this_process_explains():
    assert machine.busy_elsewhere(load1=0.4, cores=2) is None
    assert "another process keeps the cores busy (load average 1.8 on 2 cores)" in machine.busy_elsewhere(1.8, cores=2)
    assert machine.busy_elsewhere(1.8, own_threads=2, cores=2) is None


def test_a_cpu_sweep_in_the_contract_format_calibrates_as_a_cpu(tmp_path):
    """Review finding: `sweep batch --json` writes `device` as the contract's object; read_sweeps took its name
    (a CPU model) for the device kind and fitted a CPU sweep as CUDA."""
    from tuning.base.contract import device_object
    from tuning.sim.calibrate import read_sweeps

    points = [{"batch_size": b, "length": n, "status": "ok", "per_batch_ms": 1.0 + b * n / 100}
              for n in (16, 64) for b in (1, 2, 4)]
    for device, kind in ((device_object("cpu", "AMD EPYC 7B13", source="measured"), "cpu"),
                         (device_object("cuda", "NVIDIA L4", source="measured"), "cuda"), ("cpu", "cpu")):
        path = tmp_path / f"{kind}-{type(device).__name__}.json"
        path.write_text(json.dumps({"device": device, "dtype": "fp32", "graph": "eager", "points": points}))
        assert read_sweeps([path])[1] == kind
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"device": device_object("simulated", "simulated x", profile="x"), "points": points}))
    with pytest.raises(ValueError, match="simulated device"):
        read_sweeps([sim])


def test_each_engine_runs_with_its_own_thread_count(monkeypatch):
    """Review finding: torch's thread count is process-wide, so building a second engine set it for the first;
    a pipeline now applies its engine's count when it runs."""
    import torch

    from tuning.offline.pipeline import Pipeline
    from tuning.runtime.model import random_minilm

    monkeypatch.delenv(machine.RESERVED_CORES_ENV, raising=False)
    before = torch.get_num_threads()
    try:
        model = random_minilm()
        one = Pipeline(preset("tuned", torch_threads=1, dtype="fp32"), model=model)
        Pipeline(preset("tuned", torch_threads=2, dtype="fp32"), model=model)  # built last: sets 2
        seen = []
        one.run(limit=8, keep_embeddings=False, on_batch=lambda b: seen.append(torch.get_num_threads()))
        assert seen and set(seen) == {1}
    finally:
        torch.set_num_threads(before)


def test_steal_watch_reads_the_window_not_the_warm_up():
    """Steal during the warm-up (t < 2) and the server's shutdown (t > 5) is not the measured window's."""
    from tuning.profile.steal import StealWatch

    # (t, steal jiffies, total jiffies): 50% steal before t=2 and after t=5, none from 2 to 5
    table = [(0, 0, 0), (1, 50, 100), (2, 100, 200), (3, 100, 300), (4, 100, 400), (5, 100, 500), (6, 150, 600)]
    clock_at = iter(t for t, *_ in table)
    ticks_at = iter((s, tot) for _, s, tot in table)
    watch = StealWatch(interval=3600, clock=lambda: next(clock_at), ticks=lambda: next(ticks_at))
    for _ in table:
        watch._read()
    assert watch.share(2.0, 5.0) == 0.0
    assert watch.share(2.5, 4.5) == 0.0  # the readings that cover the window
    assert watch.share() == 150 / 600
    assert watch.share(0.5, 2.0) == 0.5


def test_steal_watch_without_a_steal_column_is_nan():
    from tuning.profile.steal import StealWatch

    with StealWatch(interval=0.1, ticks=lambda: None) as watch:
        pass
    assert math.isnan(watch.share(0.0, 1.0)) and watch._thread is None
