"""The HTTP front: a starlette app served by uvicorn (the ASGI stack most Python inference services run;
FastAPI is built on it) in front of a :class:`~tuning.online.serve.Server`, loopback by default.

Routes and error contract:

- ``POST /embed`` with ``{"text": ...}`` or a record object: 200 with the embedding, its token count,
  batch size, latency and per-stage timings; 400 with a JSON error naming the problem (bad UTF-8,
  malformed JSON, wrong field types, a malformed record); 411 without a length; 413 for a body over
  1 MiB; 408 when the body does not arrive in time; 422 when the workers find the request unusable (a
  formatter or tokenizer failing on it); 503 with ``Retry-After`` when the server's queue is full; 504
  when the request's deadline passed (or no answer came within the front's bound); 500 when its batch
  failed. An ``X-Request-Id`` header is echoed on every answer.
- ``GET /healthz``: status, queue depth, the admission limit and the outcome counts; 503 while the
  server stops or after one of its threads failed (the reason is in the body).
- ``GET /metrics``: ``prometheus_client``'s exposition (see :mod:`tuning.online.metrics`).
- Anything else: 404 (405 for a known path with the wrong method), with a JSON error naming the routes.

How the event loop meets the server: the handler submits to the server's bounded queue (a lock and a
``queue.put``, never blocking) and awaits the request's future through ``asyncio.wrap_future``; the
completer thread resolves it and the loop is woken once per answer. Preprocessing, batching and the
model run on the server's own threads, so the loop only parses HTTP and writes JSON. The listen
backlog is sized for thousands of simultaneous new connections (the kernel caps it at
``net.core.somaxconn``; a warning says when that is lower). Shutdown is graceful: the listener closes,
requests in flight get their answers, then the server drains its queue.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
import time
import unicodedata
import warnings
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tuning.inputs.readers import parse_line
from tuning.inputs.records import RecordError
from tuning.online.metrics import CONTENT_TYPE, prometheus_text
from tuning.online.response import SERVE_STAGES
from tuning.online.serve import Server

MAX_BODY_BYTES = 1 << 20
DRAIN_LIMIT_BYTES = 16 << 20  # larger bodies are cut off without reading
DRAIN_TIMEOUT_S = 2.0  # an oversized body is read away for at most this long, then the 413 goes out
STATUS_BY_OUTCOME = {"ok": 200, "rejected": 503, "timeout": 504, "error": 500}
INPUT_ERROR_STATUS = 422  # the JSON was fine but the request could not be processed (found by the workers)
BODY_TIMEOUT_S = 30.0  # a body that does not arrive in full by then is a 408 (a short body pins nothing)
ANSWER_TIMEOUT_S = 120.0  # a request with no answer from the server by then is a 504 (no unbounded wait)
REQUEST_ID_HEADER = "x-request-id"  # echoed on every /embed answer, so a client can match answers to requests
DEFAULT_BACKLOG = 4096
# connections the front serves; a request on one past it gets uvicorn's 503 (connection closed) before its body
# is read (well above max_queue and any keep-alive client pool)
DEFAULT_MAX_CONNECTIONS = 1024  # or the open-file limit less FILES_MARGIN, where that is lower
FILES_MARGIN = 64  # descriptors kept for the process's own files, pipes and the listening socket
ROUTES = "POST /embed, GET /healthz or GET /metrics"


UVICORN_SHED_MESSAGE = "Exceeded concurrency limit."  # what uvicorn logs for each request over limit_concurrency


class ShedCounter(logging.Filter):
    """Counts the requests uvicorn sheds past ``max_connections`` on one front's thread and drops its log
    line for each: a warning per shed request flooded the log exactly when the server could least afford
    it (and a server whose output nobody read blocked on a full pipe). Records from other threads (another
    front in the same process) pass through untouched. The logger must let WARNING through: the count
    rides on uvicorn's log record (uvicorn has no other hook for its 503s)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.thread: threading.Thread | None = None  # the front's thread, set when it starts

    def filter(self, record: logging.LogRecord) -> bool:
        thread = self.thread
        # alive: a front never closed leaves its filter behind, and a new thread may reuse its dead thread's id
        if (record.msg == UVICORN_SHED_MESSAGE and thread is not None and record.thread == thread.ident
                and thread.is_alive()):
            self.count += 1
            return False
        return True


def _error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def validate_body(raw: bytes) -> tuple[Any, str | None]:
    """The request body to submit, or the reason it is bad."""
    try:
        obj = json.loads(raw.decode("utf-8"))  # decode first: json.loads would guess UTF-16/32 from bytes
    except UnicodeDecodeError as exc:
        return None, f"body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON"
    except json.JSONDecodeError as exc:
        return None, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    if "text" in obj:
        if not isinstance(obj["text"], str):
            return None, f"field 'text' must be a string, got {type(obj['text']).__name__}"
        if not obj["text"].strip():
            return None, "field 'text' is empty"
        if not any(unicodedata.category(ch)[0] not in "CZ" for ch in obj["text"]):  # only controls and spaces
            return None, "field 'text' has no visible characters (only control characters or spaces)"
        return obj["text"], None
    parsed = parse_line(raw, 0)
    if isinstance(parsed, RecordError):
        return None, f"{parsed.reason} (send {{\"text\": ...}} or a record with id, title, category, attributes, body)"
    return parsed, None  # the parsed record: the server does not parse it again


def response_body(response: Any) -> bytes:
    """The JSON answer for an ok response. orjson writes the float32 embedding straight from the array
    (each value as the shortest text that reads back to the same float32) in one C call, where ``json.dumps``
    would first build a Python list of 384 float objects and format each one on the event loop's thread."""
    return orjson.dumps({"id": response.id, "embedding": response.embedding, "n_tokens": response.n_tokens,
                         "truncated": response.truncated, "batch_size": response.batch_size,
                         "latency_ms": response.latency_ms,
                         "timings_ms": {s: getattr(response, f"{s}_ms") for s in SERVE_STAGES}},
                        option=orjson.OPT_SERIALIZE_NUMPY)


async def _drain(request: Request) -> None:
    async for _ in request.stream():
        pass


async def _read_body(request: Request) -> tuple[bytes | None, JSONResponse | None]:
    """The body, or the error answer (411, 400, 413; an oversized body is read away up to a limit so the
    client sees the 413 and not a reset)."""
    header = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if header is None and not chunked:
        return None, _error(411, "Content-Length header is required")
    if header is not None:
        try:
            declared = int(header)
        except ValueError:
            return None, _error(400, f"Content-Length {header!r} is not an integer")
        if declared > MAX_BODY_BYTES:
            if declared <= DRAIN_LIMIT_BYTES:  # read it away (briefly: a client waiting for the answer gets it)
                try:
                    await asyncio.wait_for(_drain(request), DRAIN_TIMEOUT_S)
                except asyncio.TimeoutError:
                    pass
            return None, _error(413, f"body of {header} bytes is over the {MAX_BODY_BYTES}-byte limit; "
                                     "send one request per POST", headers={"Connection": "close"})
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            size = len(body)
            async for rest in request.stream():
                size += len(rest)
                if size > DRAIN_LIMIT_BYTES:
                    break
            return None, _error(413, f"chunked body over the {MAX_BODY_BYTES}-byte limit; send one request per "
                                     "POST", headers={"Connection": "close"})
    return bytes(body), None


def _request_id(request: Request) -> str | None:
    rid = request.headers.get(REQUEST_ID_HEADER)
    if rid is None or len(rid) > 128 or not rid.isprintable() or not rid.isascii():
        return None
    return rid


def build_app(backend: Server, body_timeout_s: float = BODY_TIMEOUT_S,
              answer_timeout_s: float = ANSWER_TIMEOUT_S, shed: ShedCounter | None = None) -> Starlette:
    """The ASGI app for ``backend`` (started and closed by its owner). Every wait is bounded: the body
    must arrive within ``body_timeout_s`` (else 408) and the answer within ``answer_timeout_s`` (else 504)."""

    async def embed(request: Request) -> Response:
        response = await _embed(request)
        rid = _request_id(request)
        if rid is not None:
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    async def _embed(request: Request) -> Response:
        try:
            raw, problem = await asyncio.wait_for(_read_body(request), body_timeout_s)
        except ClientDisconnect:
            return Response(status_code=400)
        except asyncio.TimeoutError:
            return _error(408, f"the body did not arrive within {body_timeout_s:g} s (is Content-Length right?)",
                          headers={"Connection": "close"})
        if problem is not None:
            return problem
        payload, reason = validate_body(raw)
        if reason:
            return _error(400, reason)
        future = backend.submit(payload)
        try:
            response = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), answer_timeout_s)
        except asyncio.TimeoutError:  # the request keeps its one outcome in the server's counts
            return _error(504, f"no answer from the server within {answer_timeout_s:g} s", outcome="timeout")
        status = STATUS_BY_OUTCOME[response.outcome]
        if response.outcome == "ok":
            return Response(response_body(response), media_type="application/json")
        if response.outcome == "error" and response.input_error:
            status = INPUT_ERROR_STATUS
        return _error(status, response.reason, headers={"Retry-After": "1"} if status == 503 else None,
                      outcome=response.outcome)

    async def healthz(request: Request) -> Response:
        healthy, reason = backend.health()
        return JSONResponse({"status": "ok" if healthy else "stopping" if reason == "stopping" else "failed",
                             "reason": reason, "queue_depth": backend.queue_depth,
                             "max_queue": backend.knobs.max_queue, "counts": dict(backend.counts),
                             # answered 503 by the front past max_connections, never reaching the server
                             "shed_by_front": shed.count if shed is not None else 0},
                            status_code=200 if healthy else 503)

    async def metrics(request: Request) -> Response:
        return Response(prometheus_text(backend), media_type=CONTENT_TYPE)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, f"no route {request.url.path!r}; use {ROUTES}")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, f"{request.method} is not allowed on {request.url.path!r}; use {ROUTES}")

    return Starlette(routes=[Route("/embed", embed, methods=["POST"]), Route("/healthz", healthz, methods=["GET"]),
                             Route("/metrics", metrics, methods=["GET"])],
                     exception_handlers={404: not_found, 405: not_allowed})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def somaxconn() -> int | None:
    """The kernel's cap on a listen backlog (Linux), or None where it cannot be read."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return None


def listen_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening TCP socket (so the port is known before the server starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def open_files_limit() -> int | None:
    """This process's soft limit on open files (sockets included), or None where unknown."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, OSError, ValueError):
        return None


class HttpFront:
    """uvicorn serving :func:`build_app` for a :class:`Server`, on a thread of this process; loopback by default.

    ``backlog``: the listen queue of connections not yet accepted (a short one, such as the standard library
    server's 5, resets a burst of new connections or makes them wait for a SYN retransmit).

    ``max_connections``: open connections the front serves (uvicorn's ``limit_concurrency``, which also
    caps requests in flight; a request whose client left stays in flight until its answer or the
    ``answer_timeout_s`` bound); a request on a connection past it is answered 503 (plain text,
    connection closed) when its headers arrive, without reaching the server. Every connection is still
    accepted first, and probes (``/healthz``, ``/metrics``) are shed like any request. ``max_queue``
    bounds what the server holds; this bounds the front, which would otherwise keep accepting connections
    under an overload beyond its own ceiling until the process runs out of file descriptors (answers then take
    many seconds and clients see resets). Those 503s are not in the server's outcome counts (the server never
    saw them): ``/healthz`` reports them as ``shed_by_front``.
    """

    def __init__(self, backend: Server, host: str = "127.0.0.1", port: int = 0, backlog: int = DEFAULT_BACKLOG,
                 graceful_timeout_s: float = 30.0, body_timeout_s: float = BODY_TIMEOUT_S,
                 answer_timeout_s: float = ANSWER_TIMEOUT_S, max_connections: int | None = None):
        files = open_files_limit()
        if max_connections is None:  # the default, kept under the open-file limit where that is lower
            max_connections = DEFAULT_MAX_CONNECTIONS if files is None else max(
                1, min(DEFAULT_MAX_CONNECTIONS, files - FILES_MARGIN))
        elif isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections={max_connections!r} must be an integer >= 1 (default "
                             f"{DEFAULT_MAX_CONNECTIONS})")
        elif files is not None and files < max_connections + FILES_MARGIN:
            warnings.warn(f"max_connections={max_connections} is above this process's open-file limit ({files}, "
                          f"ulimit -n) less a margin: past it accept() fails instead of a 503; raise the limit "
                          f"(ulimit -n {max_connections + 1024}) or lower max_connections", RuntimeWarning, stacklevel=2)
        if not is_loopback(host):
            warnings.warn(f"binding {host}: the server is reachable from other machines and has no authentication; "
                          "bind 127.0.0.1 unless that is what you want", RuntimeWarning, stacklevel=2)
        cap = somaxconn()
        if cap is not None and cap < backlog:
            warnings.warn(f"listen backlog {backlog} is capped by the kernel at net.core.somaxconn={cap}; raise it "
                          f"(sysctl -w net.core.somaxconn={backlog}) for bursts of that many new connections",
                          RuntimeWarning, stacklevel=2)
        self.backend = backend
        self.backlog = backlog
        self.max_connections = max_connections
        self.sock = listen_socket(host, port, backlog)
        self.shed = ShedCounter()
        self.app = build_app(backend, body_timeout_s, answer_timeout_s, self.shed)
        config = uvicorn.Config(self.app, backlog=backlog, log_config=None, log_level="warning", access_log=False,
                                lifespan="off", ws="none", timeout_graceful_shutdown=graceful_timeout_s,
                                limit_concurrency=max_connections + 1)  # uvicorn counts the arriving one too
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self, timeout_s: float = 30.0) -> "HttpFront":
        self.backend.start()
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="http-front",
                                        daemon=True)
        logger = logging.getLogger("uvicorn.error")
        self.shed.thread = self._thread  # its ident is read when a record comes, so set before it starts
        logger.addFilter(self.shed)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                logger.removeFilter(self.shed)
                self.backend.close(drain=False)
                raise RuntimeError(f"the HTTP front did not start on {self.url}")
            time.sleep(0.005)
        return self

    def close(self) -> None:
        """Stop accepting, answer what is in flight, then drain the server."""
        self.server.should_exit = True
        if self._thread:
            self._thread.join(timeout=60)
        self.sock.close()
        logging.getLogger("uvicorn.error").removeFilter(self.shed)
        self.backend.close()

    def __enter__(self) -> "HttpFront":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
