"""Load generator: closed loop at fixed concurrency, open loop at a fixed (Poisson) rate.

Drives the in-process :class:`~tuning.serve.Server` or any HTTP endpoint that takes the
same JSON as ``POST /embed``. Warm-up is excluded from every figure; the counts of the
measured requests add up: ``submitted == ok + errors + timeouts + rejected``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import clock as _clock
from .knobs import Knobs
from .serve import SERVE_STAGES, Response, Server
from .stats import clean, ledger_dict, stage_ledger, summarize

Target = Callable[[Any], Response]


def server_target(server: Server) -> Target:
    """Send to an in-process server and wait for the outcome."""
    return lambda raw: server.submit(raw).result()


def http_target(url: str, timeout_s: float = 60.0) -> Target:
    """POST each request as JSON to ``url`` (e.g. ``http://127.0.0.1:8000/embed``)."""
    counter = itertools.count()

    def send(raw: Any) -> Response:
        rid = next(counter)
        body = raw if isinstance(raw, (bytes, bytearray)) else json.dumps(
            {"text": raw} if isinstance(raw, str) else raw).encode()
        t0 = _clock.now()
        request = urllib.request.Request(url, data=bytes(body), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                payload = json.loads(resp.read())
                outcome, reason = "ok", None
        except urllib.error.HTTPError as exc:
            payload = _json_or_empty(exc.read())
            outcome = {503: "rejected", 504: "timeout"}.get(exc.code, "error")
            reason = f"HTTP {exc.code}: {payload.get('error', exc.reason)}"
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            payload, outcome, reason = {}, "error", f"connection failed: {exc}"
        t1 = _clock.now()
        stages = payload.get("timings_ms", {}) if isinstance(payload, dict) else {}
        return Response(rid, outcome, reason, payload.get("id") if isinstance(payload, dict) else None,
                        None, int(payload.get("n_tokens", 0) or 0), bool(payload.get("truncated", False)),
                        int(payload.get("batch_size", 0) or 0), t0, t1,
                        **{f"{s}_ms": float(stages.get(s, 0.0)) for s in SERVE_STAGES})

    return send


def _json_or_empty(raw: bytes) -> dict:
    try:
        obj = json.loads(raw)
        return obj if isinstance(obj, dict) else {}
    except (ValueError, TypeError):
        return {}


@dataclass
class LoadResult:
    """Raw responses of one load test (warm-up excluded) and what was seen during it."""

    mode: str  # "closed" or "open"
    concurrency: int
    rate: float | None
    responses: list[Response]
    t_window_start: float
    t_end: float
    inflight: list[tuple[float, int]] = field(default_factory=list)
    batch_log: list[tuple[float, int]] = field(default_factory=list)
    busy_s: float | None = None
    wait_for_input_total_s: float = 0.0
    warmup_requests: int = 0
    knobs: Knobs | None = None
    spans_: list[tuple[float, float]] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return max(self.t_end - self.t_window_start, 1e-9)

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.responses)

    @property
    def submitted(self) -> int:
        return len(self.responses)

    @property
    def qps(self) -> float:
        """Successful responses per second over the measured window."""
        return self.count("ok") / self.window_s

    @property
    def model_busy(self) -> float:
        return min(self.busy_s / self.window_s, 1.0) if self.busy_s is not None else math.nan

    def latency(self) -> dict[str, float]:
        return summarize(r.latency_ms for r in self.responses if r.outcome == "ok")

    def ledger(self) -> pd.DataFrame:
        """Per-stage time of the ok requests (queue wait included): p50/p99 (ms) and shares."""
        return stage_ledger([r for r in self.responses if r.outcome == "ok"], SERVE_STAGES)

    def to_frame(self) -> pd.DataFrame:
        """One row per measured request."""
        return pd.DataFrame([{**r.as_dict(), "latency_ms": r.latency_ms} for r in self.responses])

    def inflight_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.inflight, columns=["t", "inflight"])

    def batches_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.batch_log, columns=["t", "batch_size"])

    # the recorder's workload interface
    def spans(self) -> list[tuple[float, float]]:
        return list(self.spans_)

    def batch_sizes(self) -> list[int]:
        """Per model call when the server is in-process; else per ok request as the server reported it."""
        if self.batch_log:
            return [size for _, size in self.batch_log]
        return [r.batch_size for r in self.responses if r.outcome == "ok" and r.batch_size]

    def wait_for_input_s(self) -> float:
        return self.wait_for_input_total_s

    def summary(self) -> dict[str, Any]:
        lat = self.latency()
        ledger = self.ledger()
        sizes = self.batch_sizes()
        return {
            "mode": self.mode, "concurrency": self.concurrency, "rate": self.rate,
            "qps": clean(self.qps), "p50_ms": clean(lat["p50"]), "p90_ms": clean(lat["p90"]),
            "p95_ms": clean(lat["p95"]), "p99_ms": clean(lat["p99"]),
            "submitted": self.submitted, "ok": self.count("ok"), "errors": self.count("error"),
            "timeouts": self.count("timeout"), "rejected": self.count("rejected"),
            "warmup_requests": self.warmup_requests, "window_s": clean(self.window_s),
            "model_busy": clean(self.model_busy),
            "mean_batch": clean(float(np.mean(sizes))) if sizes else None,
            "stages": ledger_dict(ledger),
            "error_reasons": _top_reasons(self.responses),
            "knobs": self.knobs.as_dict() if self.knobs else None,
        }


def _top_reasons(responses: Sequence[Response], top: int = 5) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for r in responses:
        if r.outcome != "ok":
            key = f"{r.outcome}: {(r.reason or '')[:120]}"
            counts[key] = counts.get(key, 0) + 1
    return [{"reason": k, "count": v} for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]


class _Tracker:
    """Counts in-flight requests and keeps every response with its warm-up flag."""

    def __init__(self, clock: _clock.Clock):
        self.clock = clock
        self.lock = threading.Lock()
        self.inflight = 0
        self.series: list[tuple[float, int]] = []
        self.responses: list[tuple[Response, bool]] = []

    def begin(self) -> None:
        with self.lock:
            self.inflight += 1
            self.series.append((self.clock(), self.inflight))

    def end(self, response: Response, warm: bool) -> None:
        with self.lock:
            self.inflight -= 1
            self.series.append((self.clock(), self.inflight))
            self.responses.append((response, warm))


def _safe_call(target: Target, raw: Any, clock: _clock.Clock) -> Response:
    t0 = clock()
    try:
        return target(raw)
    except Exception as exc:  # a broken client call is still exactly one outcome
        return Response(-1, "error", f"client error: {type(exc).__name__}: {exc}", t_submit=t0, t_done=clock())


def run_load(target: Target | Server | str, inputs: Sequence[Any], concurrency: int = 1,
             requests: int | None = None, duration_s: float | None = None, rate: float | None = None,
             warmup_s: float = 0.0, warmup_requests: int = 0, seed: int = 0,
             clock: _clock.Clock | None = None) -> LoadResult:
    """Closed loop (``rate=None``): ``concurrency`` clients, each sends its next request when the last
    returns. Open loop (``rate`` req/s): Poisson arrivals, at most ``concurrency`` in flight on the client
    side. Stops after ``requests`` measured requests or ``duration_s`` seconds (one of them is required).
    """
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests=N or duration_s=S")
    if requests is not None and (not isinstance(requests, int) or requests < 1):
        raise ValueError(f"requests={requests!r} must be an integer >= 1")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s={duration_s!r} must be > 0")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r} must be an integer >= 1")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate={rate!r} must be > 0 requests per second")
    if not inputs:
        raise ValueError("inputs is empty: give at least one request body")
    server = target if isinstance(target, Server) else None
    send = server_target(target) if server else http_target(target) if isinstance(target, str) else target
    clock = clock or _clock.now
    tracker = _Tracker(clock)
    source = itertools.cycle(inputs)
    lock = threading.Lock()
    t_begin = clock()
    state: dict[str, Any] = {"warm": 0, "measured": 0, "window_start": None}

    def next_ticket() -> tuple[Any, bool] | None:
        """The next request body and whether it is warm-up; None when the test is over."""
        with lock:
            now = clock()
            if state["window_start"] is None:
                if state["warm"] < warmup_requests or now - t_begin < warmup_s:
                    state["warm"] += 1
                    return next(source), True
                state["window_start"] = now
            if requests is not None and state["measured"] >= requests:
                return None
            if duration_s is not None and now - state["window_start"] >= duration_s:
                return None
            state["measured"] += 1
            return next(source), False

    def closed_client() -> None:
        while (ticket := next_ticket()) is not None:
            tracker.begin()
            tracker.end(_safe_call(send, ticket[0], clock), ticket[1])

    if rate is None:
        _run_threads(closed_client, concurrency)
    else:
        _open_loop(send, next_ticket, tracker, rate, concurrency, seed, clock)
    t_end = clock()
    measured = [r for r, warm in tracker.responses if not warm]
    n_warm = sum(warm for _, warm in tracker.responses)
    t0 = state["window_start"] if state["window_start"] is not None else t_begin
    result = LoadResult("closed" if rate is None else "open", concurrency, rate, measured, t0, t_end,
                        tracker.series, warmup_requests=n_warm)
    if server is not None:
        logs = [b for b in list(server.batches) if b.t_end >= t0]
        result.batch_log = [(b.t_end, b.size) for b in logs]
        result.spans_ = [(b.t_start, b.t_end) for b in logs]
        result.busy_s = server.busy_seconds(t0, t_end)
        result.wait_for_input_total_s = sum(b.wait_for_input_ms for b in logs) / 1000
        result.knobs = server.knobs
    return result


def _run_threads(fn: Callable[[], None], n: int) -> None:
    threads = [threading.Thread(target=fn, name=f"load-client-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _open_loop(send: Target, next_ticket: Callable, tracker: _Tracker, rate: float, concurrency: int,
               seed: int, clock: _clock.Clock) -> None:
    """Poisson arrivals at ``rate``; at most ``concurrency`` requests in flight on the client side
    (an arrival that finds every slot busy waits for one, as a real client pool would)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(seed)
    slots = threading.Semaphore(concurrency)

    def fire(raw: Any, warm: bool) -> None:
        try:
            tracker.end(_safe_call(send, raw, clock), warm)
        finally:
            slots.release()

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load-client") as pool:
        t_next = clock()
        while (ticket := next_ticket()) is not None:
            t_next += rng.expovariate(rate)
            delay = t_next - clock()
            if delay > 0:
                time.sleep(delay)
            slots.acquire()
            tracker.begin()
            pool.submit(fire, *ticket)


def sweep(knobs: Knobs, inputs: Sequence[Any], variable: str, values: Sequence[Any], requests: int = 200,
          concurrency: int | None = None, warmup_requests: int = 16, server_factory: Callable | None = None,
          engine: Any = None) -> pd.DataFrame:
    """Load-test one knob at several values (others fixed); one row per value, ready to chart.

    ``variable`` is ``"concurrency"`` (client side) or a server knob such as ``"max_wait_ms"``.
    The engine (model) is built once and shared by every point.
    """
    from .engine import Engine

    engine = engine or Engine(knobs)
    rows = []
    for value in values:
        point = knobs.replace(**{variable: value}) if variable != "concurrency" else knobs.replace(concurrency=value)
        make = server_factory or (lambda k: Server(k, engine=engine))
        with make(point) as server:
            result = run_load(server, inputs, concurrency=concurrency or point.concurrency, requests=requests,
                              warmup_requests=warmup_requests)
        s = result.summary()
        rows.append({variable: value, **{k: s[k] for k in ("qps", "p50_ms", "p95_ms", "p99_ms", "ok", "errors",
                                                            "timeouts", "rejected", "model_busy", "mean_batch")}})
    return pd.DataFrame(rows)


