"""What the load generator measures: open loop timed from the schedule, percentiles over every
outcome, steady windows with a cool-down, busy from the running total, embeddings only when asked.

Fake services advance a fake clock, so the figures here are exact and the tests do not time anything.
"""

import io
import json
import threading
import types
import warnings
from contextlib import redirect_stdout

import numpy as np
import pytest

import tuning.load.generator as loadgen
import tuning.online.serve as serve
from tests.helpers import TinyModel
from tuning.base.clock import FakeClock
from tuning.inputs.readers import read_lines
from tuning.knobs import Knobs
from tuning.load.generator import run_load
from tuning.online.response import Response
from tuning.online.serve import Server
from tuning.runtime.engine import Engine

KNOBS = Knobs(num_workers=1, batch_size=1, tokenizer="fast", padding="dynamic", max_wait_ms=0.0)


@pytest.fixture(scope="module")
def lines():
    return [raw for _, raw in read_lines(limit=100)]


class FakeService:
    """One request at a time; each call advances the fake clock by its service time."""

    def __init__(self, clock, service_s=0.002, stalls=None, outcomes=None):
        self.clock, self.service_s = clock, service_s
        self.stalls = stalls or {}  # call index -> service time of that call
        self.outcomes = outcomes or {}  # call index -> outcome
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, raw):
        with self.lock:
            k = self.calls
            self.calls += 1
            t0 = self.clock()
            self.clock.advance(self.stalls.get(k, self.service_s))
            outcome = self.outcomes.get(k, "ok")
            return Response(k, outcome, None if outcome == "ok" else f"fake {outcome}", t_submit=t0,
                            t_done=self.clock())


def _fake_time(monkeypatch, clock):
    """The load generator's sleeps advance the fake clock instead of waiting."""
    monkeypatch.setattr(loadgen, "time", types.SimpleNamespace(sleep=clock.advance))


# --- 1. open loop without coordinated omission ------------------------------------------------------------
def test_open_loop_times_latency_from_the_scheduled_arrival(monkeypatch):
    clock = FakeClock(100.0)
    _fake_time(monkeypatch, clock)
    service = FakeService(clock, service_s=0.002, stalls={300: 1.0})  # one 1 s stall at 200 req/s
    result = run_load(service, ["x"], concurrency=1, requests=2000, rate=200.0, clock=clock)
    s = result.summary()
    # about 200 arrivals queue up behind the stall: their wait is latency (timed from the send, p99 was 2 ms)
    assert s["p99_ms"] > 300
    assert s["send_lag_p99_ms"] > 300 and s["send_lag_p50_ms"] < 1
    assert result.latency()["count"] == 2000
    lags = result.to_frame()["send_lag_ms"]
    assert (lags > 10).sum() > 150  # sends more than 10 ms late, recorded and reported
    assert s["offered_rate"] == pytest.approx(s["achieved_rate"], rel=0.01)  # the backlog drained in time


def test_open_loop_reports_achieved_rate_and_warns_when_it_falls_short(monkeypatch):
    clock = FakeClock()
    _fake_time(monkeypatch, clock)
    service = FakeService(clock, service_s=0.010)  # one client at 10 ms can send 100 req/s, not 200
    with pytest.warns(RuntimeWarning, match="achieved"):
        result = run_load(service, ["x"], concurrency=1, requests=500, rate=200.0, clock=clock)
    s = result.summary()
    assert s["rate"] == 200.0 and 150 < s["offered_rate"] < 250
    assert s["achieved_rate"] == pytest.approx(100.0, rel=0.05)
    assert s["send_lag_p99_ms"] > 1000 and s["p99_ms"] > 1000


# --- 2. percentiles over every outcome --------------------------------------------------------------------
def test_percentiles_cover_every_outcome_with_the_error_rate_beside_them(monkeypatch):
    clock = FakeClock()
    _fake_time(monkeypatch, clock)
    timeouts = {k: "timeout" for k in range(0, 300, 10)}  # every tenth request times out after 1 s
    service = FakeService(clock, service_s=0.005, stalls={k: 1.0 for k in timeouts}, outcomes=timeouts)
    result = run_load(service, ["x"], concurrency=1, requests=200, warmup_requests=10, clock=clock)
    s = result.summary()
    assert s["p99_ms"] == pytest.approx(1000.0) and s["p50_ms"] == pytest.approx(5.0)
    assert s["ok_p99_ms"] == pytest.approx(5.0)  # ok-only, labelled as such
    assert s["error_rate"] == pytest.approx(0.1)
    assert result.latency(ok_only=True)["count"] == 180 and result.latency()["count"] == 200


def test_server_latency_histogram_counts_every_outcome(lines):
    knobs = KNOBS.replace(max_queue=2, deadline_ms=1.0)
    server = Server(knobs, engine=Engine(knobs, TinyModel(delay_s=0.02)))
    with server:
        futures = [server.submit(raw) for raw in lines[:10]]
        outcomes = [f.result(timeout=30).outcome for f in futures]
    assert "rejected" in outcomes and "timeout" in outcomes
    assert server.metrics.count() == len(outcomes)
    from tuning.online.metrics import prometheus_text

    text = prometheus_text(server)
    assert f'tuning_request_duration_seconds_count{{outcome="rejected"}} {outcomes.count("rejected")}.0' in text
    assert f'tuning_request_duration_seconds_count{{outcome="timeout"}} {outcomes.count("timeout")}.0' in text


# --- 4. steady windows, busy from the running total ------------------------------------------------------
def test_closed_loop_window_is_steady_with_a_cool_down():
    """A service that answers only when every client has a request in it: a window that ends in a drain at
    falling concurrency leaves its last requests waiting for partners that never come."""
    barrier = threading.Barrier(3, timeout=1.0)

    def all_together(raw):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            barrier.reset()
            return Response(-1, "error", "fewer than 3 requests in flight")
        return Response(-1, "ok")

    result = run_load(all_together, ["x"], concurrency=3, requests=31, warmup_requests=6)
    s = result.summary()
    assert s["submitted"] == s["ok"] == 31
    assert s["cooldown_requests"] >= 1 and s["warmup_requests"] == 6


def test_busy_comes_from_the_running_total_not_the_capped_batch_log(lines, monkeypatch):
    monkeypatch.setattr(serve, "BATCH_LOG_MAX", 3)
    delay = 0.005
    with Server(KNOBS, engine=Engine(KNOBS, TinyModel(delay_s=delay))) as server:
        result = run_load(server, lines, concurrency=1, requests=40, warmup_requests=2)
    assert result.busy_s >= 40 * delay  # every measured batch sleeps at least `delay` in the model
    assert result.busy_s <= result.window_s


def test_url_loadtest_busy_excludes_warm_up(lines):
    from tuning.cli.commands import main
    from tuning.online.httpfront import HttpFront

    knobs = KNOBS
    with HttpFront(Server(knobs, engine=Engine(knobs, TinyModel(delay_s=0.01))), port=0) as front:
        out = io.StringIO()
        with redirect_stdout(out):
            code = main(["loadtest", "--url", front.url + "/embed", "--concurrency", "1", "--requests", "4",
                         "--warmup", "30", "--limit", "50", "--json"])
    assert code == 0
    data = json.loads(out.getvalue())
    assert data["ok"] == 4 and 0 < data["model_busy"] < 1.0  # 30 warm-up batches over a 4-request window read 1.0


def test_busy_probe_is_read_at_the_window_edges(monkeypatch):
    clock = FakeClock()
    _fake_time(monkeypatch, clock)
    service = FakeService(clock, service_s=0.01)
    result = run_load(service, ["x"], concurrency=1, requests=10, warmup_requests=50, clock=clock,
                      busy_probe=lambda: service.calls * 0.01)
    assert result.busy_s == pytest.approx(10 * 0.01) and result.model_busy == pytest.approx(1.0)


# --- 6. embeddings only when asked --------------------------------------------------------------------------
def test_load_test_keeps_embeddings_only_when_asked(lines):
    knobs = KNOBS.replace(batch_size=4, max_wait_ms=5.0)
    with Server(knobs, engine=Engine(knobs, TinyModel())) as server:
        plain = run_load(server, lines, concurrency=4, requests=20)
        kept = run_load(server, lines, concurrency=4, requests=20, keep_embeddings=True)
        direct = server.submit(lines[0]).result(timeout=30)
    assert all(r.embedding is None for r in plain.responses)
    assert all(r.embedding is not None and r.embedding.base is None for r in kept.responses)  # owns its row
    assert direct.embedding is not None and direct.embedding.base is None
    assert "embedding" not in plain.to_frame().columns


# --- the pipe client used by the serving bench ----------------------------------------------------------------
def test_pipe_target_round_trip(lines):
    import multiprocessing

    from tuning.load.generator import PipeTarget, serve_pipe

    here, there = multiprocessing.Pipe()
    with Server(KNOBS, engine=Engine(KNOBS, TinyModel())) as server:
        stop = serve_pipe(server, there)
        with PipeTarget(here) as target:
            result = run_load(target, lines, concurrency=4, requests=30, rate=500.0, busy_probe=target.busy)
        stop()
    s = result.summary()
    assert s["ok"] == 30 and s["stages"]["inference"]["p50_ms"] > 0 and s["busy_s"] > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(s["p99_ms"])


def test_abandoned_cool_down_fails_only_unmeasured_requests_and_each_gets_one_outcome(lines):
    """A server this test owns, overloaded (20 ms a request at 200 req/s): once every measured request has its
    outcome the cool-down queue is failed at once instead of drained, and not one measured request is among the
    failures."""
    import multiprocessing

    from tuning.load.generator import PipeTarget, serve_pipe

    here, there = multiprocessing.Pipe()
    calls = []
    server = Server(KNOBS, engine=Engine(KNOBS, TinyModel(delay_s=0.02)))
    with server:
        done = serve_pipe(server, there)
        with PipeTarget(here) as target:
            def abandon():
                calls.append(server.counts["ok"])
                target.abandon()
            result = run_load(target, lines, concurrency=256, requests=40, rate=200.0, abandon=abandon)
        done()
        queued_at_the_end = sum(server.counts.values()) - calls[0]
    s = result.summary()
    assert len(calls) == 1
    assert s["submitted"] == s["ok"] == 40 and s["error_rate"] == 0  # every measured request answered, ok
    assert server.counts["error"] > 0  # the cool-down's queue, failed, not served
    assert sum(server.counts.values()) == 40 + result.warmup_requests + result.cooldown_requests  # one outcome each
    assert queued_at_the_end > 0


def test_abandon_is_not_called_when_a_measured_request_is_still_owed_its_outcome(monkeypatch):
    clock = FakeClock()
    _fake_time(monkeypatch, clock)
    run = loadgen._Run(["x"], clock, 0, 0.0, 2, None, None, abandon=lambda: calls.append(1))
    calls = []
    assert run.ticket(clock())[1] == "measured"
    run.stop()  # Ctrl-C with that request in flight
    run.over()
    assert calls == []
    run = loadgen._Run(["x"], clock, 0, 0.0, 1, None, None, abandon=lambda: calls.append(1))
    run.ticket(clock())
    assert run.ticket(clock())[1] == "cool"  # the measured request has no answer yet: the cool-down goes on
    run.end(Response(0, "ok"), "measured", clock(), clock())
    assert run.ticket(clock()) is None
    run.over()
    run.over()
    assert calls == [1]  # once


def test_a_failing_abandon_keeps_the_measured_result_and_warns(monkeypatch):
    clock = FakeClock()
    _fake_time(monkeypatch, clock)

    def broken():
        raise BrokenPipeError("the server's side has gone")

    run = loadgen._Run(["x"], clock, 0, 0.0, 1, None, None, abandon=broken)
    run.ticket(clock())
    run.end(Response(0, "ok"), "measured", clock(), clock())
    assert run.ticket(clock()) is None
    with pytest.warns(RuntimeWarning, match="BrokenPipeError.*waiting for it to drain"):
        run.over()
    assert [r[1] for r in run.records] == ["measured"]  # the measured outcome is still there


def test_a_url_target_refuses_abandon():
    """A URL's server is not the test's to shut down: ``abandon`` there was ignored silently (review finding)."""
    with pytest.raises(ValueError, match="abandon.*URL"):
        run_load("http://127.0.0.1:9/embed", ["x"], requests=1, abandon=lambda: None)


def test_a_load_test_refuses_a_server_that_is_not_running(lines):
    """A second load test on a server the first one abandoned (closed without draining) measured nothing but
    rejections; it is refused, naming the fix."""
    server = Server(KNOBS, engine=Engine(KNOBS, TinyModel(delay_s=0.001)))
    with server:
        run_load(server, lines, requests=5, rate=100.0, concurrency=8, abandon=lambda: server.close(drain=False))
        with pytest.raises(ValueError, match="not running.*fresh Server"):
            run_load(server, lines, requests=5)
    with pytest.raises(ValueError, match="not running"):
        run_load(Server(KNOBS, engine=Engine(KNOBS, TinyModel(delay_s=0.001))), lines, requests=5)


@pytest.mark.parametrize("separate_process", [False, True], ids=["in-process", "load-process"])
def test_the_measure_keeps_a_warm_server_per_configuration(monkeypatch, separate_process):
    """Review finding 1: the measure started a server per load test, so no window saw a warm one. Now the server
    of one configuration is kept across its windows (its cool-down drains, nothing is abandoned) and closed when
    another configuration is asked for or the measure closes."""
    from tuning.experiments.measure import LoadMeasure

    def close(self, drain=True, timeout=60.0):
        if not drain:
            raise AssertionError("a kept server's queue is never abandoned")
        return real_close(self, drain, timeout)
    real_close = Server.close
    monkeypatch.setattr(Server, "close", close)
    measure = LoadMeasure([f"text {i}" for i in range(20)], concurrency=2, duration_s=0.3, warmup_s=0.05,
                          model=TinyModel(delay_s=0.001), separate_process=separate_process)
    try:
        first = measure(KNOBS, rate=50.0, seed=1)
        server = measure._server
        second = measure(KNOBS, window_s=0.2)
        assert measure._server is server and server.health()[0]
        measure(KNOBS.replace(batch_size=2), rate=50.0, seed=2)
        assert measure._server is not server and not server.health()[0]
    finally:
        measure.close()
    assert measure._server is None
    assert first.ok > 0 and first.ok == first.submitted and second.window_s == pytest.approx(0.2, rel=0.2)


@pytest.mark.parametrize("separate_process", [False, True], ids=["in-process", "load-process"])
def test_the_measure_tells_a_failing_abandon(monkeypatch, separate_process):
    """A run under the recorder has a server of its own, whose cool-down is abandoned: a close that abandons
    the queue and raises is told on the caller's thread (before, with the load in its own process, the close
    raised in the server's process, killed the pipe's reader, and the test hung for its 120 s limit), and every
    request still gets its answer."""
    from tuning.experiments.measure import LoadMeasure

    real_close = Server.close

    def close(self, drain=True, timeout=60.0):
        if not drain:
            raise RuntimeError("close refused")
        return real_close(self, drain, timeout)
    monkeypatch.setattr(Server, "close", close)
    measure = LoadMeasure([f"text {i}" for i in range(20)], concurrency=2, duration_s=0.3, warmup_s=0.05,
                          model=TinyModel(delay_s=0.001), separate_process=separate_process)
    try:
        with pytest.warns(RuntimeWarning, match="could not abandon.*close refused"):
            trial = measure(KNOBS, rate=50.0, seed=1, record=True)
    finally:
        measure.close()
    assert trial.ok > 0 and trial.ok == trial.submitted


def test_the_load_process_passes_on_unexpected_warnings_only():
    """The load process's filter: a probe past the knee falling behind is expected (its late sends say so); a
    failing abandon is told."""
    import warnings as w

    from tuning.experiments.measure import quiet_expected

    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always", RuntimeWarning)
        quiet_expected()
        w.warn("open loop offered 90.0 req/s but achieved 60.0 req/s", RuntimeWarning, stacklevel=1)
        w.warn("the load client's loop used 95% of a core", RuntimeWarning, stacklevel=1)
        w.warn("could not abandon the cool-down's queue (BrokenPipeError: gone)", RuntimeWarning, stacklevel=1)
    assert [str(x.message)[:18] for x in caught] == ["could not abandon "]


def test_a_load_test_that_fails_still_tells_the_warnings_it_raised_before(monkeypatch):
    """The load process's error reply dropped the warnings recorded before the failure (review finding): an
    abandon that failed, then an error, told only the error. Now both reach the caller: the warning, then the error."""
    import contextlib
    import warnings as w

    import tuning.load.generator as generator
    from tuning.experiments import measure as m

    def failing_load(target, inputs, **kw):
        w.warn("could not abandon the cool-down's queue (BrokenPipeError: gone)", RuntimeWarning, stacklevel=1)
        w.warn("open loop offered 90.0 req/s but achieved 60.0 req/s", RuntimeWarning, stacklevel=1)  # expected
        raise OSError("the pipe broke")
    monkeypatch.setattr(generator, "run_load", failing_load)
    monkeypatch.setattr(generator, "PipeTarget", lambda data: contextlib.nullcontext(SimpleTarget()))
    reply = m.run_one(None, ["x"], {"requests": 1})
    assert reply[0] == "error" and "OSError: the pipe broke" in reply[1]
    assert reply[2] == ["could not abandon the cool-down's queue (BrokenPipeError: gone)"]
    with pytest.warns(RuntimeWarning, match="could not abandon"), pytest.raises(RuntimeError, match="the pipe broke"):
        m.told(reply)


class SimpleTarget:
    busy = abandon = None


def test_failure_reasons_that_differ_only_by_a_number_are_one_row():
    """#60: five rows of "count 1" for one failure whose message carries a request's own number; an HTTP status
    is not such a number (500 and 503 stay apart)."""
    from tuning.load.generator import _top_reasons
    from tuning.online.response import Response

    responses = ([Response(i, "error", f"HTTP 400: input {i} has {500 + i} tokens, over 512") for i in range(5)]
                 + [Response(9, "error", "HTTP 500: worker died"), Response(10, "error", "HTTP 503: worker died"),
                    Response(11, "ok")])
    rows = _top_reasons(responses)
    assert rows[0] == {"reason": "error: HTTP 400: input 0 has 500 tokens, over 512", "count": 5}
    assert sorted(r["reason"] for r in rows[1:]) == ["error: HTTP 500: worker died", "error: HTTP 503: worker died"]
