"""watch: a running service seen from outside (per-thread CPU, memory, the GPU's NVML series), under
optional load, with a diagnosis limited to what can be seen and a list of what cannot."""

import json
import math
import os

import pytest

from tests.cli_run import run_cli
from tuning.experiments.watch import ServiceProcess
from tuning.profile.gpu import GpuSampler
from tuning.profile.outside import OutsideSignals, cannot_see, diagnose_outside

from .fake_nvml import FakeNvml

BASE = dict(process_cpu=60.0, cpu_capacity=800.0, max_thread_cpu=20.0, max_thread_name="worker", disk_mb_s=0.0,
            load_driven=True)
GPU = dict(gpu_available=True, gpu_util_mean=12.0, gpu_util_max=30.0, gpu_gap_share=0.5, gpu_power_frac=0.2)


@pytest.mark.parametrize("signals,kind,needle", [
    ({**GPU, "max_thread_cpu": 98.0, "max_thread_name": "preprocess"}, "starved", "thread 'preprocess' at 98%"),
    (GPU, "starved", "heartbeat: peaks to 30%"),
    ({**GPU, "gpu_util_max": 14.0, "gpu_gap_share": 0.0}, "blocked", "no thread at 50%"),
    ({**GPU, "gpu_util_mean": 92.0, "gpu_power_frac": 0.2}, "fragmented", "power only 20%"),
    ({**GPU, "gpu_util_mean": 92.0, "gpu_power_frac": 0.8}, "saturated", "GPU utilization 92%"),
    ({"process_cpu": 700.0}, "saturated", "the CPU is full"),
    ({"max_thread_cpu": 99.0, "max_thread_name": "batcher"}, "single-threaded", "thread 'batcher' at 99%"),
    ({"disk_mb_s": 300.0, "max_thread_cpu": 60.0}, "starved", "reading is slow"),
    ({}, "blocked", "no thread at 50%"),
    ({"max_thread_cpu": 60.0, "busy_threads": 2}, "inconclusive", "none pegged"),
    ({"load_driven": False}, "idle", "no load driven"),
    ({"machine_cpu": 0.97}, "contended", "other processes compete"),
    ({"model_busy": 0.95, "machine_cpu": 0.97}, "saturated", "model call is busy 95%"),
    ({**GPU, "model_busy": 0.9}, "fragmented", "host side of the call"),
    # the LitServe trial: 100% of requests HTTP 500 read CONTENDED; the error rate decides first
    ({"machine_cpu": 0.97, "error_rate": 1.0, "first_error": "error: HTTP 500: KeyError 'input'"}, "failing",
     "100.0% of the requests failed (commonest: error: HTTP 500"),
    ({"process_cpu": 700.0, "error_rate": 0.01}, "saturated", "1.00% of the requests failed"),
    ({"client_cpu": 0.97}, "client-bound", "the load client's loop used 97% of a core"),
    ({"client_cpu": 0.97, "process_cpu": 700.0}, "saturated", "the CPU is full"),
    # a service's own metrics (TEI, Triton): requests queue while batches stay at one
    ({"metrics_exporter": "tei", "server_mean_batch": 1.0, "server_queue_ms": 20.0, "server_inference_ms": 5.0},
     "fragmented", "nothing batches the queue"),
    ({"metrics_exporter": "tei", "server_mean_batch": 12.0, "server_queue_ms": 20.0, "server_inference_ms": 5.0},
     "blocked", "the server's own metrics (tei): mean batch 12.0, queue wait 20.0 ms, inference 5.0 ms"),
])
def test_outside_verdicts_follow_the_investigations_rules(signals, kind, needle):
    d = diagnose_outside(OutsideSignals(**{**BASE, **signals}))
    assert d.kind == kind and any(needle in r for r in d.reasons), (d.kind, d.reasons)
    assert any("per-request stage times" in c for c in d.cannot_see), "says what it cannot see"


def test_what_cannot_be_seen_depends_on_what_was_seen():
    no_gpu = cannot_see(OutsideSignals(**BASE, gpu_reason="NVML could not start"))
    assert any("the accelerator: NVML could not start" in c for c in no_gpu)
    assert any("model busy" in c for c in no_gpu), "a load without tuning's /metrics: model busy unseen"
    gpu = cannot_see(OutsideSignals(**{**BASE, **GPU}, model_busy=0.4))
    assert any("own share of the GPU" in c for c in gpu) and not any("model busy" in c for c in gpu)
    assert any("no load was driven" in c for c in cannot_see(OutsideSignals(**{**BASE, "load_driven": False})))


def test_gpu_sampler_reports_another_processs_own_utilization():
    with GpuSampler(0.1, nvml=FakeNvml(devices=1), pid=1) as sampler:
        pass  # the window's first and last readings
    assert sampler.series.samples and all(s.proc_sm_util == 50 for s in sampler.series.samples)
    with GpuSampler(0.1, nvml=FakeNvml(devices=1), pid=999_999) as sampler:
        pass
    assert all(math.isnan(s.proc_sm_util) for s in sampler.series.samples)


def test_watch_refuses_a_missing_process():
    out = run_cli("watch", "--pid", "999999", "--duration", "1")
    assert out.returncode == 2 and "--pid 999999: no such process" in out.stderr, out.stderr


@pytest.fixture
def service():
    """`python -m tuning serve` on a free loopback port, in its own process; stopped by pid at the end."""
    with ServiceProcess(sets={"dtype": "fp32"}, duration_s=300) as svc:
        yield svc.pid, svc.url


@pytest.mark.slow
def test_watch_a_separate_serve_process_under_load(service):
    pid, base = service
    out = run_cli("watch", "--pid", str(pid), "--url", f"{base}/embed",
                  "--concurrency", "4", "--duration", "1.5", "--interval", "0.25", "--limit", "200", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    assert s["pid"] == pid and "tuning" in s["command"]
    names = {t["name"] for t in s["threads"]} | {r["name"] for r in s["frames"]["threads"]}
    assert {"model-executor", "batcher"} <= names, names  # the service's own thread names, seen from outside
    assert s["host"]["rss_mb_max"] > 50 and s["frames"]["trend"] and s["frames"]["host"]
    load = s["load"]
    assert load["ok"] > 0 and load["submitted"] == load["ok"] + load["errors"] + load["timeouts"] + load["rejected"]
    assert load["model_busy"] is not None, "tuning's own /metrics gives model busy"
    d = s["diagnosis"]
    assert d["kind"] in ("saturated", "fragmented", "starved", "contended", "single-threaded", "blocked", "inconclusive",
                         "client-bound")
    assert d["reasons"] and any("per-request stage times" in c for c in d["cannot_see"])
    if not s["gpu"]["available"]:
        assert any(c.startswith("the accelerator:") for c in d["cannot_see"])
    text = run_cli("watch", "--pid", str(pid), "--duration", "1",
                   "--interval", "0.25")
    assert text.returncode == 0, text.stderr[-2000:]
    assert "threads by CPU" in text.stdout and "diagnosis from outside" in text.stdout
    assert "not visible from outside" in text.stdout
    print(text.stdout)


class _NvmlWithProcesses(FakeNvml):
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        from types import SimpleNamespace

        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=2**30), SimpleNamespace(pid=1, usedGpuMemory=2**31)]


def test_watch_reads_the_gpu_series_and_the_processs_own_share_through_nvml():
    from tuning import watch_service

    result = watch_service(os.getpid(), duration_s=0.6, interval=0.1, nvml=_NvmlWithProcesses(devices=1))
    gpu = result.to_frame("gpu")
    assert result.gpu.available and len(gpu) >= 3 and (gpu.proc_sm_util == 7).all() and (gpu.sm_util == 10).all()
    assert result.process_gpu_mb == {0: 1024.0}
    s = result.summary()
    assert s["frames"]["trend"][0]["gpu_util_pct"] == 10 and s["gpu"]["process_memory_mb"] == {"0": 1024.0}
    assert result.signals.gpu_util_mean == 10 and result.signals.process_gpu_mb == 1024.0
    assert result.diagnosis.kind in ("idle", "blocked", "starved", "contended")
    assert not any("own share of the GPU" in c for c in result.diagnosis.cannot_see)
