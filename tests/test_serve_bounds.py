"""The server's promises under load, and the HTTP status of each outcome (issue 17 item 5).

- Double buffering: at most ``IN_FLIGHT_BATCHES`` (2) batches are dispatched and not yet finished: one in
  the model, one prepared beside it. A slow (gated) model records, at each call, how many batches were
  staged and not finished; with the bound ignored the batcher would keep dispatching small batches.
- Batches grow with load: while the model is busy, requests gather, so the batches after a busy spell are
  full instead of a queue of batches of one.
- One model call at a time (one executor).
- HTTP: ok 200; rejected 503 with ``Retry-After``; timeout 504; a failed batch 500; an unusable input 422;
  no length 411; ``/healthz`` 503 while stopping. Checked on the committed ASGI app with a stub backend, so
  each status comes from the mapping alone (the real server's paths are in tests/test_faults.py).

Nothing is timed: the waits are for conditions, with generous limits.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from tests.helpers import TinyModel
from tuning.inputs.readers import read_lines
from tuning.knobs import Knobs
from tuning.online.httpfront import build_app
from tuning.online.response import Response
from tuning.online.serve import IN_FLIGHT_BATCHES, Server
from tuning.runtime.engine import Engine


def _until(condition, what, limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.002)


class GatedModel(TinyModel):
    """Blocks each call while the gate is shut (once armed); records the calls in the model at once."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.sizes: list[int] = []
        self.entered = threading.Event()

    def forward(self, ids, mask):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.armed:
                self.sizes.append(int(ids.shape[0]))
                self.entered.set()
                assert self.gate.wait(60), "the test never opened the gate"
            return super().forward(ids, mask)
        finally:
            with self.lock:
                self.inside -= 1


@pytest.fixture(scope="module")
def lines():
    return [raw for _, raw in read_lines(limit=60)]


def test_at_most_two_batches_in_flight_and_batches_grow_while_the_model_is_busy(lines):
    """Rule (serve.py, double buffering): one batch runs while the next is prepared; no more are dispatched, so
    requests keep gathering and later batches are full (issue 17: the in-flight bound ignored survived)."""
    knobs = Knobs(num_workers=1, batch_size=8, tokenizer="fast", padding="dynamic", max_wait_ms=0.0, max_queue=1024)
    model = GatedModel()
    server = Server(knobs, engine=Engine(knobs, model))
    staged: list[int] = []  # size of each batch handed to the executor
    stage = server.engine.stage

    def counting_stage(prepared):
        staged.append(len(prepared.ok_items))
        return stage(prepared)

    server.engine.stage = counting_stage
    in_flight_at_call: list[int] = []
    forward = model.forward

    def recording_forward(ids, mask):
        if model.armed:
            in_flight_at_call.append(len(staged) - len(in_flight_at_call))  # staged minus calls before this one
        return forward(ids, mask)

    model.forward = recording_forward
    with server:
        try:
            model.armed = True
            futures = [server.submit(lines[0])]
            assert model.entered.wait(30)  # the first batch (one request) is in the model and held there
            futures += [server.submit(raw) for raw in lines[1:41]]
            # every request tokenized and either staged or waiting in the batcher
            _until(lambda: sum(staged) + server.waiting_for_batch == 41 and server._tokenized.empty(), "the backlog")
            time.sleep(0.05)  # give a batcher that ignored the bound the chance to dispatch more (none may leave)
            assert len(staged) == IN_FLIGHT_BATCHES == 2  # one in the model, one prepared beside it
        finally:
            model.gate.set()
        results = [f.result(timeout=60) for f in futures]
    assert all(r.outcome == "ok" for r in results)
    assert max(in_flight_at_call) <= IN_FLIGHT_BATCHES and model.most_inside == 1
    first, second, *later = model.sizes
    assert first == 1 and sum(model.sizes) == 41
    # after the busy spell every batch is full but the last, which takes what is left
    assert later[:-1] == [8] * (len(later) - 1) and 1 <= later[-1] <= 8
    assert [r.batch_size for r in results[:1]] == [1]


def test_batches_stay_small_when_requests_come_one_at_a_time(lines):
    """The other side of the rule: without load there is nothing to gather, so each request rides alone (no
    waiting with max_wait_ms=0)."""
    knobs = Knobs(num_workers=1, batch_size=8, tokenizer="fast", padding="dynamic", max_wait_ms=0.0)
    model = GatedModel()
    model.gate.set()
    with Server(knobs, engine=Engine(knobs, model)) as server:
        model.armed = True
        results = [server.submit(raw).result(timeout=30) for raw in lines[:5]]
    assert [r.batch_size for r in results] == [1] * 5 and model.sizes == [1] * 5


# --- the HTTP status of each outcome, on the ASGI app ----------------------------------------------------------
class StubBackend:
    """What build_app needs of a Server: submit() answers with a chosen response at once."""

    def __init__(self, response=None, health=(True, "ok")):
        self.response, self._health = response, health
        self.queue_depth, self.counts = 3, {"ok": 5, "error": 0, "timeout": 1, "rejected": 2}
        self.knobs = SimpleNamespace(max_queue=64)
        self.submitted: list = []

    def submit(self, payload):
        self.submitted.append(payload)
        future: Future = Future()
        future.set_result(self.response)
        return future

    def health(self):
        return self._health


def _call(app, method, path, headers=(), body=b""):
    """One request through the ASGI app, as uvicorn would pass it; returns (status, headers, JSON body)."""
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    head = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], head, json.loads(payload) if payload else None


def _post(app, body=b'{"text": "hello"}', headers=None):
    headers = headers if headers is not None else [("content-length", str(len(body)))]
    return _call(app, "POST", "/embed", headers, body)


@pytest.mark.parametrize("outcome,input_error,status,retry_after", [
    ("rejected", False, 503, "1"),
    ("timeout", False, 504, None),
    ("error", False, 500, None),
    ("error", True, 422, None),
])
def test_each_outcome_maps_to_its_status(outcome, input_error, status, retry_after):
    """Rule (httpfront.py's error contract): overload is 503 with Retry-After (come back), a deadline 504, a failed
    batch 500, an input the workers could not use 422; the body names the outcome and the reason."""
    response = Response(7, outcome, f"why {outcome}", input_error=input_error)
    got, head, body = _post(build_app(StubBackend(response)))
    assert got == status and head.get("retry-after") == retry_after
    assert body == {"error": f"why {outcome}", "outcome": outcome}


def test_ok_is_200_with_the_embedding():
    import numpy as np

    response = Response(1, "ok", id="r1", embedding=np.array([0.5, -0.25], dtype=np.float32), n_tokens=4, batch_size=2,
                        t_submit=1.0, t_done=1.125)
    backend = StubBackend(response)
    got, head, body = _post(build_app(backend), headers=[("content-length", "17"), ("x-request-id", "abc")])
    assert got == 200 and head["x-request-id"] == "abc" and backend.submitted == ["hello"]
    assert body["embedding"] == [0.5, -0.25] and (body["id"], body["n_tokens"], body["batch_size"]) == ("r1", 4, 2)
    assert body["latency_ms"] == 125.0


def test_a_body_without_a_length_is_411_and_never_reaches_the_server():
    """Rule: no Content-Length and no chunked encoding is 411 (HTTP/1.1's Length Required); the ASGI equivalent
    is a request whose headers carry neither."""
    backend = StubBackend(Response(0, "ok"))
    got, _, body = _post(build_app(backend), headers=[])
    assert (got, body) == (411, {"error": "Content-Length header is required"}) and backend.submitted == []


def test_length_errors_are_400_and_413():
    app = build_app(StubBackend(Response(0, "ok")))
    got, _, body = _post(app, headers=[("content-length", "ten")])
    assert (got, body) == (400, {"error": "Content-Length 'ten' is not an integer"})
    got, head, body = _post(app, body=b"x", headers=[("content-length", str((1 << 20) + 1))])
    assert got == 413 and head["connection"] == "close" and "over the 1048576-byte limit" in body["error"]


@pytest.mark.parametrize("health,status,state", [
    ((True, "ok"), 200, "ok"), ((False, "stopping"), 503, "stopping"), ((False, "batcher crashed"), 503, "failed"),
])
def test_healthz_is_503_unless_healthy(health, status, state):
    """Rule: /healthz answers 503 while the server stops or after one of its threads failed, so a load balancer
    stops sending; the body says why, with the queue depth, the limit and the counts."""
    got, _, body = _call(build_app(StubBackend(health=health)), "GET", "/healthz")
    assert got == status
    assert body == {"status": state, "reason": health[1], "queue_depth": 3, "max_queue": 64,
                    "counts": {"ok": 5, "error": 0, "timeout": 1, "rejected": 2}, "shed_by_front": 0}


def test_healthz_of_a_real_server_while_it_stops(lines):
    knobs = Knobs(num_workers=1, batch_size=2, tokenizer="fast", padding="dynamic")
    server = Server(knobs, engine=Engine(knobs, TinyModel())).start()
    app = build_app(server)
    assert _call(app, "GET", "/healthz")[0] == 200
    with server._lock:
        server._accepting = False  # what close() does first, before it joins the threads
    got, _, body = _call(app, "GET", "/healthz")
    assert (got, body["status"]) == (503, "stopping")
    server.close()
    got, _, body = _call(app, "GET", "/healthz")
    assert (got, body["reason"]) == (503, "not started")  # closed
