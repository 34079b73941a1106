"""The per-thread CPU table loses nothing: new threads count from zero, a reused thread id is a new
thread, CPU no live thread holds is an ``unattributed`` row, and the probe does not measure itself."""

import json
import math
import os
import threading
import time

import psutil
import pytest

from tuning.base.threads import name_this_thread
from tuning.profile.host import HostSampler


def test_new_threads_count_from_zero_and_a_reused_id_is_a_new_thread():
    from tuning.profile.host_probe import ProcSnap, cpu_delta

    # per thread: (cpu seconds, name, run-queue wait seconds)
    prev = {(10, 1.0): ProcSnap(cpu=5.0, threads={(10, 100): (4.0, "main", 2.0), (11, 100): (1.0, "old", 0.0)})}
    now = {(10, 1.0): ProcSnap(cpu=5.5, threads={(10, 100): (4.1, "main", 2.3),
                                                  (11, 900): (0.05, "reused", 0.01),  # same tid, started later
                                                  (12, 950): (0.15, "new", float("nan"))}),  # started after prev
           (20, 7.0): ProcSnap(cpu=0.2, threads={(20, 700): (0.2, "worker", 0.0)})}  # a new child process
    total, rows, unattributed = cpu_delta(prev, now, dt=1.0)
    by_name = {name: cpu for pid, tid, start, name, cpu, wait in rows}
    waits = {name: wait for pid, tid, start, name, cpu, wait in rows}
    assert waits["main"] == pytest.approx(30.0) and waits["reused"] == pytest.approx(1.0)  # a new thread from zero
    assert math.isnan(waits["new"])  # no schedstats: unknown, not zero
    assert by_name == pytest.approx({"main": 10.0, "reused": 5.0, "new": 15.0, "worker": 20.0})
    # 0.5 s of process CPU, 0.3 s held by live threads: the rest (e.g. a thread that ended) is unattributed
    assert dict(unattributed) == pytest.approx({10: 20.0, 20: 0.0})
    assert total == pytest.approx(70.0) == sum(by_name.values()) + sum(cpu for _, cpu in unattributed)


def test_thread_table_sums_to_process_cpu_with_short_threads():
    """Threads shorter than an interval used to vanish from the table (100% process CPU, ~1% attributed).

    Two kinds of short thread, so the test does not depend on where the samples fall: ``seen`` threads
    burn 30 ms, then idle 250 ms (more than two intervals, so a sample falls in their life even when the probe
    runs late; the old table kept only threads alive at both ends of an interval and dropped the burn);
    ``gone`` threads burn and end between samples (their CPU is the ``unattributed`` row).
    (The test cannot wait for a sample instead: the sampler reads the probe's lines in chunks.)"""
    def burn(name, seconds, idle=0.0):
        name_this_thread(name)
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        time.sleep(idle)

    def run(*args):
        t = threading.Thread(target=burn, args=args)
        t.start()
        t.join()

    with HostSampler(0.1) as sampler:
        for _ in range(5):  # a count, not a wall-clock span: a loaded machine runs fewer iterations per second
            run("seen", 0.03, 0.25)
            for _ in range(3):
                run("gone", 0.03)
        time.sleep(0.15)
    series = sampler.series
    table = series.top_threads(4)
    names = [row["name"] for row in table]
    assert "unattributed" in names and table[-1]["cpu_mean"] > 0
    process = series.summary()["cpu_percent_mean"]
    assert process > 10
    assert sum(row["cpu_mean"] for row in table) == pytest.approx(process, rel=1e-6)
    seen = [row for row in series.top_threads(1000) if row["name"] == "seen"]
    assert len(seen) >= 4 and sum(row["cpu_mean"] for row in seen) > 0  # attributed to themselves, from zero


def test_the_probe_does_not_count_itself():
    with HostSampler(0.1) as sampler:
        others = [c.pid for c in psutil.Process().children(recursive=True) if c.pid != sampler._proc.pid]
        time.sleep(0.5)
    assert sampler.series.samples
    assert all(s.children == len(others) for s in sampler.series.samples)
    assert sampler._proc.pid not in set(sampler.series.threads_frame().pid)


def test_python_names_are_matched_by_thread_id_and_start_time():
    sampler = HostSampler(0.1)
    pid = sampler.pid
    line = {"t": 1.0, "cpu": 30.0, "rss": 1.0, "read": 0.0, "write": 0.0, "children": 0,
            "threads": [[pid, 77, 100, "comm-a", 10.0], [pid, 77, 500, "comm-b", 15.0]],
            "unattributed": [[pid, 5.0]]}
    sampler._lines = [json.dumps(line)]
    sampler._ingest({(77, 100): "first", (77, 500): "second"})
    frame = sampler.series.threads_frame()
    assert list(frame.name) == ["first", "second"]
    table = sampler.series.top_threads()
    assert [r["name"] for r in table] == ["second", "first", "unattributed"]
    assert sum(r["cpu_mean"] for r in table) == pytest.approx(30.0)


def test_thread_start_reads_this_threads_start_time():
    from tuning.base.threads import thread_start

    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc")
    start = thread_start(threading.get_native_id())
    assert isinstance(start, int) and start >= thread_start(os.getpid())


def test_a_run_shorter_than_one_interval_is_still_sampled():
    """The sampler returns only after the probe's baseline snapshot, and the probe takes a last sample when
    stopped: a 0.2 s burst inside a 1 s interval used to leave the thread table empty."""
    done, release = threading.Event(), threading.Event()

    def burn(seconds):
        name_this_thread("burst")
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        done.set()
        release.wait(10)  # alive until the sampler has stopped (a thread gone by then is 'unattributed')

    worker = threading.Thread(target=burn, args=(0.2,), name="burst")
    with HostSampler(1.0) as sampler:
        worker.start()
        done.wait(10)
    release.set()
    worker.join()
    frame = sampler.series.threads_frame()
    burst = frame[frame.name == "burst"]
    assert len(sampler.series.samples) >= 1 and burst.cpu_percent.sum() > 0
