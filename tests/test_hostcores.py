"""Host cores needed (tuning.profile.hostcores): the arithmetic on hand-made thread rows, the GIL cap, the
sentence, and the investigate what-if that carries it."""

import json
import math
import os
from types import SimpleNamespace

import pytest

from tuning.experiments.investigate import Investigation, _profile_and_what_if, what_if_cores
from tuning.experiments.trial import Trial
from tuning.knobs import preset
from tuning.profile.hostcores import GIL_CORE, GIL_CROSS_CORE, HostCores, gil_bound, host_cores

PID = os.getpid()
SIM = {"kind": "simulated", "name": "simulated h200-sxm-estimate"}


@pytest.fixture(autouse=True)
def two_core_run(monkeypatch):
    """The runs here were made on 2 cores, whatever this machine has: a prediction for another core count
    scales the GIL's cost from the run's count (GIL_CROSS_CORE), which defaults to this process's usable cores."""
    import tuning.base.machine as machine

    monkeypatch.setattr(machine, "usable_cores", lambda: 2)


def _row(name, cpu_percent, pid=PID):
    return {"pid": pid, "tid": 1, "name": name, "cpu_mean": cpu_percent, "cpu_max": cpu_percent}


def _trial(rows, qps=100.0, device_busy=0.10, tokenizer="fast"):
    knobs = preset("tuned", device="sim", tokenizer=tokenizer)
    work = SimpleNamespace(knobs=knobs, summary=lambda: {"device": SIM})
    profile = SimpleNamespace(top_threads=lambda n=8: rows[:n], workload=work,
                              host=SimpleNamespace(summary=lambda: {"samples": 0}),
                              diagnosis=SimpleNamespace(as_dict=lambda: {"kind": "host-bound", "next_step": "more cores",
                                                                         "reasons": []}))
    return Trial(qps=qps, p99_ms=50.0, device_busy=device_busy, model_busy=0.5, profile=profile)


ROWS = [_row("preprocess-0", 30.0), _row("batcher", 10.0), _row("model-executor", 20.0), _row("MainThread", 0.0),
        _row("host-sampler", 5.0), _row("python", 40.0, pid=999),  # a sampler, the load generator's process
        {"pid": None, "tid": None, "name": "unattributed", "cpu_mean": 10.0, "cpu_max": 10.0}]


def test_cpu_per_request_capacity_and_cores_from_hand_made_rows():
    hc = host_cores(_trial(ROWS), host_cores=2, service_pid=PID)
    assert [t.name for t in hc.threads] == ["preprocess-0", "batcher", "model-executor", "unattributed"]
    # (0.30 + 0.10 + 0.20 + 0.10) cores / 100 req/s = 7 ms per request; samplers and the client left out
    assert hc.cpu_s_per_request == pytest.approx(0.007)
    assert hc.capacity == pytest.approx(1000.0)  # 100 req/s at 10% device busy
    assert hc.rate == pytest.approx(700.0)  # 70% of capacity
    assert hc.cores == pytest.approx(4.9)  # 700 req/s x 7 ms
    assert hc.gil_s_per_request == pytest.approx(0.006)  # all but unattributed hold the GIL (pure_python)
    assert hc.processes == math.ceil(700 * 0.006 / GIL_CORE) == 5
    d = hc.to_dict()
    assert d["cores"] == pytest.approx(4.9) and d["processes"] == 5 and d["simulated"] is True


def test_a_gil_bound_load_beyond_one_core_needs_more_processes():
    light = host_cores(_trial([_row("batcher", 10.0)], device_busy=0.5), service_pid=PID)  # 1 ms GIL per request
    assert light.rate * light.gil_s_per_request < GIL_CORE and light.processes == 1  # 140 req/s x 1 ms
    heavy = host_cores(_trial([_row("batcher", 10.0)], device_busy=0.05), service_pid=PID)
    assert heavy.rate * heavy.gil_s_per_request == pytest.approx(1.4)  # 1400 req/s x 1 ms: 1.4 cores of GIL
    assert heavy.processes == 2
    assert heavy.rate_on(cores=16, processes=1) == pytest.approx(GIL_CORE / 0.001)  # the lock caps one process
    released = host_cores(_trial([_row("preprocess-0", 10.0)], device_busy=0.05), service_pid=PID, pure_python=False)
    assert released.gil_s_per_request == 0 and released.processes == 1  # the fast tokenizer releasing it


def test_which_threads_hold_the_gil():
    assert gil_bound("preprocess-0", "naive")[0] and gil_bound("batcher")[0] and gil_bound("http-front")[0]
    assert not gil_bound("loader-worker-0")[0] and not gil_bound("model-executor (native)")[0]
    assert not gil_bound("preprocess-1", "fast", pure_python=False)[0]
    assert not gil_bound("model-executor", pure_python=False)[0] and gil_bound("model-executor")[0]


def test_rate_on_is_the_least_of_cores_gil_thread_and_device():
    hc = host_cores(_trial([_row("preprocess-0", 30.0), _row("loader-worker-0", 50.0, pid=7)], device_busy=0.01),
                    host_cores=1, service_pid=PID)
    assert hc.rate_on(1) == pytest.approx(1 / 0.008)  # 8 ms per request on one core
    assert hc.rate_on(100) == pytest.approx(1 / 0.005)  # the loader worker, one thread, 5 ms per request
    assert hc.rate_on(100, processes=100) == pytest.approx(hc.capacity)  # then the device


def test_unattributed_cpu_is_no_single_threads_limit_and_a_results_file_predicts_the_same():
    """``unattributed`` sums many short-lived threads: it adds to the cores' load, but it is not one thread
    capped at one core (before, 5 ms of it per request capped the prediction at 200 req/s on any cores)."""
    hc = host_cores(_trial([_row("preprocess-0", 10.0), _row("unattributed", 50.0)], device_busy=0.001),
                    host_cores=1, service_pid=PID)
    assert hc.rate_on(100) == pytest.approx(GIL_CORE / (0.001 * GIL_CROSS_CORE))  # the preprocess thread's GIL, not 1 / 5 ms
    assert hc.rate_on(1) == pytest.approx(1 / 0.006)  # both count on the cores
    assert hc.rate_on(1, other_cores=0.5) == pytest.approx(0.5 / 0.006)  # a polling client's half core
    back = HostCores.from_dict(json.loads(json.dumps(hc.to_dict())))
    for cores in (1, 2, 16):
        assert back.rate_on(cores) == pytest.approx(hc.rate_on(cores), rel=1e-3)


def test_the_sentence_says_cores_processes_and_busy_shares():
    hc = host_cores(_trial(ROWS, device_busy=0.28), host_cores=2, service_pid=PID)
    s = hc.say()
    assert s.startswith("this host's 2 cores keep the simulated h200-sxm-estimate 28% busy; about ")
    assert f"{hc.cores:.1f} cores (in {hc.processes} process" in s and "would keep it 70% busy" in s
    none = host_cores(_trial(ROWS, device_busy=math.nan), service_pid=PID)
    assert "not known" in none.say() and math.isnan(none.cores)


def test_needs_a_recorded_run_and_a_sane_target():
    with pytest.raises(ValueError, match="record=True"):
        host_cores(Trial(qps=1.0, p99_ms=1.0))
    with pytest.raises(ValueError, match="target_busy"):
        host_cores(_trial(ROWS), target_busy=1.5)


def test_the_investigate_what_if_carries_the_cores_needed(tmp_path):
    seen = []

    def measure(knobs, *, rate=None, record=False):
        seen.append(knobs.device)
        return _trial(ROWS, device_busy=0.2 if knobs.device == "sim" else math.nan)
    ladder = SimpleNamespace(objective="qps", capacity=None, recommended=preset("tuned"))
    inv = Investigation(tmp_path, True, {}, {}, {}, _trial(ROWS), None)
    lines = []
    _profile_and_what_if(inv, measure, preset("baseline"), ladder, SimpleNamespace(knob="cpu"), "h200-sxm-estimate",
                         False, lines.append)
    # the run under the recorder, the same in the baseline's closed loop (the ledger, like for like), then baseline
    # and recommended on the simulated device
    assert seen == ["auto", "auto", "sim", "sim"]
    cores = inv.what_if["host_cores"]
    assert set(cores) == {"baseline", "recommended"}
    assert cores["recommended"]["cores"] == pytest.approx(0.7 * 500 * host_cores(_trial(ROWS)).cpu_s_per_request,
                                                          rel=1e-3)
    assert cores["recommended"]["sentence"].startswith("recommended: this host's")  # said once, in the ending
    assert not any(line.startswith("what-if:") for line in lines)
    assert what_if_cores({"x": Trial(qps=1.0, p99_ms=1.0)}, "label") == {}  # no thread table: nothing to say


def test_gil_bound_cpu_costs_more_on_two_cores_than_on_one():
    """The GIL's hand-offs across cores: a 1-core run's GIL-bound CPU per request is scaled up for 2+ cores, a
    2-core run's down for 1 core; CPU that does not hold the GIL is not scaled (measured: 2 cores served the
    GIL-bound baseline no faster than 1, where the unscaled rule predicted 1.22x)."""
    rows = [_row("preprocess-0", 50.0), _row("loader-worker-0", 20.0, pid=7)]  # 5 ms GIL-bound, 2 ms not
    one = host_cores(_trial(rows, device_busy=0.001), host_cores=1, service_pid=PID)
    two = host_cores(_trial(rows, device_busy=0.001), host_cores=2, service_pid=PID)
    assert one.cross_core_scale(1) == two.cross_core_scale(2) == two.cross_core_scale(16) == 1.0
    assert one.cross_core_scale(2) == pytest.approx(GIL_CROSS_CORE) == 1 / two.cross_core_scale(1)
    assert one.rate_on(1) == pytest.approx(1 / 0.007)  # as measured
    assert one.rate_on(2) == pytest.approx(GIL_CORE / (0.005 * GIL_CROSS_CORE))  # the GIL, at its 2-core cost
    assert two.rate_on(1) == pytest.approx(1 / (0.005 / GIL_CROSS_CORE + 0.002))
    assert two.rate_on(2) == pytest.approx(GIL_CORE / 0.005)
    assert one.cores == pytest.approx(one.rate * (0.005 * GIL_CROSS_CORE + 0.002))  # many cores: the scaled CPU
    assert two.cores == pytest.approx(two.rate * 0.007)
    assert f"x{GIL_CROSS_CORE:.2f} of this single-core run's" in one.say() and "of this single-core run" not in two.say()
    back = HostCores.from_dict(json.loads(json.dumps(one.to_dict())))
    assert back.rate_on(2) == pytest.approx(one.rate_on(2), rel=1e-3) and one.to_dict()["gil_cross_core"] == GIL_CROSS_CORE
    d = one.to_dict()
    assert d["gil_ms_per_request_many_cores"] == pytest.approx(5 * GIL_CROSS_CORE) and d["gil_ms_per_request"] == 5
    other = HostCores.from_dict({**d, "gil_cross_core": 1.0})  # a file written with another factor keeps it
    assert other.rate_on(2) == pytest.approx(GIL_CORE / 0.005)
