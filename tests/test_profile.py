import importlib
import json
import math
import time
import warnings

import numpy as np
import pytest

from tests.cli_run import run_cli
from tests.fake_nvml import FakeNvml
from tuning.base.clock import FakeClock
from tuning.experiments.profiled import profile_pipeline
from tuning.knobs import Knobs
from tuning.offline.pipeline import Pipeline
from tuning.profile import GpuSampler, HostSampler, Recorder, Signals, busy_series, diagnose, op_stats

dg = importlib.import_module("tuning.profile.diagnose")


def test_gpu_sampler_reads_every_metric_from_nvml():
    fake = FakeNvml()
    with GpuSampler(0.1, nvml=fake) as sampler:
        pass  # a window's first and last readings are taken whatever the scheduler does: two per GPU
    frame = sampler.series.to_frame()
    assert sampler.series.available and len(frame) >= 4 and set(frame.gpu) == {0, 1}
    row = frame[frame.gpu == 1].iloc[0]
    assert (row.sm_util, row.mem_used_mb, row.mem_total_mb, row.power_w, row.power_limit_w) == (20, 2048, 8192, 140, 700)
    assert (row.sm_clock_mhz, row.temp_c, row.proc_sm_util) == (1980, 41, 7)  # only this process's utilization
    assert fake.shutdown
    assert sampler.series.summary()["power_frac_mean"] == pytest.approx(0.2)


def test_unsupported_metric_is_nan_not_invented():
    with GpuSampler(0.1, nvml=FakeNvml(devices=1, no_power=True)) as sampler:
        pass  # the first and the last reading
    frame = sampler.series.to_frame()
    assert len(frame) and frame.power_w.isna().all() and (frame.sm_util == 10).all()


@pytest.mark.parametrize("fake,needle", [
    (FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")), "NVML could not start"),
    (FakeNvml(devices=0), "no GPU"),
])
def test_no_nvml_or_no_gpu_warns_and_gives_an_empty_typed_series(fake, needle):
    with pytest.warns(RuntimeWarning, match=needle):
        with GpuSampler(0.1, nvml=fake) as sampler:
            pass
    frame = sampler.series.to_frame()
    assert not sampler.series.available and needle in sampler.series.reason
    assert frame.empty and frame.dtypes["sm_util"] == np.float64 and frame.dtypes["gpu"] == np.int64


def test_recorder_without_cuda_keeps_the_reason_without_a_warning(monkeypatch):
    """No CUDA in this process and no NVML given: no GPU is expected, so an absent NVML is not a warning (the
    notebooks' stderr stays clean); the reason is still in the GPU series. An injected NVML still warns."""
    import tuning.profile.recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "_cuda_available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with recorder_mod.Recorder(0.1, host=False) as rec:
            pass
    said = [str(w.message) for w in caught if "GPU sampling off" in str(w.message)]
    series = rec.gpu_sampler.series
    assert said == [] or series.available, said
    assert series.available or series.reason
    with pytest.warns(RuntimeWarning, match="no GPU"):
        with recorder_mod.Recorder(0.1, host=False, nvml=FakeNvml(devices=0)):
            pass


def test_real_environment_samples_the_gpu_or_says_why_not():
    """Rule (DESIGN.md): NVML missing or failing is one warning with the reason and an empty, typed series;
    with NVML and a GPU, samples. Whichever this machine is, exactly one of the two holds."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GpuSampler(0.1) as sampler:
            pass  # the first and the last reading, if there is a GPU
    series, frame = sampler.series, sampler.series.to_frame()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if series.available:
        assert len(frame) >= 1 and series.reason is None and said == []
    else:
        assert said == [f"GPU sampling off: {series.reason}"] and series.reason.startswith(("NVML could not start",
                                                                                            "no GPU"))
        assert frame.empty and frame.dtypes["sm_util"] == np.float64 and frame.dtypes["gpu"] == np.int64


def test_nvml_error_mid_run_warns_keeps_real_samples_and_stops():
    """The first reading succeeds and the next one fails, whether the scheduler gives the sampler a periodic
    reading before the window ends or only the last one at its end."""
    fake = FakeNvml(devices=1, fail_after=1)
    with pytest.warns(RuntimeWarning, match="NVML error mid-run after 1 samples"):
        with GpuSampler(0.1, nvml=fake) as sampler:
            pass
    assert len(sampler.series.to_frame()) == 1 and "GPU is lost" in sampler.series.reason
    assert fake.calls == 2  # no sampling after the failure


def test_sampler_interval_is_validated():
    with pytest.raises(ValueError, match="interval=0.01"):
        GpuSampler(0.01)


def test_host_sampler_sees_a_busy_named_thread():
    """The sampler attributes this process's CPU to the named thread that used it. On a shared machine the
    spinner gets whatever share of a core the others leave, so it spins for an amount of its own CPU time (not
    of wall time: a loaded machine stretches the window instead of emptying it) while this thread waits on it,
    and the checks are load-free: it is the busiest thread, it holds most of the process's CPU, and what it
    used plus what it waited for a free CPU (it is always runnable) is most of a core."""
    import threading

    from tuning.base.threads import name_this_thread

    def spin():
        name_this_thread("spinner")
        while time.thread_time() < 0.6:  # this thread's own CPU: several sampling intervals of it
            sum(range(1000))

    t = threading.Thread(target=spin)
    with HostSampler(0.1) as sampler:
        t.start()
        t.join()
    top = sampler.series.top_threads(3)
    spinner = top[0]
    assert spinner["name"] == "spinner" and spinner["cpu_mean"] > 0
    assert spinner["cpu_mean"] > 0.5 * sampler.series.summary()["cpu_percent_mean"]
    demand = spinner["cpu_mean"] + (spinner["wait_mean"] or 0.0)  # no schedstats: the CPU alone, as before
    assert demand > 40
    assert sampler.series.summary()["rss_mb_max"] > 10


def test_busy_series_with_fake_spans():
    clock = FakeClock()
    series = busy_series([(0.1, 0.3), (0.9, 1.4)], t0=clock(), t1=2.0, window_s=0.5)
    assert np.allclose(series.busy, [0.4, 0.2, 0.8, 0.0])
    assert list(series.to_frame().columns) == ["t", "busy"]


@pytest.mark.parametrize("signals,kind", [
    (Signals(model_busy=0.85, wait_for_input_share=0.05, batch_size_knob=1, dtype_knob="fp32"), "saturated"),
    (Signals(model_busy=0.25, wait_for_input_share=0.6, max_thread_cpu=99.0, max_thread_name="loader"), "starved"),
    (Signals(model_busy=0.25, wait_for_input_share=0.6, max_thread_cpu=5.0, disk_mb_s=200.0), "starved"),
    (Signals(model_busy=0.3, wait_for_input_share=0.5, max_thread_cpu=60.0, max_thread_name="loader-worker-0"),
     "starved"),
    (Signals(model_busy=0.3, wait_for_input_share=0.1, median_span_ms=1.2, mean_batch=1.0), "fragmented"),
    (Signals(model_busy=0.4, wait_for_input_share=0.1, median_span_ms=20.0, mean_batch=8.0, launch_share=0.5),
     "fragmented"),
    (Signals(model_busy=0.05, wait_for_input_share=0.9, max_thread_cpu=3.0, disk_mb_s=0.0), "blocked"),
    (Signals(model_busy=0.1, wait_for_input_share=0.1, max_thread_cpu=3.0, mean_batch=16.0), "blocked"),
])
def test_diagnosis_classes_from_synthetic_signals(signals, kind):
    d = diagnose(signals)
    assert d.kind == kind and d.reasons and d.next_step
    assert d.evidence["model_busy"] == pytest.approx(signals.model_busy)


def test_diagnosis_thresholds_are_named_constants():
    assert dg.SATURATED_BUSY == 0.70 and dg.STARVED_WAIT_SHARE == 0.30
    just_under = Signals(model_busy=dg.SATURATED_BUSY - 0.01, wait_for_input_share=dg.STARVED_WAIT_SHARE,
                         max_thread_cpu=dg.PEGGED_THREAD_CPU)
    assert diagnose(just_under).kind == "starved"
    assert diagnose(Signals(model_busy=dg.SATURATED_BUSY, wait_for_input_share=0.9)).kind == "saturated"


def _slow_formatter(record):
    t_end = time.perf_counter() + 0.03  # a CPU-bound custom preprocess: 30 ms of Python per record
    while time.perf_counter() < t_end:
        pass
    return record.title


def test_a_starved_configuration_is_classified_starved():
    """A 30 ms CPU-bound formatter feeding a model that costs nothing: the model waits for input almost all
    the time and the formatting thread wants a whole core (CPU plus run-queue wait on a shared machine), so
    the verdict is starved however loaded the machine is (the real model's time grew with the load and
    could outweigh the formatter's fixed wall time)."""
    from tests.helpers import TinyModel

    pipeline = Pipeline(Knobs(num_workers=0, batch_size=8, tokenizer="fast"), model=TinyModel(),
                        formatter=_slow_formatter)
    profile = profile_pipeline(pipeline.knobs, limit=64, interval=0.1, pipeline=pipeline, with_ops=False,
                               nvml=FakeNvml(devices=1))
    assert profile.diagnosis.kind == "starved", profile.diagnosis
    assert profile.signals.wait_for_input_share > 0.5
    assert "num_workers" in profile.diagnosis.next_step
    assert len(profile.to_frame("gpu")) > 0 and len(profile.to_frame("requests")) == 64
    busy = profile.to_frame("busy")
    assert len(busy) and busy.busy.max() <= 1.0 and busy.t.iloc[0] == 0.0
    with pytest.raises(ValueError, match="signal='nope'"):
        profile.to_frame("nope")


def test_op_stats_on_cpu():
    import torch

    from tuning.runtime.model import random_minilm

    stats = op_stats(random_minilm(), torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long), batches=2)
    s = stats.summary()
    assert s["device"] == "cpu" and s["batches"] == 2 and s["batch_shape"] == [2, 16]
    assert s["ops_per_batch"] > 50 and s["kernels_per_batch"] == 0 and s["launches_per_batch"] == s["ops_per_batch"]
    assert len(stats.durations_us) == 2 * stats.ops_per_batch and s["launch_cost_us"] > 0
    assert s["top_ops"][0]["name"].startswith("aten::") and len(stats.to_frame()) == len(stats.durations_us)


def _event(name, us, device="cpu", parent=None):
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    return SimpleNamespace(name=name, device_type=DeviceType.CUDA if device == "cuda" else DeviceType.CPU,
                           cpu_parent=parent, cpu_time_total=us,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_op_stats_from_known_events_on_cpu():
    """Op statistics from injected profiler events: per-batch counts, short share, launch budget and share."""
    from tuning.profile.ops import stats_from_events

    events = [_event("aten::linear", us) for us in (5.0, 5.0, 20.0, 30.0)] + [_event("aten::relu", 2.0)] * 2 + [
        _event("aten::mm", 99.0, parent="linear"),  # a child: counted in its parent
        _event("cudaLaunchKernel", 1.0), _event("ProfilerStep", 7.0)]  # not an aten operator
    stats = stats_from_events(events, batches=2, batch_shape=(4, 32), device="cpu", wall_ms=0.6, launch_cost_us=50.0)
    s = stats.summary()
    assert (s["ops_per_batch"], s["kernels_per_batch"], s["launches_per_batch"]) == (3.0, 0.0, 3.0)
    assert (s["busy_ms_per_batch"], s["wall_ms_per_batch"]) == (0.3, 0.3)
    assert s["short_share"] == 4 / 6 and s["launch_overhead_ms"] == 0.15 and s["launch_share"] == 0.5
    assert s["top_ops"] == [{"name": "aten::linear", "calls_per_batch": 2.0, "total_us_per_batch": 30.0,
                             "median_us": 12.5},
                            {"name": "aten::relu", "calls_per_batch": 1.0, "total_us_per_batch": 2.0, "median_us": 2.0}]


def test_op_stats_launch_share_on_cuda_is_bounded_by_the_time_outside_kernels():
    """On CUDA the launch budget counts host launch calls, and capture cannot save time the device computes:
    min(launches x cost, wall - kernel time) / wall."""
    from tuning.profile.ops import stats_from_events

    events = ([_event("aten::linear", 40.0)] * 2 + [_event("cudaLaunchKernel", 3.0)] * 8
              + [_event("sgemm", 150.0, device="cuda")] * 2)
    stats = stats_from_events(events, batches=2, batch_shape=(1, 16), device="cuda", wall_ms=1.0, launch_cost_us=100.0)
    assert (stats.host_launches_per_batch, stats.kernels_per_batch, stats.busy_ms_per_batch) == (4.0, 1.0, 0.15)
    # 4 launches x 100 us = 0.4 ms, but only 0.5 - 0.15 ms per batch is outside kernels: 0.35 / 0.5
    assert stats.launch_overhead_ms == 0.4 and stats.launch_share == pytest.approx(0.7)
    assert stats.top_ops[0]["name"] == "sgemm" and stats.short_share == 0.0
    no_wall = stats_from_events(events, batches=2, batch_shape=(1, 16), device="cuda", wall_ms=0.0, launch_cost_us=1.0)
    assert math.isnan(no_wall.launch_share)


def test_recorder_one_clock_and_joined_result():
    pipeline = Pipeline(Knobs(num_workers=1, batch_size=4, tokenizer="fast"))
    pipeline.warmup()
    with Recorder(0.1, nvml=FakeNvml(devices=1)) as rec:
        result = pipeline.run(limit=40)
    profile = rec.join(result)
    assert rec.t_start <= result.t_start and result.t_end <= rec.t_end
    threads = profile.to_frame("threads")
    assert "loader-worker-0" in set(threads.name)
    assert not math.isnan(profile.signals.process_cpu)
    summary = profile.summary()
    assert summary["gpu"]["available"]
    assert summary["diagnosis"] == diagnose(profile.signals).as_dict()  # the verdict on the joined signals
    assert profile.signals.mean_batch == 4.0 and profile.signals.batch_size_knob == 4  # 40 records in batches of 4


@pytest.mark.slow
def test_cli_profile_json():
    out = run_cli("profile", "--preset", "tuned", "--limit", "48", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout[out.stdout.index("{"):])
    assert {"diagnosis", "threads", "gpu", "model_busy", "stages"} <= set(data)
    assert set(data["diagnosis"]) >= {"kind", "evidence", "next_step"}
    assert set(data["gpu"]) >= {"available", "reason"}
    assert data["threads"] and data["stages"]["inference"]["p50_ms"] > 0
