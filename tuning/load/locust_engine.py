"""``loadtest --engine locust``: locust, headless, with a master and N local worker processes, against an
HTTP endpoint, mapped into the same :class:`~tuning.load.generator.LoadResult` as our own client's.

Locust is the outside cross-check for our client and the way past one machine's client CPU: a
worker is one process (gevent), so N workers use N cores, and more workers on other machines join
the same master with locust's own flags (``locust -f tuning/load/locustfile.py --worker --master-host
HOST``; pass ``remote_workers`` so the master waits for them). It runs in its own processes; this
module never imports locust (gevent patches the process it is imported in).

What maps to what: each locust user is one closed-loop client (no wait between requests, one
keep-alive connection), so ``concurrency`` users = our closed loop at that concurrency. Every
request's start (epoch), response time, status and failure reach the master with the workers'
stats reports; from them the window and the figures are computed exactly as for our client:
warm-up (``warmup_s`` after the first request), a measured window of ``duration_s`` (requests
started in it), a cool-down that keeps the load on until the window's requests are answered;
percentiles over every outcome (200 ok, 503 rejected, 504 timeout, anything else or no answer an
error with its reason); throughput = ok answers received in the window / its length. Locust's
own aggregate (requests/s and its rounded percentiles over the whole run) is kept beside it as
``engine_stats``. The model's busy share is not read (locust has no hook at the window's edges).
"""

from __future__ import annotations

import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from tuning.base.net import free_port
from tuning.load.generator import CLIENT_BOTTLENECK, LoadResult, http_response, request_body
from tuning.load.procs import reap
from tuning.online.response import Response

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def _locust_stats(prefix: Path) -> dict[str, Any]:
    """Locust's own aggregate row from its CSV (requests/s and percentiles over the whole run)."""
    path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("Name") == "Aggregated":
                pick = {"requests": "Request Count", "failures": "Failure Count", "rps": "Requests/s",
                        "p50_ms": "50%", "p95_ms": "95%", "p99_ms": "99%", "p999_ms": "99.9%"}
                out = {}
                for key, column in pick.items():
                    try:
                        out[key] = float(row[column])
                    except (KeyError, TypeError, ValueError):
                        out[key] = None
                return out
    return {}


def run_locust(url: str, inputs: Sequence[Any], concurrency: int, duration_s: float, workers: int = 1,
               warmup_s: float = 2.0, cooldown_s: float = 2.0, spawn_rate: float | None = None,
               remote_workers: int = 0, master_host: str = "127.0.0.1", master_port: int | None = None,
               timeout_s: float | None = None, stop_timeout_s: float = 60.0, api: Any = None) -> LoadResult:
    """Closed loop at ``concurrency`` locust users over ``workers`` local worker processes (plus
    ``remote_workers`` joining from elsewhere) against ``url`` (``http://host:port/embed``). ``api``
    (:class:`tuning.load.apis.Api`): the route, headers and answer check, the same as our own client's
    (``inputs`` are then the bodies it encoded)."""
    if workers < 0 or remote_workers < 0 or workers + remote_workers < 1:
        raise ValueError(f"workers={workers}, remote_workers={remote_workers}: give at least one worker")
    if concurrency < 1 or duration_s <= 0:
        raise ValueError(f"concurrency={concurrency!r} must be >= 1 and duration_s={duration_s!r} > 0")
    from tuning.inputs.records import RecordError

    bad = sum(isinstance(raw, RecordError) for raw in inputs)
    inputs = [raw for raw in inputs if not isinstance(raw, RecordError)]
    if not inputs:
        raise ValueError("inputs is empty: give at least one request body")
    if bad:
        warnings.warn(f"{bad} rows of the data cannot be requests (bad rows): locust replays the other "
                      f"{len(inputs)} (our own engine counts each bad row as an error outcome)", RuntimeWarning,
                      stacklevel=2)
    from urllib.parse import urlsplit

    from tuning.load.apis import Api

    api = api if api is not None else Api("tuning", validate=False)
    parts = urlsplit(api.url(url))
    base, route = f"{parts.scheme}://{parts.netloc}", parts.path + (f"?{parts.query}" if parts.query else "")
    spawn_rate = spawn_rate or float(concurrency)  # every user within about a second: the ramp is warm-up
    ramp_s = concurrency / spawn_rate
    run_time = warmup_s + ramp_s + duration_s + cooldown_s
    port = master_port or free_port(master_host)
    with tempfile.TemporaryDirectory(prefix="tuning-locust-") as tmp:
        folder = Path(tmp)
        payloads, records = folder / "payloads.jsonl", folder / "records.jsonl"
        payloads.write_bytes(b"".join(request_body(raw).replace(b"\n", b" ") + b"\n" for raw in inputs))
        spec = {k: (list(map(list, v)) if k == "headers" else v) for k, v in vars(api).items() if not k.startswith("_")}
        env = {**os.environ, "TUNING_LOCUST_PAYLOADS": str(payloads), "TUNING_LOCUST_OUT": str(records),
               "TUNING_LOCUST_ROUTE": route, "TUNING_LOCUST_API": json.dumps(spec), "PYTHONUNBUFFERED": "1"}
        common = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING"]
        master_cmd = common + [
            "--headless", "--master", "--master-bind-host", master_host, "--master-bind-port", str(port),
            "--expect-workers", str(workers + remote_workers), "--expect-workers-max-wait", "120",
            "-u", str(concurrency), "-r", str(spawn_rate), "--run-time", f"{run_time:.0f}s", "--host", base,
            "--csv", str(folder / "locust"), "--only-summary", "--exit-code-on-error", "0",
            # at the end each user finishes the request it has in flight: every request sent gets its outcome
            "--stop-timeout", f"{stop_timeout_s:.0f}"]
        worker_cmd = common + ["--worker", "--master-host", master_host, "--master-port", str(port)]
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t_start = time.perf_counter()
        master = subprocess.Popen(master_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        logs = [open(folder / f"worker-{i}.log", "w") for i in range(workers)]
        procs = [subprocess.Popen(worker_cmd, env=env, stdout=subprocess.DEVNULL, stderr=log) for log in logs]
        try:
            _, err = master.communicate(timeout=timeout_s or run_time + stop_timeout_s + 180)
        except subprocess.TimeoutExpired:
            master.kill()
            _, err = master.communicate()
            raise RuntimeError(f"locust master ran past its time limit; its stderr ends: {err[-2000:]}") from None
        finally:
            reap(procs, 30.0)
            for log in logs:
                log.close()
        wall = time.perf_counter() - t_start
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if master.returncode not in (0, None):
            raise RuntimeError(f"locust master exited with {master.returncode}: {err[-2000:]}")
        rows = [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
        engine_stats = _locust_stats(folder / "locust")
        worker_err = "".join((folder / f"worker-{i}.log").read_text()[-1000:] for i in range(workers))
    if not rows:
        raise RuntimeError(f"locust recorded no requests (is {url} up?); the master's stderr ends: {err[-1500:]}; "
                           f"the workers': {worker_err[-1500:]}")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] + warmup_s + ramp_s
    t1 = t0 + duration_s
    measured = [r for r in rows if t0 <= r[0] < t1]
    responses, timings = [], []
    for i, (start, rt_ms, status, reason) in enumerate(measured):
        done = start + rt_ms / 1000
        failure = reason if status == 0 else None
        if reason and 200 <= status < 300:  # answered, but the answer failed the API's check in the worker
            responses.append(Response(i, "error", reason, t_submit=start, t_done=done))
        else:
            payload = {"error": reason} if reason else {}
            responses.append(http_response(i, status or None, payload, start, done, failure or (
                "no HTTP answer" if not status else None)))
        timings.append((start, start, done))
    result = LoadResult("closed", concurrency, None, responses, t0, t1, engine="locust",
                        texts_per_request=api.client_batch, api=api.describe())
    result.timings = timings
    result.ok_in_window = sum(200 <= status < 300 and not reason and t0 <= start + rt / 1000 <= t1
                              for start, rt, status, reason in rows)
    result.warmup_requests = sum(r[0] < t0 for r in rows)
    result.cooldown_requests = sum(r[0] >= t1 for r in rows)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    result.client_cpu = cpu / max(wall, 1e-9)  # cores used by the master and the local workers together
    result.engine_stats = {**engine_stats, "workers": workers, "remote_workers": remote_workers,
                           "locust_warnings": [line for line in err.splitlines() if "CPU usage" in line][:5]}
    per_worker = result.client_cpu / max(workers, 1)
    if workers and per_worker > CLIENT_BOTTLENECK or result.engine_stats["locust_warnings"]:
        warnings.warn(f"locust's processes used {result.client_cpu:.2f} cores ({per_worker:.0%} of a core per local "
                      f"worker): the load generator may be the bottleneck; add --workers (or workers on other "
                      "machines)", RuntimeWarning, stacklevel=2)
    return result
