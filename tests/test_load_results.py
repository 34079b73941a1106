"""Load results from hand-built responses (issue 17 item 4): the exact percentiles, rates and window each
definition promises (tuning/load/generator.py's module docstring and the metric definitions in README), and the
statistics helpers they use (tuning/base/stats.py).

Times are multiples of 1/64 s, so every latency below is exact in binary and the expectations are equalities.
Percentiles are numpy's default (linear between the closest ranks).
"""

from __future__ import annotations

import math
import types

import numpy as np
import pandas as pd
import pytest

import tuning.load.generator as loadgen
from tuning.base.clock import FakeClock
from tuning.base.stats import PERCENTILES, clean, ledger_dict, stage_ledger, summarize
from tuning.load.generator import LoadResult, run_load
from tuning.online.response import SERVE_STAGES, Response

U = 1 / 64  # seconds


def _result(mode, outcomes_and_latencies, t0=10.0, t_end=12.0, lags=None, **kw) -> LoadResult:
    """Responses scheduled every 1/8 s from ``t0``; each sent ``lag`` after its schedule and received its latency
    after the schedule."""
    responses, timings = [], []
    for i, (outcome, latency_s) in enumerate(outcomes_and_latencies):
        scheduled = t0 + i / 8
        sent = scheduled + (lags[i] if lags else 0.0)
        reason = None if outcome == "ok" else f"{outcome} #{i % 2}"
        responses.append(Response(i, outcome, reason, t_submit=sent, t_done=scheduled + latency_s, batch_size=i % 3))
        timings.append((scheduled, sent, scheduled + latency_s))
    result = LoadResult(mode, 4, 8.0 if mode == "open" else None, responses, t0, t_end, **kw)
    result.timings = timings
    return result


def test_percentiles_cover_every_outcome_and_ok_only_is_separate():
    """Rule: percentiles over every outcome (a rejection is a latency too); ok-only ones beside them. With half
    the requests rejected at once, the all-outcome p50 of 125 ms ok answers reads 62.5 ms and the ok-only 125 ms
    (issue 17: percentiles over the wrong set survived)."""
    result = _result("closed", [("rejected", 0.0)] * 5 + [("ok", 8 * U)] * 5)
    assert result.latency()["p50"] == 62.5 and result.latency(ok_only=True)["p50"] == 125.0
    assert result.latency()["count"] == 10 and result.latency(ok_only=True)["count"] == 5
    s = result.summary()
    assert (s["p50_ms"], s["p90_ms"], s["p95_ms"], s["p99_ms"]) == (62.5, 125.0, 125.0, 125.0)
    assert (s["ok_p50_ms"], s["ok_p90_ms"], s["ok_p95_ms"], s["ok_p99_ms"]) == (125.0,) * 4
    assert s["error_rate"] == 0.5


def test_percentiles_interpolate_between_ranks():
    """p50/p90/p95/p99 of 1..11 units: ranks 5, 9, 9.5, 9.9 of 0..10."""
    result = _result("closed", [("ok", (i + 1) * U) for i in range(11)])
    lat = result.latency()
    ms = 1000 * U
    assert lat == {"count": 11, "mean": 6 * ms, "iqr": 5 * ms, "p50": 6 * ms, "p90": 10 * ms, "p95": 10.5 * ms,
                   "p99": pytest.approx(10.9 * ms)}


def test_latency_runs_from_the_scheduled_arrival_not_the_send():
    """Rule: in the open loop a request's latency runs from its scheduled arrival; a send late by 250 ms adds
    250 ms (no coordinated omission). The send lag is reported beside it."""
    result = _result("open", [("ok", 16 * U), ("ok", 8 * U)], lags=[0.25, 0.0])
    assert result.latencies_ms() == [250.0, 125.0]
    assert result.send_lags_ms() == [250.0, 0.0]
    frame = result.to_frame()
    assert list(frame.latency_ms) == [250.0, 125.0] and list(frame.send_lag_ms) == [250.0, 0.0]
    assert list(frame.t_scheduled) == [10.0, 10.125] and list(frame.t_sent) == [10.25, 10.125]
    assert list(frame.t_received) == [10.25, 10.25]
    s = result.summary()
    assert s["latency_from"] == "scheduled arrival" and s["send_lag_p50_ms"] == 125.0 and s["send_lag_p99_ms"] == 247.5


def test_without_client_timings_latency_is_the_response_own():
    responses = [Response(0, "ok", t_submit=1.0, t_done=1.0 + 4 * U), Response(1, "timeout", "late", t_submit=1.0,
                                                                                t_done=1.0 + 64 * U)]
    result = LoadResult("closed", 1, None, responses, 0.0, 2.0)
    assert result.latencies_ms() == [62.5, 1000.0] and result.latencies_ms(ok_only=True) == [62.5]
    assert list(result.to_frame().latency_ms) == [62.5, 1000.0] and "send_lag_ms" not in result.to_frame()
    assert result.send_lags_ms() == [] and result.summary()["latency_from"] == "send"


def test_rates_and_window_in_the_open_loop():
    """throughput = ok answers received in the window / window; offered = arrivals scheduled in the window /
    window; achieved = measured requests actually sent before the window closed / window."""
    outcomes = [("ok", U)] * 6 + [("rejected", 0.0), ("timeout", 1.0), ("error", U), ("ok", U)]
    lags = [0.0] * 8 + [1.0, 2.0]  # the last two were sent after the window closed at 12.0
    result = _result("open", outcomes, lags=lags)
    assert result.window_s == 2.0 and result.submitted == 10
    assert result.qps == 7 / 2  # no client count: the ok responses
    result.ok_in_window = 5
    assert result.qps == 5 / 2
    assert result.offered_rate == 10 / 2 and result.achieved_rate == 8 / 2
    assert result.error_rate == 3 / 10
    s = result.summary()
    assert (s["qps"], s["offered_rate"], s["achieved_rate"], s["error_rate"], s["window_s"]) == (2.5, 5.0, 4.0, 0.3, 2.0)
    assert (s["submitted"], s["ok"], s["errors"], s["timeouts"], s["rejected"]) == (10, 7, 1, 1, 1)
    assert (s["mode"], s["concurrency"], s["rate"]) == ("open", 4, 8.0)


def test_closed_loop_has_no_offered_or_achieved_rate():
    result = _result("closed", [("ok", U)] * 3, t0=0.0, t_end=0.5)
    assert result.offered_rate is None and result.achieved_rate is None
    s = result.summary()
    assert s["offered_rate"] is None and s["achieved_rate"] is None and s["qps"] == 6.0


def test_an_empty_window_reads_nan_not_a_number():
    import warnings

    result = LoadResult("open", 1, 5.0, [], 3.0, 3.0)
    assert result.window_s == 1e-9 and math.isnan(result.error_rate) and result.qps == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice" on the way
        s = result.summary()
    assert s["p50_ms"] is None and s["error_rate"] is None and s["mean_batch"] is None and s["busy_s"] is None
    assert s["model_busy"] is None and s["device_busy"] is None and s["error_reasons"] == []


def test_model_busy_is_the_busy_total_over_the_span_it_was_read_across():
    """Rule: model busy = busy seconds between the two reads of the running total / the time between them
    (the window when the reads' times are unknown), at most 1."""
    result = _result("closed", [("ok", U)], busy_s=1.5)
    assert result.model_busy == 0.75
    result.busy_window = (10.0, 13.0)
    assert result.model_busy == 0.5
    result.busy_s = 4.0
    assert result.model_busy == 1.0
    result.busy_s = None
    assert math.isnan(result.model_busy)
    cpu = _result("closed", [("ok", U)], busy_s=0.5, device={"kind": "cpu"})
    assert cpu.device_busy == 0.25 and math.isnan(_result("closed", [], busy_s=0.5, device={"kind": "cuda"}).device_busy)
    s = cpu.summary()
    assert (s["busy_s"], s["model_busy"], s["device_busy"]) == (0.5, 0.25, 0.25)


def test_batch_sizes_come_from_the_batch_log_else_from_ok_responses():
    result = _result("closed", [("ok", U)] * 4 + [("error", U)] * 3)  # batch_size i % 3: 0, 1, 2, 0 | 1, 2, 0
    result.responses[5].batch_size = 7  # an error's batch size is not a batch the model ran for it
    assert result.batch_sizes() == [1, 2]  # ok ones that rode a batch (0: not reported)
    assert result.summary()["mean_batch"] == 1.5
    result.batch_log = [(1.0, 4), (2.0, 8)]
    assert result.batch_sizes() == [4, 8] and result.summary()["mean_batch"] == 6.0
    assert list(result.batches_frame().columns) == ["t", "batch_size"] and len(result.batches_frame()) == 2
    result.inflight = [(0.0, 1), (0.5, 0)]
    assert result.inflight_frame().to_dict("list") == {"t": [0.0, 0.5], "inflight": [1, 0]}
    result.spans_, result.wait_for_input_total_s = [(1.0, 1.5)], 0.25
    assert result.spans() == [(1.0, 1.5)] and result.wait_for_input_s() == 0.25


def test_error_reasons_are_the_five_commonest_with_counts():
    reasons = ["a"] * 3 + ["b"] * 5 + ["c", "d", "e", "f"] + ["x" * 200]
    responses = [Response(i, "error", r) for i, r in enumerate(reasons)] + [Response(99, "rejected", None),
                                                                            Response(98, "ok")]
    top = LoadResult("closed", 1, None, responses, 0.0, 1.0).summary()["error_reasons"]
    assert top == [{"reason": "error: b", "count": 5}, {"reason": "error: a", "count": 3},
                   {"reason": "error: c", "count": 1}, {"reason": "error: d", "count": 1},
                   {"reason": "error: e", "count": 1}]
    one = LoadResult("closed", 1, None, [Response(2, "ok"), Response(0, "timeout", "y" * 200), Response(1, "rejected",
                                                                                                      None)], 0, 1)
    assert one.summary()["error_reasons"] == [{"reason": "timeout: " + "y" * 120, "count": 1},
                                              {"reason": "rejected: ", "count": 1}]


def test_summary_names_every_figure():
    result = _result("open", [("ok", U)] * 2, engine="locust", engine_stats={"workers": 2}, client_cpu=0.5)
    s = result.summary()
    assert list(s) == [
        "mode", "concurrency", "rate", "latency_from", "qps", "texts_per_s", "texts_per_request", "p50_ms", "p90_ms",
        "p95_ms", "p99_ms", "error_rate",
        "ok_p50_ms", "ok_p90_ms", "ok_p95_ms", "ok_p99_ms", "offered_rate", "achieved_rate", "send_lag_p50_ms",
        "send_lag_p99_ms", "submitted", "ok", "errors", "timeouts", "rejected", "warmup_requests",
        "cooldown_requests", "window_s", "busy_s", "model_busy", "device_busy", "device", "mean_batch", "stages",
        "error_reasons", "client_cpu", "engine", "engine_stats", "knobs"]
    assert (s["engine"], s["engine_stats"], s["client_cpu"], s["knobs"]) == ("locust", {"workers": 2}, 0.5, None)
    from tuning.knobs import Knobs

    assert _result("closed", [("ok", U)], knobs=Knobs(batch_size=4)).summary()["knobs"] == Knobs(batch_size=4).as_dict()
    assert "engine_stats" not in _result("open", [("ok", U)]).summary()


def test_ledger_is_over_ok_requests_with_shares_of_p50_and_p99():
    ok = [Response(i, "ok", inference_ms=float(10 * (i + 1)), queue_wait_ms=10.0) for i in range(3)]
    bad = [Response(9, "error", "x", inference_ms=1000.0, queue_wait_ms=1000.0)]
    result = LoadResult("closed", 1, None, ok + bad, 0.0, 1.0)
    frame = result.ledger()
    assert list(frame.index) == list(SERVE_STAGES)
    assert frame.loc["inference", "p50_ms"] == 20.0 and frame.loc["inference", "mean_ms"] == 20.0
    assert frame.loc["inference", "p99_ms"] == pytest.approx(29.8)
    assert frame.loc["inference", "share"] == pytest.approx(20 / 30) and frame.loc["queue_wait", "share"] == pytest.approx(
        10 / 30)
    assert frame.loc["inference", "share_p99"] == pytest.approx(29.8 / 39.8)
    stages = result.summary()["stages"]
    assert stages["queue_wait"] == {"p50_ms": 10.0, "p99_ms": 10.0, "share": pytest.approx(1 / 3),
                                    "share_p99": pytest.approx(10 / 39.8)}


# --- the statistics helpers -------------------------------------------------------------------------------------
def test_summarize_exact_and_empty():
    assert summarize([4.0, 1.0, 3.0, 2.0]) == {"count": 4, "mean": 2.5, "iqr": 1.5, "p50": 2.5, "p90": 3.7,
                                               "p95": pytest.approx(3.85), "p99": pytest.approx(3.97)}
    empty = summarize([])
    assert empty["count"] == 0 and list(empty) == ["count", "mean", "iqr", "p50", "p90", "p95", "p99"]
    assert all(math.isnan(empty[k]) for k in empty if k != "count")
    assert PERCENTILES == (50, 90, 95, 99) and type(summarize([1])["count"]) is int


def test_clean_turns_non_finite_into_none():
    assert clean(1.5) == 1.5 and type(clean(np.float64(2.0))) is float and clean(3) == 3.0
    assert clean(math.nan) is None and clean(math.inf) is None and clean(-math.inf) is None and clean(None) is None


def test_stage_ledger_without_records_has_nan_shares():
    frame = stage_ledger([], ("a", "b"))
    assert list(frame.index) == ["a", "b"] and frame["share"].isna().all() and frame["share_p99"].isna().all()
    assert ledger_dict(frame) == {"a": {"p50_ms": None, "p99_ms": None, "share": None, "share_p99": None},
                                  "b": {"p50_ms": None, "p99_ms": None, "share": None, "share_p99": None}}
    rec = types.SimpleNamespace(a_ms=3.0, b_ms=1.0)
    assert ledger_dict(stage_ledger([rec], ("a", "b"))) == {
        "a": {"p50_ms": 3.0, "p99_ms": 3.0, "share": 0.75, "share_p99": 0.75},
        "b": {"p50_ms": 1.0, "p99_ms": 1.0, "share": 0.25, "share_p99": 0.25}}
    assert isinstance(stage_ledger([rec], ("a",)), pd.DataFrame)


# --- the measured window, from run_load on the fake clock ----------------------------------------------------------
class _Service:
    """One request at a time, each taking ``service_s`` of fake time."""

    def __init__(self, clock, service_s):
        self.clock, self.service_s, self.calls = clock, service_s, 0

    def __call__(self, raw):
        t0 = self.clock()
        self.clock.advance(self.service_s)
        self.calls += 1
        return Response(self.calls, "ok", t_submit=t0, t_done=self.clock())


@pytest.mark.parametrize("warmup_requests,warmup_s,warm", [(5, 0.0, 5), (2, 5 * U, 5), (6, 2 * U, 6), (0, 0.0, 0)])
def test_the_window_opens_when_warm_up_ends(warmup_requests, warmup_s, warm):
    """Rule: warm-up lasts until both ``warmup_requests`` were sent and ``warmup_s`` passed; the window opens at
    the first measured request and closes at the first one after it (issue 17: a window starting before warm-up
    ended survived)."""
    clock = FakeClock(100.0)
    service = _Service(clock, U)
    result = run_load(service, ["x"], concurrency=1, requests=10, warmup_requests=warmup_requests, warmup_s=warmup_s,
                      clock=clock, busy_probe=lambda: service.calls * U)
    assert result.warmup_requests == warm
    assert result.t_window_start == 100.0 + warm * U and result.t_end == 100.0 + (warm + 10) * U
    assert result.window_s == 10 * U and [r.request for r in result.responses] == list(range(warm + 1, warm + 11))
    assert result.cooldown_requests == 0  # one client: every measured answer is in when the window closes
    assert result.busy_s == 10 * U and result.busy_window == (result.t_window_start, result.t_end)
    # throughput = ok answers received in [t_window_start, t_end): one per 1/64 s once warm; without warm-up the
    # first answer comes one service time into the window (the ramp that warm-up exists to leave out)
    assert result.qps == (64.0 if warm else 9 / (10 * U))


def test_a_duration_window_closes_at_its_length():
    clock = FakeClock()
    service = _Service(clock, 3 * U)
    result = run_load(service, ["x"], concurrency=1, duration_s=16 * U, warmup_requests=1, clock=clock)
    assert result.t_window_start == 3 * U and result.t_end == 19 * U  # opens at the first measured send
    assert result.submitted == 6  # sent at 3, 6, 9, 12, 15, 18 (units): all before 19
    assert result.summary()["window_s"] == 16 * U


def test_open_loop_window_runs_from_the_first_measured_arrival_to_the_first_after(monkeypatch):
    """Rule: in the open loop a request's phase is decided at its scheduled arrival; the window runs from the
    first measured arrival to the first arrival after the measured ones (the Poisson schedule, seed 0)."""
    import random

    clock = FakeClock()
    monkeypatch.setattr(loadgen, "time", types.SimpleNamespace(sleep=clock.advance))
    result = run_load(_Service(clock, U / 4), ["x"], concurrency=1, requests=40, rate=64.0, warmup_requests=3,
                      clock=clock)
    rng, arrivals = random.Random(0), [0.0]
    for _ in range(43):
        arrivals.append(arrivals[-1] + rng.expovariate(64.0))
    assert (result.t_window_start, result.t_end) == (arrivals[3], arrivals[43])
    assert [scheduled for scheduled, _, _ in result.timings] == arrivals[3:43]
    s = result.summary()
    assert s["submitted"] == 40 and s["warmup_requests"] == 3 and s["latency_from"] == "scheduled arrival"
    assert s["offered_rate"] == 40 / (arrivals[43] - arrivals[3])


def test_a_window_closes_before_a_request_due_exactly_at_its_end():
    """Rule: the window is half-open; with ``duration_s`` a request due exactly at its end is not measured."""
    clock = FakeClock()
    result = run_load(_Service(clock, 4 * U), ["x"], concurrency=1, duration_s=16 * U, warmup_requests=1, clock=clock)
    assert (result.t_window_start, result.t_end) == (4 * U, 20 * U)
    assert result.submitted == 4  # sent at 4, 8, 12, 16 (units); the one due at 20 belongs to the next window


# --- the phases of a run, driven by hand ---------------------------------------------------------------------------
def _run(**kw):
    clock = FakeClock()
    args = dict(warmup_requests=1, warmup_s=0.0, requests=2, duration_s=None, busy_probe=None)
    args.update(kw)
    return clock, loadgen._Run(["a", "b", "c"], clock, **args)


def test_run_phases_warm_measured_then_cool_until_every_measured_answer_is_in():
    """Rule: warm-up, then the measured requests, then cool-down requests that keep the load steady until every
    measured request has its answer; then the test stops (no request is left without its outcome)."""
    clock, run = _run(busy_probe=lambda: clock() * 10)
    assert run.ticket(clock()) == ("a", "warm")
    clock.advance(U)
    assert run.ticket(clock()) == ("b", "measured") and run.t0 == U
    assert run.ticket(clock()) == ("c", "measured")  # two clients: both measured requests out at once
    clock.advance(U)
    assert run.ticket(clock()) == ("a", "cool") and run.t1 == 2 * U  # the window closed; two answers still due
    run.end(Response(0, "ok"), "measured", U, U)
    assert run.ticket(clock()) == ("b", "cool")  # one measured answer still due: keep the load
    run.end(Response(1, "ok"), "measured", U, U)
    assert run.ticket(clock()) is None  # all measured answers in: stop
    assert (run.n_warm, run.n_measured, run.n_cool, run.outstanding) == (1, 2, 2, 0)
    assert run.busy == [(U, 10 * U), (2 * U, 20 * U)]  # the busy total read at the window's two edges


def test_run_counts_requests_in_flight():
    clock, run = _run()
    run.begin()
    clock.advance(U)
    run.begin()
    run.end(Response(0, "ok"), "warm", 0.0, 0.0)
    clock.advance(U)
    run.end(Response(1, "ok"), "measured", U, U)
    assert run.series == [(0.0, 1), (U, 2), (U, 1), (2 * U, 0)] and run.inflight == 0
    assert [phase for _, phase, *_ in run.records] == ["warm", "measured"] and run.records[1][4] == 2 * U


def test_stopping_a_run_closes_the_window_there_and_ends_the_test():
    """Ctrl-C: no more tickets; a window that was open closes at the stop (what was measured is kept)."""
    clock, run = _run(requests=10)
    run.ticket(clock())
    clock.advance(U)
    run.ticket(clock())
    clock.advance(U)
    run.stop()
    assert run.ticket(clock()) is None and (run.t0, run.t1) == (U, 2 * U)
    clock, before = _run()
    before.stop()
    assert before.ticket(clock()) is None and (before.t0, before.t1) == (None, None)  # stopped during warm-up
    clock, after = _run(requests=1, warmup_requests=0)
    after.ticket(clock())
    clock.advance(U)
    after.ticket(clock())  # the window closed at U
    clock.advance(U)
    after.stop()
    assert after.t1 == U  # a closed window keeps its end
