"""The hard worlds' known properties (tests/worlds_hard.py): SIMULATED queues whose answers are known, so that
the engine can be judged against them. Nothing here times anything."""

import math

import numpy as np
import pytest

from tests.worlds_hard import (
    CONCURRENCY,
    HARD_WORLDS,
    OVER_SHARE,
    SERVICE_KINDS,
    WARMUP_S,
    BatchConfig,
    BatchCosts,
    BatchingWorld,
    ClientLag,
    QueueWorld,
    batch_saturation,
    fifo_done,
    mg1_latencies,
    mg1_windows,
    serve_closed,
    serve_open,
    service_draws,
    target_for,
    text_lengths,
    when,
)
from tuning.knobs import Knobs


def lindley_loop(arrivals, service, start_free=0.0):
    done, free = [], start_free
    for a, s in zip(arrivals, service):
        free = max(a, free) + s
        done.append(free)
    return np.asarray(done)


def test_fifo_done_is_lindleys_recursion_row_by_row():
    rng = np.random.default_rng(1)
    a = np.cumsum(rng.exponential(1.0, (3, 500)), axis=1)
    s = rng.exponential(0.9, (3, 500))
    done = fifo_done(a, s, start_free=2.0)
    for row in range(3):
        np.testing.assert_allclose(done[row], lindley_loop(a[row], s[row], 2.0), rtol=1e-12)


@pytest.mark.parametrize("kind", SERVICE_KINDS)
def test_service_draws_have_mean_one_and_the_named_shape(kind):
    s = service_draws(kind, np.random.default_rng(2), 400_000)
    assert s.mean() == pytest.approx(1.0, rel=0.01)
    if kind == "lognormal":
        assert np.log(s).std() == pytest.approx(1.0, rel=0.01)
    if kind == "mixture":
        short = s.min()
        long = s[s > 2 * short]
        assert long.size / s.size == pytest.approx(0.03, rel=0.05)
        assert 10 * short <= long.min() and long.max() <= 20 * short


@pytest.mark.parametrize("kind", SERVICE_KINDS)
def test_a_saturated_server_answers_at_its_pace_and_rules_multiply_it(kind):
    """The mean service time is one over the pace: 16 clients keep the server busy, so it answers at its pace."""
    world = QueueWorld(service=kind, noise=0.0, rules=[(when("tokenizer", "fast"), 1.5)], seed=3)
    assert world(Knobs(), window_s=400.0).qps == pytest.approx(100.0, rel=0.03)
    assert world(Knobs(tokenizer="fast"), window_s=400.0).qps == pytest.approx(150.0, rel=0.03)


def test_the_pace_varies_window_to_window_without_drift_or_dips():
    world = QueueWorld(service="deterministic", noise=0.10, seed=4)
    log_pace = np.log([world(Knobs(), window_s=20.0).qps / 100.0 for _ in range(300)])
    assert log_pace.std() == pytest.approx(0.10, rel=0.15)
    assert abs(np.corrcoef(log_pace[:-1], log_pace[1:])[0, 1]) < 0.2  # no slow drift
    assert log_pace.min() > -0.45  # no dip to half the pace


def test_an_open_window_gives_the_outcomes_in_arrival_order_with_their_arrivals_and_lags():
    world = QueueWorld(service="deterministic", noise=0.0, seed=5)
    t = world(Knobs(), rate=60.0, seed=7, window_s=5.0)
    again = world(Knobs(), rate=60.0, seed=7, window_s=5.0)
    assert t.latencies_ms.size == t.arrivals_s.size == t.lags_ms.size == t.ok == t.submitted
    assert np.all(np.diff(t.arrivals_s) > 0) and t.arrivals_s.min() >= WARMUP_S and t.arrivals_s.max() < WARMUP_S + 5
    np.testing.assert_array_equal(t.arrivals_s, again.arrivals_s)  # the seed fixes the arrivals
    assert t.latencies_ms.min() >= 10.0  # every answer takes at least one service time
    assert t.rate == 60.0 and t.offered_rate == pytest.approx(60.0, rel=0.3) and t.qps == pytest.approx(60, rel=0.3)
    assert t.p99_ms >= t.p50_ms


def test_the_clients_lag_rises_steeply_to_its_ceiling_and_falls_behind_above_it():
    lag = ClientLag(ceiling_rate=1000.0)
    assert lag.mean_ms(950.0) > 5 * lag.mean_ms(500.0)
    rng = np.random.default_rng(6)
    over = lag.lags_ms(2000.0, np.arange(0, 10, 1 / 2000), rng)
    assert over[-100:].mean() == pytest.approx(10_000, rel=0.05)  # at twice its ceiling, 1 s behind a second
    world = QueueWorld(service="deterministic", base_rate=5000.0, noise=0.0, lag=lag, seed=6)
    calm, busy = (world(Knobs(), rate=r, seed=1, window_s=2.0).lags_ms.mean() for r in (300.0, 900.0))
    assert busy > 5 * calm


@pytest.mark.parametrize("name", list(HARD_WORLDS))
def test_every_world_answers_both_loops_through_the_seam(name):
    world = HARD_WORLDS[name](seed=13)
    closed = world(Knobs(batch_size=4), window_s=2.0)
    assert closed.rate is None and closed.ok == closed.latencies_ms.size > 0 and closed.qps > 0
    opened = world(Knobs(batch_size=4), rate=0.5 * world.saturation(Knobs(batch_size=4)), seed=2, window_s=2.0)
    assert opened.latencies_ms.size == opened.arrivals_s.size == opened.lags_ms.size == opened.ok > 0
    assert np.isfinite(opened.p99_ms) and opened.window_s == 2.0


def test_the_truth_is_the_servers_without_the_clients_lag():
    lagged, plain = HARD_WORLDS["lognormal, client ceiling 110/s"](), HARD_WORLDS["lognormal, sigma 1"]()
    assert lagged.truth(Knobs(), 300.0) == plain.truth(Knobs(), 300.0) > 0
    near = lagged(Knobs(), rate=100.0, seed=3, window_s=3.0)
    assert near.lags_ms.mean() > 40.0  # the measurement near the client's ceiling carries its lag


# --- the batcher ----------------------------------------------------------------------------------------

def _open_batches(padding, max_batch=8, max_wait_ms=5.0, rate=300.0, n=4000, seed=8):
    cfg = BatchConfig.of(Knobs(batch_size=max_batch, max_wait_ms=max_wait_ms, padding=padding))
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1 / rate, n))
    trace = []
    done, sizes = serve_open(sent, text_lengths(BatchCosts(), rng, n, cfg.max_length), cfg, BatchCosts(),
                             rng.random(n), trace=trace)
    return cfg, sent, done, sizes, trace


@pytest.mark.parametrize("padding", ["dynamic", "bucket"])
def test_batches_hold_at_most_max_batch_and_wait_at_most_max_wait_after_their_first_arrival(padding):
    cfg, sent, done, sizes, trace = _open_batches(padding)
    assert sizes.sum() == sent.size and 1 <= sizes.min() and sizes.max() <= cfg.max_batch
    assert sizes.max() == cfg.max_batch and sizes.min() < cfg.max_batch  # both limits are met at this load
    assert np.all(done > sent)
    prev_end = 0.0
    for start, head, size, end in trace:
        assert start >= head
        assert start <= max(prev_end, head + cfg.max_wait_s) + 1e-12  # never waits past max_wait once free
        if start < head + cfg.max_wait_s and start > prev_end:
            assert size == cfg.max_batch  # it left early only because it was full
        prev_end = end


def test_a_closed_loop_of_16_splits_batches_and_understates_what_open_arrivals_reach():
    """Its clients come back apart, so a batcher that does not wait takes one and then the rest: the closed
    loop's throughput is not the open loop's capacity."""
    costs, knobs = BatchCosts(), Knobs(batch_size=16, padding="bucket", tokenizer="fast")
    rng = np.random.default_rng(9)
    _, sizes = serve_closed(BatchConfig.of(Knobs(batch_size=32)), costs, rng, rng, window_s=10.0)
    assert sizes.max() <= CONCURRENCY and sizes.mean() < 0.75 * CONCURRENCY and (sizes <= 2).mean() > 0.25
    world = BatchingWorld(noise=0.0, seed=9)
    world(knobs, window_s=3.0)  # the new server's cold window
    closed = world(knobs, window_s=10.0).qps
    assert world.truth(knobs, target_for(world, knobs, 0.9)) > 1.2 * closed


def test_the_fast_tokenizer_is_worth_more_in_larger_batches():
    costs = BatchCosts()

    def gain(batch):
        sat = [batch_saturation(costs, BatchConfig.of(Knobs(batch_size=batch, tokenizer=t))) for t in ("naive", "fast")]
        return sat[1] / sat[0]
    assert gain(16) > gain(1) + 0.05 > 1.05


def test_bf16_raises_closed_loop_throughput_and_lowers_the_truth_at_a_tight_target():
    world = BatchingWorld(noise=0.0, seed=10)
    fp32, bf16 = Knobs(batch_size=8), Knobs(batch_size=8, dtype="bf16")

    def closed_qps(knobs):
        world(knobs, window_s=3.0)  # the new server's cold window
        return np.mean([world(knobs, window_s=10.0).qps for _ in range(3)])
    assert closed_qps(bf16) > 1.15 * closed_qps(fp32)
    assert world.truth(bf16, 15.0) < 0.85 * world.truth(fp32, 15.0)


def test_a_new_server_is_slow_for_its_first_seconds_only():
    world = BatchingWorld(noise=0.0, seed=11)
    knobs = Knobs(batch_size=8)
    rate = 0.5 * world.saturation(knobs)

    def by_arrival(t):
        early = t.latencies_ms[t.arrivals_s < 2.0].mean()
        late = t.latencies_ms[t.arrivals_s > 5.0].mean()
        return early, late
    cold_early, cold_late = by_arrival(world(knobs, rate=rate, seed=1, window_s=8.0))
    warm_early, warm_late = by_arrival(world(knobs, rate=rate, seed=1, window_s=8.0))
    assert cold_early > 3 * warm_early
    assert cold_late == pytest.approx(warm_late, rel=0.25)
    other_early, _ = by_arrival(world(Knobs(batch_size=8, max_wait_ms=1.0), rate=rate, seed=1, window_s=8.0))
    assert other_early > 3 * warm_early  # any change of knobs starts a new server



def test_a_service_s_own_knob_names_map_onto_the_batcher():
    world = BatchingWorld(aliases={"batch_size": "MAX_BATCH", "max_wait_ms": "MAX_WAIT_MS"})
    assert world.saturation({"MAX_BATCH": 16, "MAX_WAIT_MS": 5}) == world.saturation(Knobs(batch_size=16))
    assert world({"MAX_BATCH": 8}, rate=100.0, seed=1, window_s=2.0).mean_batch > 1.0


# --- truths ---------------------------------------------------------------------------------------------

def test_the_truth_is_the_highest_rate_whose_long_run_meets_the_target():
    world = QueueWorld(service="lognormal")
    truth = world.truth(Knobs(), 200.0)
    assert 0 < truth < 100
    assert (mg1_latencies("lognormal", 100.0, truth, (("sigma", 1.0),)) > 200.0).mean() <= OVER_SHARE
    assert (mg1_latencies("lognormal", 100.0, truth * 1.01, (("sigma", 1.0),)) > 200.0).mean() > OVER_SHARE


def test_the_truth_is_monotone_in_the_target():
    queue, batcher = QueueWorld(service="mixture"), BatchingWorld()
    truths = [queue.truth(Knobs(), t) for t in (160.0, 320.0, 640.0, 1280.0)]
    assert all(a < b for a, b in zip(truths, truths[1:]))
    assert queue.truth(Knobs(), 80.0) == 0.0  # 3% of requests take 100-200 ms alone
    truths = [batcher.truth(Knobs(tokenizer="fast"), t) for t in (8.0, 12.0, 20.0, 40.0)]
    assert all(a < b for a, b in zip(truths, truths[1:]))
    assert QueueWorld(service="deterministic", floor_ms=lambda k: 50.0).truth(Knobs(), 40.0) == 0.0


@pytest.mark.parametrize("kind", SERVICE_KINDS)
@pytest.mark.parametrize("load", [0.6, 0.8, 0.9])
def test_target_for_puts_the_truth_at_the_asked_share_of_saturation(kind, load):
    world = QueueWorld(service=kind)
    assert world.truth(Knobs(), target_for(world, Knobs(), load)) == pytest.approx(load * 100.0, rel=0.02)


def test_target_for_places_the_batchers_truth_too():
    world, knobs = BatchingWorld(), Knobs(batch_size=8, padding="bucket")
    target = target_for(world, knobs, 0.8)
    assert world.truth(knobs, target) == pytest.approx(0.8 * world.saturation(knobs), rel=0.02)


def test_best_finds_the_configuration_with_the_highest_truth():
    world = QueueWorld(service="lognormal", rules=[(when("tokenizer", "fast"), 1.3), (when("dtype", "bf16"), 0.8)])
    best = world.best({"tokenizer": ("naive", "fast"), "dtype": ("fp32", "bf16")}, 300.0)
    assert (best.knobs.tokenizer, best.knobs.dtype) == ("fast", "fp32")
    assert best.capacity == world.truth(Knobs(tokenizer="fast"), 300.0)
    from_dicts = world.best([{"tokenizer": "naive"}, {"tokenizer": "fast"}], 300.0)
    assert from_dicts.knobs == {"tokenizer": "fast"} and from_dicts.capacity == best.capacity


def test_mg1_windows_start_empty_and_stop_at_1000_arrivals_or_10_s():
    windows = mg1_windows("deterministic", 100.0, 90.0, 50, np.random.default_rng(12))
    sizes = [lat.size for lat, _ in windows]
    assert max(sizes) <= 1000 and min(sizes) > 700
    for lat, arr in windows:
        assert arr.min() >= 0.5 and arr.max() < 10.5 and np.all(np.diff(arr) > 0) and lat.min() >= 10.0 - 1e-9


def test_bad_input_names_the_value_and_the_fix():
    with pytest.raises(ValueError, match="target_ms=0"):
        QueueWorld().truth(Knobs(), 0)
    with pytest.raises(ValueError, match="load=1.2"):
        target_for(QueueWorld(), Knobs(), 1.2)
    with pytest.raises(ValueError, match="'weibull'"):
        QueueWorld(service="weibull")
    with pytest.raises(ValueError, match="batch_size=0"):
        BatchingWorld().saturation({"batch_size": 0})
    with pytest.raises(ValueError, match="dtype='fp16'"):
        BatchingWorld()({"dtype": "fp16"}, rate=10.0)
    with pytest.raises(ValueError, match="rate=0"):
        QueueWorld()(Knobs(), rate=0.0)
    with pytest.raises(ValueError, match="ceiling_rate"):
        ClientLag(ceiling_rate=-1.0)
    assert math.isfinite(BatchingWorld().saturation({"padding": "fixed"}))


@pytest.mark.parametrize("name", ["lognormal, sigma 1", "dynamic batcher"])
def test_a_hold_s_unmeasured_start_is_its_own_and_its_queue_carries_into_the_window(name):
    """A hold (stage 5) asks for its own settle: arrivals before it are not measured, their queue is."""
    world = HARD_WORLDS[name](seed=3, noise=0.0)
    knobs = Knobs(batch_size=4)
    rate = 1.2 * world.saturation(knobs)  # overloaded: the settle's backlog makes the window's answers later
    short, held = (world(knobs, rate=rate, seed=4, window_s=4.0, warmup_s=s) for s in (WARMUP_S, 8.0))
    assert held.arrivals_s.min() >= 8.0 and held.arrivals_s.max() < 12.0
    assert short.arrivals_s.min() >= WARMUP_S and short.arrivals_s.max() < WARMUP_S + 4.0
    assert held.p50_ms > short.p50_ms and held.window_s == 4.0
