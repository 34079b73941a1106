import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tuning.online.serve as serve
from tests.cli_run import run_cli
from tests.helpers import TinyModel
from tuning.experiments.sweeps import load_sweep
from tuning.inputs.readers import read_lines
from tuning.knobs import Knobs
from tuning.load.generator import run_load
from tuning.online.httpfront import HttpFront
from tuning.online.serve import Server
from tuning.profile import diagnose
from tuning.runtime.engine import Engine

KNOBS = Knobs(num_workers=2, batch_size=8, tokenizer="fast", padding="bucket", max_wait_ms=2.0)


@pytest.fixture(scope="module")
def lines():
    return [raw for _, raw in read_lines(limit=200)]


def make_server(knobs=KNOBS, **model_kw):
    return Server(knobs, engine=Engine(knobs, TinyModel(**model_kw)))


def test_one_outcome_per_request_at_concurrency_64_with_malformed(lines):
    bad = [b"{oops", b'{"id": "x"}', b"", b'{"id": "e", "title": "", "category": "c", "attributes": {}, "body": " "}']
    inputs = [bad[i % len(bad)] if i % 20 == 0 else lines[i % len(lines)] for i in range(400)]  # 5% malformed
    reads = []  # the server's running busy total, read at the window's two edges
    with make_server() as server:
        result = run_load(server, inputs, concurrency=64, requests=400,
                          busy_probe=lambda: reads.append(server.busy_total_s) or reads[-1])
        assert server.queue_depth == 0
    s = result.summary()
    assert (s["submitted"], s["ok"], s["errors"], s["timeouts"], s["rejected"]) == (400, 380, 20, 0, 0)
    assert sorted(r.request for r in result.responses) == sorted(set(r.request for r in result.responses))
    assert all(r.reason for r in result.responses if r.outcome != "ok")
    assert s["mean_batch"] > 1  # 64 clients: requests gather into batches
    assert len(reads) == 2 and result.busy_s == reads[1] - reads[0] > 0  # busy from the total at the edges
    assert result.latency()["count"] == 400 and result.latency(ok_only=True)["count"] == 380  # every outcome
    assert len(result.inflight_frame()) and max(result.inflight_frame().inflight) <= 64


def test_exception_in_one_batch_fails_that_batch_only(lines):
    # batches leave only when full (8): the failing call holds exactly the first eight, however slowly they arrive
    knobs = KNOBS.replace(num_workers=1, max_wait_ms=600_000.0, padding="dynamic")
    with make_server(knobs, fail_on_calls=(3,)) as server:  # calls 1-2 are warm-up
        first = [server.submit(raw) for raw in lines[:8]]  # one full batch -> the failing call
        failed = [f.result(timeout=30) for f in first]
        later = [f.result(timeout=30) for f in [server.submit(raw) for raw in lines[8:16]]]
    assert all(r.outcome == "error" and "injected failure" in r.reason for r in failed)
    assert all(r.outcome == "ok" for r in later)


class _Held(TinyModel):
    """Holds every model call (after warm-up) until released: the queue cannot drain while the test submits."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()  # set when a held call has begun
        self.hold = False

    def forward(self, ids, mask):
        if self.hold:
            self.entered.set()
            self.release.wait(60)
        return super().forward(ids, mask)


def test_full_queue_rejects_at_once(lines):
    """Back-pressure: with max_queue requests admitted, the next ones are rejected when submitted (their futures
    are resolved before submit returns), never queued; the admitted ones are answered."""
    knobs = KNOBS.replace(max_queue=4, num_workers=1, batch_size=2)
    model = _Held()
    with Server(knobs, engine=Engine(knobs, model)) as server:
        model.hold = True
        try:
            futures = [server.submit(raw) for raw in lines[:4]]
            late = [server.submit(raw) for raw in lines[4:12]]
            assert all(f.done() for f in late) and not any(f.done() for f in futures)
        finally:
            model.release.set()
        results = [f.result(timeout=30) for f in futures + late]
    rejected = [r for r in results if r.outcome == "rejected"]
    assert len(rejected) == 8 and rejected == [f.result() for f in late]
    assert rejected[0].reason == "rejected: overloaded, 4 requests queued (max_queue=4)"
    assert [r.outcome for r in results[:4]] == ["ok"] * 4


def test_deadline_turns_into_timeout(lines):
    knobs = KNOBS.replace(num_workers=1, batch_size=1, deadline_ms=50.0)
    with make_server(knobs, delay_s=0.1) as server:
        results = [f.result(timeout=30) for f in [server.submit(raw) for raw in lines[:4]]]
    assert {r.outcome for r in results} == {"timeout"} and all("deadline" in r.reason for r in results)


def test_shutdown_under_load_leaves_nothing_pending(lines):
    server = make_server(KNOBS.replace(num_workers=1), delay_s=0.02).start()
    futures = [server.submit(raw) for raw in lines * 2]
    time.sleep(0.1)
    server.close(drain=False)
    results = [f.result(timeout=5) for f in futures]
    outcomes = {r.outcome for r in results}
    assert len(results) == len(futures) and outcomes <= {"ok", "error"}
    assert any("shut down" in (r.reason or "") for r in results)
    late = server.submit(lines[0]).result(timeout=1)
    assert late.outcome == "rejected" and "not running" in late.reason


def test_a_draining_close_does_not_undo_an_abandoning_one(lines):
    """A load test abandons its server's queue (close(drain=False), on the client's thread) while the owner's own
    close() (drain=True) runs: the queue stays abandoned, each request one outcome."""
    knobs = KNOBS.replace(num_workers=1, batch_size=1, max_wait_ms=0.0)
    model = _Held()
    server = Server(knobs, engine=Engine(knobs, model)).start()
    worker = server._threads[0]
    assert worker.name == "preprocess-0"
    model.hold = True
    futures = [server.submit(raw) for raw in lines[:6]]
    try:  # whatever fails, the held model call is released (else the server's threads wait 60 s)
        # one batch held in the model, one staged behind it (IN_FLIGHT_BATCHES=2), four in the batcher: waiting on this
        # state, not on a sleep, since the batcher may still hold requests a moment after the workers' queue is empty
        assert model.entered.wait(30)
        deadline = time.monotonic() + 30
        while server.waiting_for_batch != 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert server.waiting_for_batch == 4 and server._ready.qsize() == 1
        abandoning = threading.Thread(target=server.close, kwargs={"drain": False})
        abandoning.start()
        while server._accepting:  # the abandoning close has begun and waits on the held model call
            time.sleep(0.001)
        owner = threading.Thread(target=server.close, kwargs={"drain": True, "timeout": 30})
        owner.start()
        # the abandoning close's stop ended the one worker; the owner's close puts its stop after it has set the
        # abort flag, so a stop left in the queue says the draining close has run that far
        worker.join(30)
        while server._incoming.qsize() != 1 and time.monotonic() < deadline + 30:
            time.sleep(0.001)
        assert server._incoming.qsize() == 1
    finally:
        model.release.set()
    abandoning.join(30), owner.join(30)
    results = [f.result(timeout=5) for f in futures]
    assert len(results) == 6
    outcomes = sorted("shut down" if "shut down" in (r.reason or "") else r.outcome for r in results)
    assert outcomes == ["ok"] + ["shut down"] * 5  # the held batch answers; the staged one and the queue do not


def test_drain_finishes_everything(lines):
    server = make_server(delay_s=0.005).start()
    futures = [server.submit(raw) for raw in lines[:50]]
    server.close(drain=True)
    assert all(f.result(timeout=1).outcome == "ok" for f in futures)


def test_open_loop_and_sweep(lines):
    with make_server() as server:
        result = run_load(server, lines, concurrency=16, duration_s=0.6, rate=150.0, warmup_requests=5)
    s = result.summary()
    assert s["mode"] == "open" and s["submitted"] == s["ok"] > 20 and s["warmup_requests"] == 5
    engine = Engine(KNOBS, TinyModel())
    frame = load_sweep(KNOBS, lines, "max_wait_ms", [0.0, 5.0], requests=40, concurrency=8, engine=engine)
    assert list(frame["max_wait_ms"]) == [0.0, 5.0] and {"qps", "p99_ms"} <= set(frame.columns)
    frame = load_sweep(KNOBS, lines, "concurrency", [1, 4], requests=20, engine=engine)
    assert list(frame["concurrency"]) == [1, 4] and (frame.ok == 20).all()


def test_load_arguments_are_validated(lines):
    with pytest.raises(ValueError, match="exactly one"):
        run_load(lambda raw: None, lines)
    with pytest.raises(ValueError, match="concurrency=0"):
        run_load(lambda raw: None, lines, concurrency=0, requests=1)


def _post(url, body: bytes, headers=None):
    req = urllib.request.Request(url, data=body, method="POST", headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_front_on_loopback(lines):
    with HttpFront(make_server(), port=0) as front:
        url = front.url + "/embed"
        status, body = _post(url, lines[0])
        assert status == 200 and body["id"] == "rec-00000" and len(body["embedding"]) == 8
        status, body = _post(url, json.dumps({"text": "hello there"}).encode())
        assert status == 200 and body["n_tokens"] == 4
        for payload, needle in [(b"{nope", "malformed JSON"), (b"[1,2]", "expected a JSON object"),
                                (b'{"text": 5}', "'text' must be a string"), (b'{"text": "  "}', "'text' is empty"),
                                (b'{"id": "a"}', "missing field"), (b"\xff\xfe", "UTF-8")]:
            status, body = _post(url, payload)
            assert status == 400 and needle in body["error"], (payload, body)
        status, body = _post(url, b"x" * ((1 << 20) + 1))
        assert status == 413 and "limit" in body["error"]
        with urllib.request.urlopen(front.url + "/healthz") as resp:
            assert json.loads(resp.read())["status"] == "ok"
        with urllib.request.urlopen(front.url + "/metrics") as resp:
            text = resp.read().decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("tuning_requests_total", (("outcome", "ok"),))] == 2
        assert samples[("tuning_queue_depth", ())] == 0
        assert samples[("tuning_stage_duration_seconds_bucket", (("le", "+Inf"), ("stage", "inference")))] == 2
        assert samples[("tuning_batch_size_count", ())] >= 1
        status, body = _post(front.url + "/nope", b"{}")
        assert status == 404
        result = run_load(url, lines, concurrency=8, requests=40)  # the load generator drives the URL too
        assert result.summary()["ok"] == 40


@pytest.mark.slow
def test_cli_serve_and_loadtest_url_together(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve = subprocess.Popen([sys.executable, "-m", "tuning", "serve", "--port", str(port), "--duration", "120"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stdout.readline()
        assert f"127.0.0.1:{port}" in line, serve.stderr.read() if serve.poll() is not None else line
        out = run_cli("loadtest", "--url", f"http://127.0.0.1:{port}/embed",
                      "--concurrency", "4", "--requests", "24", "--limit", "100", "--json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        for key in ("qps", "p50_ms", "p95_ms", "p99_ms", "submitted", "ok", "errors", "timeouts", "rejected", "model_busy"):
            assert key in data
        assert data["submitted"] == data["ok"] == 24 and data["model_busy"] > 0
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert serve.returncode == 0


@pytest.mark.slow
def test_cli_loadtest_in_process_and_bad_flags(capfd):

    out = run_cli("loadtest", "--set", "batch_size=4", "--concurrency", "8",
                  "--requests", "32", "--limit", "64", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["submitted"] == 32 and data["ok"] == 32 and data["mean_batch"] > 1
    bad = run_cli("loadtest", "--concurrency", "4", capfd=capfd)
    assert bad.returncode == 2 and "--requests" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_recorder_wraps_a_load_test(lines):
    from tests.fake_nvml import FakeNvml
    from tuning.profile import Recorder

    with make_server(delay_s=0.01) as server:
        with Recorder(0.1, nvml=FakeNvml(devices=1)) as rec:
            result = run_load(server, lines, concurrency=16, requests=120)
    profile = rec.join(result)
    assert profile.summary()["diagnosis"] == diagnose(profile.signals).as_dict()  # the verdict on these signals
    assert profile.signals.mean_batch == np.mean(result.batch_sizes()) > 1
    assert profile.signals.model_busy == result.model_busy and profile.signals.batch_size_knob == 8
    threads = set(profile.to_frame("threads").name)
    assert {"batcher", "model-executor", "preprocess-0"} <= threads
    assert len(profile.to_frame("requests")) == 120 and len(profile.to_frame("gpu")) > 0
    assert profile.summary()["stages"]["queue_wait"]["p50_ms"] >= 0


# --- issue 11 item 8: the model's critical path holds only the model ---------------------------------------
class _Recording(TinyModel):
    def __init__(self, second_batch_at_call: int):
        super().__init__()
        self.second_batch_at_call = second_batch_at_call
        self.second_batch = threading.Event()

    def forward(self, ids, mask):
        if self.calls + 1 == self.second_batch_at_call:
            self.second_batch.set()
        return super().forward(ids, mask)


def test_next_batch_starts_before_the_previous_one_is_answered(lines, monkeypatch):
    """Review finding: the executor answered every request of a batch (responses, lock, histograms, futures)
    before it started the next batch. Here answering the first batch waits for the model's next call."""
    knobs = KNOBS.replace(num_workers=1, batch_size=2, max_wait_ms=0.0, padding="dynamic")
    model = _Recording(second_batch_at_call=4)  # two warm-up calls, then the first batch
    overlapped = []
    original = Server._complete

    def slow_answer(self, *args):
        if not overlapped:
            overlapped.append(model.second_batch.wait(timeout=3))
        return original(self, *args)

    monkeypatch.setattr(Server, "_complete", slow_answer)
    with Server(knobs, engine=Engine(knobs, model)) as server:
        results = [f.result(timeout=30) for f in [server.submit(raw) for raw in lines[:3]]]
    assert overlapped == [True] and all(r.outcome == "ok" for r in results)


def test_metrics_are_observed_outside_the_server_lock(lines):
    server = make_server()
    held = []
    observe = server.metrics.observe
    server.metrics.observe = lambda response: (held.append(server._lock.locked()), observe(response))
    with server:
        [server.submit(raw).result(timeout=30) for raw in lines[:5]]
    assert len(held) == 5 and not any(held)


def test_expiry_looks_only_at_due_requests(lines):
    """Review finding: _expire rescanned every pending request on each arrival (78 us at 1,000 pending)."""
    knobs = KNOBS.replace(num_workers=1, batch_size=64, max_wait_ms=60_000.0, deadline_ms=60_000.0)
    server = make_server(knobs).start()
    looked = []
    remove = server.former.remove

    def counting_remove(predicate):
        def counted(item):
            looked.append(1)
            return predicate(item)
        return remove(counted)

    server.former.remove = counting_remove
    futures = [server.submit(raw) for raw in lines[:40]]
    for _ in range(2000):
        if len(server.former) == 40:
            break
        time.sleep(0.005)
    server.close()
    assert all(f.result(timeout=30).outcome == "ok" for f in futures)
    assert len(looked) == 0  # no deadline was due: nothing scanned (was about 40 * 40 / 2)


def test_simulated_pinned_copy_overlaps_the_running_batch(lines, monkeypatch):
    """With pin_memory the copy starts when the batcher builds the batch; the executor waits only for what is
    left of it (on the simulated device: the copy engine works while the device computes)."""
    from tuning.sim.standin import SimulatedDevice

    knobs = KNOBS.replace(device="sim", pin_memory=True, num_workers=1)
    copies_on = []
    monkeypatch.setattr(SimulatedDevice, "copy_in", lambda self, nbytes, pinned: copies_on.append(
        threading.current_thread().name))
    with Server(knobs) as server:
        results = [f.result(timeout=30) for f in [server.submit(raw) for raw in lines[:20]]]
    assert all(r.outcome == "ok" for r in results)
    assert copies_on == []  # no synchronous copy on the executor: it was staged
    assert all(r.copy_ms < 5 for r in results)


def test_a_worker_tokenizes_every_waiting_request_in_one_call(lines):
    server = make_server(KNOBS.replace(num_workers=1))
    calls = []
    encode = server.preparer.tokenizer.encode_batch
    server.preparer.tokenizer.encode_batch = lambda texts: (calls.append(len(texts)), encode(texts))[1]
    server._accepting = True  # admit without starting the threads: the worker loop runs here, once
    futures = [server.submit(raw) for raw in lines[:10]] + [server.submit(b"{oops")]
    server._incoming.put(serve._STOP)
    server._worker_loop()
    assert calls == [10]  # ten good requests, one call; the malformed one answered without tokenizing
    assert futures[-1].result(timeout=1).outcome == "error"
    queued = [server._tokenized.get_nowait() for _ in range(11)]
    assert queued[-1] is serve._STOP and all(r.encoded is not None for r in queued[:-1])
