"""The experiment engine (docs/deciding.md): its judges, the factorial screen, the runner's log and lag rule,
the target check, and whole decisions through the seam on simulated worlds of known answer (no timing)."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from tests.worlds import TARGET_MS, WORLDS, World, batched, best_rate, bf16, seam_kwargs, served
from tuning.base.decide import Paired
from tuning.experiments import judge
from tuning.experiments.capacity import CEILING, MAX_LONGER, Capacity, check_target, next_length, probe_of, under_bursts
from tuning.experiments.design import fit_effects, ranked_levels, two_level_design
from tuning.experiments.engine import EngineSettings, Runner, Window
from tuning.experiments.judge import (
    Sequential,
    arrivals_needed,
    batch_design_effect,
    client_lagged,
    design_effect,
    lag_explains,
    outlying,
    pocock_level,
    target_verdict,
    wilson,
)
from tuning.experiments.ladder import LadderError, LadderSettings, run_ladder
from tuning.experiments.trial import Trial

QUICK = LadderSettings.quick()


def _run(world, settings=QUICK, **kw):
    return run_ladder(device=kw.pop("device", "cpu"), measure=world, progress=False, settings=settings,
                      target_p99_ms=kw.pop("target_p99_ms", TARGET_MS), **{**seam_kwargs(), **kw})


# --- the judges -------------------------------------------------------------------------------------

def test_pocock_levels_are_the_published_constants():
    from scipy import stats

    assert stats.norm.isf(pocock_level(2, 0.025)) == pytest.approx(2.178, abs=0.003)
    assert stats.norm.isf(pocock_level(4, 0.025)) == pytest.approx(2.361, abs=0.003)
    assert pocock_level(1, 0.025) == 0.025


@pytest.mark.parametrize("sd", [0.07, 0.21])
def test_the_confirmation_says_better_for_no_effect_at_most_alpha_over_all_its_looks(sd):
    """Review finding 5: a fixed-n interval looked at after every pair inflated false keeps; the group-sequential
    test holds its 2.5% over all looks (2,000 tests, so the bound has room for the simulation's own spread)."""
    rng = np.random.default_rng(3)
    better = 0
    for _ in range(2000):
        test = Sequential(0.10, max_pairs=8)
        for _ in range(8):
            if test.add(rng.normal(0.0, sd)) != "continue":
                break
        better += test.verdict == "better"
    assert better / 2000 <= 0.035


def test_the_confirmation_finds_a_true_ten_percent_at_five_percent_noise():
    rng = np.random.default_rng(4)
    found = 0
    for _ in range(500):
        test = Sequential(0.10, max_pairs=8)
        for _ in range(8):
            if test.add(rng.normal(math.log(1.10), 0.07)) != "continue":
                break
        found += test.verdict == "better"
    assert found / 500 >= 0.80


def test_the_confirmation_looks_only_at_its_looks_and_decides_at_the_cap():
    test = Sequential(0.10, look_every=4, max_pairs=8)
    assert test.set([1.0, 1.0, 1.0]) == "continue"  # no look before 4 pairs, however clear
    assert test.set([0.5, 0.52, 0.48, 0.5]) == "better"
    assert test.set([0.0, 0.01, -0.01, 0.0, 0.0, 0.01, -0.01, 0.0]) == "not better"
    with pytest.raises(ValueError, match="effect"):
        Sequential(0.0)


def test_pairs_run_abba_then_baab():
    assert [Paired.order(i) for i in range(4)] == [("A", "B"), ("B", "A"), ("B", "A"), ("A", "B")]


def _mg1(service_s, rate, n, rng):
    """Poisson arrivals at ``rate`` to one FIFO server with these service times: arrivals and latencies (ms)."""
    a = np.cumsum(rng.exponential(1 / rate, n))
    done, free = np.empty(n), 0.0
    for i in range(n):
        free = max(a[i], free) + service_s[i]
        done[i] = free
    return a, (done - a) * 1000


def test_a_target_window_passes_fails_or_says_indeterminate():
    clear = np.full(1000, 2.0)
    v = target_verdict(clear, 100.0)
    assert v.verdict == "pass" and v.by == "batches"
    assert v.deff == pytest.approx(19 / stats.chi2.ppf(0.25, 19))  # no correlation seen, at its 75% upper limit
    over = clear.copy()
    over[::20] = 500.0  # 5% over
    assert target_verdict(over, 100.0).verdict == "fail"
    edge = clear.copy()
    edge[::80] = 500.0  # 1.25% over: no bound on 1,000 outcomes clears the 1% line either way
    assert target_verdict(edge, 100.0).verdict == "indeterminate"


def test_a_window_needs_299_effective_outcomes_to_pass():
    """With nothing over the target, 299 independent outcomes are the fewest that bound a share under 1%; on
    batches even a window with no sign of bursts counts at the design effect's 75% upper limit (1.30)."""
    assert target_verdict(np.full(298, 2.0), 100.0, method="blocks").verdict == "indeterminate"
    assert target_verdict(np.full(299, 2.0), 100.0, method="blocks").verdict == "pass"
    limit = 19 / stats.chi2.ppf(0.25, 19)
    assert target_verdict(np.full(int(299 * limit) - 2, 2.0), 100.0).verdict == "indeterminate"
    assert target_verdict(np.full(int(299 * limit) + 2, 2.0), 100.0).verdict == "pass"
    assert arrivals_needed(0.0, 1.0) == pytest.approx(299, rel=0.02)
    assert arrivals_needed(0.0, 40.0) == pytest.approx(40 * 299, rel=0.02)
    assert arrivals_needed(0.01, 1.0) == math.inf and arrivals_needed(0.02, 1.0) == math.inf


def test_arrival_times_put_the_outcomes_in_order():
    """Batches are consecutive in arrival order: a burst delivered out of order is still one burst."""
    lat = np.full(4000, 2.0)
    lat[1000:1040] = 500.0  # 1% over, in one burst
    a = np.arange(4000) * 0.01
    shuffle = np.random.default_rng(0).permutation(4000)
    ordered = target_verdict(lat, 100.0)
    assert target_verdict(lat[shuffle], 100.0, arrivals_s=a[shuffle]).deff == pytest.approx(ordered.deff)
    assert ordered.deff > 10 and target_verdict(lat[shuffle], 100.0).deff < 3  # out of order the burst is lost


def test_bursts_under_the_target_count_too():
    """A window with nothing over the target whose slow outcomes come in runs of 100: judged on the target
    alone it is 10,000 independent outcomes and passes; the design effect at the window's 95th percentile
    sees the runs (the bursts that, a little slower, would cross the target together), so it cannot pass."""
    lat = np.full(10_000, 2.0)
    for start in range(0, 10_000, 2000):
        lat[start:start + 100] = 80.0  # 5% of outcomes, in 5 runs of 100
    assert batch_design_effect(lat > 100.0) == 1.0
    assert design_effect(lat, 100.0) > 40
    assert target_verdict(lat, 100.0).verdict == "indeterminate"
    spread = np.full(10_000, 2.0)
    spread[::20] = 80.0  # the same share, spread out: no bursts
    assert target_verdict(spread, 100.0).verdict == "pass"


def test_the_blocks_method_sees_the_target_alone_in_five_blocks():
    clear = np.full(1000, 2.0)
    assert target_verdict(clear, 100.0, method="blocks").by == "blocks"
    burst = clear.copy()
    burst[:25] = 500.0  # 2.5% over, all in one block: the blocks disagree
    assert target_verdict(burst, 100.0, method="blocks").verdict == "indeterminate"
    spread = clear.copy()
    spread[::20] = 500.0  # 5% over, every block over 1%
    assert target_verdict(spread, 100.0, method="blocks").verdict == "fail"
    lat = np.full(10_000, 2.0)
    for start in range(0, 10_000, 2000):
        lat[start:start + 100] = 80.0  # bursts under the target: blocks do not look there
    assert target_verdict(lat, 100.0, method="blocks").verdict == "pass"
    with pytest.raises(ValueError, match="method='cycles'"):
        target_verdict(clear, 100.0, method="cycles")


def test_nan_latencies_count_as_failures_and_nan_arrivals_are_refused():
    a = np.arange(1000) * 1.0
    assert target_verdict(np.full(1000, math.nan), 100.0, arrivals_s=a).verdict == "fail"
    with pytest.raises(ValueError, match="NaN"):
        target_verdict(np.full(1000, 2.0), 100.0, arrivals_s=np.full(1000, math.nan))
    with pytest.raises(ValueError, match="999 values for 1000 latencies"):
        target_verdict(np.full(1000, 2.0), 100.0, arrivals_s=np.arange(999.0))


def test_failures_count_as_over_the_target_and_errors_beyond_the_budget_fail():
    lat = np.full(1000, 1.0)
    lat[::50] = math.inf
    assert target_verdict(lat, 100.0).verdict == "fail"
    lat = np.full(1000, 1.0)
    lat[0] = math.inf
    assert target_verdict(lat, 100.0, errors=1, error_budget=0.001).verdict == "pass"
    assert target_verdict(lat, 100.0, errors=5, error_budget=0.001).verdict != "pass"


def _mg1_windows(sigma, share, windows, arrivals, seed):
    """M/G/1 windows at load 0.8 (service 10 ms, deterministic or lognormal ``sigma``) from an empty server, each
    ``arrivals`` long after 40 warm-up arrivals, and the target at the steady state's ``share`` over it."""
    rng = np.random.default_rng(seed)
    mean_s, rate = 0.01, 80.0
    draw = (lambda n: np.full(n, mean_s)) if sigma == 0 else (lambda n: mean_s * np.exp(rng.normal(-0.5, 1.0, n)))
    _, long = _mg1(draw(200_000), rate, 200_000, rng)
    target = float(np.quantile(long[20_000:], 1 - share))
    return target, [_mg1(draw(arrivals + 40), rate, arrivals + 40, rng)[1][40:] for _ in range(windows)]


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_a_window_whose_exceedances_come_in_bursts_rarely_passes(sigma):
    """Issue 57: five blocks of a window gave the variance 4 degrees of freedom and passed 16-85% of M/G/1
    windows whose true share over the target was 1.5-3%. With the bursts counted such a window (3% over here)
    passes rarely, short or long (bench/verdict_bench.py has the full table)."""
    target, wins = _mg1_windows(sigma, 0.03, 60, 1000, int(10 * sigma) + 1)
    assert sum(target_verdict(lat, target).passed for lat in wins) <= 3  # 5% of 60
    target, wins = _mg1_windows(sigma, 0.03, 20, 20_000, int(10 * sigma) + 2)
    assert sum(target_verdict(lat, target).passed for lat in wins) <= 1


def test_a_long_window_well_under_the_target_passes():
    """The other side: at a true 0.2% over, most windows of 40,000 arrivals pass (power, not just caution)."""
    target, wins = _mg1_windows(0.0, 0.002, 10, 40_000, 5)
    assert sum(target_verdict(lat, target).passed for lat in wins) >= 6


def test_a_client_lags_when_its_sends_are_late_beyond_ten_ms_and_five_percent_of_the_target():
    assert not client_lagged(None, 300.0)
    assert not client_lagged(np.full(100, 12.0), 300.0)  # over 10 ms, under 15 ms (5% of 300)
    assert client_lagged(np.r_[np.zeros(90), np.full(10, 40.0)], 300.0)


def test_outliers_are_told_by_their_robust_spread():
    assert outlying([0.0, 0.01, -0.01, 0.02, -0.7]) == [4]
    assert outlying([0.0, 0.01]) == []
    assert outlying([0.0, 0.0, 0.0, 0.001], floor=0.03) == []


def test_a_pair_s_outlier_scale_comes_from_the_screen_never_from_the_pairs():
    """Issue 57: the pair re-measure took its scale from the pairs' own spread (at least the screen's), where the
    design says the screen's alone: a confirmation whose pairs spread more than the screen's windows did kept
    its outlier."""
    d = [0.0, 0.3, -0.3, 0.25, -0.25, 1.2]
    assert outlying(d, floor=0.05) == []  # the pairs' own spread hides it
    assert outlying(d, sd=0.2) == [5]  # the screen says a pair varies 0.2: 1.2 is beyond 3.5 of that


def test_wilson_interval_of_three_in_a_hundred():
    low, high = wilson(3, 100)
    assert low == pytest.approx(0.0103, abs=0.001) and high == pytest.approx(0.0846, abs=0.002)


# --- the factorial screen ---------------------------------------------------------------------------

def test_designs_are_full_up_to_four_factors_and_a_resolution_k_half_beyond():
    rng = np.random.default_rng(0)
    d4 = two_level_design(4, 16, rng, interactions=False)
    assert d4.shape == (16, 4) and len({tuple(r) for r in d4}) == 16
    d5 = two_level_design(5, 16, rng)
    assert d5.shape[0] == 32  # 16 runs cannot also estimate 10 interactions: the other half follows
    first = d5[:16]
    assert (np.prod(first, axis=1) == 1).all() and len({tuple(r) for r in d5}) == 32
    assert (d4.sum(axis=0) == 0).all()  # balanced


def test_the_fit_recovers_known_effects_and_drops_the_rest():
    rng = np.random.default_rng(1)
    design = two_level_design(4, 32, rng)
    y = 4.0 + 0.5 * np.log(1.4) * design[:, 0] + 0.5 * np.log(1.2) * design[:, 3] + rng.normal(0, 0.03, len(design))
    effects = fit_effects(["batch", "tokenizer", "buckets", "precision"], design, y, np.arange(len(y)))
    rows = {r["term"]: r for r in effects.rows()}
    assert rows["batch"]["ratio"] == pytest.approx(1.4, rel=0.05) and rows["batch"]["kept"]
    assert rows["precision"]["ratio"] == pytest.approx(1.2, rel=0.05) and rows["precision"]["kept"]
    assert effects.active() == ["batch", "precision"] or set(effects.active()) >= {"batch", "precision"}
    best, _ = ranked_levels(effects)[0]
    assert best[0] == 1 and best[3] == 1


def test_a_window_the_machine_took_away_is_found_by_the_robust_fit():
    rng = np.random.default_rng(2)
    design = two_level_design(4, 16, rng, interactions=False)
    y = 4.0 + 0.5 * np.log(1.2) * design[:, 3] + rng.normal(0, 0.05, 16)
    y[[2, 11]] += np.log(0.5)  # two deep dips on runs that share a factor's level
    effects = fit_effects(["a", "b", "c", "d"], design, y, np.arange(16), interactions=False)
    assert set(effects.outliers(design, y, np.arange(16), )) >= {2, 11}


def test_the_robust_fit_s_scale_comes_from_the_data():
    """Issue 57: a fixed robust scale of 0.05 in log-throughput re-measured honest runs in 41-59% of screens at
    10% noise. The scale is the residuals' own robust SD: at 10% noise, with no lost window, nothing is
    re-measured in most screens; a window at half pace still is."""
    flagged = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        design = two_level_design(4, 16, rng, interactions=False)
        y = 4.0 + rng.normal(0, 0.10, 16)
        effects = fit_effects(["a", "b", "c", "d"], design, y, np.arange(16), interactions=False)
        flagged += bool(effects.outliers(design, y, np.arange(16)))
    assert flagged <= 8  # at most 20% of honest screens (3.5 robust SDs; the fixed scale: 41-59%)
    y = 4.0 + np.random.default_rng(1).normal(0, 0.10, 16)
    y[5] += np.log(0.5)
    design = two_level_design(4, 16, np.random.default_rng(1), interactions=False)
    effects = fit_effects(["a", "b", "c", "d"], design, y, np.arange(16), interactions=False)
    assert 5 in effects.outliers(design, y, np.arange(16))


# --- the runner ---------------------------------------------------------------------------------------

def test_a_throughput_window_with_too_few_answers_is_measured_again_longer():
    """Issue 57: on a real Ray Serve app 2 s windows held 2 requests each, and a figure from 2 requests ranked a
    configuration. A window with under 30 ok answers is measured again over a window long enough for them."""
    asked = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        asked.append(window_s)
        n = int(2 * window_s / 2.0)  # 1 answer a second
        return Trial(qps=n / window_s, p99_ms=10.0, ok=n, submitted=n, window_s=window_s,
                     latencies_ms=np.full(n, 10.0))
    settings = EngineSettings.quick(window_s=2.0)
    runner = Runner(measure, dict, settings, 300.0)
    w = runner.run("screen", {}, None, 0)
    assert asked == [2.0, 2.0 * settings.max_window_factor] and len(runner.windows) == 1 and w.n == 16
    asked.clear()
    Runner(measure, dict, EngineSettings.quick(window_s=40.0), 300.0).run("screen", {}, None, 0)
    assert asked == [40.0]  # 40 answers: enough



def _trial(qps=100.0, lags=None, lat=None):
    lat = np.full(200, 10.0) if lat is None else lat
    return Trial(qps=qps, p99_ms=float(np.percentile(lat, 99)), ok=len(lat), submitted=len(lat), window_s=2.0,
                 latencies_ms=lat, lags_ms=lags)


def _late(share=0.05, lag_ms=400.0, n=200):
    """A window whose server answers in 10 ms, and whose client sent ``share`` of it ``lag_ms`` late."""
    lags = np.zeros(n)
    lags[: int(share * n)] = lag_ms
    return lags, 10.0 + lags


def test_a_window_whose_client_lagged_is_run_once_more_and_both_are_logged():
    """Review finding 4: late sends failed a probe that passed; now the window is flagged and run again once,
    and the lag is reported as the client's."""
    seen = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        seen.append(seed)
        lags, lat = _late() if len(seen) == 1 else (np.zeros(200), np.full(200, 10.0))
        return _trial(lags=lags, lat=lat)
    runner = Runner(measure, dict, EngineSettings.quick(), 300.0)
    w = runner.run("target", {"k": 1}, 50.0, seed=7)
    assert len(seen) == 2 and seen[1] != seen[0]
    assert [x.lagged for x in runner.windows] == [True, False] and w.rerun and w.lag_p99_ms == 0.0


def test_a_resumed_runner_replays_its_log_and_measures_only_what_is_new():
    calls = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        calls.append((config["k"], rate))
        return _trial(qps=50.0 + config["k"])
    first = Runner(measure, dict, EngineSettings.quick(), 300.0)
    first.run("screen", {"k": 1}, None, 0)
    first.run("screen", {"k": 2}, None, 1)
    log = json.loads(json.dumps([w.to_dict() for w in first.windows]))
    calls.clear()
    again = Runner(measure, dict, EngineSettings.quick(), 300.0, replay=log)
    assert again.run("screen", {"k": 1}, None, 0).qps == 51.0
    assert again.run("screen", {"k": 2}, None, 1).qps == 52.0
    again.run("screen", {"k": 3}, None, 2)
    assert calls == [(3, None)]
    with pytest.raises(Exception, match="start afresh"):
        Runner(measure, dict, EngineSettings.quick(), 300.0, replay=log).run("screen", {"k": 9}, None, 0)


def test_the_engine_asks_for_its_window_lengths():
    asked = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        asked.append((rate, window_s))
        return _trial()
    settings = EngineSettings.quick()
    runner = Runner(measure, dict, settings, 300.0)
    runner.run("screen", {}, None, 0)
    runner.run("target", {}, 200.0, 0)
    assert asked == [(None, settings.window_s), (200.0, min(settings.target_max_s, settings.target_outcomes / 200.0))]


# --- the target check ---------------------------------------------------------------------------------

def test_lindley_matches_the_loop():
    rng = np.random.default_rng(5)
    a = np.cumsum(rng.exponential(0.01, 500))
    done, prev = [], 0.3
    for x in a:
        prev = max(x, prev) + 0.009
        done.append(prev)
    assert np.allclose(served(a, 0.009, 0.3), done)


def test_a_warm_queue_past_its_capacity_fails_the_target_check():
    """Review finding 1: 3-5 s of a fresh server passed 1.04x its capacity 99% of the time. Kept warm across
    windows and measured long enough, a server at 1.04x its pace never passes, and one at 0.80x does."""
    world = World(noise=0.0, drift=0.0, dip_share=0.0, seed=1, carry_queue=True)
    from tuning.knobs import preset

    knobs = preset("baseline")
    settings = EngineSettings.full(target_longest_s=600.0)
    runner = Runner(world, lambda k: {}, settings, TARGET_MS)
    under = runner.run("target", knobs, 80.0, 9, arrivals=40_000).trial  # long enough for its bursts
    assert target_verdict(under.latencies_ms, TARGET_MS).verdict == "pass"
    over = [runner.run("target", knobs, 104.0, s).trial for s in range(3)]
    verdicts = [target_verdict(t.latencies_ms, TARGET_MS) for t in over]
    assert not any(v.passed for v in verdicts) and all(v.mean > 0.5 for v in verdicts)


def test_the_check_descends_until_a_rate_is_claimed_by_a_fresh_window():
    """From the server's sustained throughput (100 req/s here) the check descends until a rate passes, and
    claims it only when a fresh window at it passes too: never above the steady state's own capacity at this
    target (92.3 req/s, tests.worlds.steady_capacity), and not far under it. A target the server cannot keep
    near its throughput is found lower down."""
    from tests.worlds import steady_capacity
    from tuning.knobs import preset

    world = World(noise=0.0, drift=0.0, dip_share=0.0, seed=2)
    runner = Runner(world, lambda k: {}, EngineSettings.full(), TARGET_MS)
    cap = check_target(lambda rate, seed, arrivals: runner.run("target", preset("baseline"), rate, seed, arrivals),
                       100.0, TARGET_MS,
                       (0.90, 0.85, 0.80, 0.70, 0.60))
    truth = steady_capacity(100.0, TARGET_MS)
    assert 0.85 * truth <= cap.capacity <= truth
    claimed = [p for p in cap.probes if p.rate == cap.capacity]
    assert [p.role for p in claimed] == ["look", "again"] and all(p.passed for p in claimed)
    tight = Runner(world, lambda k: {}, EngineSettings.full(), 60.0)
    cap = check_target(lambda rate, seed, arrivals: tight.run("target", preset("baseline"), rate, seed, arrivals), 100.0, 60.0,
                       EngineSettings.full().fractions)
    assert cap.met and cap.capacity <= steady_capacity(100.0, 60.0) and cap.high > cap.capacity
    assert not cap.probes[0].passed and cap.probes[-1].passed and cap.probes[-1].role == "again"
    logged = Window.from_dict(json.loads(json.dumps(runner.windows[0].to_dict())))
    assert (logged.verdict, logged.over, logged.deff) == (runner.windows[0].verdict, runner.windows[0].over,
                                                         runner.windows[0].deff)


def _paced_window(pace, fell_behind=()):
    """A server that answers at most ``pace`` requests/s, in 2 ms below 90% of it and 500 ms above; the calls
    numbered in ``fell_behind`` answer at half their rate (a server just started)."""
    calls = []

    def window(rate, seed, arrivals=None):
        calls.append(rate)
        w = _open_window(rate, 2.0 if rate <= 0.9 * pace else 500.0)
        w.qps, w.window_s = min(rate, pace) / (2 if len(calls) in fell_behind else 1), w.n / rate
        return w
    return window, calls


def test_the_check_starts_from_the_open_loop_ceiling_a_closed_loop_undercounts():
    """Issue 57: capacity was capped near the closed-loop throughput, where a batcher's closed loop at 16 in flight
    splits its batches (a real one shipped 498 req/s where 650 was there). The check first climbs the open loop
    while each window keeps up; two windows in a row that fall behind end it, and the fractions are of the pace
    the server answered at there (at least the rate kept up with)."""
    window, calls = _paced_window(250.0)
    cap = check_target(window, 100.0, 100.0, (0.9, 0.8), climb=())
    assert cap.ceiling == pytest.approx(250.0) and cap.capacity == pytest.approx(225.0) and cap.at_least
    assert calls[:6] == pytest.approx([125, 150, 200, 250, 300, 300])  # 300 fell behind twice
    assert [p.role for p in cap.probes[:6]] == ["ceiling"] * 6 and cap.best.role in ("look", "again")
    assert cap.summary()["ceiling"] == pytest.approx(250.0) and cap.decided
    assert [p["role"] for p in cap.summary()["probes"]] == ["look", "again"]  # the report's target windows
    assert len(cap.summary()["ceiling_probes"]) == 6 and type(cap).from_summary(cap.summary()).ceiling == 250.0
    window, calls = _paced_window(90.0)  # nothing kept up with above the closed loop's: its throughput stands
    cap = check_target(window, 100.0, 100.0, (0.9, 0.8), climb=())
    assert cap.ceiling == pytest.approx(100.0) and calls[:2] == pytest.approx([125, 125])


def test_the_ceiling_is_never_under_the_throughput_when_a_server_collapses_past_it():
    """Review: a server that answers almost nothing once overloaded (timeouts) gave a ceiling of its collapsed
    pace, 5 req/s, under the rates it had kept up with; the closed loop's throughput is the floor."""
    def window(rate, seed, arrivals=None):
        w = _open_window(rate, 2.0)
        w.qps, w.window_s = (rate if rate <= 200 else 5.0), w.n / rate
        return w
    cap = check_target(window, 100.0, 100.0, (0.9,), climb=())
    assert cap.ceiling == pytest.approx(100.0) and cap.capacity == pytest.approx(90.0)


def test_a_ceiling_window_whose_client_lagged_ends_the_climb_as_the_client_s():
    def window(rate, seed, arrivals=None):
        w = _open_window(rate, 2.0)
        w.window_s, w.lagged = w.n / rate, rate > 160
        return w
    cap = check_target(window, 100.0, 100.0, (0.9,), climb=())
    ceiling = [p for p in cap.probes if p.role == "ceiling"]
    assert [p.by for p in ceiling][-1] == "client lag" and len(ceiling) == 3  # 125, 150, then 200 once
    assert cap.ceiling == pytest.approx(150.0) and "client lagged" in cap.note


def test_a_check_stopped_while_finding_the_ceiling_claims_nothing_and_says_so():
    window, _ = _paced_window(250.0)
    cap = check_target(window, 100.0, 100.0, (0.9,), climb=(), stop=lambda probe: True)
    assert not cap.met and cap.ceiling is None and "ceiling" in cap.note
    assert not cap.decided and cap.summary()["decided"] is False  # review: no judged window, so "all decided"
    assert "not met" not in cap.sentence() and "stopped" in cap.sentence()


def test_a_tight_target_is_looked_for_below_the_ceiling_s_fractions_down_to_the_throughput_s():
    """Review: with a ceiling 2.5 x the throughput, the lowest rate tried was 0.75 x the throughput; a target
    met only lower was said unmet."""
    window, calls = _paced_window(250.0)
    tight = lambda rate, seed, arrivals=None: (lambda w: setattr(w, "trial", _open_window(  # noqa: E731
        rate, 2.0 if rate <= 40 else 500.0).trial) or w)(window(rate, seed, arrivals))
    cap = check_target(tight, 100.0, 100.0, (0.9, 0.6, 0.3), climb=())
    looked = [p.rate for p in cap.judged if p.role == "look"]
    assert looked == pytest.approx([225, 150, 75, 60, 30]) and cap.capacity == pytest.approx(30.0)


def test_a_window_in_texts_per_second_keeps_up_against_its_offered_texts():
    """Review: with 4 texts a request, ok answers were texts/s and arrivals requests/s, so a server that answered
    30% of them kept up."""
    from tuning.experiments.capacity import keeps_up

    w = SimpleNamespace(qps=60.0, n=500, window_s=10.0, offered_rate=200.0)  # 4 texts a request, 50 requests/s
    assert not keeps_up(w) and keeps_up(SimpleNamespace(qps=190.0, n=500, window_s=10.0, offered_rate=200.0))
    assert keeps_up(SimpleNamespace(qps=48.0, n=500, window_s=10.0, offered_rate=math.nan))  # no offered rate: n


def test_a_window_that_fell_behind_once_is_measured_again_before_the_ceiling_ends():
    window, calls = _paced_window(250.0, fell_behind={1})  # the first window: a server just started
    cap = check_target(window, 100.0, 100.0, (0.9,), climb=())
    assert calls[:3] == pytest.approx([125, 125, 150]) and cap.ceiling == pytest.approx(250.0)
    window, calls = _paced_window(250.0, fell_behind={5})  # past it: the second (warm) window's pace stands
    cap = check_target(window, 100.0, 100.0, (0.9,), climb=())
    assert calls[4:6] == pytest.approx([300, 300]) and cap.ceiling == pytest.approx(250.0)
    everything, _ = _paced_window(10_000.0)  # kept up with at every multiple: the top one
    assert check_target(everything, 100.0, 100.0, (0.9,), climb=()).ceiling == pytest.approx(max(CEILING) * 100)


def test_a_batcher_s_capacity_is_claimed_near_its_truth_from_a_closed_loop_that_splits_its_batches():
    """Issue 57: the dynamic batcher of tests/worlds_hard.py (SIMULATED), its closed loop at 16 in flight about
    40% of its open-loop pace: the claim from that throughput was 0.40-0.46 of the truth; from the open loop's
    ceiling, on the batches verdict, it is near it (its 5% run-to-run pace noise keeps a look and a fresh window
    near the truth from both passing), and never more than the verdict's error above."""
    from tests.worlds_hard import BatchingWorld, target_for
    from tuning.knobs import preset

    knobs = preset("baseline").replace(batch_size=16, tokenizer="fast", padding="bucket")
    ratios = []
    for seed in range(12):
        world = BatchingWorld(seed=seed)
        target = target_for(world, knobs, 0.8)
        settings = EngineSettings.quick(verdict="batches")
        runner = Runner(world, lambda k: {}, settings, target)
        cap = check_target(lambda rate, sd, arrivals: runner.run("target", knobs, rate, sd, arrivals), world(knobs).qps,
                           target, settings.fractions, longest=settings.longest_arrivals,
                           ceiling_arrivals=settings.ceiling_window_arrivals)
        ratios.append(cap.capacity / world.truth(knobs, target))
    assert 0.75 <= float(np.median(ratios)) and max(ratios) <= 1.05, ratios


def test_a_first_fraction_claimed_climbs_and_says_at_least_at_the_top():
    """Issue 57: capacity was capped at 0.90 x the closed-loop throughput, where a batcher's closed loop at 16
    in flight undercounts what open arrivals get. The check climbs past it while each rate is claimed."""
    cap = check_target(lambda rate, seed, arrivals=None: _open_window(rate, 2.0), 100.0, 100.0, (0.9, 0.8), ceiling=(),
                       climb=(1.0, 1.5))
    assert cap.capacity == pytest.approx(150.0) and cap.at_least and "at least" in cap.sentence()
    assert [p.rate for p in cap.probes] == pytest.approx([90, 90, 100, 100, 150, 150])

    slows = lambda rate, seed, arrivals=None: _open_window(rate, 2.0 if rate <= 120 else 500.0)  # noqa: E731 (over it above 120)
    cap = check_target(slows, 100.0, 100.0, (0.9, 0.8), ceiling=(), climb=(1.0, 1.5))
    assert cap.capacity == pytest.approx(100.0) and not cap.at_least and cap.high == pytest.approx(150.0)


def test_a_look_that_passes_and_a_fresh_window_that_fails_claims_nothing_there():
    looks = []

    def window(rate, seed, arrivals=None):
        looks.append(rate)
        late = rate > 85 and len([r for r in looks if r == rate]) == 2  # its fresh window fails
        return _open_window(rate, 500.0 if late else 2.0)
    cap = check_target(window, 100.0, 100.0, (0.9, 0.8), ceiling=())
    assert cap.capacity == pytest.approx(80.0) and looks == pytest.approx([90, 90, 80, 80])
    assert cap.high == pytest.approx(90.0)  # the rate above the claim, that was not claimed
    seen = []
    stopped = check_target(lambda rate, seed, arrivals=None: seen.append(arrivals) or _open_window(rate, 2.0), 100.0,
                           100.0, (0.9, 0.8), ceiling=(), climb=(), stop=lambda probe: probe.role == "again")
    assert seen == [None, None] and not stopped.met  # a plain look's fresh window: the first look's length
    assert not stopped.decided and "stopped" in stopped.note  # a stop is not "no rate met the target"
    assert not Capacity.from_summary(stopped.summary()).decided


def _bursty_window(rate, arrivals=None):
    """A window whose slow outcomes (80 ms, under a 100 ms target) come in runs of 10, 5% of them: a short one
    cannot tell (its bursts are few), a long one passes."""
    n = arrivals or 400
    lat = np.full(n, 2.0)
    for start in range(0, n, 200):
        lat[start:start + 10] = 80.0
    trial = Trial(qps=rate, p99_ms=80.0, ok=n, submitted=n, window_s=n / rate, rate=rate, offered_rate=rate,
                  latencies_ms=lat)
    return SimpleNamespace(trial=trial, lagged=False, lag_p99_ms=math.nan, qps=rate, p50_ms=2.0, p99_ms=80.0)


def test_a_look_too_short_to_tell_is_followed_by_a_longer_one_sized_by_what_it_needs():
    asked = []

    def window(rate, seed, arrivals=None):
        asked.append(arrivals)
        return _bursty_window(rate, arrivals)
    cap = check_target(window, 100.0, 100.0, (0.9,), ceiling=(), climb=(), longest=lambda rate: 50_000)
    assert [p.role for p in cap.probes] == ["look", "longer", "again"] and cap.capacity == pytest.approx(90.0)
    look = cap.probes[0]
    assert look.verdict == "indeterminate" and asked[0] is None
    assert asked[1] == int(max(4 * look.n, 1.5 * look.needed)) and asked[2] == cap.probes[1].n
    asked.clear()
    cap = check_target(window, 100.0, 100.0, (0.9,), ceiling=(), climb=(), longest=lambda rate: 500)
    assert not cap.met and asked == [None]  # it would need more than the longest: no longer window


def test_a_rate_gets_a_bounded_number_of_longer_windows_even_when_each_holds_fewer_arrivals_than_asked():
    """Review: the longest window was judged by the arrivals it held, a Poisson count often under what was asked,
    so a window that stayed undecided (errors over the budget, not beyond chance) asked for the longest again
    and again."""
    asked = []

    def window(rate, seed, arrivals=None):
        asked.append(arrivals)
        n = (arrivals or 400) - 1
        lat = np.full(n, 2.0)
        lat[::770] = math.inf  # 0.13% failed: over the 0.1% budget, not beyond chance
        failed = int(np.isinf(lat).sum())
        trial = Trial(qps=rate, p99_ms=2.0, ok=n - failed, submitted=n, window_s=n / rate, rate=rate,
                      offered_rate=rate, latencies_ms=lat)
        return SimpleNamespace(trial=trial, lagged=False, lag_p99_ms=math.nan, qps=rate, p50_ms=2.0, p99_ms=2.0)
    cap = check_target(window, 100.0, 100.0, (0.9,), ceiling=(), climb=(), longest=lambda rate: 3_000,
                       stop=lambda probe: len(asked) > 10)  # without the bound: a crisp failure, not a hang
    assert not cap.met and len(asked) <= 1 + MAX_LONGER and asked[-1] == 3_000 and asked.count(3_000) == 1
    asked.clear()  # a longest far away: the cap on longer windows ends it
    check_target(window, 100.0, 100.0, (0.9,), ceiling=(), climb=(), longest=lambda rate: 10_000_000,
                 stop=lambda probe: len(asked) > 10)
    assert len(asked) == 1 + MAX_LONGER and asked[0] is None and asked[1:] == sorted(asked[1:])


def test_the_next_length_grows_fourfold_at_least_and_stops_at_the_longest():
    v = target_verdict(np.full(400, 2.0), 100.0)  # decided: no longer window
    assert next_length(v.verdict, v.needed, 400, 10_000) is None
    short = target_verdict(np.full(200, 2.0), 100.0)
    assert short.verdict == "indeterminate" and next_length(short.verdict, short.needed, 200, 10_000) == 800
    assert next_length("indeterminate", 5_000.0, 200, 10_000) == 7_500  # 1.5 x its need, over 4 x its length
    assert next_length("indeterminate", 10_000.0, 200, 10_000) == 10_000  # its need at the longest: capped
    assert next_length("indeterminate", 10_001.0, 200, 10_000) is None  # more than the longest could pass
    assert next_length(short.verdict, short.needed, 200, 500) == 500
    assert next_length(short.verdict, short.needed, 500, 500) is None
    assert next_length("indeterminate", None, 200, 10_000) is None  # a need unknown (an older log)
    over = target_verdict(np.r_[np.full(190, 2.0), np.full(10, 500.0)], 100.0)  # 5% over: no length passes
    assert next_length(over.verdict, over.needed, 200, 10_000) is None


def _open_window(rate, latency_ms, n=400):
    """An open-loop window with one arrival a second (every request its own cycle) at ``latency_ms``."""
    trial = Trial(qps=rate, p99_ms=latency_ms, ok=n, submitted=n, window_s=float(n), rate=rate, offered_rate=rate,
                  latencies_ms=np.full(n, latency_ms), arrivals_s=np.arange(n) * 1.0)
    return SimpleNamespace(trial=trial, lagged=False, lag_p99_ms=math.nan, qps=rate, p50_ms=latency_ms,
                           p99_ms=latency_ms, n=n, window_s=float(n))


# --- whole decisions through the seam -------------------------------------------------------------------

def test_no_knob_matters_ships_no_change():
    shipped = [_run(World(noise=0.10, seed=s, **WORLDS["no knob matters"])).changes() for s in range(6)]
    assert shipped == [{}] * 6


def test_two_knobs_that_matter_are_shipped():
    good = 0
    for seed in range(5):
        world = World(noise=0.05, seed=seed, **WORLDS["two knobs matter, with an interaction"])
        result = _run(world)
        good += world.service_rate(result.recommended) >= 0.9 * best_rate(world)
        assert result.target_met and result.capacity.capacity > result.baseline_capacity.capacity
    assert good >= 4


def test_a_knob_that_breaks_the_target_is_never_shipped():
    for seed in range(4):
        world = World(noise=0.05, seed=seed, **WORLDS["a knob gains throughput but breaks the target"])
        result = _run(world)
        assert result.recommended.tokenizer == "naive" and result.target_met


def test_a_top_candidate_that_fails_the_target_gives_way_to_the_runner_up():
    """Issue 57: the engine checked the target of the top candidate alone and then shipped the baseline; a knob
    that raises throughput but breaks the target rode along in the top bundle. Ranked by the objective, the
    runner-up without it is checked and ships."""
    rules = {"rules": [(batched, 1.5), (bf16, 1.15)], "floor_ms": lambda k: 600.0 if k.dtype == "bf16" else 0.0}
    for seed in range(3):
        result = _run(World(noise=0.05, seed=seed, **rules))
        assert result.recommended.dtype == "fp32" and result.recommended.batch_size > 1, result.changes()
        assert result.target_met and len(result.decision.checks) >= 2


def test_an_unreachable_target_is_said():
    result = _run(World(noise=0.05, seed=0, **WORLDS["unreachable target"]))
    assert not result.target_met and result.capacity is not None and not result.capacity.met


def test_what_each_stage_decided_is_in_the_table_and_the_summary():
    result = _run(World(noise=0.05, seed=1, **WORLDS["two knobs matter, with an interaction"]))
    frame = result.to_frame()
    assert {"batch", "precision", "confirm", "target"} <= set(frame.step)
    assert set(frame[frame.step == "workers"].status) <= {"skipped", "shipped", "not shipped"}
    s = json.loads(json.dumps(result.summary(), default=str))
    checked = [c["configuration"] for c in s["target_checks"]]
    assert s["confirmations"][0]["verdict"] == "better" and checked[0] == "baseline" and len(set(checked)) == len(checked)
    assert len(checked) == 1 + sum(c["verdict"] == "better" for c in s["confirmations"])  # every confirmed one
    assert s["screen"]["effects"] and len(s["state"]["log"]) == len(result.windows)
    assert s["recommended"]["set_line"].startswith("--preset baseline --set batch_size=")


def test_a_baseline_with_no_ok_answer_says_so():
    def dead(knobs, *, rate=None, record=False, seed=None, window_s=None):
        return Trial(qps=0.0, p99_ms=math.nan, ok=0, errors=20, submitted=20, first_error="error: HTTP 500: boom")
    with pytest.raises(LadderError, match="HTTP 500: boom"):
        _run(dead, factors=("tokenizer",))


def test_ctrl_c_keeps_what_was_measured_and_resume_replays_it():
    world = World(noise=0.05, seed=3, **WORLDS["one knob worth +10%"])
    armed = {"at": 10}

    def measure(knobs, **kw):
        if armed["at"] is not None and world.calls >= armed["at"]:
            raise KeyboardInterrupt
        return world(knobs, **kw)
    partial = _run(measure)
    assert partial.interrupted and len(partial.windows) == 10
    saved = json.loads(json.dumps(partial.summary(), default=str))
    armed["at"] = None
    before = world.calls
    done = _run(measure, resume=saved)
    assert not done.interrupted and done.decision.stage == "done"
    assert [w.to_dict() for w in done.windows[:10]] == saved["state"]["log"]
    assert world.calls - before == len(done.windows) - 10  # the logged windows were not measured again


def test_the_one_argument_seam_works_for_qps_with_a_warning():
    def old(knobs):
        return Trial(qps=10.0 * (1.5 if knobs.tokenizer == "fast" else 1.0), p99_ms=100.0, ok=10, submitted=10)
    with pytest.warns(DeprecationWarning, match="one argument"):
        result = _run(old, factors=("tokenizer",), objective="qps")
    assert result.recommended.tokenizer == "fast"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="objective='qps'"):
        _run(old, factors=("tokenizer",))


def test_the_ship_line_carries_only_what_the_server_reads():
    import dataclasses

    world = World(noise=0.02, seed=0, rules=[(lambda k: k.tokenizer == "fast", 1.5)])
    result = _run(world, device="sim")
    line = result.set_line()
    assert "tokenizer=fast" in line and "device=sim" not in line and "sim_profile" not in line
    offline_only = dataclasses.replace(result, recommended=result.recommended.replace(prefetch_factor=4))
    assert "prefetch_factor" not in offline_only.set_line()


def test_factors_that_do_not_apply_say_why():
    result = _run(World(noise=0.02, seed=0), accuracy=lambda dtypes: {"bf16": 0.98},
                  settings=LadderSettings.quick(workers_min_cores=99))
    frame = result.to_frame().set_index("step")
    assert frame.loc["precision", "status"] == "skipped" and "0.98" in frame.loc["precision", "reason"]
    assert frame.loc["workers", "status"] == "skipped" and "usable cores" in frame.loc["workers", "reason"]
    assert frame.loc["graph", "status"] == "skipped"
    with pytest.raises(ValueError, match="unknown factor"):
        _run(World(), factors=("warp",))


# --- review findings, each reproduced --------------------------------------------------------------------

def test_a_window_at_exactly_one_percent_over_passes_at_most_five_percent_of_the_time():
    """Review: blocks with no exceedance had no spread, so the bound was zero and such a window passed; at
    exactly 1% over, 7.6-11% of windows passed. The bound on the effective sample size holds 5%."""
    rng = np.random.default_rng(11)
    for n in (400, 1000, 2000):
        passed = sum(target_verdict(np.where(rng.random(n) < 0.01, 500.0, 10.0), 100.0).verdict == "pass"
                     for _ in range(1000))
        assert passed / 1000 <= 0.06, n
    assert target_verdict(np.full(290, 10.0), 100.0).verdict == "indeterminate"  # too few outcomes to pass


def test_a_resume_whose_log_ends_on_a_lagged_window_measures_its_re_run():
    calls = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        calls.append(seed)
        return _trial(lags=np.zeros(200))
    lagged = Window("target", "target", {}, 50.0, 7, 50.0, 10.0, 10.0, 200, 0, 2.0, "pass", lagged=True)
    runner = Runner(measure, dict, EngineSettings.quick(), 300.0, replay=[lagged.to_dict()])
    w = runner.run("target", {}, 50.0, 7)
    assert calls == [7 + 1_000_033] and w.rerun and not w.lagged


def test_a_window_whose_client_lagged_twice_is_indeterminate_not_the_server_s_failure():
    lags, lat = _late(n=500)

    def measure(config, *, rate=None, seed=None, window_s=None):
        return _trial(lags=lags, lat=lat)
    runner = Runner(measure, dict, EngineSettings.quick(), 300.0)
    cap = check_target(lambda rate, seed, arrivals: runner.run("target", {}, rate, seed, arrivals), 100.0, 300.0, (0.9,),
                       ceiling=())
    assert cap.probes[0].verdict == "indeterminate" and cap.probes[0].by == "client lag" and not cap.met


def test_a_lag_that_cannot_explain_the_latency_excuses_nothing():
    """Issue 57: on a real Ray Serve app a window with p99 8.8 s and a client lag of 44 ms was logged as "client
    lagged", its re-run passed, and that rate was shipped. Taking each send's lag off leaves it over the target:
    the server's failure, not re-run."""
    lags = np.full(500, 44.0)
    lat = np.full(500, 100.0)
    lat[::10] = 8800.0  # 10% of the window 8.8 s, each sent 44 ms late
    calls = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        calls.append(seed)
        return _trial(lags=lags, lat=lat)
    runner = Runner(measure, dict, EngineSettings.quick(), 300.0)
    cap = check_target(lambda rate, seed, arrivals: runner.run("target", {}, rate, seed, arrivals), 100.0, 300.0, (0.9,),
                       ceiling=())
    assert len(calls) == 1 and not runner.windows[0].lagged
    assert cap.probes[0].verdict == "fail" and cap.probes[0].by != "client lag"
    assert client_lagged(lags, 300.0)  # the old rule's flag, which alone excused it


def test_a_lag_explains_only_what_moves_the_share_across_one_percent():
    lags, lat = _late(share=0.05)
    assert lag_explains(lat, lags, 300.0)  # 5% over, none without the lag
    assert not lag_explains(np.full(200, 10.0), lags, 300.0)  # under the target either way
    over = lat.copy()
    over[-20:] = 900.0  # 10% more over the target with no lag at all
    assert not lag_explains(over, lags, 300.0)


def test_a_resume_with_other_settings_is_refused_and_one_with_the_same_reuses_what_was_measured():
    world = World(noise=0.02, seed=4, **WORLDS["one knob worth +10%"])
    armed = {"at": 6}
    sweeps = []

    def measure(knobs, **kw):
        if armed["at"] is not None and world.calls >= armed["at"]:
            raise KeyboardInterrupt
        return world(knobs, **kw)
    kw = seam_kwargs()
    sweep = kw.pop("sweep")
    partial = _run(measure, sweep=lambda k: sweeps.append(k) or sweep(k), **kw)
    saved = json.loads(json.dumps(partial.summary(), default=str))
    armed["at"] = None
    with pytest.raises(ValueError, match="target_p99_ms"):
        _run(measure, resume=saved, target_p99_ms=500.0)
    older = json.loads(json.dumps(saved))
    del older["state"]["settings"]["engine"]["target_longest_s"]  # logged before that setting existed
    done = _run(measure, resume=older, sweep=lambda k: sweeps.append(k) or sweep(k), **kw)
    assert len(sweeps) == 1 and done.decision.stage == "done"  # the knee of the first part, not swept again


def test_a_log_written_before_a_setting_existed_resumes_and_one_that_differs_does_not():
    """Review: a setting added since a run was logged (target_longest_s) made every older log 'other settings'."""
    from tuning.experiments.engine import same_as_recorded

    now = {"engine": {"verdict": "blocks", "target_longest_s": 40.0}, "limit": 3}
    assert same_as_recorded({"engine": {"verdict": "blocks"}, "limit": 3}, now)
    assert not same_as_recorded({"engine": {"verdict": "cycles"}, "limit": 3}, now)
    assert not same_as_recorded({"engine": {"verdict": "blocks", "gone_setting": 1}, "limit": 3}, now)
    assert not same_as_recorded({"limit": 4}, now)


def test_a_replay_that_does_not_match_is_not_taken_for_a_failed_candidate():
    """Review: the confirmation's handler caught every exception, so a resume under other settings marked the
    candidate failed and shipped the baseline; a mismatch now ends the run and says why."""
    from tuning.experiments.engine import ReplayMismatch

    world = World(noise=0.02, seed=5, rules=[(lambda k: k.tokenizer == "fast", 1.5)])
    full = _run(world)
    log = full.summary()["state"]["log"]
    confirm_at = next(i for i, w in enumerate(log) if w["stage"] == "confirm")
    log[confirm_at]["config"] = {"tokenizer": "naive-but-other"}
    with pytest.raises(ReplayMismatch, match="start afresh"):
        _run(World(noise=0.02, seed=5, rules=[(lambda k: k.tokenizer == "fast", 1.5)]),
             resume={"state": {**full.summary()["state"], "log": log}})



def test_a_log_of_an_older_procedure_is_refused_at_its_first_window():
    """Review: a log written before the open loop's ceiling replayed its screen and confirmations, then failed
    at the first target window it held (or, where it held none, went on as if it were this version's). Its
    windows record no procedure: the first replayed one is refused."""
    from tuning.experiments.engine import PROCEDURE, ReplayMismatch

    world = World(noise=0.02, seed=5, rules=[(lambda k: k.tokenizer == "fast", 1.5)])
    full = _run(world)
    log = full.summary()["state"]["log"]
    assert all(w["procedure"] == PROCEDURE for w in log)
    old = [{k: v for k, v in w.items() if k != "procedure"} for w in log[:3]]  # interrupted in its screen
    with pytest.raises(ReplayMismatch, match=r"procedure 1 .* \(a new --out\)"):
        _run(World(noise=0.02, seed=5, rules=[(lambda k: k.tokenizer == "fast", 1.5)]),
             resume={"state": {**full.summary()["state"], "log": old}})


# --- the rules a mutant changed without a test failing (issue 57) ----------------------------------------

def test_a_term_between_the_80_and_95_percent_lines_stays_in_the_screen_s_model():
    """The screen keeps a term whose two-sided 80% interval excludes zero (a screening level; the confirmation
    bounds false ships): an effect between the 80% and the 95% lines stays, where a 95% level would drop it."""
    from scipy import stats

    rng = np.random.default_rng(0)
    design = two_level_design(4, 32, rng)
    y = 4.0 + rng.normal(0, 0.05, len(design))
    alone = fit_effects(["a", "b", "c", "d"], design, y, np.arange(len(y)))
    t80, t95 = stats.t.ppf(0.90, alone.dof), stats.t.ppf(0.975, alone.dof)
    shift = (0.5 * (t80 + t95) * alone.se[0] - alone.estimate[0]) * design[:, 0]  # the estimate lands midway
    effects = fit_effects(["a", "b", "c", "d"], design, y + shift, np.arange(len(y)))
    assert t80 < effects.estimate[0] / effects.se[0] < t95 and effects.kept[0]


def test_the_confirmation_s_false_better_rate_is_the_documented_two_and_a_half_percent():
    """alpha is split over the candidates; the page states it, and a run of no-effect pairs says "better" at
    most that often over all its looks."""
    settings = EngineSettings.full()
    page = " ".join((__import__("pathlib").Path(__file__).parents[1] / "docs" / "deciding.md").read_text().split())
    assert settings.alpha == 0.025 and "alpha = 2.5%" in page
    assert settings.candidates == EngineSettings.quick().candidates == 2 and "`candidates`: 2 in both modes" in page
    from tuning.experiments import capacity, judge

    assert judge.BATCHES == 20 and "20 consecutive batches" in page
    assert judge.DEFF_QUANTILES == (0.98, 0.95) and "98th and 95th percentiles" in page
    assert judge.DEFF_LEVEL == 0.75 and "75% upper confidence limit" in page
    assert capacity.MAX_LONGER == 3 and "3 longer windows at most" in page
    assert capacity.LONGER == 4 and capacity.NEEDED_MARGIN == 1.5 and "4 times as many arrivals" in page
    assert "1.5 times" in page and settings.target_longest_s == 120 and EngineSettings.quick().target_longest_s == 40
    assert "120 / 40 s" in page and settings.verdict == "blocks" and "default verdict is blocks" in page
    rng = np.random.default_rng(9)
    better = 0
    for _ in range(4000):
        test = Sequential(settings.min_effect, settings.alpha / settings.candidates, settings.look_every,
                          settings.max_pairs)
        for x in rng.normal(0, 0.05, settings.max_pairs):
            if test.add(x) != "continue":
                break
        better += test.verdict == "better"
    assert better / 4000 <= settings.alpha / settings.candidates + 0.006


def test_a_pair_beyond_the_screen_s_spread_is_measured_once_more():
    qps = iter([100.0, 100.0, 100.0, 101.0, 101.0, 100.0, 100.0, 30.0, 100.0, 100.0, 100.0, 102.0])

    def measure(config, *, rate=None, seed=None, window_s=None):
        return _trial(qps=next(qps))
    from tuning.experiments.engine import paired_log_ratios

    runner = Runner(measure, dict, EngineSettings.quick(), 300.0)
    d, _, _ = paired_log_ratios(runner, "confirm", {"k": 0}, {"k": 1}, 4, 0, pair_sd=0.02)
    assert len(runner.windows) == 10 and max(abs(x) for x in d) < 0.05  # the dipped pair (x0.3) again
    runner = Runner(measure, dict, EngineSettings.quick(), 300.0)
    qps = iter([100.0, 100.0, 100.0, 101.0, 101.0, 100.0, 100.0, 30.0])
    d, _, _ = paired_log_ratios(runner, "confirm", {"k": 0}, {"k": 1}, 4, 0)
    assert len(runner.windows) == 8 and min(d) < -1  # without the screen's spread nothing is measured again


def test_a_screen_run_the_model_cannot_explain_is_measured_again():
    from tuning.experiments.screen import screen
    from tuning.knobs import preset

    calls = []

    def measure(config, *, rate=None, seed=None, window_s=None):
        calls.append(config)
        dip = 0.4 if len(calls) == 3 else 1.0
        return _trial(qps=100.0 * (1.3 if config.tokenizer == "fast" else 1.0) * dip * (1 + 0.01 * (len(calls) % 3)))
    runner = Runner(measure, lambda k: {"tokenizer": k.tokenizer, "padding": k.padding}, EngineSettings.quick(), 300.0)
    highs = {"tokenizer": {"tokenizer": "fast"}, "buckets": {"padding": "bucket"}}
    explored = screen(preset("baseline"), highs, EngineSettings.quick(), str)(runner)
    assert explored.tables["measured_again"] == [2] and len(calls) == len(explored.tables["design"]) + 1


def test_a_candidate_whose_capacity_is_under_the_baseline_s_is_not_shipped():
    """Faster in the closed loop, but every answer carries 265 ms more: at a 300 ms target it holds less, and
    still meets the target at a lower rate."""
    world = World(noise=0.05, seed=3, dip_share=0.0, rules=[(batched, 1.3)],
                  floor_ms=lambda k: 265.0 if k.batch_size > 1 else 0.0)
    result = _run(world)
    caps = {name: cap for name, cap in result.decision.checks}
    assert result.decision.confirmations and result.decision.confirmations[0].confirmed
    assert all(cap.met for cap in caps.values()) and len(caps) >= 2, {n: c.capacity for n, c in caps.items()}
    assert result.recommended.batch_size == 1, {n: c.capacity for n, c in caps.items()}


def test_the_check_starts_at_ninety_percent_of_the_throughput():
    """None above 0.90 to start: near saturation a window does not reach its steady state (the climb goes
    higher only after 0.90 was claimed)."""
    seen = []

    def window(rate, seed, arrivals=None):
        seen.append(rate)
        return _open_window(rate, 500.0)
    check_target(window, 100.0, 100.0, EngineSettings.full().fractions, ceiling=())
    assert seen[0] == pytest.approx(90.0) and seen == sorted(seen, reverse=True)


def test_the_target_check_starts_from_each_arm_s_freshest_windows():
    """Issue 57: a candidate's starting throughput was the median of all its confirmation windows, most of them
    run on a server just started. It is the median of each arm's last 4."""
    from tuning.experiments.engine import Candidate, confirm

    paces = {0: iter([50.0] * 4 + [100.0] * 12), 1: iter([60.0] * 4 + [200.0] * 12)}

    def measure(config, *, rate=None, seed=None, window_s=None):
        return _trial(qps=next(paces[config["k"]]))
    runner = Runner(measure, dict, EngineSettings.full(), 300.0)
    conf = confirm(runner, Candidate({"k": 1}, "k=1", 0.5), {"k": 0}, EngineSettings.full(max_pairs=8, look_every=8))
    assert len(conf.test.d) == 8 and (conf.qps_baseline, conf.qps_winner) == (100.0, 200.0)


def test_without_a_climb_the_check_looks_no_higher_than_its_first_fraction_and_says_at_least():
    cap = check_target(lambda rate, seed, arrivals=None: _open_window(rate, 2.0), 100.0, 100.0, (0.9, 0.8), ceiling=(), climb=())
    assert cap.capacity == pytest.approx(90.0) and cap.at_least and cap.sentence().startswith("at least 90.0")
    assert max(p.rate for p in cap.probes) == pytest.approx(90.0)


# --- a held rate (loadtest --target-p99-ms) ---------------------------------------------------------

def _hold(lat, rate=100.0, lags=None):
    lat = np.asarray(lat, dtype=float)
    return Trial(qps=rate, p99_ms=float(np.percentile(lat, 99)), ok=int(np.isfinite(lat).sum()), submitted=lat.size,
                 window_s=lat.size / rate, rate=rate, offered_rate=rate, latencies_ms=lat,
                 lags_ms=None if lags is None else np.asarray(lags, dtype=float),
                 arrivals_s=np.arange(lat.size) / rate)


def test_a_hold_is_judged_with_its_bursts_counted_and_says_how_long_it_would_need():
    from tuning.experiments.capacity import hold_check

    lat = np.full(1000, 2.0)
    for start in range(0, 1000, 200):
        lat[start:start + 10] = 80.0  # bursts under a 100 ms target
    h = hold_check(_hold(lat), 100.0)
    assert h["verdict"] == "indeterminate" and h["deff"] > 3 and h["independent"] < 600
    assert h["needed_s"] == pytest.approx(arrivals_needed(0.0, h["deff"]) / 100.0, rel=0.01)
    assert h["p99_high_ms"] is None  # under 368 independent outcomes the p99 has no upper bound
    clear = hold_check(_hold(np.full(5000, 2.0)), 100.0)
    assert clear["verdict"] == "pass" and clear["needed_s"] is None and clear["p99_high_ms"] == 2.0
    spread = np.full(5000, 2.0)
    spread[::25] = 500.0
    over = hold_check(_hold(spread), 100.0)
    assert over["verdict"] == "fail" and over["share"] == pytest.approx(0.04)


def test_a_hold_whose_client_lagged_says_so_as_the_client_s():
    from tuning.experiments.capacity import hold_check

    lat, lags = np.full(5000, 20.0), np.zeros(5000)
    lat[::50], lags[::50] = 140.0, 60.0  # 2% over 100 ms, each of them sent 60 ms late by the client
    h = hold_check(_hold(lat, lags=lags), 100.0)
    assert h["verdict"] == "indeterminate" and h["undecided_by"] == "client lag" and h["lag_explains"]
    assert h["lag_p99_ms"] == pytest.approx(60.0) and h["needed_s"] is None  # the client's, as the engine says
    server = hold_check(_hold(lat, lags=np.zeros(5000)), 100.0)
    assert server["verdict"] == "fail" and not server["lag_explains"]


def test_a_hold_undecided_by_its_errors_does_not_ask_for_a_shorter_hold():
    """Review: 20 failures in 18,000 (0.11%, over the 0.1% budget, not beyond chance) printed "a hold of about
    4 s would" tell; the need is about the share, and errors are said as errors."""
    from tuning.experiments.capacity import hold_check
    from tuning.present.tables import hold_lines

    lat = np.full(18_000, 2.0)
    lat[::900] = math.inf
    trial = _hold(lat)
    trial.ok, trial.submitted = 18_000 - 20, 18_000
    h = hold_check(trial, 100.0)
    assert h["verdict"] == "indeterminate" and h["undecided_by"] == "errors" and h["needed_s"] is None
    text = "\n".join(hold_lines(h))
    assert "not yet beyond chance" in text and "would (give --duration)" not in text


def test_the_p99_interval_widens_with_the_design_effect():
    from tuning.base.decide import quantile_interval

    x = np.random.default_rng(0).exponential(1.0, 10_000)
    lo1, hi1 = quantile_interval(x)
    lo20, hi20 = quantile_interval(x, deff=20.0)
    assert lo20 <= lo1 < hi1 <= hi20 and (hi20 - lo20) > 3 * (hi1 - lo1)
    with pytest.raises(ValueError, match="deff=0.5"):
        quantile_interval(x, deff=0.5)


# --- the verdict's arithmetic, pinned (mutmut found these lines untested) ---------------------------

def test_share_bounds_are_clopper_pearson_one_sided():
    """Integer counts give the exact binomial (Clopper-Pearson) bounds: one-sided 95% each side, the two ends of
    a two-sided 90% interval; no outcomes: no information."""
    from tuning.experiments.judge import share_bounds

    for over, n in ((0, 100), (5, 100), (37, 200), (100, 100)):
        ci = stats.binomtest(over, n).proportion_ci(confidence_level=0.90, method="exact")
        assert share_bounds(over, n) == pytest.approx((ci.low, ci.high), abs=1e-9), (over, n)
    assert share_bounds(0, 0) == (0.0, 1.0) and share_bounds(3, 0) == (0.0, 1.0)


def test_the_batch_design_effect_of_one_burst_has_its_closed_form():
    """Every exceedance in one of k batches of m: the batches' variance over a binomial's is m k / (k - 1)."""
    burst = np.r_[np.ones(50), np.zeros(950)]
    assert batch_design_effect(burst) == pytest.approx(50 * 20 / 19)
    block = np.r_[np.ones(200), np.zeros(800)]
    assert batch_design_effect(block, batches=5) == pytest.approx(200 * 5 / 4)
    assert batch_design_effect(np.tile([1.0, 0.0], 500)) == 1.0  # every batch alike: no clustering seen
    # five outcomes: two batches of 3 and 2 (shares 1 and 0), p = 0.6
    assert batch_design_effect(np.array([1.0, 1.0, 1.0, 0.0, 0.0])) == pytest.approx(0.5 / (0.24 / 2.5))
    assert batch_design_effect(np.array([1.0, 0.0, 1.0])) == 3.0  # under two batches: one unit, its length
    lat = np.where(block > 0, 500.0, 2.0)
    assert target_verdict(lat, 100.0, method="blocks").deff == pytest.approx(200 * 5 / 4)  # 5 blocks


def test_arrivals_needed_follows_the_level():
    assert arrivals_needed(0.0, 1.0, level=0.99) == pytest.approx(math.log(0.01) / math.log(0.99), rel=0.02)
    assert arrivals_needed(0.005, 1.0) == pytest.approx(1150, rel=0.02)  # the share's own bound reaches 1%


def test_an_empty_window_fails_and_a_window_names_its_fastest_answer():
    """A window with no outcome cannot meet a target (mutmut: its verdict could be anything); the fastest answer
    is the fastest finite latency, infinity when every outcome failed."""
    empty = target_verdict([], 100.0, errors=2)
    assert (empty.verdict, empty.n, empty.over, empty.errors) == ("fail", 0, 0, 2) and empty.fastest_ms == math.inf
    mixed = target_verdict([math.inf, 7.0, 3.5, math.nan, 9.0] * 100, 100.0)
    assert mixed.fastest_ms == 3.5 and mixed.over == 200 and mixed.verdict == "fail"
    assert target_verdict([math.inf] * 400, 100.0).fastest_ms == math.inf
    ordered = target_verdict(np.r_[np.full(500, 2.0), np.full(500, 60.0)], 100.0, arrivals_s=np.arange(1000.0))
    flipped = target_verdict(np.r_[np.full(500, 2.0), np.full(500, 60.0)], 100.0, arrivals_s=-np.arange(1000.0))
    assert ordered.deff == pytest.approx(flipped.deff)  # the same runs read in either direction


# --- a knob that widens the tail ---------------------------------------------------------------------

def test_the_screen_names_a_factor_that_widens_the_tail_and_no_other():
    """Issue 57: bf16 a call cheaper with a slow path raises throughput and fattens the tail. The screen's own
    windows' ln(p99 / p50) name it (at the screen's 80% level a factor without one is named in 10% of screens,
    which only reorders what is checked); one that narrows it is not named; windows without a tail are left out."""
    from tuning.experiments.screen import tail_wideners

    rng = np.random.default_rng(3)
    design = two_level_design(3, 16, rng, interactions=False)
    tails = 0.3 + 0.4 * (design[:, 2] > 0) + rng.normal(0, 0.05, len(design))
    wide, rows = tail_wideners(["a", "b", "c"], design, list(tails), np.arange(len(design)))
    assert wide == {"c"} and [r["widens"] for r in rows] == [False, False, True]
    narrower = 0.3 - 0.4 * (design[:, 2] > 0) + rng.normal(0, 0.05, len(design))
    assert "c" not in tail_wideners(["a", "b", "c"], design, list(narrower), np.arange(len(design)))[0]
    unknown = list(tails[:-1]) + [math.nan]  # a window without answers is left out, not the whole fit
    assert tail_wideners(["a", "b", "c"], design, unknown, np.arange(len(design)))[0] == {"c"}
    assert tail_wideners(["a", "b", "c"], design, [math.nan] * len(design), np.arange(len(design))) == (set(), [])


def test_a_bundle_is_checked_next_without_its_tail_widening_factor():
    """Of a checked bundle's bundles less one change, the one without its tail-widening factor comes first,
    even where the model ranks it lower: that knob can add throughput and cost capacity at the target."""
    from tuning.experiments.engine import Candidate, _without_one_first

    runner = Runner(lambda *a, **k: None, dict, EngineSettings.quick(), 100.0)
    full = Candidate({"batch": 16, "dtype": "bf16", "tok": "fast"}, "all", 1.0, widens=("dtype",))
    no_tok = Candidate({"batch": 16, "dtype": "bf16"}, "no tok", 0.9, widens=("dtype",))
    no_bf16 = Candidate({"batch": 16, "tok": "fast"}, "no bf16", 0.8)
    other = Candidate({"tok": "fast"}, "tok", 0.2)
    assert [c.label for c in _without_one_first(runner, {}, full, [no_tok, other, no_bf16])] == \
        ["no bf16", "no tok", "tok"]
    plain = Candidate(full.config, "all", 1.0)  # no widener: rank order
    assert [c.label for c in _without_one_first(runner, {}, plain, [no_tok, other, no_bf16])] == \
        ["no tok", "no bf16", "tok"]


# --- a claim under bursts (capacity.under_bursts) -----------------------------------------------------------

def _window_probe(lat, rate=100.0):
    n = len(lat)
    trial = Trial(qps=rate, p99_ms=float(np.quantile(lat, 0.99)), ok=n, submitted=n, window_s=n / rate, rate=rate,
                  offered_rate=rate, latencies_ms=np.asarray(lat, dtype=float), arrivals_s=np.arange(n) / rate)
    return probe_of(rate, trial, None, 100.0, 0.001)


def _queue_burst(n=2000):
    """A window whose slow outcomes come in one run (a queue's busy period): 30 at 80 ms (under a 100 ms target),
    2 of them over."""
    lat = np.full(n, 5.0)
    lat[1000:1030] = 80.0
    lat[1010:1012] = 500.0
    return lat


def test_a_claim_on_blocks_that_bursts_cannot_certify_says_so_and_how_long_a_hold_needs():
    lat = _queue_burst()
    assert judge.target_verdict(lat, 100.0, method="blocks").verdict == "pass"  # what the default verdict claims on
    probes = [_window_probe(lat), _window_probe(lat)]
    b = under_bursts(probes, 100.0, 100.0)
    assert b["verdict"] != "pass" and b["n"] == 4000 and b["deff"] > 10
    assert b["hold_s"] is not None and b["hold_s"] > 2 * 2000 / 100.0  # longer than the windows it claimed on
    cap = Capacity(100.0, 0.001, 100.0, 100.0, None, probes, bursts=b)
    assert cap.certified is False and Capacity.from_summary(cap.summary()).certified is False


def test_a_claim_whose_outcomes_do_not_move_together_is_certified_under_bursts():
    lat = np.full(2000, 5.0)
    lat[[300, 1700]] = 500.0
    b = under_bursts([_window_probe(lat), _window_probe(lat)], 100.0, 100.0)
    assert b["verdict"] == "pass" and b["hold_s"] is not None
    assert under_bursts([_window_probe(lat, rate=90.0)], 100.0, 100.0) is None  # no window at the claimed rate


def test_check_target_judges_its_claim_under_bursts():
    cap = check_target(lambda rate, seed, arrivals=None: _open_window(rate, 2.0, n=600), 100.0, 100.0, (0.9,),
                       ceiling=(), climb=())
    assert cap.met and cap.bursts is not None and cap.bursts["n"] == 1200 and cap.certified is True


def test_an_uncertified_claim_prints_why_and_asks_for_a_hold_long_enough_to_tell():
    from tuning.present.tables import HOLD_S, bursts_line, hold_seconds

    probes = [_window_probe(_queue_burst(), rate=10.0), _window_probe(_queue_burst(), rate=10.0)]
    cap = Capacity(100.0, 0.001, 10.0, 10.0, None, probes, bursts=under_bursts(probes, 10.0, 100.0))
    assert hold_seconds(cap) == math.ceil(cap.bursts["hold_s"]) > HOLD_S
    line = bursts_line(cap)
    assert "not certified with bursts counted" in line and f"about {hold_seconds(cap)} s" in line
    certified = Capacity(100.0, 0.001, 10.0, 10.0, None, probes, bursts={"verdict": "pass", "hold_s": 900.0})
    assert bursts_line(certified) is None and hold_seconds(certified) == HOLD_S
    resumed = Capacity(100.0, 0.001, 10.0, 10.0, None, probes)  # figures only: not known, nothing said
    assert bursts_line(resumed) is None and hold_seconds(resumed) == HOLD_S
