"""Host trend sampling (psutil): the workbook's ``top -H`` and ``pidstat``.

Per interval: process CPU %, per-thread CPU % with names (this process's threads and those
of its child processes, e.g. DataLoader workers), resident memory, disk read/write rates.
CPU % is per core: 100 means one core fully busy.

The thread table sums to the process CPU: threads are keyed by (pid, tid, start time), a thread
first seen counts from zero, and CPU that no sampled thread holds (a thread that started and
ended between two samples) is an ``unattributed`` row. The probe process is not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from tuning.base.threads import name_this_thread, python_thread_keys
from tuning.profile.sampler import MIN_INTERVAL_S


@dataclass
class HostSample:
    t: float
    cpu_percent: float  # this process and its children
    rss_mb: float
    read_mb_s: float
    write_mb_s: float
    children: int


@dataclass
class ThreadSample:
    t: float
    pid: int
    tid: int
    name: str
    cpu_percent: float
    start: int = 0  # start time in clock ticks since boot: (pid, tid, start) names one thread
    wait_percent: float = float("nan")  # runnable but waiting for a CPU (run-queue delay), % of the interval


@dataclass
class HostSeries:
    samples: list[HostSample] = field(default_factory=list)
    threads: list[ThreadSample] = field(default_factory=list)
    unattributed: list[ThreadSample] = field(default_factory=list)  # per sample and process: CPU no thread held
    cpu_count: int = field(default_factory=lambda: psutil.cpu_count() or 1)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(s) for s in self.samples], columns=list(HostSample.__dataclass_fields__))

    def threads_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(s) for s in self.threads], columns=list(ThreadSample.__dataclass_fields__))

    def top_threads(self, n: int = 8) -> list[dict[str, Any]]:
        """Threads by mean CPU % over the run (like ``top -H`` sorted by CPU), then ``other threads`` (the
        rest, if any) and ``unattributed``: the rows sum to the mean process CPU (``summary()``).

        A thread's mean is over every sample (zero where it did not run), so short threads weigh
        what they used."""
        if not self.samples:
            return []
        n_samples = len(self.samples)
        frame = self.threads_frame()
        rows: list[dict[str, Any]] = []
        if not frame.empty:
            keys = ["pid", "tid", "start", "name"]
            grouped = frame.groupby(keys, as_index=False)["cpu_percent"].agg(["sum", "max"])
            waits = frame.groupby(keys)["wait_percent"].sum(min_count=1)
            grouped = grouped.sort_values("sum", ascending=False)
            rows = []
            for _, r in grouped.head(n).iterrows():
                wait = waits.get((r["pid"], r["tid"], r["start"], r["name"]))
                rows.append({"pid": int(r["pid"]), "tid": int(r["tid"]), "name": str(r["name"]),
                             "cpu_mean": float(r["sum"]) / n_samples, "cpu_max": float(r["max"]),
                             # runnable but no CPU free (pidstat's %wait): high when the host is oversubscribed
                             "wait_mean": None if wait is None or wait != wait else float(wait) / n_samples})
            rest = grouped.iloc[n:]
            if len(rest):
                rows.append({"pid": None, "tid": None, "name": f"other threads ({len(rest)})",
                             "cpu_mean": float(rest["sum"].sum()) / n_samples, "cpu_max": None})
        lost = [u.cpu_percent for u in self.unattributed]
        rows.append({"pid": None, "tid": None, "name": "unattributed", "cpu_mean": sum(lost) / n_samples,
                     "cpu_max": max(lost, default=0.0)})
        return rows

    def summary(self) -> dict[str, Any]:
        frame = self.to_frame()
        if frame.empty:
            return {"samples": 0}
        return {"samples": len(frame), "cpu_percent_mean": float(frame.cpu_percent.mean()),
                "rss_mb_max": float(frame.rss_mb.max()), "read_mb_s_mean": float(frame.read_mb_s.mean()),
                "write_mb_s_mean": float(frame.write_mb_s.mean()), "cpu_count": self.cpu_count}


READY_TIMEOUT_S = 10.0  # the longest the sampler waits for its probe's first snapshot


class HostSampler:
    """Samples this process (and its children) every ``interval`` seconds from a probe process.

    A context manager: the probe starts on enter and stops on exit. Python thread names of
    this process are attached on exit; other threads show their OS name (``/proc/.../comm``),
    which :func:`tuning.base.threads.name_this_thread` sets.
    """

    thread_name = "host-sampler"

    def __init__(self, interval: float = 0.5, pid: int | None = None):
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < MIN_INTERVAL_S:
            raise ValueError(f"interval={interval!r} must be a number >= {MIN_INTERVAL_S} seconds")
        self.interval = float(interval)
        self.pid = pid or os.getpid()
        self.series = HostSeries()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._lines: list[str] = []
        self._names: dict[tuple[int, int], str] = {}  # (tid, start ticks) -> Python name
        self._ready = threading.Event()

    def __enter__(self) -> "HostSampler":
        self._proc = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).with_name("host_probe.py")), "--pid", str(self.pid),
             "--interval", str(self.interval)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, name=self.thread_name, daemon=True)
        self._reader.start()
        # the work starts after the probe's baseline snapshot, or it would go unmeasured (bounded: a probe
        # that cannot start leaves an empty series, not a hang)
        self._ready.wait(READY_TIMEOUT_S)
        return self

    def _read(self) -> None:
        name_this_thread(self.thread_name)
        try:
            self._read_lines()
        finally:
            self._ready.set()  # a probe that ended (or could not start) releases the waiting __enter__

    def _read_lines(self) -> None:
        for line in self._proc.stdout:
            if line.startswith('{"ready"'):
                self._ready.set()
                continue
            self._lines.append(line)
            if self.pid == os.getpid():  # remember names of threads that may end before we do
                self._names.update(python_thread_keys())

    def __exit__(self, *exc: Any) -> None:
        if self.pid == os.getpid():
            self._names.update(python_thread_keys())
        self._proc.stdin.close()
        try:  # interrupted (Ctrl-C): the probe gets a second, then ends with us
            self._proc.wait(timeout=1 if exc and exc[0] is KeyboardInterrupt else 10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join()
        self._proc.stdout.close()
        self._ingest(self._names)

    def _ingest(self, names: dict[tuple[int, int], str]) -> None:
        for raw in self._lines:
            obj = json.loads(raw)
            self.series.samples.append(HostSample(obj["t"], obj["cpu"], obj["rss"], obj["read"], obj["write"],
                                                  obj["children"]))
            for pid, tid, start, comm, cpu, *rest in obj["threads"]:
                wait = rest[0] if rest and rest[0] is not None else float("nan")
                if pid == self.pid and pid == os.getpid():  # threads torch/OpenMP start natively have no
                    # Python name; they inherit the OS name of the thread that started them ("model-executor (native)")
                    name = names.get((tid, start)) or ("MainThread" if tid == pid else f"{comm} (native)")
                else:  # another process (a watched service, a loader worker): the OS name its threads set
                    name = comm
                self.series.threads.append(ThreadSample(obj["t"], pid, tid, name, cpu, start, wait))
            for pid, cpu in obj["unattributed"]:
                self.series.unattributed.append(ThreadSample(obj["t"], pid, -1, "unattributed", cpu))
