import json
import math
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from tests.fake_nvml import FakeNvml
from tuning.clock import FakeClock
from tuning.knobs import Knobs
from tuning.pipeline import Pipeline
from tuning.profile import GpuSampler, HostSampler, Recorder, Signals, busy_series, diagnose, op_stats, profile_pipeline
import importlib

dg = importlib.import_module("tuning.profile.diagnose")


def test_gpu_sampler_reads_every_metric_from_nvml():
    fake = FakeNvml()
    with GpuSampler(0.1, nvml=fake) as sampler:
        time.sleep(0.35)
    frame = sampler.series.to_frame()
    assert sampler.series.available and len(frame) >= 4 and set(frame.gpu) == {0, 1}
    row = frame[frame.gpu == 1].iloc[0]
    assert (row.sm_util, row.mem_used_mb, row.mem_total_mb, row.power_w, row.power_limit_w) == (20, 2048, 8192, 140, 700)
    assert (row.sm_clock_mhz, row.temp_c, row.proc_sm_util) == (1980, 41, 7)  # only this process's utilization
    assert fake.shutdown
    assert sampler.series.summary()["power_frac_mean"] == pytest.approx(0.2)


def test_unsupported_metric_is_nan_not_invented():
    with GpuSampler(0.1, nvml=FakeNvml(devices=1, no_power=True)) as sampler:
        time.sleep(0.15)
    frame = sampler.series.to_frame()
    assert len(frame) and frame.power_w.isna().all() and (frame.sm_util == 10).all()


@pytest.mark.parametrize("fake,needle", [
    (FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")), "NVML could not start"),
    (FakeNvml(devices=0), "no GPU"),
])
def test_no_nvml_or_no_gpu_warns_and_gives_an_empty_typed_series(fake, needle):
    with pytest.warns(RuntimeWarning, match=needle):
        with GpuSampler(0.1, nvml=fake) as sampler:
            time.sleep(0.05)
    frame = sampler.series.to_frame()
    assert not sampler.series.available and needle in sampler.series.reason
    assert frame.empty and frame.dtypes["sm_util"] == np.float64 and frame.dtypes["gpu"] == np.int64


def test_real_environment_without_gpu_does_not_crash():
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with GpuSampler(0.1) as sampler:
            time.sleep(0.05)
    assert sampler.series.available or sampler.series.reason


def test_nvml_error_mid_run_warns_keeps_real_samples_and_stops():
    fake = FakeNvml(devices=1, fail_after=2)
    with pytest.warns(RuntimeWarning, match="NVML error mid-run after 2 samples"):
        with GpuSampler(0.1, nvml=fake) as sampler:
            time.sleep(0.5)
    assert len(sampler.series.to_frame()) == 2 and "GPU is lost" in sampler.series.reason
    assert fake.calls == 3  # no sampling after the failure


def test_sampler_interval_is_validated():
    with pytest.raises(ValueError, match="interval=0.01"):
        GpuSampler(0.01)


def test_host_sampler_sees_a_busy_named_thread():
    import threading

    from tuning.profile.threads import name_this_thread

    stop = threading.Event()

    def spin():
        name_this_thread("spinner")
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin)
    with HostSampler(0.1) as sampler:
        t.start()
        time.sleep(0.8)
        stop.set()
        t.join()
    top = sampler.series.top_threads(3)
    assert top[0]["name"] == "spinner" and top[0]["cpu_mean"] > 40
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
    pipeline = Pipeline(Knobs(num_workers=0, batch_size=8, tokenizer="fast"), formatter=_slow_formatter)
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

    from tuning.model import random_minilm

    stats = op_stats(random_minilm(), torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long), batches=2)
    s = stats.summary()
    assert s["device"] == "cpu" and s["ops_per_batch"] > 50 and s["kernels_per_batch"] == 0
    assert 0 <= s["short_share"] <= 1 and s["launch_cost_us"] > 0
    assert s["launch_overhead_ms"] == pytest.approx(stats.ops_per_batch * stats.launch_cost_us / 1000)
    assert s["top_ops"] and len(stats.to_frame()) == len(stats.durations_us)


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
    assert summary["gpu"]["available"] and summary["diagnosis"]["kind"] in dg.KINDS


def test_cli_profile_json():
    out = subprocess.run([sys.executable, "-m", "tuning", "profile", "--preset", "tuned", "--limit", "48", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout[out.stdout.index("{"):])
    assert {"diagnosis", "threads", "gpu", "model_busy", "stages"} <= set(data)
    assert set(data["diagnosis"]) >= {"kind", "evidence", "next_step"}
    assert set(data["gpu"]) >= {"available", "reason"}
    assert data["threads"] and data["stages"]["inference"]["p50_ms"] > 0
