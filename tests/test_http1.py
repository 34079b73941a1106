"""The load client's own HTTP/1.1 transport (tuning.load.http1, issue 24 item 8): keep-alive reuse, one outcome
per request for a reset, a refusal and a timeout, chunked and close-delimited answers, headers both ways, and
aiohttp where it does not go (https, redirects, TUNING_HTTP_CLIENT=aiohttp).

A raw socket server of a few lines (threads, loopback only) plays each behaviour by its route, so the bytes on
the wire are exactly the ones named. Nothing here is timed against a target.
"""

import asyncio
import gzip
import json
import socket
import struct
import threading

import pytest

from tests.helpers import installed_by_test_extra
from tuning.base.net import free_port
from tuning.load import http1
from tuning.load.apis import Api
from tuning.load.generator import AsyncHttpClient, HttpTarget, run_load

ANSWER = json.dumps([[0.25, 0.5, 0.75]]).encode()  # TEI: one embedding per text


class RawServer:
    """HTTP/1.1 by hand. Routes: /ok (Content-Length, keep-alive), /chunked (three chunks), /gzip, /eof (no
    length, closes after), /cut (no length, half the body, then a reset), /reset (every third request reset instead
    of answered), /stall (never answers),
    /redirect (307 to /ok), /timed (TEI's x-*-time headers). Records each request's headers and the peers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.peers: set[tuple[str, int]] = set()
        self.requests: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        self.count = 0
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}{route}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.peers.add(peer)
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
                n = int(headers.get("content-length", 0))
                while len(buf) < n:
                    buf += conn.recv(65536)
                body, buf = buf[:n], buf[n:]
                with self.lock:
                    self.count += 1
                    k = self.count
                    self.requests.append(headers)
                    self.bodies.append(body)
                if not self._answer(conn, path, k):
                    return
        except OSError:
            return

    def _answer(self, conn: socket.socket, path: str, k: int) -> bool:
        """Answer one request; False: the connection is done."""
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if path == "/ok":
            conn.sendall(ok + b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
        elif path == "/timed":
            conn.sendall(ok + b"X-Inference-Time: 7\r\nx-queue-time: 2\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
                         + ANSWER)
        elif path == "/chunked":
            parts = [ANSWER[:5], ANSWER[5:12], ANSWER[12:]]
            conn.sendall(ok + b"Transfer-Encoding: chunked\r\n\r\n")
            for p in parts:
                conn.sendall(b"%x\r\n%s\r\n" % (len(p), p))
            conn.sendall(b"0\r\n\r\n")
        elif path == "/gzip":
            z = gzip.compress(ANSWER)
            conn.sendall(ok + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(z) + z)
        elif path == "/eof":
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + ANSWER)
            conn.close()
            return False
        elif path == "/cut":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + ANSWER[:9])
            self.stop.wait(0.1)  # the client reads the half, then the reset comes
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return False
        elif path == "/reset":
            if k % 3 == 0:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # an RST, not an answer
                return False
            conn.sendall(ok + b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
        elif path == "/redirect":
            conn.sendall(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n")
        elif path == "/stall":
            return not self.stop.wait(30)
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nno route.")
        return True


@pytest.fixture
def server():
    with RawServer() as s:
        yield s


TEI = Api("tei")
BODIES = TEI.encode([f"text {i}" for i in range(10)])


def _outcomes(result):
    return [r.outcome for r in result.responses]


def test_keeps_one_connection_per_client_slot_and_sends_the_bytes_once(server):
    result = run_load(server.url("/ok"), BODIES, concurrency=4, requests=80, warmup_requests=4, api=TEI)
    assert _outcomes(result) == ["ok"] * 80
    assert 1 <= len(server.peers) <= 4, server.peers  # opened once per slot, then reused
    assert set(server.bodies) <= set(BODIES) and len(server.bodies) >= 84
    assert server.requests[0]["content-type"] == "application/json" and "connection" not in server.requests[0]
    pool = http1.Pool(server.url("/ok"), 2, 5.0, {})
    assert pool.wire(BODIES[0]) is pool.wire(BODIES[0])  # encoded once per distinct body


def test_a_reset_is_one_error_outcome_and_the_next_request_reconnects(server):
    result = run_load(server.url("/reset"), BODIES, concurrency=1, requests=30, api=TEI)
    outcomes = _outcomes(result)
    errors = [r for r in result.responses if r.outcome == "error"]
    assert len(outcomes) == 30 and outcomes.count("ok") == 20 and len(errors) == 10
    assert all("connection failed: ServerDisconnected" in r.reason for r in errors), errors[0].reason
    assert len(server.peers) == 10  # the first connection, then a new one after each reset but the last


@pytest.mark.filterwarnings("ignore:the load client's loop")
def test_a_refused_connection_is_one_error_outcome_each():
    url = f"http://127.0.0.1:{free_port()}/embed"
    result = run_load(url, BODIES, concurrency=3, requests=9, api=TEI)
    assert _outcomes(result) == ["error"] * 9
    assert all(r.reason.startswith("connection failed: ConnectError: cannot connect to 127.0.0.1") for r in
               result.responses), result.responses[0].reason


def test_a_reset_in_the_middle_of_a_close_delimited_body_is_no_answer(server):
    """Without a length the answer ends at the close, but a reset is not a close: half a body is not an answer."""
    result = run_load(server.url("/cut"), BODIES, concurrency=1, requests=3, api=TEI)
    assert _outcomes(result) == ["error"] * 3
    assert all("connection failed: ServerDisconnected" in r.reason for r in result.responses), result.responses[0].reason


def test_a_connection_handed_over_as_the_wait_for_it_times_out_is_not_lost(server, monkeypatch):
    """A request waiting for a free connection can time out in the very turn a connection is handed to it: the
    connection goes back to the pool (else the pool is one connection short for good, and with one, stuck)."""
    real = asyncio.wait_for

    async def racing(aw, timeout):  # the free connection arrives, and in the same turn the time is up
        if isinstance(aw, asyncio.Future):
            await aw
            raise asyncio.TimeoutError
        return await real(aw, timeout)

    async def main():
        pool = http1.Pool(server.url("/ok"), 1, 1.0, {"Content-Type": "application/json"})
        try:
            first = await asyncio.gather(pool.post(BODIES[0]), pool.post(BODIES[1]), return_exceptions=True)
            monkeypatch.setattr(asyncio, "wait_for", real)
            status, _, _ = await pool.post(BODIES[2])
            return first, status, pool.opened
        finally:
            pool.close()

    monkeypatch.setattr(asyncio, "wait_for", racing)
    first, status, opened = asyncio.run(main())
    assert first[0][0] == 200 and isinstance(first[1], TimeoutError), first
    assert status == 200 and opened == 1


def test_a_path_this_client_cannot_write_goes_through_aiohttp(server):
    assert http1.supported(server.url("/a b"), {}) and http1.supported(server.url("/caf\u00e9"), {})
    assert http1.supported(server.url("/ok?q=1"), {}) is None
    result = run_load(server.url("/caf\u00e9"), BODIES, concurrency=1, requests=2, api=TEI)  # sent %-encoded
    assert _outcomes(result) == ["error"] * 2 and result.responses[0].reason == "HTTP 404: no route."


def test_the_api_timeout_ends_a_stalled_request_as_one_timeout(server):
    """A stalled answer is a timeout, not a connection error (counted as a timeout in the summary)."""
    api = Api("tei", timeout_s=0.3)
    result = run_load(server.url("/stall"), BODIES, concurrency=2, requests=4, api=api)
    assert _outcomes(result) == ["timeout"] * 4 and result.summary()["timeouts"] == 4
    assert all("TimeoutError: no whole answer within 0.3 s" in r.reason for r in result.responses)
    latencies = result.latencies_ms()
    assert all(290 <= ms < 1500 for ms in latencies), latencies  # at most a tick (1/20 of it) late


@pytest.mark.parametrize("route", ["/chunked", "/gzip", "/eof"])
def test_chunked_gzip_and_close_delimited_answers_are_read_whole(server, route):
    result = run_load(server.url(route), BODIES, concurrency=2, requests=12, api=TEI)
    assert _outcomes(result) == ["ok"] * 12, result.responses[0].reason


def test_headers_go_out_and_tei_timings_come_back(server):
    api = Api("tei", headers=(("Authorization", "Bearer sekrit"), ("X-Tenant", "a")))
    result = run_load(server.url("/timed"), BODIES, concurrency=2, requests=6, api=api)
    assert _outcomes(result) == ["ok"] * 6
    seen = server.requests[-1]
    assert seen["authorization"] == "Bearer sekrit" and seen["x-tenant"] == "a"
    assert seen["host"] == f"127.0.0.1:{server.port}" and seen["content-length"] == str(len(server.bodies[-1]))
    r = result.responses[0]
    assert r.inference_ms == 7.0 and r.queue_wait_ms == 2.0 and r.preprocess_ms == 0.0


def test_a_wrong_answer_is_still_checked(server):
    result = run_load(server.url("/nothing"), BODIES, concurrency=1, requests=3, api=TEI)
    assert _outcomes(result) == ["error"] * 3 and result.responses[0].reason == "HTTP 404: no route."


@pytest.mark.filterwarnings("ignore:the load client's loop")  # aiohttp's first import lands in the loop's CPU
def test_redirects_https_and_the_override_go_through_aiohttp(server, monkeypatch):
    result = run_load(server.url("/redirect"), BODIES, concurrency=1, requests=3, api=TEI)
    assert _outcomes(result) == ["ok"] * 3  # followed to /ok, as aiohttp always did

    async def transport(url):
        async with AsyncHttpClient(url, 2, api=TEI) as client:
            return client.transport, client.why_aiohttp, await client(BODIES[0])

    kind, why, response = asyncio.run(transport(f"https://127.0.0.1:{free_port()}/embed"))
    assert kind == "aiohttp" and why.startswith("https://")
    assert response.outcome == "error" and "connection failed" in response.reason  # nothing listens: one outcome
    assert asyncio.run(transport(server.url("/ok")))[:2] == ("http1", None)
    assert http1.supported("http://u:p@127.0.0.1:1/", {}) == "a user name in the URL"
    monkeypatch.setenv("TUNING_HTTP_CLIENT", "aiohttp")
    kind, why, response = asyncio.run(transport(server.url("/ok")))
    assert kind == "aiohttp" and why == "TUNING_HTTP_CLIENT=aiohttp" and response.outcome == "ok"


def test_the_blocking_target_shares_one_pool_across_threads(server):
    from concurrent.futures import ThreadPoolExecutor

    target = HttpTarget(server.url("/ok"), connections=3, api=TEI)
    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(target, BODIES * 3))
    finally:
        target.close()
    assert [r.outcome for r in answers] == ["ok"] * 30
    assert 1 <= len(server.peers) <= 3  # six threads, three connections: the rest waited for a free one


def test_the_event_loop_is_uvloop_when_installed_unless_told(monkeypatch):
    installed_by_test_extra("uvloop")
    loop = http1.new_event_loop()
    assert http1.loop_name(loop) == "uvloop"
    loop.close()
    monkeypatch.setenv("TUNING_EVENT_LOOP", "asyncio")
    loop = http1.new_event_loop()
    assert http1.loop_name(loop) == "asyncio"
    loop.close()


def test_a_send_is_timed_when_the_request_goes_out_not_when_it_was_queued(server, monkeypatch):
    """An event loop that falls behind its open-loop schedule queues several due requests at once; each goes out
    only when the loop gets to it, and that lateness must show as send lag (a late send is counted, not hidden)."""
    import time

    real = AsyncHttpClient.__call__

    async def busy(self, raw):  # the loop is busy 50 ms with each request before it goes out (a CPU-bound client)
        time.sleep(0.05)
        return await real(self, raw)

    monkeypatch.setattr(AsyncHttpClient, "__call__", busy)
    result = run_load(server.url("/ok"), BODIES, concurrency=4, requests=6, rate=1000.0, api=TEI)
    assert _outcomes(result) == ["ok"] * 6
    sent = sorted(t[1] for t in result.timings)
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 0.04, gaps  # one request out per 50 ms of the loop, so one send per 50 ms
    assert max(result.send_lags_ms()) >= 200, result.send_lags_ms()  # the last went out 250 ms after the first
