"""A load test whose first answers are all errors stops early (#50: a wrong route answered 404 in a few
milliseconds and ``loadtest`` fired 80-105k requests in 2-5 s), with the first reason; every request it had
sent still gets its one outcome. Timeouts and rejections (a server slow to warm up, or overloaded) do not
count: only errors do."""

from __future__ import annotations

import threading

import pytest

from tests.cli_run import run_cli
from tests.standin_services import StandIn
from tuning.base.clock import FakeClock
from tuning.load.generator import EARLY_STOP_ERRORS, run_load
from tuning.online.response import Response

N = EARLY_STOP_ERRORS
U = 1 / 64


class _Answers:
    """A service that answers ``outcomes[i]`` to its i-th request (the last one from then on), each after
    ``service_s`` of fake time."""

    def __init__(self, clock, outcomes, service_s=U):
        self.clock, self.outcomes, self.service_s, self.calls = clock, outcomes, service_s, 0
        self.lock = threading.Lock()

    def __call__(self, raw):
        with self.lock:
            i, self.calls = self.calls, self.calls + 1
        t0 = self.clock()
        self.clock.advance(self.service_s)
        outcome, reason = self.outcomes[min(i, len(self.outcomes) - 1)]
        return Response(i, outcome, reason, t_submit=t0, t_done=self.clock())


NOT_FOUND = ("error", "HTTP 404: Not Found")


@pytest.mark.parametrize("warmup", [0, 16, 2 * N])
def test_the_first_errors_stop_the_test_with_the_first_reason(warmup):
    clock = FakeClock()
    service = _Answers(clock, [("error", "HTTP 404: first"), NOT_FOUND])
    result = run_load(service, ["x"], concurrency=1, requests=10 * N, warmup_requests=warmup, clock=clock)
    assert service.calls == N, "stops at the Nth error, not at the end of the test"
    assert result.stopped_early == f"the first {N} requests all failed: HTTP 404: first"
    # every request sent is measured, warm-up included (stopped in its warm-up it would otherwise show nothing)
    s = result.summary()
    assert s["submitted"] == s["errors"] == N and s["warmup_requests"] == s["cooldown_requests"] == 0
    assert s["stopped_early"] == result.stopped_early and s["ok"] == 0 and s["error_reasons"]
    assert result.t_window_start == 0.0 and result.t_end == pytest.approx(N * U)


@pytest.mark.parametrize("first", [("ok", None), ("timeout", "timed out"), ("rejected", "HTTP 503: loading")],
                         ids=["ok", "timeout", "rejected"])
def test_any_answer_but_an_error_ends_the_rule(first):
    """A server slow to warm up (timeouts) or shedding load (503) is not a wrong request: the test runs on."""
    clock = FakeClock()
    service = _Answers(clock, [NOT_FOUND] * (N - 1) + [first, NOT_FOUND])
    result = run_load(service, ["x"], concurrency=1, requests=3 * N, clock=clock)
    assert result.stopped_early is None and result.submitted == 3 * N
    assert "stopped_early" not in result.summary()


def test_bad_inputs_neither_count_nor_end_the_rule():
    """A bad row of the data is never sent: it says nothing about the server either way."""
    clock = FakeClock()
    bad = [("error", "bad input: empty text")] * (2 * N)
    result = run_load(_Answers(clock, bad + [("ok", None)]), ["x"], concurrency=1, requests=3 * N, clock=clock)
    assert result.stopped_early is None and result.submitted == 3 * N
    clock = FakeClock()
    service = _Answers(clock, [("error", "bad input: empty text")] * 10 + [NOT_FOUND])
    result = run_load(service, ["x"], concurrency=1, requests=10 * N, clock=clock)
    assert service.calls == N + 10 and result.stopped_early.endswith("HTTP 404: Not Found")


def test_every_request_in_flight_at_the_stop_gets_its_outcome():
    clock = FakeClock()
    service = _Answers(clock, [NOT_FOUND], service_s=0.0)
    result = run_load(service, ["x"], concurrency=8, requests=100 * N, clock=clock)
    assert result.stopped_early is not None
    assert N <= service.calls < N + 8, "no new request after the stop; the 7 others in flight at most"
    assert result.submitted == service.calls == result.count("error")  # each one sent has its one outcome


@pytest.fixture(scope="module")
def standin():
    with StandIn() as url:
        yield url


@pytest.mark.parametrize("rate", [None, 5000.0], ids=["closed", "open"])
def test_a_route_that_answers_404_is_not_fired_at(standin, rate):
    result = run_load(standin + "/no-such-route", ["a text"], concurrency=8, duration_s=30.0, rate=rate)
    assert result.stopped_early.startswith(f"the first {N} requests all failed: HTTP 404")
    assert result.submitted <= N + 8 and result.submitted == result.count("error")


def test_loadtest_says_it_stopped_and_why(standin):
    out = run_cli("loadtest", "--url", standin + "/no-such-route", "--duration", "30", "--concurrency", "4",
                  "--limit", "10")
    assert out.returncode == 1, out.stderr
    assert f"the first {N} requests all failed: HTTP 404" in out.stderr, out.stderr
