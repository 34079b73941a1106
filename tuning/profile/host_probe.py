"""Host probe, run as a separate process (``python host_probe.py --pid P --interval S``).

Sampling from outside the measured process, like ``top -H`` and ``pidstat`` do, keeps it
free of that process's GIL: a thread spinning in Python would otherwise delay an in-process
sampler by one GIL switch interval per system call. Only the standard library and psutil
are imported here. One JSON line per sample on stdout (the first, ``{"ready": t}``, marks the
baseline snapshot); when stdin closes it takes one last sample and stops, so a run shorter
than an interval is still covered.
Times are ``time.perf_counter()``: CLOCK_MONOTONIC on Linux, the parent's clock too.

What a sample's CPU adds up to: the process tree's CPU in the interval (the measured process
and its children; this probe, a child too, is left out) = the sum of its threads' CPU + one
``unattributed`` figure per process. A thread is keyed by (pid, tid, start time), so a reused
thread id is a new thread; a thread first seen in this sample started after the last one and
counts from zero. CPU that no live thread holds (threads that started and ended between two
samples, or ended since the last) is the process's ``unattributed`` CPU.
"""

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProcSnap:
    """One process at one sample: CPU seconds (user + system) and its threads'
    ``{(tid, start): (cpu seconds, name)}``."""

    cpu: float
    threads: dict = field(default_factory=dict)


def _task_stat(pid, tid):
    """(cpu seconds, start ticks, name) of one thread from /proc, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()  # from field 3 (state) on
    return (int(rest[11]) + int(rest[12])) / _TICKS, int(rest[19]), name


def _task_wait(pid, tid):
    """Seconds one thread has spent runnable but waiting for a CPU (``/proc/.../schedstat``), or NaN where the
    kernel does not keep schedstats."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def snapshot(procs):
    """``{(pid, create time): ProcSnap}`` of the given processes (those that exit meanwhile are left out)."""
    snaps = {}
    for p in procs:
        try:
            times = p.cpu_times()
            threads = {}
            try:
                tids = [int(tid) for tid in os.listdir(f"/proc/{p.pid}/task")]
            except OSError:  # not Linux: no start time; key by id alone
                tids = None
                for th in p.threads():
                    threads[(th.id, 0)] = (th.user_time + th.system_time, f"tid-{th.id}", float("nan"))
            for tid in tids or ():
                stat = _task_stat(p.pid, tid)
                if stat is not None:
                    threads[(tid, stat[1])] = (stat[0], stat[2], _task_wait(p.pid, tid))
            snaps[(p.pid, p.create_time())] = ProcSnap(times.user + times.system, threads)
        except psutil.Error:
            continue  # a worker that exited between listing and reading
    return snaps


def cpu_delta(prev, now, dt):
    """CPU % (of one core) in the interval: ``(total, threads, unattributed)``, with
    ``threads = [[pid, tid, start, name, cpu, wait]]`` (``wait``: % of the interval the thread was runnable
    but waiting for a CPU; NaN without schedstats) and ``unattributed = [[pid, cpu]]``; the threads' CPU and
    the unattributed figures add up to the total."""
    total, rows, unattributed = 0.0, [], []
    for (pid, created), snap in now.items():
        before = prev.get((pid, created))
        used_threads = 0.0
        for (tid, start), (cpu, name, wait) in snap.threads.items():
            was, waited = (before.threads.get((tid, start), (0.0, "", 0.0)) if before else (0.0, "", 0.0))[::2]
            used = max(cpu - was, 0.0)
            used_threads += used
            rows.append([pid, tid, start, name, used / dt * 100, max(wait - waited, 0.0) / dt * 100])
        used_process = max(snap.cpu - (before.cpu if before else 0.0), used_threads)  # new process: from zero
        unattributed.append([pid, (used_process - used_threads) / dt * 100])
        total += used_process / dt * 100
    return total, rows, unattributed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args()
    root = psutil.Process(args.pid)
    me = os.getpid()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    prev_t, prev_snaps, prev_io = None, {}, None
    last = False
    while True:
        t = time.perf_counter()
        try:
            procs = [root, *(p for p in root.children(recursive=True) if p.pid != me)]
        except psutil.Error:
            break  # the measured process is gone
        snaps = snapshot(procs)
        rss, io = 0.0, [0, 0]
        for p in procs:
            try:
                rss += p.memory_info().rss / 2**20
                counters = p.io_counters()
                io[0] += counters.read_bytes
                io[1] += counters.write_bytes
            except (psutil.Error, AttributeError):
                continue
        if prev_t is not None:
            dt = max(t - prev_t, 1e-9)
            cpu, threads, unattributed = cpu_delta(prev_snaps, snaps, dt)
            line = {"t": t, "cpu": cpu, "rss": rss, "read": max(io[0] - prev_io[0], 0) / dt / 2**20,
                    "write": max(io[1] - prev_io[1], 0) / dt / 2**20, "children": len(procs) - 1,
                    "threads": threads, "unattributed": unattributed}
            sys.stdout.write(json.dumps(line) + "\n")
        else:  # the first snapshot is the baseline every later one is measured from: the parent waits for it
            sys.stdout.write(json.dumps({"ready": t}) + "\n")
        sys.stdout.flush()
        prev_t, prev_snaps, prev_io = t, snaps, io
        if last:
            break
        last = stop.wait(args.interval)  # stopped: one more sample, so the end of the run is covered


if __name__ == "__main__":
    main()
