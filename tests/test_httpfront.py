"""The HTTP front on uvicorn + starlette, its /metrics, and the keep-alive load client (issue 11).

Loopback only, bounded request counts; nothing here is timed against a target.
"""

import asyncio
import json
import threading
import urllib.error
import urllib.request
import warnings
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cli_run import run_cli
from tests.helpers import TinyModel
from tuning.base.net import free_port
from tuning.inputs.readers import read_lines
from tuning.knobs import Knobs
from tuning.load.generator import run_load
from tuning.online.httpfront import HttpFront, is_loopback
from tuning.online.serve import Server
from tuning.runtime.engine import Engine

KNOBS = Knobs(num_workers=2, batch_size=8, tokenizer="fast", padding="bucket", max_wait_ms=2.0)


@pytest.fixture(scope="module")
def lines():
    return [raw for _, raw in read_lines(limit=100)]


def make_front(knobs=KNOBS, **model_kw):
    return HttpFront(Server(knobs, engine=Engine(knobs, TinyModel(**model_kw))), port=0)


def _post(url, body: bytes):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_200_simultaneous_new_connections_are_all_answered():
    """Review finding (issue 11): the standard library's listen backlog (5) overflowed under a burst of new
    connections: some were reset or waited for a SYN retransmit, with no answer and no outcome."""

    async def one(host, port, body):
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            writer.write(b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return data.split(b" ", 2)[1].decode() if data else "no answer"
        except (OSError, asyncio.TimeoutError) as exc:
            return type(exc).__name__

    async def burst(url):
        host, port = url.split("//")[1].rsplit(":", 1)
        body = json.dumps({"text": "hello there"}).encode()
        return await asyncio.gather(*(one(host, int(port), body) for _ in range(200)))

    with make_front() as front:
        answers = Counter(asyncio.run(burst(front.url)))
        counts = dict(front.backend.counts)
    assert answers == {"200": 200}, answers
    assert counts["ok"] == 200


def test_errors_keep_their_contract(lines):
    knobs = KNOBS.replace(max_queue=1, num_workers=1, batch_size=1)
    with make_front(knobs, delay_s=0.3) as front:
        url = front.url + "/embed"
        status, _, body = _post(front.url + "/nope", b"{}")
        assert status == 404 and "POST /embed" in body["error"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=10)  # GET on a POST route
        assert info.value.code == 405 and "POST /embed" in json.loads(info.value.read())["error"]
        raw = urllib.request.Request(url, data=iter([b'{"text": "chunked"}']), method="POST",
                                     headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        with urllib.request.urlopen(raw, timeout=30) as resp:  # a chunked body (no Content-Length) is read too
            assert resp.status == 200
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(_post(url, lines[0]))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rejected = [(h, b) for status, h, b in answers if status == 503]
    assert rejected and all(h.get("retry-after") == "1" and b["outcome"] == "rejected" for h, b in rejected)


def test_deadline_is_a_504():
    with make_front(KNOBS.replace(num_workers=1, batch_size=1, deadline_ms=20.0), delay_s=0.1) as front:
        status, _, body = _post(front.url + "/embed", json.dumps({"text": "late"}).encode())
    assert status == 504 and body["outcome"] == "timeout" and "deadline" in body["error"]


def test_metrics_parse_with_prometheus_client_and_mirror_tei(lines):
    with make_front() as front:
        result = run_load(front.url + "/embed", lines[:20] + [b"{oops"], concurrency=4, requests=42)
        with urllib.request.urlopen(front.url + "/metrics", timeout=10) as resp:
            content_type = resp.headers["Content-Type"]
            text = resp.read().decode()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert families["tuning_requests"].type == "counter" and families["tuning_model_busy_seconds"].type == "counter"
    for name in ("tuning_request_duration_seconds", "tuning_request_tokenization_duration_seconds",
                 "tuning_request_queue_duration_seconds", "tuning_request_inference_duration_seconds",
                 "tuning_stage_duration_seconds", "tuning_batch_size", "tuning_batch_tokens"):
        assert families[name].type == "histogram", name
    for name in ("tuning_queue_size", "tuning_queue_depth", "tuning_max_queue"):
        assert families[name].type == "gauge", name
    ok, errors = result.count("ok"), result.count("error")
    assert ok + errors == 42 and errors == 2  # the malformed body, twice: a 400 from the front, not the server
    served = value[("tuning_requests_total", (("outcome", "ok"),))]  # the measured ones and the cool-down's
    assert served >= ok and value[("tuning_requests_total", (("outcome", "error"),))] == 0
    assert value[("tuning_request_duration_seconds_count", (("outcome", "ok"),))] == served
    assert value[("tuning_request_inference_duration_seconds_count", ())] == served
    assert value[("tuning_batch_size_sum", ())] == served  # every ok request rode in exactly one batch
    assert value[("tuning_queue_size", ())] == 0 and value[("tuning_queue_depth", ())] == 0
    assert value[("tuning_model_busy_seconds_total", ())] > 0


@pytest.mark.filterwarnings("ignore:the load client's loop")  # refusals come back at once: the client is busy
def test_client_counts_a_refused_connection_as_an_error_outcome():
    url = f"http://127.0.0.1:{free_port()}/embed"
    result = run_load(url, ["a", "b"], concurrency=4, requests=12, warmup_requests=2)
    s = result.summary()
    assert s["submitted"] == 12 == s["errors"] and s["ok"] == 0
    assert all(r.outcome == "error" and "connection failed" in r.reason for r in result.responses)
    assert "Connect" in s["error_reasons"][0]["reason"]


def test_client_keeps_its_connections_alive(lines):
    """Review finding (issue 11): our client opened a new connection per request, so its tail measured
    connection set-up (and the backlog's SYN retransmits), not the server."""
    front, peers = make_front(), set()

    async def remember(scope, receive, send):  # the app, noting each request's client address and port
        if scope["type"] == "http":
            peers.add(tuple(scope["client"]))
        await front.app(scope, receive, send)

    front.server.config.app = remember
    with front:
        result = run_load(front.url + "/embed", lines, concurrency=4, requests=60, warmup_requests=4)
    assert result.summary()["ok"] == 60
    assert 1 <= len(peers) <= 4, peers  # one connection per client slot, reused: not 64 connections
    assert result.summary()["client_cpu"] is not None and 0 <= result.client_cpu <= 1.5


def test_open_loop_over_http_counts_every_outcome(lines):
    with make_front() as front:
        result = run_load(front.url + "/embed", lines, concurrency=8, duration_s=0.5, rate=100.0, warmup_requests=4)
    s = result.summary()
    assert s["mode"] == "open" and s["submitted"] == s["ok"] + s["errors"] + s["timeouts"] + s["rejected"] > 10


def test_graceful_shutdown_answers_requests_in_flight(lines):
    front = make_front(KNOBS.replace(num_workers=1, batch_size=2), delay_s=0.05).start()
    answers = []
    threads = [threading.Thread(target=lambda i=i: answers.append(_post(front.url + "/embed", lines[i])[0]))
               for i in range(6)]
    for t in threads:
        t.start()
    while front.backend.queue_depth < 1 and any(t.is_alive() for t in threads):
        threading.Event().wait(0.002)
    front.close()
    for t in threads:
        t.join(timeout=30)
    assert sorted(answers) == [200] * 6


def test_loopback_by_default_and_a_warning_elsewhere(monkeypatch):
    import tuning.online.httpfront as httpfront

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")
    monkeypatch.setattr(httpfront, "listen_socket", lambda host, port, backlog: httpfront.socket.create_server(
        ("127.0.0.1", 0)))  # nothing is bound beyond loopback: only the warning is checked
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        front = HttpFront(Server(KNOBS, engine=Engine(KNOBS, TinyModel())), host="0.0.0.0")
    front.sock.close()
    assert any("reachable from other machines" in str(w.message) for w in caught)


@pytest.mark.slow
@pytest.mark.thirdparty
def test_cli_loadtest_engine_locust_with_workers():

    out = run_cli("loadtest", "--engine", "locust", "--workers", "2",
                  "--set", "device=sim", "--concurrency", "4", "--duration", "2", "--warmup-s", "1",
                  "--limit", "50", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["engine"] == "locust" and data["engine_stats"]["workers"] == 2
    for key in ("qps", "p50_ms", "p95_ms", "p99_ms", "submitted", "ok", "errors", "timeouts", "rejected"):
        assert key in data
    assert data["submitted"] == data["ok"] + data["errors"] + data["timeouts"] + data["rejected"] > 0
    assert data["qps"] > 0 and data["client_cpu"] > 0


@pytest.mark.parametrize("flags,needle", [
    (["--engine", "locust", "--requests", "10"], "--duration"),
    (["--engine", "locust", "--duration", "1", "--rate", "5"], "closed loop"),
    (["--workers", "2", "--requests", "10"], "--engine locust"),
])
def test_cli_loadtest_engine_flags_are_checked(flags, needle, capfd):

    bad = run_cli("loadtest", *flags, capfd=capfd)
    assert bad.returncode == 2 and needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
