"""Several load-client processes against one URL, their outcomes merged exactly.

One asyncio client loop tops out at about one core of CPU (``bench/client_ceiling.py``), and a GPU service
answers faster than that. ``loadtest --url ... --client-procs N`` runs N client processes, each a fresh
interpreter (``python -c``, so no caller's script is re-imported) with its share of the load: the clients and
the requests split as evenly as they go, and in an open loop a rate of R/N each (N independent Poisson
streams of rate R/N are one Poisson stream of rate R). The processes start together after every one has
imported (a barrier), and their per-request records come back whole: the merged result's percentiles are
taken over the union of every outcome, never averaged across processes.
"""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import time
from typing import Any, Sequence

from tuning.load.generator import LoadResult, run_load

_CHILD = "from tuning.load.procs import _child; _child()"
START_MARGIN_S = 0.2  # between the barrier and the common start


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("!Q", len(data)) + data)
    stream.flush()


def _recv(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the client process ended without an answer")
    (size,) = struct.unpack("!Q", head)
    return pickle.loads(stream.read(size))


def _child() -> None:
    """One client process: its job from stdin, "ready", the start time, the run, the result to stdout."""
    import warnings

    from tuning.base import clock as _clock

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    job = _recv(stdin)
    _send(stdout, "ready")
    start_at = _recv(stdin)
    delay = start_at - _clock.now()
    if delay > 0:
        time.sleep(delay)
    probe = job.pop("busy_probe", None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            result = run_load(job.pop("url"), job.pop("inputs"), busy_probe=probe, **job)
        _send(stdout, ("ok", result, probe, [str(w.message) for w in caught]))
    except Exception as exc:  # the parent raises it with this process's number
        _send(stdout, ("error", f"{type(exc).__name__}: {exc}", None, []))


def reap(procs: Sequence[subprocess.Popen], timeout_s: float) -> None:
    """Wait for each process up to ``timeout_s``; kill (and collect) any still running."""
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summed_inflight(series: Sequence[Sequence[tuple[float, int]]]) -> list[tuple[float, int]]:
    """The requests in flight over all processes: at every change in one process's series, the sum of each
    process's latest count (each series is a step function of its own; interleaving them would chart a saw
    between one process's count and another's)."""
    events = sorted((t, i, n) for i, s in enumerate(series) for t, n in s)
    latest = [0] * len(series)
    out = []
    for t, i, n in events:
        latest[i] = n
        out.append((t, sum(latest)))
    return out


def merge(results: Sequence[LoadResult]) -> LoadResult:
    """One result from several processes' results of the same test: every response and its timings kept,
    the window from the earliest start to the latest end, clients, rates and client CPU summed; the busy
    total from the first process (the one that read the server's metrics)."""
    first = results[0]
    rate = sum(r.rate for r in results) if first.rate is not None else None
    merged = LoadResult(first.mode, sum(r.concurrency for r in results), rate,
                        [resp for r in results for resp in r.responses],
                        min(r.t_window_start for r in results), max(r.t_end for r in results),
                        summed_inflight([r.inflight for r in results]),
                        warmup_requests=sum(r.warmup_requests for r in results))
    merged.timings = [t for r in results for t in r.timings]
    merged.ok_in_window = sum(r.ok_in_window or 0 for r in results)
    merged.cooldown_requests = sum(r.cooldown_requests for r in results)
    cpus = [r.client_cpu for r in results if r.client_cpu is not None]
    merged.client_cpu = sum(cpus) if cpus else None
    merged.busy_s, merged.busy_window = first.busy_s, first.busy_window
    merged.texts_per_request, merged.api, merged.engine = first.texts_per_request, first.api, first.engine
    merged.stopped_early = next((r.stopped_early for r in results if getattr(r, "stopped_early", None)), None)
    return merged


def run_load_procs(url: str, inputs: Sequence[Any], procs: int, *, concurrency: int = 1, requests: int | None = None,
                   duration_s: float | None = None, rate: float | None = None, warmup_requests: int = 0,
                   warmup_s: float = 0.0, seed: int = 0, busy_probe: Any = None, api: Any = None,
                   start_timeout_s: float = 120.0) -> tuple[LoadResult, list[str]]:
    """:func:`tuning.load.generator.run_load` against ``url`` from ``procs`` processes (``procs`` <=
    ``concurrency``); returns the merged result and the warnings the processes raised. ``busy_probe`` (a
    picklable callable such as :class:`tuning.load.scrape.MetricsProbe`) runs in the first process; the
    probe that comes back replaces the caller's state (its scrapes are copied onto ``busy_probe``)."""
    if not isinstance(procs, int) or procs < 1:
        raise ValueError(f"--client-procs {procs!r}: give a whole number of processes >= 1")
    if procs > concurrency:
        raise ValueError(f"--client-procs {procs} > --concurrency {concurrency}: each process needs at least one "
                         f"client; raise --concurrency to {procs} or more")
    if procs == 1:
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            result = run_load(url, inputs, concurrency=concurrency, requests=requests, duration_s=duration_s,
                              rate=rate, warmup_requests=warmup_requests, warmup_s=warmup_s, seed=seed,
                              busy_probe=busy_probe, api=api)
        return result, [str(w.message) for w in caught]
    from tuning.base import clock as _clock

    clients = _split(concurrency, procs)
    counts = _split(requests, procs) if requests is not None else [None] * procs
    if requests is not None and min(counts) < 1:
        raise ValueError(f"--requests {requests} < --client-procs {procs}: each process needs a request")
    warm = _split(warmup_requests, procs)
    children = [subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for _ in range(procs)]
    try:
        for i, child in enumerate(children):
            job = {"url": url, "inputs": list(inputs[i:]) + list(inputs[:i]), "concurrency": clients[i],
                   "requests": counts[i], "duration_s": duration_s, "rate": rate / procs if rate else None,
                   "warmup_requests": warm[i], "warmup_s": warmup_s, "seed": seed * 1009 + i, "api": api}
            if i == 0 and busy_probe is not None:
                job["busy_probe"] = busy_probe
            _send(child.stdin, job)
        for child in children:  # the barrier: every process has imported and is ready
            if _recv(child.stdout) != "ready":
                raise RuntimeError("a client process did not get ready")
        start_at = _clock.now() + START_MARGIN_S
        for child in children:
            _send(child.stdin, start_at)
        answers = [_recv(child.stdout) for child in children]
    finally:
        reap(children, 10.0)
    failed = [(i, a[1]) for i, a in enumerate(answers) if a[0] != "ok"]
    if failed:
        raise RuntimeError(f"client process {failed[0][0]} failed: {failed[0][1]}")
    if busy_probe is not None and answers[0][2] is not None and hasattr(busy_probe, "scrapes"):
        busy_probe.scrapes, busy_probe.reason = answers[0][2].scrapes, answers[0][2].reason
    notes = list(dict.fromkeys(w for a in answers for w in a[3]))
    return merge([a[1] for a in answers]), notes
