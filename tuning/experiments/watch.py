"""Watch a running service from outside: ``python -m tuning watch [--pid PID] [--url URL ...]``.

The investigation's first step (``nvidia-smi -l`` and ``top -H -p PID`` during a load test) for any
process: per-thread CPU with names, memory and disk of that process (and its children), the GPU's NVML
series with that process's own utilization where NVML gives it, optionally while driving load at its
URL from this process; then trend tables and a diagnosis from what can be seen from outside
(:mod:`tuning.profile.outside`), which says what it could not see.

Given a URL and no pid, the process listening on the URL's port is watched when the URL's host is this
machine and that process is visible to this user; otherwise (a remote host, a container, another user's
process) no process is sampled and the watch drives the load, reads the server's metrics (and NVML when
the host is this machine) and says what it lacked.
"""

from __future__ import annotations

import math
import threading
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import psutil

from tuning.base import clock as _clock
from tuning.base.machine import RESERVED_CORES_ENV, reserved_cores
from tuning.base.net import is_local_host, listening_pid, url_host_port
from tuning.load.proctree import service_root
from tuning.load.scrape import MetricsProbe, ServerMetrics, mapping_of
from tuning.load.scrape import metrics_url as _metrics_url
from tuning.profile.gpu import GpuSampler, GpuSeries
from tuning.profile.host import HostSampler, HostSeries
from tuning.profile.outside import NO_PROCESS, OutsideDiagnosis, OutsideSignals, diagnose_outside, outside_signals

MAX_TREND_ROWS = 20
NO_PID = -1  # the GPU sampler's pid when no process is watched: NVML's per-process figures then match none
# processes that listen on a port only to forward it into a container: watching them is not watching the service
PORT_FORWARDERS = ("docker-proxy", "rootlessport", "slirp4netns", "pasta", "conmon", "kubectl", "ssh", "socat")


def url_target(url: str, api: Any = None) -> Callable[[Any], Any]:
    """POST each input to ``url``; an input that cannot be a request (a :class:`~tuning.inputs.records.RecordError`,
    a bad row of the data) is its own error outcome with its reason, without being sent."""
    from tuning.inputs.records import RecordError
    from tuning.load.generator import http_target
    from tuning.online.response import Response

    send = http_target(url, timeout_s=api.timeout_s if api is not None else 60.0, api=api)

    def target(raw: Any) -> Any:
        if isinstance(raw, RecordError):
            now = _clock.now()
            return Response(-1, "error", f"bad input: {raw.reason}", raw.id, t_submit=now, t_done=now)
        return send(raw)
    return target


class ServiceProcess:
    """``python -m tuning serve`` in a process of its own, on a free loopback port: a service to watch
    from outside. A context manager (or :meth:`start` / :meth:`close`); stopped by its pid (SIGTERM: it
    drains), and in any case after ``duration_s``.

    ``model``: a model folder or ``module:factory`` (``--model``); ``sets``: knobs (``--set``)."""

    def __init__(self, preset: str = "tuned", model: str | None = None, sets: dict[str, Any] | None = None,
                 duration_s: float = 900.0, start_timeout_s: float = 300.0):
        self.args = ["--preset", preset, "--port", "0", "--duration", str(duration_s)]
        if model is not None:
            self.args += ["--model", str(model)]
        for knob, value in (sets or {}).items():
            self.args += ["--set", f"{knob}={','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"]
        self.start_timeout_s = start_timeout_s
        self.proc: Any = None
        self.url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def endpoint(self) -> str:
        return f"{self.url}/embed"

    def start(self) -> "ServiceProcess":
        import os
        import queue
        import re
        import subprocess
        import sys
        from pathlib import Path

        env = dict(os.environ)  # the same tuning as this process, wherever it is installed
        # this process drives the load: the service's model threads leave it a core
        env[RESERVED_CORES_ENV] = str(reserved_cores() + 1)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, "-m", "tuning", "serve", *self.args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True,
                         name="service-output").start()
        seen, deadline = [], _clock.now() + self.start_timeout_s
        while _clock.now() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            match = re.search(r"serving .* on (http://[\w.\[\]:]+)", line)
            if match:
                self.url = match.group(1)
                return self
        self.close()
        raise RuntimeError("the service did not start: " + "".join(seen[-20:]).strip())

    def close(self) -> None:
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ServiceProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def describe_process(pid: int) -> str:
    """``name (command line)`` of a running process; a ValueError naming the pid if there is none."""
    try:
        proc = psutil.Process(pid)
        # a process that retitles itself (setproctitle: Ray's workers) leaves its other argv slots empty
        command = " ".join(arg.strip() for arg in proc.cmdline() if arg.strip())
        return f"{proc.name()}: {command[:200]}"
    except psutil.NoSuchProcess:
        raise ValueError(f"--pid {pid}: no such process; give the pid of a running service "
                         "(e.g. pgrep -f 'my_service')") from None
    except psutil.AccessDenied:
        raise ValueError(f"--pid {pid}: access denied; watch a process of your own user (or run as its owner)") from None


@dataclass
class Subject:
    """What a watch samples: the service's process (given, found from its port, or none and why) and whether
    the service runs on this machine (then the machine's CPU load and NVML's GPUs are its machine's)."""

    pid: int | None
    command: str
    local: bool = True
    pid_from: str | None = None  # how the pid was found ("listening port 8000"); None when given
    process_reason: str = ""  # why no process is sampled; "" when one is


def watch_subject(pid: int | None, url: str | None) -> Subject:
    """The process to watch: ``pid`` when given, else the one listening on ``url``'s port on this machine."""
    if pid is not None:
        return Subject(pid, describe_process(pid))
    host, port = url_host_port(url)
    if not is_local_host(host):
        return Subject(None, "no local process", local=False, process_reason=NO_PROCESS)
    found = listening_pid(url)
    command = _visible_command(found) if found is not None else None
    if command is None:
        reason = (f"no process of this user listens on port {port} here (another user's, or in a container); "
                  "give --pid when it is local, or watch as its owner")
        return Subject(None, "no local process", process_reason=reason)
    if command.split(":", 1)[0] in PORT_FORWARDERS:
        reason = (f"port {port} is forwarded by {command.split(':', 1)[0]} (pid {found}) to the service behind it "
                  "(a container, a pod, another host); give --pid of the service's process where it is local")
        return Subject(None, "no local process", process_reason=reason)
    root = service_root(found)
    if root != found:  # the port's process is one part of a service: watch the whole of it
        root_command = _visible_command(root)
        if root_command is not None:
            return Subject(root, root_command, pid_from=f"listening port {port} (pid {found}: {command[:80]}), "
                                                        f"under pid {root}, the service's top process")
    return Subject(found, command, pid_from=f"listening port {port}")


def _visible_command(pid: int) -> str | None:
    """``describe_process`` of a pid found from a port, or None when it is gone or not this user's to read."""
    try:
        return describe_process(pid)
    except ValueError:
        return None


@dataclass
class WatchResult:
    """Everything one watch saw, on the shared clock; statistics and tables on demand. ``pid`` is None when
    no process was sampled (``process_reason`` says why); ``pid_from`` says how a pid not given was found."""

    pid: int | None
    command: str
    interval: float
    host: HostSeries
    gpu: GpuSeries
    t_start: float
    t_end: float
    load: Any = None  # LoadResult when load was driven
    target: str | None = None
    process_gpu_mb: dict[int, float] = field(default_factory=dict)
    signals: OutsideSignals | None = None
    diagnosis: OutsideDiagnosis | None = None
    server_metrics: ServerMetrics | None = None  # the service's own Prometheus metrics over the window
    pid_from: str | None = None
    process_reason: str = ""
    metrics_url_given: bool = False  # server_metrics came from --metrics-url, not the default /metrics beside the URL

    @property
    def window(self) -> tuple[float, float]:
        """The load's measured window when load was driven, else the whole watch."""
        if self.load is not None:
            return self.load.t_window_start, self.load.t_end
        return self.t_start, self.t_end

    def to_frame(self, signal: str) -> pd.DataFrame:
        """host, threads, gpu, trend or requests (times in seconds from the start of the watch)."""
        frames = {"host": self.host.to_frame, "threads": self.host.threads_frame, "gpu": self.gpu.to_frame,
                  "trend": self.trend_frame,
                  "requests": self.load.to_frame if self.load is not None else pd.DataFrame}
        if signal not in frames:
            raise ValueError(f"signal={signal!r} is not recorded; choose one of {', '.join(frames)}")
        frame = frames[signal]().copy()
        if signal != "trend":
            for col in ("t", "t_scheduled", "t_sent", "t_received", "t_submit", "t_done"):
                if col in frame:
                    frame[col] = frame[col] - self.t_start
        return frame

    def trend_frame(self, rows: int = MAX_TREND_ROWS) -> pd.DataFrame:
        """The trend table: per time bin (at most ``rows``), process CPU, RSS, the busiest thread, the GPU's
        utilization, power and memory, this process's GPU share and, under load, QPS."""
        hf = self.host.to_frame()
        gf = self.gpu.to_frame()
        if hf.empty and gf.empty:
            return pd.DataFrame()
        span = max(self.t_end - self.t_start, 1e-9)
        width = max(self.interval, span / rows)
        edges = [self.t_start + i * width for i in range(int(math.ceil(span / width)) + 1)]
        threads = self.host.threads_frame()
        ok_times = []
        if self.load is not None:
            req = self.load.to_frame()
            if "t_received" in req:
                ok_times = req.loc[req.outcome == "ok", "t_received"].tolist()
        out = []
        for a, b in zip(edges[:-1], edges[1:]):
            h = hf[(hf.t > a) & (hf.t <= b)]
            g = gf[(gf.t > a) & (gf.t <= b)]
            if h.empty and g.empty:
                continue
            th = threads[(threads.t > a) & (threads.t <= b)]
            # one thread by (pid, tid, start): threads that share a name (a pool's workers) are not summed
            busiest = (th.groupby(["pid", "tid", "start", "name"])["cpu_percent"].sum().sort_values(ascending=False)
                       / max(len(h), 1) if len(th) else None)
            row = {"t_s": round(b - self.t_start, 2), "cpu_pct": h.cpu_percent.mean() if len(h) else None,
                   "rss_mb": h.rss_mb.max() if len(h) else None,
                   "busiest_thread": (f"{busiest.index[0][3]} {busiest.iloc[0]:.0f}%"
                                      if busiest is not None and len(busiest) else "-"),
                   "gpu_util_pct": g.sm_util.mean() if len(g) else None,
                   "power_w": g.power_w.mean() if len(g) else None,
                   "gpu_mem_mb": g.mem_used_mb.mean() if len(g) else None,
                   "proc_gpu_pct": g.proc_sm_util.mean() if len(g) and g.proc_sm_util.notna().any() else None}
            if self.load is not None:
                row["qps"] = sum(a < t <= b for t in ok_times) / (b - a)
            out.append(row)
        return pd.DataFrame(out)

    def summary(self) -> dict[str, Any]:
        """Everything ``watch --json`` prints: the verdict, what could not be seen, the tables as records."""
        from tuning.base.stats import clean

        load = self.load.summary() if self.load is not None else None
        host = self.host.summary()
        t0, t1 = self.window

        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return frame.astype(object).where(frame.notna(), None).to_dict("records")

        return {
            "pid": self.pid, "pid_from": self.pid_from, "process_reason": self.process_reason or None,
            "command": self.command, "target": self.target, "interval_s": self.interval,
            "window_s": clean(t1 - t0),
            "diagnosis": self.diagnosis.as_dict() if self.diagnosis else None,
            "threads": self.host.top_threads(8),
            "host": host,
            "gpu": {**self.gpu.summary(), "process_memory_mb": {str(k): v for k, v in self.process_gpu_mb.items()}},
            "server_metrics": self.server_metrics.summary() if self.server_metrics is not None else None,
            "load": {k: load[k] for k in ("mode", "concurrency", "qps", "p50_ms", "p95_ms", "p99_ms", "error_rate",
                                          "submitted", "ok", "errors", "timeouts", "rejected", "model_busy",
                                          "error_reasons")} if load else None,
            "frames": {"trend": records(self.trend_frame()), "host": records(self.to_frame("host")),
                       "threads": records(self.to_frame("threads")), "gpu": records(self.to_frame("gpu"))},
        }


def _check_watch_args(pid: Any, url: str | None, duration_s: Any, inputs: Any) -> None:
    """One clear error for each bad argument, before anything is sampled or sent."""
    if pid is None and url is None:
        raise ValueError("watch: give --pid PID (a local service's process) or --url URL (a service to drive, "
                         "local or remote), or both")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 1):
        raise ValueError(f"--pid {pid!r}: give the process id of a running service")
    if not isinstance(duration_s, (int, float)) or duration_s <= 0:
        raise ValueError(f"--duration {duration_s!r}: give a number of seconds > 0")
    if url is not None and not str(url).startswith(("http://", "https://")):
        raise ValueError(f"--url {url!r}: give an http:// URL of the service's endpoint, e.g. http://127.0.0.1:8000/embed")
    if url is not None:
        try:
            url_host_port(url)
        except ValueError as exc:
            raise ValueError(f"--url {exc}") from None
    if url is not None and not inputs:
        raise ValueError("watch with --url needs request bodies (--data)")


def _samplers(subject: Subject, interval: float, nvml: Any,
              gpu_device: int | str | None) -> tuple[GpuSampler | None, HostSampler | None]:
    """NVML's GPUs when the service runs on this machine (on another host they are not its GPUs), and the
    process's threads, memory and disk when there is a process."""
    gpu = GpuSampler(interval, nvml=nvml, device=gpu_device, pid=subject.pid or NO_PID) if subject.local else None
    host = HostSampler(interval, pid=subject.pid) if subject.pid is not None else None
    return gpu, host


def watch(pid: int | None = None, url: str | None = None, inputs: Sequence[Any] | None = None, concurrency: int = 8,
          duration_s: float = 10.0, interval: float = 0.5, warmup_requests: int = 16,
          busy_probe: Callable[[], float | None] | None = None, nvml: Any = None,
          gpu_device: int | str | None = None, api: Any = None, metrics_url: str | None = None) -> WatchResult:
    """Sample process ``pid`` (threads, memory, disk; the GPU through NVML) for ``duration_s`` seconds, or
    while driving ``concurrency`` clients at ``url`` for ``duration_s`` measured seconds; diagnose it.

    Without ``pid``, the process listening on ``url``'s port is watched when the URL's host is this machine
    and the process is visible (``pid_from`` says so); else none is (``process_reason`` says why) and the
    diagnosis uses the load, the server's metrics and, on this machine, NVML.

    ``busy_probe``: the service's running model-busy seconds (default: a scrape of ``metrics_url``, or of
    ``/metrics`` beside ``url``, which also reads TEI's and Triton's metrics (:mod:`tuning.load.scrape`); model
    busy is tuning's own and reported as unseen for other services). ``api``: the service's request schema
    (:class:`tuning.load.apis.Api`; ``inputs`` are then its encoded bodies)."""
    from tuning.load.generator import run_load

    _check_watch_args(pid, url, duration_s, inputs)
    subject = watch_subject(pid, url)
    gpu_sampler, host_sampler = _samplers(subject, interval, nvml, gpu_device)
    load = None
    probe = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the GPU section says why it is empty
        with ExitStack() as stack:
            for sampler in (gpu_sampler, host_sampler):
                if sampler is not None:
                    stack.enter_context(sampler)
            psutil.cpu_percent(None)  # the machine's CPU from here...
            me = psutil.Process()
            own0 = sum(me.cpu_times()[:2])
            t_start = _clock.now()
            if url is not None:
                probe = (MetricsProbe(_metrics_url(url, metrics_url), model=getattr(api, "model_name", None),
                                      mapping=mapping_of(api))
                         if busy_probe is None else None)
                load = run_load(url_target(url, api), list(inputs), concurrency=concurrency, duration_s=duration_s,
                                warmup_requests=warmup_requests, busy_probe=busy_probe or probe, api=api)
            else:
                threading.Event().wait(duration_s)
            process_gpu_mb = gpu_sampler.process_memory() if gpu_sampler is not None and subject.pid else {}
            t_end = _clock.now()
            # ...to here: every process, all cores (of this machine: the service's only when it runs here)
            machine_cpu = psutil.cpu_percent(None) / 100 if subject.local else math.nan
            watcher_cpu = (sum(me.cpu_times()[:2]) - own0) / max(t_end - t_start, 1e-9) * 100
    host = host_sampler.series if host_sampler is not None else HostSeries()
    gpu = gpu_sampler.series if gpu_sampler is not None else GpuSeries(False, _remote_gpu_reason(url))
    result = WatchResult(subject.pid, subject.command, interval, host, gpu, t_start, t_end, load, url, process_gpu_mb,
                         server_metrics=probe.result() if probe is not None else None, pid_from=subject.pid_from,
                         process_reason=subject.process_reason, metrics_url_given=metrics_url is not None)
    return _diagnosed(result, machine_cpu, watcher_cpu)


def _remote_gpu_reason(url: str | None) -> str:
    host = url_host_port(url)[0] if url else "?"
    return (f"the service runs on another host ({host}): NVML here would read this machine's GPUs, not its; "
            "watch on its host for them")


def _diagnosed(result: WatchResult, machine_cpu: float, watcher_cpu: float) -> WatchResult:
    """The result with its signals over the window and the diagnosis from them."""
    t0, t1 = result.window
    mb = sum(result.process_gpu_mb.values()) if result.process_gpu_mb else math.nan
    result.signals = outside_signals(result.host, result.gpu, t0, t1, result.load.summary() if result.load else None,
                                     mb, machine_cpu, watcher_cpu, result.server_metrics,
                                     process_reason=result.process_reason,
                                     metrics_url_given=result.metrics_url_given)
    result.diagnosis = diagnose_outside(result.signals)
    return result
