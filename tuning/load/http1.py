"""A small HTTP/1.1 keep-alive client for the load generator: the client must not be what is measured.

Why its own client: a load test measures the server only while the client has CPU to spare. Against a bare
ASGI echo, each on a core of its own, the aiohttp client spends several times the CPU per request of a minimal
client such as Debian's ``hey`` (``bench/client_ceiling.py``; its figures, with the machine they were measured on,
in ``bench/results/client_ceiling.json``), so a service faster than its ceiling measures the client, and a GPU
service of this kind answers thousands of requests per second. aiohttp's cost is its generality (a request object,
a response object, a stream reader, payload wrappers, a timer context and cookie, redirect and
decompression handling per request); a load generator sends the same few bodies over and over to one
host. So this client does only that:

- one HTTP/1.1 connection per client slot, opened once and kept alive (``Pool``); a connection the server
  closed, reset or that timed out is dropped and the next request on that slot opens a new one;
- the request's head and body as one ``bytes`` built once per distinct body (``Content-Length`` framing,
  one ``write`` per request), the ``--header`` values in the head;
- the answer parsed by ``httptools`` (llhttp, the parser uvicorn uses) on an ``asyncio.Protocol``:
  ``Content-Length``, chunked and read-until-close bodies; gzip/deflate decoded if a server sends them
  unasked; the response headers kept for TEI's ``x-*-time`` stage timings;
- on uvloop's event loop when uvloop is installed (``new_event_loop``), else the standard library's.

Every request gets exactly one outcome: ``Pool.post`` returns ``(status, body, headers)`` or raises
(``ConnectError`` for a refused or unreachable host, ``ServerDisconnected`` for a connection closed or
reset before the answer was whole, ``TimeoutError`` past the per-request timeout, ``ProtocolError`` for an
answer that is not HTTP); the caller (:class:`tuning.load.generator.AsyncHttpClient`) turns either into a
:class:`~tuning.online.response.Response`. What it does not do goes to aiohttp, as before: ``https://``,
a user name in the URL, a host that is not ASCII, a path with spaces or beyond ASCII (aiohttp %-encodes
it), header values outside latin-1, and any redirect
(``supported`` says why a URL is not taken; ``TUNING_HTTP_CLIENT=aiohttp`` forces aiohttp,
``TUNING_EVENT_LOOP=asyncio`` forces the standard event loop).
"""

from __future__ import annotations

import asyncio
import os
import zlib
from collections import deque
from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import urlsplit

import httptools

REDIRECTS = frozenset((301, 302, 303, 307, 308))
WIRE_CACHE = 4096  # distinct request bodies whose bytes on the wire are kept (a load test cycles a few hundred)
USER_AGENT = "tuning-loadgen/1"


class TransportError(Exception):
    """A request that got no whole HTTP answer."""


class ConnectError(TransportError):
    """The connection could not be opened (refused, unreachable, name not resolved)."""


class ServerDisconnected(TransportError):
    """The server closed or reset the connection before the answer was whole."""


class ProtocolError(TransportError):
    """The server's bytes are not an HTTP/1.1 answer."""


def client_kind() -> str:
    """``aiohttp`` when ``TUNING_HTTP_CLIENT=aiohttp`` forces it, else ``http1`` (this module, where it can)."""
    return "aiohttp" if os.environ.get("TUNING_HTTP_CLIENT", "").strip().lower() == "aiohttp" else "http1"


def supported(url: str, headers: Mapping[str, str]) -> str | None:
    """None if this client can send to ``url`` with ``headers``; else why not (aiohttp sends them)."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return f"{parts.scheme}:// (TLS goes through aiohttp)"
    if parts.username is not None or parts.password is not None:
        return "a user name in the URL"
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        return f"the URL's port: {exc}"
    if not host or not host.isascii():
        return "a host name that is not ASCII"
    target = parts.path + parts.query
    if not target.isascii() or any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        return "a path that is not plain ASCII (aiohttp %-encodes it)"
    for name, value in headers.items():
        if not name.isascii() or any(c in name for c in "\r\n: ") or any(c in value for c in "\r\n"):
            return f"the header {name!r}"
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            return f"the header {name!r} is not latin-1"
    return None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when installed (unless ``TUNING_EVENT_LOOP=asyncio``), else the standard one."""
    if os.environ.get("TUNING_EVENT_LOOP", "").strip().lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    """``asyncio.run(main())`` on :func:`new_event_loop`'s loop."""
    if hasattr(asyncio, "Runner"):  # Python 3.11+
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main())
    loop = new_event_loop()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


class Headers:
    """An answer's headers, looked up by name in any case (``get``); built into a dict on first use."""

    __slots__ = ("raw", "_map", "has_x")

    def __init__(self, raw: list[tuple[bytes, bytes]], has_x: bool = True):
        self.raw, self._map = raw, None
        self.has_x = has_x  # False: no header's name starts with x- (TEI's timings are looked up on every answer)

    def _built(self) -> dict[str, str]:
        if self._map is None:
            m: dict[str, str] = {}
            for name, value in self.raw:
                key, text = name.decode("latin-1").lower(), value.decode("latin-1")
                m[key] = f"{m[key]}, {text}" if key in m else text
            self._map = m
        return self._map

    def get(self, name: str, default: Any = None) -> Any:
        if not self.has_x and name[:2] in ("x-", "X-"):
            return default
        return self._built().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._built()[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._built()

    def items(self) -> Any:
        return self._built().items()

    def __repr__(self) -> str:
        return f"Headers({self._built()!r})"


class _Conn(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight, its answer parsed as it arrives."""

    def __init__(self, pool: "Pool"):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.deadline = 0.0  # the request in flight times out here (the pool's sweep looks)
        self.closed = False
        self._reset_message()

    def _reset_message(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.encoding: bytes | None = None
        self.has_x = False
        self.framed = False  # Content-Length or chunked: the answer ends by itself, not at the close
        self.headers_done = False

    # --- the request ---

    def send(self, wire: bytes, loop: asyncio.AbstractEventLoop, deadline: float) -> asyncio.Future:
        waiter = self.waiter = loop.create_future()
        self.deadline = deadline
        self.transport.write(wire)
        return waiter

    def _settle(self, result: Any = None, exc: BaseException | None = None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(result)

    def _timed_out(self) -> None:
        self._settle(exc=TimeoutError(f"no whole answer within {self.pool.timeout_s:g} s"))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()  # a late answer must not be read as the next request's
            self.pool._lost(self)

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection can no longer be trusted
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._settle(exc=ProtocolError("the server switched protocols"))
            self.close()
        except httptools.HttpParserError as exc:
            self._settle(exc=ProtocolError(f"not an HTTP/1.1 answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost settles what is pending

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None:
            if self.headers_done and not self.framed and exc is None:  # an answer without a length ends at the
                self._settle(self._answer())  # close (a reset is no end: what came is half an answer)
            else:
                why = f": {exc}" if exc is not None else ""
                self._settle(exc=ServerDisconnected(f"the server closed the connection before the answer was "
                                                    f"whole{why}"))
        if not self.closed:
            self.closed = True
            self.pool._lost(self)

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        if name[:2] in (b"x-", b"X-"):
            self.has_x = True
        n = len(name)
        if n == 14 or n == 17:
            low = name.lower()
            if low == b"content-length" or (low == b"transfer-encoding" and b"chunked" in value.lower()):
                self.framed = True
        elif n == 16 and name.lower() == b"content-encoding":
            self.encoding = value.strip().lower()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.framed = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self._reset_message()
            return
        keep = self.parser.should_keep_alive()
        answer = self._answer()
        self._reset_message()
        self._settle(answer)
        if not keep:
            self.close()

    def _answer(self) -> tuple[int, bytes, Headers]:
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        if self.encoding in (b"gzip", b"x-gzip", b"deflate"):
            try:
                data = zlib.decompress(data, 47 if self.encoding != b"deflate" else 15)
            except zlib.error:
                try:
                    data = zlib.decompress(data, -15)  # raw deflate, as some servers send
                except zlib.error:
                    pass  # left as sent: the answer check says it is not JSON
        return self.status, data, Headers(self.raw_headers, self.has_x)


class Pool:
    """Keep-alive connections to one ``http://`` URL, at most ``connections`` open; ``await post(body)``
    sends one ``POST`` on an idle connection (or a new one, or waits for one) and returns
    ``(status, body, headers)``, or raises a :class:`TransportError` or ``TimeoutError``. Use on one event
    loop; ``close()`` when done."""

    def __init__(self, url: str, connections: int, timeout_s: float, headers: Mapping[str, str]):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.connections, self.timeout_s = max(int(connections), 1), float(timeout_s)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port is not None and parts.port != 80:
            host_header = f"{host_header}:{parts.port}"
        given = {k.lower(): (k, v) for k, v in headers.items()}
        fixed = {"host": ("Host", host_header), "user-agent": ("User-Agent", USER_AGENT), "accept": ("Accept", "*/*")}
        fixed.update({k: kv for k, kv in given.items() if k not in ("content-length", "transfer-encoding",
                                                                     "connection")})
        head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fixed.values())
        self._head = head.encode("latin-1")
        self._wires: dict[bytes, bytes] = {}
        self._idle: list[_Conn] = []
        self._open = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future] = deque()
        self._conns: set[_Conn] = set()  # every open connection, idle or busy (close() closes them all)
        self._closing = False
        # one sweep for every connection's deadline, not a timer per request (a timer armed and cancelled per
        # request cost 3% of the client's CPU): a timeout fires at most a tick late (1/20 of it, <= 0.1 s)
        self.tick = min(max(self.timeout_s / 20, 0.001), 0.1)
        self._sweeper: asyncio.TimerHandle | None = None
        self.opened = 0  # connections opened over the pool's life (a test of keep-alive reads it)

    def wire(self, body: bytes) -> bytes:
        """The request's bytes on the wire: head, framing and body, built once per distinct body."""
        wire = self._wires.get(body)
        if wire is None:
            wire = self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body
            if len(self._wires) >= WIRE_CACHE:
                self._wires.clear()
            self._wires[body] = wire
        return wire

    async def post(self, body: bytes) -> tuple[int, bytes, Headers]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        conn = self._idle.pop() if self._idle else await self._acquire(loop, deadline)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.tick, self._sweep, loop)
        try:
            return await conn.send(self.wire(body), loop, deadline)
        finally:
            self._release(conn)

    async def _acquire(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Conn:
        while True:
            if self._closing:
                raise ConnectError("the client is closing")
            if self._idle:
                return self._idle.pop()
            if self._open < self.connections:
                return await self._connect(loop, deadline)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                conn = await asyncio.wait_for(waiter, max(deadline - loop.time(), 0.0))
            except BaseException as exc:  # timed out or cancelled, perhaps in the turn it was handed a connection
                self._pass_on(waiter)
                if isinstance(exc, asyncio.TimeoutError):
                    raise TimeoutError(f"no free connection within {self.timeout_s:g} s") from None
                raise
            if conn is not None and not conn.closed:
                return conn
            # None: a connection closed, so there is room to open one; loop round

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Conn:
        self._open += 1
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Conn(self), self.host, self.port),
                                             max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:
            self._open -= 1
            self._wake()
            raise TimeoutError(f"cannot connect to {self.host}:{self.port} within {self.timeout_s:g} s") from None
        except OSError as exc:
            self._open -= 1
            self._wake()
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        self.opened += 1
        self._conns.add(conn)
        return conn

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in list(self._conns):
            if conn.waiter is not None and conn.deadline <= now:
                conn._timed_out()
        self._sweeper = loop.call_later(self.tick, self._sweep, loop) if self._conns and not self._closing else None

    def _release(self, conn: _Conn) -> None:
        if conn.closed or conn.waiter is not None:
            if not conn.closed:  # cancelled mid-request: the answer would land on the next one's
                conn.close()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _pass_on(self, waiter: asyncio.Future) -> None:
        """A wait for a connection given up: what it was handed meanwhile (a connection, or room to open one)
        goes to the next waiter, so that the pool is never a connection short."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled():
            conn = waiter.result()
            if conn is None:
                self._wake()
            else:
                self._release(conn)

    def _lost(self, conn: _Conn) -> None:
        """A connection closed (by either side): forget it and let a waiting request open another."""
        if conn not in self._conns:  # one whose connect was abandoned: never counted as open
            return
        self._conns.discard(conn)
        self._open -= 1
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._conns):
            conn.close()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
