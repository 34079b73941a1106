"""Host probe, run as a separate process (``python host_probe.py --pid P --interval S``).

Sampling from outside the measured process, like ``top -H`` and ``pidstat`` do, keeps it
free of that process's GIL: a thread spinning in Python would otherwise delay an in-process
sampler by one GIL switch interval per system call. Only the standard library and psutil
are imported here. One JSON line per sample on stdout; stops when stdin closes.
Times are ``time.perf_counter()``: CLOCK_MONOTONIC on Linux, the parent's clock too.
"""

import argparse
import json
import sys
import threading
import time

import psutil


def _comm(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return f"tid-{tid}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args()
    root = psutil.Process(args.pid)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    prev_t, prev_proc, prev_threads, prev_io = None, {}, {}, None
    while True:
        t = time.perf_counter()
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break  # the measured process is gone
        cpu_now, threads_now, rss, io = {}, {}, 0.0, [0, 0]
        for p in procs:
            try:
                times = p.cpu_times()
                cpu_now[p.pid] = times.user + times.system
                rss += p.memory_info().rss / 2**20
                for th in p.threads():
                    threads_now[(p.pid, th.id)] = (th.user_time + th.system_time, _comm(p.pid, th.id))
                counters = p.io_counters()
                io[0] += counters.read_bytes
                io[1] += counters.write_bytes
            except (psutil.Error, AttributeError):
                continue  # a worker that exited between listing and reading
        if prev_t is not None:
            dt = max(t - prev_t, 1e-9)
            cpu = sum(max(v - prev_proc.get(pid, v), 0.0) for pid, v in cpu_now.items()) / dt * 100
            threads = [[pid, tid, name, max(used - prev_threads[(pid, tid)], 0.0) / dt * 100]
                       for (pid, tid), (used, name) in threads_now.items() if (pid, tid) in prev_threads]
            line = {"t": t, "cpu": cpu, "rss": rss, "read": max(io[0] - prev_io[0], 0) / dt / 2**20,
                    "write": max(io[1] - prev_io[1], 0) / dt / 2**20, "children": len(procs) - 1, "threads": threads}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
        prev_t, prev_proc, prev_io = t, cpu_now, io
        prev_threads = {k: v[0] for k, v in threads_now.items()}
        if stop.wait(args.interval):
            break


if __name__ == "__main__":
    main()
