"""watch: a running service seen from outside (per-thread CPU, memory, the GPU's NVML series), under
optional load, with a diagnosis limited to what can be seen and a list of what cannot."""

import json
import math
import os
import socket
import time

import pytest

from tests.cli_run import run_cli
from tests.standin_services import StandIn
from tuning.base.net import is_local_host, listening_pid
from tuning.experiments.watch import ServiceProcess, watch_subject
from tuning.profile.gpu import GpuSampler
from tuning.profile.outside import NO_PROCESS, STAGES, OutsideSignals, cannot_see, diagnose_outside

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


TRITON = dict(metrics_exporter="triton", server_mean_batch=4.9, server_queue_ms=80.2, server_inference_ms=137.1)


def test_not_visible_is_computed_from_what_was_read():
    """#50: with Triton's metrics giving a mean batch, "batch sizes per model call" was listed as not visible
    while that mean batch was printed."""
    bare = cannot_see(OutsideSignals(**BASE))
    assert any(c.startswith("batch sizes per model call") for c in bare)
    assert any(c.startswith("per-request stage times (read, preprocess, queue wait, inference, postprocess)")
               for c in bare)
    triton = cannot_see(OutsideSignals(**BASE, **TRITON))
    assert not any("batch sizes" in c for c in triton), triton
    assert any(c.startswith("kernel launch overhead") for c in triton)
    stages = next(c for c in triton if c.startswith("per-request stage times"))
    assert stages.startswith("per-request stage times (read, preprocess, postprocess)")  # queue and inference read
    # this package's own server: each answer carries its stage times and its batch; its metrics its model busy
    own = cannot_see(OutsideSignals(**BASE, stages_seen=STAGES, answer_mean_batch=3.0, model_busy=0.5))
    assert not any(c.startswith(("per-request stage times", "batch sizes", "whether the model waited")) for c in own)


def test_without_a_process_its_signals_are_listed_with_the_reason():
    remote = cannot_see(OutsideSignals(load_driven=True, process_reason=NO_PROCESS, **TRITON))
    assert f"per-thread CPU, memory, disk and GPU share of the service: {NO_PROCESS}" in remote
    assert not any("own share of the GPU" in c for c in cannot_see(OutsideSignals(**BASE, **GPU, process_reason="x")))
    assert not any(c.startswith("per-thread CPU") for c in cannot_see(OutsideSignals(**BASE)))


@pytest.mark.parametrize("signals,kind", [
    ({}, "inconclusive"),  # was "blocked: no thread at 50%" with no thread read at all
    ({**GPU, "gpu_util_max": 14.0, "gpu_gap_share": 0.0}, "inconclusive"),
    ({**GPU, "gpu_util_mean": 92.0, "gpu_power_frac": 0.8}, "saturated"),  # the GPU decides without a process
    ({"metrics_exporter": "tei", "server_mean_batch": 1.0, "server_queue_ms": 20.0, "server_inference_ms": 5.0},
     "fragmented"),  # the server's own metrics decide
    ({"error_rate": 1.0, "first_error": "error: HTTP 404"}, "failing"),
])
def test_without_a_process_no_verdict_rests_on_threads(signals, kind):
    d = diagnose_outside(OutsideSignals(load_driven=True, cpu_capacity=800.0, process_reason=NO_PROCESS, **signals))
    assert d.kind == kind, (d.kind, d.reasons)
    if kind == "inconclusive":
        assert any(NO_PROCESS in r for r in d.reasons) and "--pid" in d.next_step


def test_listening_pid_finds_the_process_listening_on_a_local_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listening_pid(f"http://127.0.0.1:{port}/embed") == os.getpid()
        assert listening_pid(f"http://localhost:{port}/embed") == os.getpid()
        assert listening_pid(f"http://203.0.113.7:{port}/embed") is None  # TEST-NET-3: not this machine
    assert listening_pid(f"http://127.0.0.1:{port}/embed") is None  # nothing listens there now
    assert is_local_host("127.0.0.2") and is_local_host("::1") and not is_local_host("203.0.113.7")


def test_a_remote_url_is_watched_without_a_process():
    subject = watch_subject(None, "http://203.0.113.7:8000/embed")
    assert (subject.pid, subject.local, subject.process_reason) == (None, False, NO_PROCESS)
    assert watch_subject(os.getpid(), "http://203.0.113.7:8000/embed").pid == os.getpid()  # a pid given is used


def test_watch_needs_a_pid_or_a_url():
    out = run_cli("watch", "--duration", "1")
    assert out.returncode == 2 and "--pid" in out.stderr and "--url" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def standin():
    with StandIn() as url:
        yield url


def test_watch_by_url_finds_the_local_listener(standin):
    """The stand-in TEI listens in this process: watched by URL alone, this process is found from its port."""
    port = standin.rsplit(":", 1)[1]
    out = run_cli("watch", "--url", standin, "--api", "tei", "--duration", "0.5", "--interval", "0.1",
                  "--concurrency", "2", "--limit", "10", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    assert s["pid"] == os.getpid() and s["pid_from"] == f"listening port {port}" and s["process_reason"] is None
    assert s["frames"]["host"] and not any(c.startswith("per-thread CPU") for c in s["diagnosis"]["cannot_see"])


def test_watch_by_url_of_a_remote_service_drives_load_and_says_what_it_lacked(standin, monkeypatch):
    """A host that is not this machine (the stand-in's loopback address taken as remote): no process sampled,
    no GPU of this machine taken for the service's, the load and the server's own metrics still read."""
    import tuning.experiments.watch as watch_module

    monkeypatch.setattr(watch_module, "is_local_host", lambda host: False)
    out = run_cli("watch", "--url", standin, "--api", "tei", "--duration", "0.5", "--interval", "0.1",
                  "--concurrency", "2", "--limit", "10", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    assert s["pid"] is None and s["pid_from"] is None and s["process_reason"] == NO_PROCESS
    assert s["threads"] == [] and s["frames"]["host"] == [] and s["frames"]["threads"] == []
    assert not s["gpu"]["available"] and "another host" in s["gpu"]["reason"]
    assert s["load"]["ok"] > 0 and s["server_metrics"]["exporter"] == "tei"
    d = s["diagnosis"]
    assert f"per-thread CPU, memory, disk and GPU share of the service: {NO_PROCESS}" in d["cannot_see"]
    assert not any("batch sizes" in c for c in d["cannot_see"]), "TEI's metrics gave the mean batch"
    assert d["kind"] == "inconclusive" and any(NO_PROCESS in r for r in d["reasons"])
    text = run_cli("watch", "--url", standin, "--api", "tei", "--duration", "0.3", "--limit", "10")
    assert text.returncode == 0 and "no local process" in text.stdout, text.stderr[-2000:]


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
    assert d["reasons"] and not any(c.startswith("batch sizes") for c in d["cannot_see"]), "its answers say their batch"
    if not s["gpu"]["available"]:
        assert any(c.startswith("the accelerator:") for c in d["cannot_see"])
    by_url = run_cli("watch", "--url", f"{base}/embed", "--concurrency", "2", "--duration", "1", "--interval", "0.25",
                     "--limit", "50", "--json")  # no --pid: found from the listening port
    assert by_url.returncode == 0, by_url.stderr[-2000:]
    u = json.loads(by_url.stdout)
    assert u["pid"] == pid and u["pid_from"] == f"listening port {base.rsplit(':', 1)[1]}" and u["frames"]["host"]
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


@pytest.mark.parametrize("forwarder", ["docker-proxy", "kubectl", "ssh", "socat"])
def test_a_port_forwarder_is_not_watched_as_the_service(monkeypatch, forwarder):
    """``kubectl port-forward``, ``ssh -L`` or ``socat`` listening on the port: their threads are not the
    service's, so no process is sampled and the reason names the forwarder."""
    from tuning.experiments import watch as watch_mod

    monkeypatch.setattr(watch_mod, "listening_pid", lambda url: 4242)
    monkeypatch.setattr(watch_mod, "_visible_command", lambda pid: f"{forwarder}: {forwarder} -L 8080:svc:80")
    subject = watch_subject(None, "http://127.0.0.1:8080/embed")
    assert subject.pid is None and f"forwarded by {forwarder} (pid 4242)" in subject.process_reason


def test_a_command_line_with_empty_arguments_is_described_without_their_padding():
    """A process that retitles itself (Ray's ``ray::ProxyActor``, setproctitle) keeps its old argv slots as empty
    arguments: they are not printed as a run of spaces."""
    import subprocess
    import sys

    import psutil

    from tuning.experiments.watch import describe_process

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *[""] * 200],
                            stdin=subprocess.PIPE)
    try:
        child = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while "-c" not in child.cmdline() and time.monotonic() < deadline:  # until the child has exec'd
            time.sleep(0.01)
        text = describe_process(proc.pid)
    finally:
        proc.communicate(b"")
    assert text.endswith(f"{sys.executable} -c import sys; sys.stdin.read()"), repr(text)


UNREAD = "no metrics of a known exporter (tuning_*, te_*, nv_*)"


def test_the_metrics_url_hint_appears_only_when_none_was_given():
    """#60: with --metrics-url given and read (an exporter none of the known ones), the diagnosis still said
    "pass --metrics-url"."""
    hinted = cannot_see(OutsideSignals(**BASE, metrics_reason=UNREAD))
    assert any("pass --metrics-url" in c for c in hinted)
    given = cannot_see(OutsideSignals(**BASE, metrics_reason=UNREAD, metrics_url_given=True))
    assert not any("pass --metrics-url" in c for c in given), given
    assert any(f"the server's own queue, batch and inference times: {UNREAD} at --metrics-url" in c for c in given)
    for signals in ({}, {"metrics_url_given": True}):
        d = diagnose_outside(OutsideSignals(**BASE, process_reason=NO_PROCESS, metrics_reason=UNREAD, **signals))
        assert ("pass --metrics-url" in d.next_step) is not signals, d.next_step


def test_watch_with_a_metrics_url_given_does_not_ask_for_one(standin):
    out = run_cli("watch", "--url", standin, "--api", "tei", "--metrics-url", standin.rstrip("/") + "/no-metrics-here",
                  "--duration", "0.5", "--interval", "0.1", "--concurrency", "2", "--limit", "10", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)["diagnosis"]["cannot_see"]
    assert not any("pass --metrics-url" in c for c in seen), seen
    assert any(c.startswith("the server's own queue, batch and inference times") and "--metrics-url" in c
               for c in seen), seen


def test_the_busiest_thread_is_one_thread_not_the_sum_of_those_sharing_its_name():
    """#60: Infinity's two busiest threads, both "infinity_emb" at 48% and 40%, showed as "infinity_emb 100%"."""
    from tuning.experiments.watch import WatchResult
    from tuning.profile.gpu import GpuSeries
    from tuning.profile.host import HostSample, HostSeries, ThreadSample

    host = HostSeries(samples=[HostSample(t, 90.0, 100.0, 0.0, 0.0, 0) for t in (1.0, 2.0)],
                      threads=[ThreadSample(t, 7, tid, "infinity_emb", cpu, start=tid)
                               for t in (1.0, 2.0) for tid, cpu in ((11, 48.0), (12, 40.0))])
    result = WatchResult(7, "infinity_emb", 1.0, host, GpuSeries(False, "none"), 0.0, 2.0)
    assert result.trend_frame()["busiest_thread"].tolist() == ["infinity_emb 48%"] * 2


def test_a_port_held_by_one_part_of_a_service_is_watched_as_the_whole_service(tmp_path):
    """Issue 60: Ray Serve's proxy holds the port while the replica, its sibling under the same script, does the
    work; `watch --url` followed the port to the proxy and read the replica as other processes competing. The
    port's process is climbed to the service's top process (not past a shell or this process), and its tree
    is watched."""
    import subprocess
    import sys

    port_file = tmp_path / "port"
    child = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
             f"open({str(port_file)!r}, 'w').write(str(s.getsockname()[1])); time.sleep(120)")
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        holder = listening_pid(f"http://127.0.0.1:{port}/")
        assert holder is not None and holder != proc.pid
        subject = watch_subject(None, f"http://127.0.0.1:{port}/")
        assert subject.pid == proc.pid, (subject, holder)
        assert f"(pid {holder}:" in subject.pid_from and f"under pid {proc.pid}" in subject.pid_from
    finally:
        import psutil

        for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            p.kill()
        proc.wait()


def test_the_climb_stops_at_a_shell_at_a_runner_and_at_this_process(tmp_path):
    """Review: the climb went through any parent (an IDE's java, a Procfile runner). It goes only through the
    Python script that started the port's process (or Ray's raylet), never a shell, a runner or this process."""
    import subprocess
    import sys

    from tuning.load.proctree import _part_of_service, service_root

    assert service_root(os.getpid()) == os.getpid()  # its parents are this process's own: never climbed
    marker = tmp_path / "ready"
    script = tmp_path / "svc.py"
    script.write_text(f"import time\nopen({str(marker)!r}, 'w').close()\ntime.sleep(60)\n")
    proc = subprocess.Popen(["bash", "-c", f"{sys.executable} {script}; true"])  # "; true": bash forks, not execs
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        import psutil

        (child,) = psutil.Process(proc.pid).children()
        assert service_root(child.pid) == child.pid  # bash started it and is not part of it
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()

    class Proc:
        def __init__(self, name, cmdline):
            self._name, self._cmdline = name, cmdline

        def name(self):
            return self._name

        def cmdline(self):
            return self._cmdline

    assert _part_of_service(Proc("python3", ["python3", "/srv/pytriton_server.py", "--port", "8000"]))
    assert _part_of_service(Proc("raylet", ["/ray/core/src/ray/raylet/raylet", "--node_ip_address=1"]))
    assert not _part_of_service(Proc("python3", ["python3", "/usr/bin/honcho", "start"]))
    assert not _part_of_service(Proc("python", ["python", "-m", "ipykernel_launcher", "-f", "k.json"]))
    assert not _part_of_service(Proc("java", ["java", "-jar", "pycharm.jar"]))
