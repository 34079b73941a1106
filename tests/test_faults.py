"""Fault injection and the serving review's findings (issue 13 items 1, 1b).

Every test is bounded in time (every wait has a timeout), loopback only, and injects its fault
deterministically (a tokenizer, a model or a formatter that fails on a chosen input or call).
"""

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings

import pytest

from tests.fake_nvml import FakeNvml, NVMLError
from tests.helpers import TinyModel
from tuning.inputs.readers import read_lines
from tuning.inputs.records import format_record
from tuning.inputs.tokenize import Tokenized
from tuning.knobs import Knobs
from tuning.offline.pipeline import Pipeline
from tuning.online.httpfront import HttpFront
from tuning.online.serve import Server
from tuning.runtime.engine import Engine, make_tokenizer

KNOBS = Knobs(num_workers=1, batch_size=4, tokenizer="fast", padding="bucket", max_wait_ms=2.0)


@pytest.fixture(scope="module")
def lines():
    return [raw for _, raw in read_lines(limit=40)]


def make_server(knobs=KNOBS, tokenizer=None, **model_kw):
    return Server(knobs, engine=Engine(knobs, TinyModel(**model_kw)), tokenizer=tokenizer)


class _OverLongTokenizer:
    """A user tokenizer that forgets to truncate: the text 'LONG' comes back with 4 * max_length ids."""

    def __init__(self, knobs):
        self.inner = make_tokenizer(knobs)
        self.pad_id = self.inner.pad_id
        self.limit = knobs.max_length

    def encode_batch(self, texts):
        out = self.inner.encode_batch(texts)
        return [Tokenized([101] + [1000] * (4 * self.limit) + [102], 4 * self.limit + 2, False) if t == "LONG" else e
                for t, e in zip(texts, out)]

    def build_batch(self, encoded, length):
        return self.inner.build_batch(encoded, length)


# --- 1b: guards on every server loop ------------------------------------------------------------

def test_token_count_over_the_last_bucket_fails_that_request_only(lines):
    """Review finding: the batcher's bucket function raised StopIteration for a request longer than the
    last bucket, the batcher thread died, and every later request stayed pending forever."""
    with make_server(tokenizer=_OverLongTokenizer(KNOBS)) as server:
        bad = server.submit("LONG").result(timeout=10)
        later = [f.result(timeout=10) for f in [server.submit(raw) for raw in lines[:8]]]
        assert server.health()[0], server.health()
    assert bad.outcome == "error" and "max_length" in bad.reason
    assert [r.outcome for r in later] == ["ok"] * 8


def test_a_crashed_loop_fails_its_requests_and_turns_health_to_503(lines, monkeypatch):
    """Any exception that escapes a server loop fails every open request with the reason, rejects new
    ones and turns /healthz to 503 instead of leaving futures pending behind an ok health check."""
    front = HttpFront(make_server(), port=0)
    server = front.backend
    with front:
        def broken(*a, **k):
            raise RuntimeError("injected batcher bug")

        monkeypatch.setattr(server.former, "pop_ready", broken)
        futures = [server.submit(raw) for raw in lines[:4]]
        answers = [f.result(timeout=10) for f in futures]
        assert all(a.outcome == "error" and "injected batcher bug" in a.reason for a in answers), answers
        healthy, why = server.health()
        assert not healthy and "batcher" in why
        after = server.submit(lines[0]).result(timeout=10)
        assert after.outcome in ("error", "rejected") and "batcher" in after.reason
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(front.url + "/healthz", timeout=10)
        assert info.value.code == 503 and "batcher" in json.loads(info.value.read())["reason"]
        monkeypatch.undo()
    assert server.queue_depth == 0


def test_healthz_is_503_while_stopping():
    with make_server() as server:
        front = HttpFront(server, port=0)
        front.start()
        try:
            server._accepting = False  # the moment close() has begun
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(front.url + "/healthz", timeout=10)
            assert info.value.code == 503
        finally:
            server._accepting = True
            front.close()


# --- 1b: expired requests cost nothing ------------------------------------------------------------

class _CountingTokenizer(_OverLongTokenizer):
    def __init__(self, knobs):
        super().__init__(knobs)
        self.texts = 0

    def encode_batch(self, texts):
        self.texts += len(texts)
        return super().encode_batch(texts)


def test_expired_requests_are_dropped_before_tokenizing_and_before_the_model(lines):
    """Review finding: a request past its deadline was still tokenized and computed, then relabelled."""
    offset = [0.0]
    tok = _CountingTokenizer(KNOBS)
    server = Server(KNOBS, engine=Engine(KNOBS, TinyModel()), tokenizer=tok, clock=lambda: time.monotonic() + offset[0])
    server._accepting = True  # admit one request before any worker runs (deterministic: nobody can take it yet)
    future = server.submit(lines[0], deadline_ms=10.0)
    offset[0] = 1.0  # the clock passes its deadline while it is queued
    server.start(warmup=False)
    try:
        r = future.result(timeout=10)
    finally:
        server.close()
    assert r.outcome == "timeout" and "before" in r.reason
    assert tok.texts == 0


def test_a_batch_whose_requests_all_expired_skips_the_model(lines):
    knobs = KNOBS.replace(batch_size=1)
    model = TinyModel(delay_s=0.3)
    with Server(knobs, engine=Engine(knobs, model)) as server:
        calls0 = model.calls
        first = server.submit(lines[0])  # occupies the model for 0.3 s
        time.sleep(0.05)
        late = [server.submit(raw, deadline_ms=50.0) for raw in lines[1:5]]  # expire while waiting
        answers = [f.result(timeout=10) for f in late]
        first.result(timeout=10)
    assert all(a.outcome == "timeout" for a in answers)
    assert model.calls - calls0 <= 2, "expired batches went through the model"


# --- 1b: every wait has a bound ----------------------------------------------------------------------

def _raw_http(url, payload: bytes, read_timeout=10.0) -> bytes:
    host, port = url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(payload)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        return data


def test_a_short_body_gets_408_and_does_not_pin_the_handler():
    """Review finding: Content-Length larger than the body sent kept a handler waiting forever."""
    server = make_server()
    front = HttpFront(server, port=0, body_timeout_s=0.5)
    with front:
        t0 = time.monotonic()
        data = _raw_http(front.url, b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: 100\r\n\r\n{\"text\": \"sh", read_timeout=5)
        took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert took < 4


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3"])
def test_a_bad_content_length_is_a_400(length):
    with HttpFront(make_server(), port=0) as front:
        data = _raw_http(front.url, b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: " + length +
                         b"\r\nConnection: close\r\n\r\n{}", read_timeout=5)
    assert data.split(b" ", 2)[1] == b"400", data[:200]


def test_no_answer_within_the_bound_is_a_504(lines):
    with HttpFront(make_server(delay_s=1.5), port=0, answer_timeout_s=0.3) as front:
        req = urllib.request.Request(front.url + "/embed", data=json.dumps({"text": "slow"}).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 504 and "within" in json.loads(info.value.read())["error"]


# --- 1b: input errors are 4xx; keep-alive error paths ----------------------------------------------------

def test_input_errors_found_by_the_workers_are_4xx():
    """Review finding: an error found in preprocessing (a bad record, a failing formatter) came back as 500."""
    def picky(rec):
        if rec.id == "bad":
            raise ValueError("no title")
        return format_record(rec)

    knobs = KNOBS
    server = Server(knobs, engine=Engine(knobs, TinyModel()), formatter=picky)
    record = {"id": "bad", "title": "t", "category": "c", "attributes": {}, "body": "b"}
    with HttpFront(server, port=0) as front:
        req = urllib.request.Request(front.url + "/embed", data=json.dumps(record).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 422
    assert "no title" in json.loads(info.value.read())["error"]


def test_model_failures_stay_500(lines):
    knobs = KNOBS.replace(batch_size=1)
    with HttpFront(Server(knobs, engine=Engine(knobs, TinyModel(fail_on_calls=(3,)))), port=0) as front:
        req = urllib.request.Request(front.url + "/embed", data=lines[0], method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 500 and "injected" in json.loads(info.value.read())["error"]


@pytest.mark.parametrize("first", [
    b"POST /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{\"text\":1}\n",
    b"PUT /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{\"text\":1}\n",
    b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{\"text\":1}\n",
    b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n{oops",
], ids=["404", "405", "400-type", "400-json"])
def test_error_paths_on_a_keep_alive_connection_leave_no_body_behind(first):
    """Review finding: an error answer left the body unread, and it was parsed as the next request."""
    second = b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{\"text\": \"next\"}"
    with HttpFront(make_server(), port=0) as front:
        data = _raw_http(front.url, first + second)
    statuses = [line.split(b" ")[1] for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    assert len(statuses) <= 2 and statuses[0][0:1] == b"4", data[:400]
    if len(statuses) == 2:  # kept alive: the second request is answered as itself
        assert statuses[1] == b"200", data[:600]


# --- 1: fault injection ----------------------------------------------------------------------------------

def test_client_disconnecting_mid_request_leaves_nothing_behind(lines):
    with HttpFront(make_server(delay_s=0.2), port=0) as front:
        host, port = front.url.split("//")[1].rsplit(":", 1)
        for payload in (b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 200\r\n\r\n{\"text\": ",  # mid-body
                        b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: 16\r\n\r\n{\"text\": \"gone\"}"):  # waiting
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(payload)
            time.sleep(0.05)
            sock.close()
        req = urllib.request.Request(front.url + "/embed", data=lines[0], method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        deadline = time.monotonic() + 5
        while front.backend.queue_depth and time.monotonic() < deadline:
            time.sleep(0.02)
        assert front.backend.queue_depth == 0
        counts = dict(front.backend.counts)
    assert counts["ok"] == 2 and sum(counts.values()) == 2  # the disconnected one still got its one outcome


def test_shutdown_over_http_while_requests_are_queued(lines):
    knobs = KNOBS.replace(batch_size=1)
    front = HttpFront(make_server(knobs, delay_s=0.1), port=0, graceful_timeout_s=0.3)
    front.start()
    server = front.backend
    futures = [server.submit(raw) for raw in lines[:20]]  # queued behind a 0.1 s model
    time.sleep(0.15)
    t0 = time.monotonic()
    front.server.should_exit = True
    front._thread.join(10)
    server.close(drain=False, timeout=10)
    answers = [f.result(timeout=1) for f in futures]
    assert time.monotonic() - t0 < 10
    assert len(answers) == 20 and all(a.outcome in ("ok", "error") for a in answers)
    assert any("shut down" in (a.reason or "") for a in answers)
    assert server.queue_depth == 0


def _kill_in_worker(rec):
    """A formatter that kills the DataLoader worker process that formats record 'poison'."""
    import multiprocessing

    if rec.id == "poison" and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return format_record(rec)


def test_dataloader_worker_killed_mid_run_reports_the_failed_requests(tmp_path, lines):
    records = [json.loads(raw) for raw in lines[:24]]
    records[17]["id"] = "poison"
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    knobs = Knobs(num_workers=2, batch_size=4, tokenizer="fast", prefetch_factor=2)
    t0 = time.monotonic()
    result = Pipeline(knobs, model=TinyModel(), formatter=_kill_in_worker).run(data, warmup_batches=0)
    assert time.monotonic() - t0 < 30
    outcomes = {r.index: r for r in result.requests}
    assert len(outcomes) == 24  # every input one outcome
    failed = [r for r in result.requests if r.outcome == "error"]
    assert 18 in {r.index for r in failed}  # line 18 held the poison record
    assert all("DataLoader worker" in r.reason for r in failed), {r.reason for r in failed}
    assert result.ok + result.errors == 24 and result.ok > 0


def test_nvml_failing_mid_run_ends_the_series_with_a_warning_and_the_run_completes(lines):
    from tuning.profile.recorder import Recorder

    fake = FakeNvml(devices=1, fail_after=2)
    pipe = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel(delay_s=0.08))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(0.1, nvml=fake) as rec:
            result = pipe.run(lines[:40], warmup_batches=0)
    assert result.ok == 40
    assert "GPU is lost" in rec.gpu_sampler.series.reason
    assert any("GPU sampling stopped" in str(w.message) for w in caught)


class _VanishingNvml(FakeNvml):
    """The driver goes away: after two samples every call raises, even the memory query."""

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.calls > 2:
            raise NVMLError("Driver Not Loaded")
        return super().nvmlDeviceGetMemoryInfo(h)

    def nvmlShutdown(self):
        raise NVMLError("Uninitialized")


def test_nvml_disappearing_mid_sample_does_not_crash_the_run(lines):
    from tuning.profile.gpu import GpuSampler

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        sampler = GpuSampler(0.1, nvml=_VanishingNvml(devices=1, fail_after=2))
        with sampler:
            thread = sampler._thread
            assert thread is not None
            thread.join(timeout=60)  # NVML gone: the sampler ends its own thread, without waiting for the exit
            assert not thread.is_alive()
    assert sampler.series.reason and len(sampler.series.to_frame()) <= 3


def test_data_file_truncated_mid_line(tmp_path, lines):
    data = tmp_path / "cut.jsonl"
    data.write_bytes(b"\n".join(lines[:5]) + b"\n" + lines[5][: len(lines[5]) // 2])  # cut mid-record
    result = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel()).run(
        data, warmup_batches=0)
    assert result.ok == 5 and result.errors == 1
    bad = next(r for r in result.requests if r.outcome == "error")
    assert bad.index == 6 and ("line 6" in bad.reason.lower() or "json" in bad.reason.lower()), bad


def test_data_file_truncated_while_the_run_reads_it(tmp_path, lines):
    data = tmp_path / "shrinks.jsonl"
    data.write_bytes(b"\n".join(lines[:12]) + b"\n")
    pipe = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel())
    from tuning.offline.pipeline import LineDataset

    dataset = LineDataset(data)
    cut = sum(dataset.sizes[:6]) + dataset.sizes[6] // 2
    with open(data, "r+b") as fh:
        fh.truncate(cut)  # shrunk after its lines were indexed: lines 7-12 are half or gone
    result = pipe.run(data, warmup_batches=0)
    assert len(result.requests) >= 6 and result.ok >= 6 - 1


@pytest.mark.parametrize("kind", ["directory", "unreadable"])
def test_unreadable_data_file_is_a_clear_error(tmp_path, kind, monkeypatch):

    path = tmp_path / "data.jsonl"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_text('{"text": "x"}\n')
        real_open = type(path).open

        def denied(self, *a, **k):
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real_open(self, *a, **k)

        monkeypatch.setattr(type(path), "open", denied)
    pipe = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel())
    with pytest.raises((OSError, ValueError)) as info:
        pipe.run(path, warmup_batches=0)
    assert str(path) in str(info.value)


def test_connections_past_max_connections_are_shed_at_once_with_503(caplog):
    """Overload past the front's own ceiling: the front used to accept every connection until the process ran
    out of file descriptors (answers after 10-20 s, clients reset). Past ``max_connections`` open connections
    a request is answered 503 at once, before its body is read, and the held connections still get answers."""
    with pytest.raises(ValueError, match="max_connections=0"):
        HttpFront(make_server(), port=0, max_connections=0)  # never started: no threads to close
    caplog.set_level("WARNING", logger="uvicorn.error")
    with HttpFront(make_server(delay_s=1.0), port=0, max_connections=2) as front:
        host, port = front.sock.getsockname()[:2]
        body = json.dumps({"text": "held"}).encode()
        request = (b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: "
                   + str(len(body)).encode() + b"\r\n\r\n" + body)
        held = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        for s in held:
            s.sendall(request)
        deadline = time.monotonic() + 10
        while front.backend.queue_depth < 2 and time.monotonic() < deadline:  # both in flight (the model takes 1 s)
            time.sleep(0.01)
        t0 = time.perf_counter()
        extra = socket.create_connection((host, port), timeout=10)
        extra.sendall(request)
        shed = extra.recv(4096)
        shed_s = time.perf_counter() - t0
        answers = [s.recv(65536) for s in held]
        for s in (*held, extra):
            s.close()
        deadline = time.monotonic() + 5
        while True:  # the probe itself is shed until the front has seen the three connections close
            try:
                with urllib.request.urlopen(front.url + "/healthz", timeout=10) as resp:
                    health = json.loads(resp.read())
                break
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    assert health["shed_by_front"] == 1 and health["counts"]["ok"] == 2  # the server never saw the shed one
    assert "Exceeded concurrency limit" not in caplog.text  # counted, not logged once per shed request
    assert shed.split(b" ", 2)[1] == b"503" and shed_s < 0.8, (shed[:120], shed_s)  # before the held answers
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200"]


def test_a_dead_fronts_shed_counter_does_not_take_a_new_fronts_sheds():
    """A front never closed leaves its filter on uvicorn's logger; once its thread is gone a new front's thread
    may get the same id. The old filter took (and hid) the new front's count: the full suite read 0 for 1."""
    import logging

    from tuning.online.httpfront import UVICORN_SHED_MESSAGE, ShedCounter

    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    old, new = ShedCounter(), ShedCounter()
    old.thread, new.thread = dead, threading.current_thread()
    record = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, UVICORN_SHED_MESSAGE, None, None)
    record.thread = dead.ident  # the id reused by the live thread
    new.thread = type("Alive", (), {"ident": dead.ident, "is_alive": lambda self: True})()
    assert old.filter(record) and not new.filter(record)
    assert (old.count, new.count) == (0, 1)
    other = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "something else", None, None)
    other.thread = dead.ident
    assert new.filter(other) and new.count == 1  # only the shed line is counted and dropped
