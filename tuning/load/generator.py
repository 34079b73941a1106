"""Load generator: closed loop at fixed concurrency, open loop at a fixed (Poisson) rate.

Drives the in-process :class:`~tuning.online.serve.Server`, any HTTP endpoint that takes the same
JSON as ``POST /embed``, or a server in another process over a pipe (:class:`PipeTarget`).
An HTTP endpoint is driven by an asyncio client on one thread with a keep-alive connection
pool (one connection per client slot, opened once; :mod:`tuning.load.http1`, a small HTTP/1.1
client on uvloop where installed, so that the client is not what is measured; aiohttp for
``https://`` and redirects): no connection set-up per request, an accurate open-loop schedule,
and every transport failure (refused, reset, timed out) is that request's ``error`` outcome
with the reason. The client's own CPU use is
reported (``client_cpu``), with a warning when the client, not the server, is the bottleneck.
The counts of the measured requests add up: ``submitted == ok + errors + timeouts + rejected``.

How it measures (see the README, "How latency is measured"):

- Latency is client side. In the open loop it runs from each request's *scheduled* arrival,
  not from its send: when every client is busy the arrival waits, and that wait is part of
  its latency (no coordinated omission, as wrk2 and HdrHistogram require). The send lag
  (send - scheduled) and the achieved send rate are reported beside the offered rate, with
  a warning when the generator fell short of it. In the closed loop it runs from the send.
- Percentiles cover every outcome (a timeout or a rejection is a latency too), with the
  error rate beside them; the ok-only percentiles are reported as ``ok_p99_ms`` and so on.
- The measured window is steady: warm-up requests before it and a cool-down after it keep
  the load constant, so no measured request is sent at a ramp or answered in a drain. The
  measured requests are those sent (closed loop) or scheduled (open loop) in the window;
  throughput counts the ok answers received in it.
- Model busy is the server's running busy total read at the two edges of the window.
- A test whose first :data:`EARLY_STOP_ERRORS` answers are all errors stops there (``stopped_early`` says so
  with the first reason); every request already sent still gets its outcome, and all of them are measured.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import queue
import random
import re
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from tuning.base import clock as _clock
from tuning.base.stats import clean, ledger_dict, stage_ledger, summarize
from tuning.inputs.records import RecordError
from tuning.knobs import Knobs
from tuning.load import http1
from tuning.load.apis import Api
from tuning.online.response import SERVE_STAGES, Response
from tuning.online.serve import Server

TUNING_API = Api("tuning", validate=False)  # this package's own server: status decides (its answer is checked in tests)

Target = Callable[[Any], Response]


def server_target(server: Server, keep_embeddings: bool = False) -> Target:
    """Send to an in-process server and wait for the outcome (embeddings only if ``keep_embeddings``)."""
    return lambda raw: server.submit(raw, embedding=keep_embeddings).result()


CLIENT_BOTTLENECK = 0.8  # the client's loop thread busier than this share of a core: it may be the bottleneck
# A load test whose first EARLY_STOP_ERRORS answers are all errors stops (a wrong route, body or API, nothing
# listening): without it a 404 answered in milliseconds fires tens of thousands of requests a second. Only "error" outcomes count:
# a timeout (a server slow to warm up) or a rejection (503/429: overloaded, or still loading) is the server's
# answer to load and ends the rule, as does any ok answer. 50 is more than one round of any usual concurrency's
# first requests (a few connections reset while a server opens, a model's first call failing) and a small
# fraction of a second of a wrong route.
EARLY_STOP_ERRORS = 50


def request_body(raw: Any) -> bytes:
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw)
    return json.dumps({"text": raw} if isinstance(raw, str) else raw).encode()


def http_response(rid: int, status: int | None, payload: Any, t0: float, t1: float,
                  failure: str | None = None, api: Api | None = None, data: bytes | None = None,
                  headers: Any = None, texts: int | None = None) -> Response:
    """One HTTP exchange as a :class:`Response`. With an ``api`` (:mod:`tuning.load.apis`): ok only for a 2xx
    answer that carries one embedding per text sent, 503/429 rejected, 504 timeout, anything else an error with
    the reason from the body. Without one (this package's own server): 2xx ok, the same reasons."""
    if failure is not None:
        return Response(rid, "error", f"connection failed: {failure}", t_submit=t0, t_done=t1)
    if data is None:
        data = json.dumps(payload).encode() if isinstance(payload, (dict, list)) else b""
    outcome, reason, parsed = (api or TUNING_API).check(status, data, texts)
    if type(parsed) is not dict:  # TEI's bare list, or not JSON: none of this package's fields (the fast path)
        stages = api.server_stages(headers) if api is not None and outcome == "ok" else None
        return Response(rid, outcome, reason, t_submit=t0, t_done=t1,
                        **({f"{s}_ms": float(v) for s, v in stages.items() if s in SERVE_STAGES} if stages else {}))
    payload = parsed
    stages = payload.get("timings_ms", {}) if outcome == "ok" and isinstance(payload.get("timings_ms"), dict) else {}
    if api is not None and outcome == "ok":
        stages = {**stages, **api.server_stages(headers)}
    return Response(rid, outcome, reason, payload.get("id") if isinstance(payload.get("id"), str) else None, None,
                    int(payload.get("n_tokens", 0) or 0) if isinstance(payload.get("n_tokens", 0), (int, float)) else 0,
                    bool(payload.get("truncated", False)), int(payload.get("batch_size", 0) or 0)
                    if isinstance(payload.get("batch_size", 0), (int, float)) else 0, t0, t1,
                    **{f"{s}_ms": float(stages.get(s, 0.0)) for s in SERVE_STAGES})


def transport_failure(rid: int, exc: BaseException, t0: float, t1: float) -> Response:
    """A request that got no HTTP answer: a ``timeout`` when the client's per-request timeout ran out (asyncio's
    and aiohttp's timeouts are ``TimeoutError``s), else an ``error`` naming the failure (refused, reset, not HTTP)."""
    text = f"{type(exc).__name__}: {str(exc) or type(exc).__name__}"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # distinct classes before Python 3.11
        return Response(rid, "timeout", f"timed out: {text}", t_submit=t0, t_done=t1)
    return http_response(rid, None, {}, t0, t1, text)


class AsyncHttpClient:
    """``POST`` request bodies to ``url`` over a keep-alive pool of at most ``connections`` connections.
    Use inside the event loop that runs it: ``async with AsyncHttpClient(...) as c: await c(raw)``.
    Never raises for a request: a transport failure is that request's error outcome.

    An ``http://`` URL goes through :mod:`tuning.load.http1` (one connection per slot, bodies encoded once,
    httptools' parser: a fifth of aiohttp's CPU per request, see that module); ``https://`` and what that
    client does not speak (see :func:`tuning.load.http1.supported`), and any redirect, through aiohttp.
    ``transport`` says which one it took (``http1`` or ``aiohttp``)."""

    def __init__(self, url: str, connections: int, timeout_s: float = 60.0, clock: _clock.Clock | None = None,
                 api: Api | None = None):
        self.url, self.connections = url, connections
        self.api = api
        self.timeout_s = api.timeout_s if api is not None else timeout_s
        self.clock = clock or _clock.now
        self._ids = itertools.count()
        self.session = None
        self.pool: http1.Pool | None = None
        self.headers = self.api.header_dict() if self.api is not None else {"Content-Type": "application/json"}
        self.transport = "aiohttp"
        self.why_aiohttp: str | None = None

    async def __aenter__(self) -> "AsyncHttpClient":
        self.why_aiohttp = "TUNING_HTTP_CLIENT=aiohttp" if http1.client_kind() == "aiohttp" else \
            http1.supported(self.url, self.headers)
        if self.why_aiohttp is None:
            self.pool = http1.Pool(self.url, self.connections, self.timeout_s, self.headers)
            self.transport = "http1"
        else:
            await self._open_session()
        return self

    async def _open_session(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=self.connections,
                                         force_close=False, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                             headers=self.headers)

    async def __aexit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.close()
            await asyncio.sleep(0)  # let the closed connections' callbacks run on this loop
        if self.session is not None:
            await self.session.close()

    async def __call__(self, raw: Any) -> Response:
        rid = next(self._ids)
        t0 = self.clock()
        if isinstance(raw, RecordError):  # an input that cannot be a request: its own error, not sent
            return Response(rid, "error", f"bad input: {raw.reason}", raw.id, t_submit=t0, t_done=t0)
        body = raw if type(raw) is bytes else request_body(raw)
        if self.pool is not None:
            try:
                status, data, headers = await self.pool.post(body)
            except Exception as exc:  # refused, reset, timed out, not HTTP: this request's one outcome
                return transport_failure(rid, exc, t0, self.clock())
            if status not in http1.REDIRECTS:
                return http_response(rid, status, None, t0, self.clock(), api=self.api, data=data, headers=headers)
            if self.session is None:  # a redirect: aiohttp follows it, as it always did
                await self._open_session()
        try:
            async with self.session.post(self.url, data=body) as resp:
                data = await resp.read()
                status, headers = resp.status, resp.headers
            return http_response(rid, status, None, t0, self.clock(), api=self.api, data=data, headers=headers)
        except Exception as exc:  # refused, reset, timed out, protocol error: this request's one outcome
            return transport_failure(rid, exc, t0, self.clock())


class HttpTarget:
    """A blocking, thread-safe target that POSTs to ``url`` over a keep-alive pool (an
    :class:`AsyncHttpClient` on a background event loop of its own). :func:`run_load` given one (or a
    URL) drives the URL with the async client directly; called from threads, it still reuses
    connections. ``close()`` ends its loop (it is a daemon thread otherwise)."""

    def __init__(self, url: str, timeout_s: float = 60.0, connections: int = 256, api: Api | None = None):
        self.url, self.timeout_s, self.connections, self.api = url, timeout_s, connections, api
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AsyncHttpClient | None = None
        self._thread: threading.Thread | None = None

    def _started(self) -> tuple[asyncio.AbstractEventLoop, AsyncHttpClient]:
        with self._lock:
            if self._loop is None:
                loop = http1.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="http-target", daemon=True)
                self._thread.start()
                client = AsyncHttpClient(self.url, self.connections, self.timeout_s, api=self.api)
                asyncio.run_coroutine_threadsafe(client.__aenter__(), loop).result()
                self._loop, self._client = loop, client
                self._finalizer = weakref.finalize(self, _stop_loop, loop, client)  # when dropped, or at exit
            return self._loop, self._client

    def __call__(self, raw: Any) -> Response:
        loop, client = self._started()
        return asyncio.run_coroutine_threadsafe(client(raw), loop).result()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            self._finalizer()
            self._thread.join(timeout=10)
            loop.close()


def _stop_loop(loop: asyncio.AbstractEventLoop, client: AsyncHttpClient) -> None:
    """Close the client's session on its loop, then stop the loop (never waits: safe from a finalizer)."""
    async def close() -> None:
        try:
            await client.__aexit__(None, None, None)
        finally:
            loop.stop()

    if loop.is_running():
        asyncio.run_coroutine_threadsafe(close(), loop)


def http_target(url: str, timeout_s: float = 60.0, api: Api | None = None) -> HttpTarget:
    """A blocking callable POSTing to ``url`` over a keep-alive pool (see :class:`HttpTarget`)."""
    return HttpTarget(url, timeout_s, api=api)


def _json_or_empty(raw: bytes) -> dict:
    try:
        obj = json.loads(raw)
        return obj if isinstance(obj, dict) else {}
    except (ValueError, TypeError):
        return {}


@dataclass
class LoadResult:
    """Raw responses of one load test's measured window ``[t_window_start, t_end)`` and what was seen.

    ``timings`` holds, per response, the client's (scheduled, sent, received) times; latency is
    received - scheduled (the open loop's schedule; the send in the closed loop).
    """

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
    timings: list[tuple[float, float, float]] = field(default_factory=list, repr=False)
    ok_in_window: int | None = None  # ok answers received in the window, whichever phase sent them
    cooldown_requests: int = 0
    busy_window: tuple[float, float] | None = None  # when the busy total was read
    device: dict[str, Any] = field(default_factory=dict)  # kind (simulated | cpu | cuda), name/profile, source
    device_timeline: Any = field(default=None, repr=False)  # the simulated device's DeviceTimeline (None: real)
    client_cpu: float | None = None  # HTTP client: CPU of its loop thread / wall time of the run (1.0 = a core)
    engine: str = "tuning"  # the load generator: "tuning" (ours) or "locust"
    texts_per_request: int = 1  # --client-batch: texts each request carries
    api: dict[str, Any] | None = None  # the request schema spoken (tuning.load.apis.Api.describe), secrets masked
    engine_stats: dict[str, Any] = field(default_factory=dict)  # the load generator's own figures (locust's)
    stopped_early: str | None = None  # why the test stopped before its end (its first answers were all errors)

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
        """Successful responses received per second in the measured window."""
        ok = self.ok_in_window if self.ok_in_window is not None else self.count("ok")
        return ok / self.window_s

    @property
    def p50_ms(self) -> float:
        """Median latency over every outcome of the window (from the scheduled arrival in an open loop)."""
        return self.latency()["p50"]

    @property
    def p99_ms(self) -> float:
        """99th-percentile latency over every outcome of the window."""
        return self.latency()["p99"]

    @property
    def error_rate(self) -> float:
        """Share of the measured requests whose outcome is not ok."""
        return (self.submitted - self.count("ok")) / self.submitted if self.submitted else math.nan

    @property
    def offered_rate(self) -> float | None:
        """Open loop: arrivals scheduled in the window per second (the Poisson draw of ``rate``)."""
        return self.submitted / self.window_s if self.mode == "open" else None

    @property
    def achieved_rate(self) -> float | None:
        """Open loop: measured requests actually sent in the window per second."""
        if self.mode != "open":
            return None
        return sum(sent < self.t_end for _, sent, _ in self.timings) / self.window_s

    @property
    def model_busy(self) -> float:
        if self.busy_s is None:
            return math.nan
        span = self.busy_window[1] - self.busy_window[0] if self.busy_window else self.window_s
        return min(self.busy_s / max(span, 1e-9), 1.0)

    def latencies_ms(self, ok_only: bool = False) -> list[float]:
        """Client-side latency of each measured request (from its scheduled arrival in the open loop)."""
        if not self.timings:
            return [r.latency_ms for r in self.responses if not ok_only or r.outcome == "ok"]
        return [(received - scheduled) * 1000 for r, (scheduled, _, received) in zip(self.responses, self.timings)
                if not ok_only or r.outcome == "ok"]

    def send_lags_ms(self) -> list[float]:
        """How late each measured request was sent after its scheduled arrival (0 in the closed loop)."""
        return [(sent - scheduled) * 1000 for scheduled, sent, _ in self.timings]

    @property
    def device_busy(self) -> float:
        """Device compute time in the window / window (simulated timeline; model busy on a CPU; NaN on CUDA)."""
        from tuning.sim.standin import window_device_busy

        return window_device_busy(self.device, self.device_timeline, self.t_window_start, self.t_end,
                                  self.window_s, self.model_busy)

    def latency(self, ok_only: bool = False) -> dict[str, float]:
        """Percentiles over every outcome (``ok_only=True``: the ok requests alone)."""
        return summarize(self.latencies_ms(ok_only))

    def ledger(self) -> pd.DataFrame:
        """Per-stage time of the ok requests (queue wait included): p50/p99 (ms) and shares."""
        return stage_ledger([r for r in self.responses if r.outcome == "ok"], SERVE_STAGES)

    def to_frame(self) -> pd.DataFrame:
        """One row per measured request; ``latency_ms`` is the client's (from the scheduled arrival)."""
        rows = [r.as_dict() for r in self.responses]
        for row, latency, timing in zip(rows, self.latencies_ms(), self.timings or [None] * len(rows)):
            row["latency_ms"] = latency
            if timing is not None:
                scheduled, sent, received = timing
                row.update(t_scheduled=scheduled, t_sent=sent, t_received=received,
                           send_lag_ms=(sent - scheduled) * 1000)
        return pd.DataFrame(rows)

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
        lat, ok_lat = self.latency(), self.latency(ok_only=True)
        lags = summarize(self.send_lags_ms())
        ledger = self.ledger()
        sizes = self.batch_sizes()
        offered, achieved = self.offered_rate, self.achieved_rate
        return {
            "mode": self.mode, "concurrency": self.concurrency, "rate": self.rate,
            "latency_from": "scheduled arrival" if self.mode == "open" else "send",
            "qps": clean(self.qps), "texts_per_s": clean(self.qps * self.texts_per_request),
            "texts_per_request": self.texts_per_request, "p50_ms": clean(lat["p50"]), "p90_ms": clean(lat["p90"]),
            "p95_ms": clean(lat["p95"]), "p99_ms": clean(lat["p99"]), "error_rate": clean(self.error_rate),
            **{f"ok_p{q}_ms": clean(ok_lat[f"p{q}"]) for q in (50, 90, 95, 99)},
            "offered_rate": clean(offered) if offered is not None else None,
            "achieved_rate": clean(achieved) if achieved is not None else None,
            "send_lag_p50_ms": clean(lags["p50"]), "send_lag_p99_ms": clean(lags["p99"]),
            "submitted": self.submitted, "ok": self.count("ok"), "errors": self.count("error"),
            "timeouts": self.count("timeout"), "rejected": self.count("rejected"),
            "warmup_requests": self.warmup_requests, "cooldown_requests": self.cooldown_requests,
            "window_s": clean(self.window_s), "busy_s": clean(self.busy_s) if self.busy_s is not None else None,
            "model_busy": clean(self.model_busy), "device_busy": clean(self.device_busy),
            "device": self.device or None,  # null: a service of its own, whose device this client cannot see
            "mean_batch": clean(float(np.mean(sizes))) if sizes else None,
            "stages": ledger_dict(ledger),
            "error_reasons": _top_reasons(self.responses),
            "client_cpu": clean(self.client_cpu) if self.client_cpu is not None else None,
            "engine": self.engine, **({"engine_stats": self.engine_stats} if self.engine_stats else {}),
            "knobs": self.knobs.as_dict() if self.knobs else None,
            **({"api": self.api} if self.api else {}),
            **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
        }


# a number in a failure's reason that is the request's own (an index, a length), not an HTTP status
_OWN_NUMBER = re.compile(r"(?<!HTTP )\b\d+(?:\.\d+)?\b")


def _top_reasons(responses: Sequence[Response], top: int = 5) -> list[dict[str, Any]]:
    """The commonest failure reasons, those that differ only in their requests' own numbers counted as one (shown
    by the first of them)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in responses:
        if r.outcome != "ok":
            reason = f"{r.outcome}: {(r.reason or '')[:120]}"
            row = rows.setdefault(_OWN_NUMBER.sub("#", reason), {"reason": reason, "count": 0})
            row["count"] += 1
    return sorted(rows.values(), key=lambda row: -row["count"])[:top]


def abandon_failed(exc: BaseException) -> str:
    """The warning when abandoning a load test's cool-down queue raised (in the load test's process or the server's)."""
    return f"could not abandon the cool-down's queue ({type(exc).__name__}: {exc}); waiting for it to drain instead"


class _Run:
    """One load test's phases (warm-up, measured window, cool-down) and every request's record.

    A request's phase is decided when it is due: at its send in the closed loop, at its scheduled
    arrival in the open loop. The window opens at the first measured request and closes at the first
    one after it; then cool-down requests keep the load steady until every measured request has its
    answer, and the test stops. The busy probe is read at the two edges.
    """

    def __init__(self, inputs: Sequence[Any], clock: _clock.Clock, warmup_requests: int, warmup_s: float,
                 requests: int | None, duration_s: float | None, busy_probe: Callable[[], float | None] | None,
                 abandon: Callable[[], None] | None = None):
        self.source = itertools.cycle(inputs)
        self.clock = clock
        self.warmup_requests, self.warmup_s = warmup_requests, warmup_s
        self.requests, self.duration_s = requests, duration_s
        self.busy_probe = busy_probe
        self.lock = threading.Lock()
        self.t_begin = clock()
        self.t0: float | None = None
        self.t1: float | None = None
        self.busy: list[tuple[float, float | None]] = []  # (when, busy total) at the window's edges
        self.n_warm = self.n_measured = self.n_cool = 0
        self.outstanding = 0  # measured requests not yet answered
        self.inflight = 0
        self.series: list[tuple[float, int]] = []
        self.records: list[tuple[Response, str, float, float, float]] = []  # response, phase, sched, sent, recv
        self.stopped = False
        self._abandon = abandon
        self.errors_first: int | None = 0  # errors answered while no other outcome came back; None once one did
        self.first_error = ""
        self.stopped_early: str | None = None
        self.t_stopped: float | None = None

    def over(self) -> None:
        """The schedule is over: once every measured request has its outcome (not after a Ctrl-C, whose measured
        requests are still owed theirs), the cool-down's queued requests are abandoned (see :func:`run_load`)."""
        with self.lock:
            abandon, self._abandon = self._abandon, None
            done = not self.stopped and self.t1 is not None and self.outstanding == 0
        if abandon is not None and done:
            try:
                abandon()
            except Exception as exc:  # noqa: BLE001 - the measured result is complete; losing the shortcut costs time only
                warnings.warn(abandon_failed(exc), RuntimeWarning, stacklevel=2)

    def _read_busy(self) -> None:
        if self.busy_probe is not None:
            self.busy.append((self.clock(), self.busy_probe()))

    def stop(self) -> None:
        """End the test now (Ctrl-C): no more tickets; the window closes here."""
        with self.lock:
            self.stopped = True
            if self.t0 is not None and self.t1 is None:
                self.t1 = self.clock()

    def ticket(self, due: float) -> tuple[Any, str] | None:
        """The next request body and its phase (warm, measured, cool) for a request due at ``due``;
        None when the test is over."""
        with self.lock:
            if self.stopped:
                return None
            if self.t0 is None:
                if self.n_warm < self.warmup_requests or due - self.t_begin < self.warmup_s:
                    self.n_warm += 1
                    return next(self.source), "warm"
                self.t0 = due
                self._read_busy()
            if self.t1 is None:
                if (self.n_measured < self.requests) if self.requests is not None else \
                        (due < self.t0 + self.duration_s):
                    self.n_measured += 1
                    self.outstanding += 1
                    return next(self.source), "measured"
                self.t1 = due if self.requests is not None else self.t0 + self.duration_s
                self._read_busy()
            if self.outstanding == 0:
                return None
            self.n_cool += 1
            return next(self.source), "cool"

    def begin(self) -> None:
        with self.lock:
            self.inflight += 1
            self.series.append((self.clock(), self.inflight))

    def end(self, response: Response, phase: str, scheduled: float, sent: float) -> None:
        with self.lock:
            received = self.clock()
            self.inflight -= 1
            self.series.append((received, self.inflight))
            self.records.append((response, phase, scheduled, sent, received))
            if phase == "measured":
                self.outstanding -= 1
            self._count_first_errors(response, received)

    def _count_first_errors(self, response: Response, now: float) -> None:
        """Stop the test (no more tickets; what is in flight still gets its outcome) once the first
        :data:`EARLY_STOP_ERRORS` answers are all errors. A bad input, never sent, neither counts nor ends the
        count. Called under the lock."""
        if self.errors_first is None or (response.reason or "").startswith("bad input"):
            return
        if response.outcome != "error":
            self.errors_first = None
            return
        self.errors_first += 1
        self.first_error = self.first_error or (response.reason or "error")
        if self.errors_first >= EARLY_STOP_ERRORS and not self.stopped:
            self.stopped_early = f"the first {EARLY_STOP_ERRORS} requests all failed: {self.first_error}"
            self.stopped, self.t_stopped = True, now


def _safe_call(target: Target, raw: Any, clock: _clock.Clock) -> Response:
    t0 = clock()
    try:
        return target(raw)
    except Exception as exc:  # a broken client call is still exactly one outcome
        return Response(-1, "error", f"client error: {type(exc).__name__}: {exc}", t_submit=t0, t_done=clock())


def run_load(target: Target | Server | str, inputs: Sequence[Any], concurrency: int = 1,
             requests: int | None = None, duration_s: float | None = None, rate: float | None = None,
             warmup_s: float = 0.0, warmup_requests: int = 0, seed: int = 0,
             clock: _clock.Clock | None = None, busy_probe: Callable[[], float | None] | None = None,
             keep_embeddings: bool = False, api: Api | None = None,
             abandon: Callable[[], None] | None = None) -> LoadResult:
    """Closed loop (``rate=None``): ``concurrency`` clients, each sends its next request when the last
    returns. Open loop (``rate`` req/s): Poisson arrivals, at most ``concurrency`` in flight on the client
    side; latency runs from each arrival's scheduled time. Measures ``requests`` requests or ``duration_s``
    seconds (one of them is required) after the warm-up, then cools down (see the module docstring).

    ``busy_probe`` returns the server's running busy seconds (an in-process server's is used by default);
    it is read when the window opens and when it closes. Responses keep their embeddings only with
    ``keep_embeddings=True`` (in-process server). ``api`` (:class:`tuning.load.apis.Api`): the schema, headers
    and answer check for a URL target (``inputs`` then are bodies it encoded, see ``Api.encode``).

    ``abandon`` (a server this test owns): called once every measured request has its outcome, to fail at once
    the cool-down requests still queued (each still gets its one outcome, an error that says the server shut
    down) instead of waiting for them: none of them is measured. Near and past the knee that wait (the queue
    behind the last measured request) can be as long as the window itself. A URL target's server is
    not this test's to shut down: pass no ``abandon`` there (the cool-down then waits for its queue). If
    ``abandon`` raises, the measured result stands and a RuntimeWarning says the queue was waited for instead.
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
    url = target if isinstance(target, str) else target.url if isinstance(target, HttpTarget) else None
    if url is not None and abandon is not None:
        raise ValueError(f"abandon= was given for the URL target {url!r}: a URL's server is not this test's to shut "
                         "down; drop abandon (the cool-down then waits for its queue)")
    if server is not None and server.failure is None and not server.health()[0]:
        raise ValueError("the server is not running (never started, or closed): every request would be rejected. "
                         "Start it (server.start(), or `with server:`), or load a fresh Server: a load test with "
                         "abandon= closes its server without draining")
    if server is not None:
        send = server_target(server, keep_embeddings)
        busy_probe = busy_probe or (lambda: server.busy_total_s)
    else:
        send = target
    clock = clock or _clock.now
    run = _Run(inputs, clock, warmup_requests, warmup_s, requests, duration_s, busy_probe, abandon)
    client_cpu = None

    def closed_client() -> None:
        while True:
            sent = clock()
            ticket = run.ticket(sent)
            if ticket is None:
                run.over()
                return
            run.begin()
            run.end(_safe_call(send, ticket[0], clock), ticket[1], sent, sent)

    interrupted = None
    try:
        if url is not None:
            client_cpu = _async_http_load(url, run, rate, concurrency, seed, clock,
                                          api if api is not None else getattr(target, "api", None))
        elif rate is None:
            _run_threads(closed_client, concurrency)
        else:
            _open_loop(send, run, rate, concurrency, seed, clock)
    except KeyboardInterrupt as exc:  # Ctrl-C: no new requests; what was measured goes up with the interrupt
        run.stop()
        interrupted = exc
    t0, t1, measured = _measured(run, clock)
    result = LoadResult("closed" if rate is None else "open", concurrency, rate, [rec[0] for rec in measured],
                        t0, t1, run.series, warmup_requests=run.n_warm)
    result.timings = [(sched, sent, recv) for _, _, sched, sent, recv in measured]
    result.ok_in_window = sum(r.outcome == "ok" and t0 <= recv < t1 for r, _, _, _, recv in run.records)
    result.cooldown_requests = run.n_cool
    result.client_cpu = client_cpu
    if run.stopped_early is not None:  # every request sent is measured: none was left out as warm-up or cool-down
        result.stopped_early, result.warmup_requests, result.cooldown_requests = run.stopped_early, 0, 0
    if api is not None:
        result.texts_per_request, result.api = api.client_batch, api.describe()
    if len(run.busy) == 2 and run.busy[0][1] is not None and run.busy[1][1] is not None:
        result.busy_s = max(run.busy[1][1] - run.busy[0][1], 0.0)
        result.busy_window = (run.busy[0][0], run.busy[1][0])
    if server is not None:
        attach_server(result, server)
    if interrupted is not None:
        interrupted.partial = result
        raise interrupted
    if result.mode == "open" and result.submitted and result.achieved_rate < 0.95 * result.offered_rate:
        lag = summarize(result.send_lags_ms())
        warnings.warn(
            f"open loop offered {result.offered_rate:.1f} req/s but achieved {result.achieved_rate:.1f} req/s "
            f"(send lag p50 {lag['p50']:.0f} ms, p99 {lag['p99']:.0f} ms): every one of the {concurrency} "
            "clients was busy; the latencies count that wait from the scheduled arrival. Raise concurrency, "
            "or lower the rate below what the server sustains", RuntimeWarning, stacklevel=2)
    # a run that got no answer at all says so itself; its client CPU share is that of a few failed connects
    if client_cpu is not None and client_cpu > CLIENT_BOTTLENECK and result.count("ok") > 0:
        warnings.warn(
            f"the load client's loop used {client_cpu:.0%} of a core: it, not the server, may be the bottleneck "
            "(its requests wait for the client). Spread the load over processes: "
            "`--client-procs N` (one per core the client may use), or run the client on another machine", RuntimeWarning,
            stacklevel=2)
    return result


def _measured(run: _Run, clock: _clock.Clock) -> tuple[float, float, list[tuple]]:
    """The window and its records. A test stopped early (its first answers all errors) measures every request
    it sent, warm-up included, from its start to its stop: it has no steady window to keep clean, and its errors
    are its result (a test stopped in its warm-up would otherwise measure nothing and hide them)."""
    if run.stopped_early is not None:
        return run.t_begin, max(run.t_stopped, run.t_begin + 1e-9), list(run.records)
    t0 = run.t0 if run.t0 is not None else run.t_begin
    t1 = run.t1 if run.t1 is not None else clock()
    return t0, t1, [rec for rec in run.records if rec[1] == "measured"]


def attach_server(result: LoadResult, server: Server) -> LoadResult:
    """Add what only the server's process knows to a result (its batches in the window, its knobs and device):
    done by :func:`run_load` for an in-process server, and by the caller when the load ran in another process."""
    t0, t1 = result.t_window_start, result.t_end
    logs = [b for b in list(server.batches) if t0 <= b.t_end <= t1]  # for charts; busy is the running total
    result.batch_log = [(b.t_end, b.size) for b in logs]
    result.spans_ = [(b.t_start, b.t_end) for b in logs]
    result.wait_for_input_total_s = sum(b.wait_for_input_ms for b in logs) / 1000
    result.knobs = server.knobs
    result.device = server.engine.device_info
    result.device_timeline = server.engine.device_timeline()
    return result


def _run_threads(fn: Callable[[], None], n: int) -> None:
    threads = [threading.Thread(target=fn, name=f"load-client-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _open_loop(send: Target, run: _Run, rate: float, concurrency: int, seed: int, clock: _clock.Clock) -> None:
    """Poisson arrivals at ``rate`` on a fixed schedule; at most ``concurrency`` requests in flight on the
    client side. An arrival that finds every client busy waits for one (as a real client pool would), but
    the schedule does not move: its latency still runs from its scheduled time."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(seed)
    slots = threading.Semaphore(concurrency)

    def fire(raw: Any, phase: str, scheduled: float) -> None:
        sent = clock()  # when a worker takes it up, not when it was queued (see _async_http_load)
        try:
            run.end(_safe_call(send, raw, clock), phase, scheduled, sent)
        finally:
            slots.release()

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load-client") as pool:
        scheduled = clock()
        while True:
            slots.acquire()  # a free client first: any wait for one is send lag, counted in the latency
            delay = scheduled - clock()
            if delay > 0:
                time.sleep(delay)
            ticket = run.ticket(scheduled)
            if ticket is None:
                slots.release()
                run.over()
                break
            run.begin()
            pool.submit(fire, ticket[0], ticket[1], scheduled)
            scheduled += rng.expovariate(rate)


def _async_http_load(url: str, run: _Run, rate: float | None, concurrency: int, seed: int,
                     clock: _clock.Clock, api: Api | None = None) -> float:
    """Drive ``url`` with the pooled async client on a thread of its own (so it also works where an event
    loop is already running, as in a notebook): ``concurrency`` client tasks in the closed loop, the
    Poisson schedule in the open loop (at most ``concurrency`` in flight). Returns the client's CPU share
    (its loop thread's CPU time over the run's wall time)."""
    cpu: list[float] = []
    failure: list[BaseException] = []

    async def drive() -> None:
        async with AsyncHttpClient(url, concurrency, clock=clock, api=api) as client:
            if rate is None:
                async def closed_client() -> None:
                    while (ticket := run.ticket(sent := clock())) is not None:
                        run.begin()
                        run.end(await client(ticket[0]), ticket[1], sent, sent)

                await asyncio.gather(*(closed_client() for _ in range(concurrency)))
                return
            rng = random.Random(seed)
            slots = asyncio.Semaphore(concurrency)
            tasks: set[asyncio.Task] = set()

            async def fire(raw: Any, phase: str, scheduled: float) -> None:
                # sent when this task runs: a loop behind its schedule queues several due requests at once and
                # sends them one by one; timing them at the queueing would hide that lateness from the send lag
                sent = clock()
                try:
                    run.end(await client(raw), phase, scheduled, sent)
                finally:
                    slots.release()

            scheduled = clock()
            while True:
                await slots.acquire()  # a free client first: any wait for one is send lag, counted in the latency
                delay = scheduled - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                ticket = run.ticket(scheduled)
                if ticket is None:
                    slots.release()
                    break
                run.begin()
                task = asyncio.get_running_loop().create_task(fire(ticket[0], ticket[1], scheduled))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                scheduled += rng.expovariate(rate)
            await asyncio.gather(*tasks)

    def thread() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            http1.run(drive)
        except BaseException as exc:  # surfaced in the caller's thread
            failure.append(exc)
        cpu.append((time.thread_time() - c0) / max(time.perf_counter() - t0, 1e-9))

    worker = threading.Thread(target=thread, name="load-client", daemon=True)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return cpu[0]


class PipeTarget:
    """A target in a load-generating process: each request goes over a ``multiprocessing`` connection to
    :func:`serve_pipe` in the server's process, many in flight on one pipe. Keeps the load generator's
    threads and GIL out of the measured server. A context manager: closing ends the server side too."""

    def __init__(self, conn: Any):
        self.conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._reader = threading.Thread(target=self._read, name="pipe-reader", daemon=True)

    def __enter__(self) -> "PipeTarget":
        self._reader.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._send_lock:
            self.conn.send(None)
        self._reader.join()

    def _read(self) -> None:
        try:
            while (msg := self.conn.recv()) is not None:
                key, answer = msg
                with self._lock:
                    future = self._pending.pop(key)
                future.set_result(Response(**answer) if isinstance(answer, dict) else answer)
        except (EOFError, OSError) as exc:  # the server's side is gone: every pending request gets an outcome
            with self._lock:
                pending, self._pending = list(self._pending.values()), {}
            for future in pending:
                future.set_exception(ConnectionError(f"the server's pipe closed: {exc or type(exc).__name__}"))

    def _ask(self, kind: str, raw: Any = None) -> Any:
        key, future = next(self._ids), Future()
        with self._lock:
            self._pending[key] = future
        with self._send_lock:
            self.conn.send((kind, key, raw))
        return future.result()

    def __call__(self, raw: Any) -> Response:
        return self._ask("request", raw)

    def busy(self) -> float:
        """The server's running busy seconds (a ``busy_probe`` for :func:`run_load`)."""
        return self._ask("busy")

    def abandon(self) -> None:
        """Ask the server's side to fail what it still has queued (``run_load``'s ``abandon``): it shuts that
        server down, so only for a server that lives for one load test; the answers come back as usual."""
        with self._send_lock:
            self.conn.send(("abandon", None, None))


def serve_pipe(server: Server, conn: Any) -> Callable[[], None]:
    """Answer :class:`PipeTarget` requests arriving on ``conn`` with ``server`` (no embeddings sent back),
    on a reader and a sender thread; returns a function that waits until the client has closed. The client's
    :meth:`PipeTarget.abandon` closes ``server`` without draining it."""
    answers: queue.Queue = queue.Queue()
    failed: list[str] = []  # an abandon that raised: told on the caller's thread by the returned function

    def read() -> None:
        n = 0
        try:
            while (msg := conn.recv()) is not None:
                kind, key, raw = msg
                if kind == "busy":
                    answers.put((key, server.busy_total_s))
                elif kind == "abandon":  # no answer of its own: the queued requests' failures are the answers
                    try:
                        server.close(drain=False)
                    except Exception as exc:  # noqa: BLE001 - the queue then drains: each request still gets its answer
                        failed.append(abandon_failed(exc))
                    continue
                else:
                    server.submit(raw, embedding=False).add_done_callback(
                        lambda f, key=key: answers.put((key, f.result())))
                n += 1
        except (EOFError, OSError):  # the client went away (Ctrl-C, a killed load process): stop quietly
            answers.put((None, -1))
            return
        answers.put((None, n))

    def write() -> None:
        sent, expected = 0, None
        try:
            while expected is None or sent < expected:
                key, answer = answers.get()
                if key is None:
                    if answer < 0:
                        return
                    expected = answer
                    continue
                if isinstance(answer, Response):
                    answer = answer.as_dict()
                    answer.pop("latency_ms")
                conn.send((key, answer))
                sent += 1
            conn.send(None)
        except (OSError, EOFError):  # the client went away mid-answer
            return

    threads = [threading.Thread(target=fn, name=name, daemon=True) for fn, name in ((read, "pipe-in"),
                                                                                   (write, "pipe-out"))]
    for t in threads:
        t.start()

    def done() -> None:
        for t in threads:
            t.join()
        for text in failed:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
    return done


