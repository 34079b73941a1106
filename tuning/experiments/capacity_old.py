"""Capacity at a p99 target, and the paired comparison of two configurations at one rate.

**Capacity** (:func:`capacity_at_target`): for one configuration, the highest Poisson arrival rate whose
open-loop p99 (from the scheduled arrival, over every outcome: a failure counts as over the target) is
within ``target_p99_ms`` and whose error rate is within ``error_budget``. One probe at one rate
(:func:`probe`) passes or fails on a count (:func:`tuning.base.decide.count_verdict`): of the ``n``
outcomes of its windows, ``c`` exceeded the target or failed. It fails fast at the knee (ok answers below
:data:`KNEE_COMPLETION` of the offered rate), when errors are significantly above the budget, or when the
load client fell behind its schedule (more than 1% of sends late by more than 10 ms or 5% of the
target); otherwise an undecided probe gets another window, up to ``max_windows``, and is then decided
on the pooled p99 estimate, labelled so, unless its windows disagree (:func:`windows_agree`): then it says
so and does not pass. A count decides only after ``min_windows`` windows: latencies in one window are
correlated by queue bursts, and one burst can put a dozen consecutive requests over the target. The
search brackets (from the saturation rate, :func:`saturation_rate`: ``hi`` = that rate, assumed failing, ``lo`` =
``hi / 2`` checked to pass, halved while it fails; or from a rate known to pass: doubled until one fails),
then bisects geometrically until ``hi / lo <= 1 + tolerance``.

**Comparison** (:func:`compare_at`): a reference A and a candidate B in interleaved pairs (AB, BA, BA,
AB, ...) at the same offered rate (open loop, both arms of a pair with the same arrivals) or the same
concurrency (closed loop), judged by :class:`tuning.base.decide.Paired` on the latency at that rate
(:func:`latency_figure`, the reference's over the candidate's: above 1 is better) or on QPS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy import stats

from tuning.base.decide import (
    EXCEED_SHARE,
    PROBE_ALPHA,
    Paired,
    count_verdict,
    pairs_to_tell,
    pass_limits,
    quantile_interval,
    spread_of,
)
from tuning.base.format import rounded
from tuning.base.stats import known_median
from tuning.experiments.trial import Measure, Trial, as_measure, late_sends, p99_of
from tuning.knobs import Knobs

KNEE_COMPLETION = 0.97  # a probe whose ok answers fall below this share of the offered rate is past the knee
LATE_SHARE = 0.01  # a probe with more late sends than this share measured the client, not the server...
LATE_MIN = 2  # ...and more than this many (in a window of 50, one late send is 2%: a hiccup, not a client that lags)
DEFAULT_ERROR_BUDGET = 0.001


@dataclass(frozen=True)
class CapacitySettings:
    """How hard a capacity search looks: windows per probe, bracket tolerance, probes at most."""

    max_windows: int = 4
    min_windows: int = 2  # a count decides only after this many windows (a queue burst fills one window)
    tolerance: float = 0.03
    max_probes: int = 12
    error_budget: float = DEFAULT_ERROR_BUDGET
    halvings: int = 4  # below the saturation rate: give up after hi / 2**halvings fails
    doublings: int = 4  # above a rate known to pass

    def __post_init__(self) -> None:
        if not 0 <= self.error_budget < 1:
            raise ValueError(f"error_budget={self.error_budget!r} must be a share in [0, 1): 0.001 is 0.1%")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance={self.tolerance!r} must be > 0 (0.03: stop at hi/lo <= 1.03)")

    @classmethod
    def quick(cls, error_budget: float = DEFAULT_ERROR_BUDGET) -> "CapacitySettings":
        return cls(max_windows=2, min_windows=1, tolerance=0.12, max_probes=7, error_budget=error_budget, halvings=3,
                   doublings=3)


@dataclass
class Probe:
    """One rate's verdict and the figures behind it (pooled over its windows)."""

    rate: float
    verdict: str  # pass | fail | undecided (then ``passed`` follows the p99 estimate)
    by: str  # count | knee | errors | late sends | estimate
    passed: bool
    windows: int
    n: int
    exceed: int  # outcomes over the target or failed
    errors: int  # outcomes other than ok
    offered_rate: float
    achieved_rate: float  # ok answers per second
    late: int
    p50_ms: float
    p99_ms: float
    p99_low_ms: float | None
    p99_high_ms: float | None
    trials: list[Trial] = field(default_factory=list, repr=False)
    windows_agree: bool = True  # the windows' exceedance shares are one share (chi-square, p >= 0.01)

    def row(self) -> dict[str, Any]:
        return {"rate": rounded(self.rate), "verdict": self.verdict, "by": self.by, "passed": self.passed,
                "windows": self.windows, "n": self.n, "exceed": self.exceed, "errors": self.errors,
                "offered_rate": rounded(self.offered_rate), "achieved_rate": rounded(self.achieved_rate),
                "late": self.late, "p50_ms": rounded(self.p50_ms), "p99_ms": rounded(self.p99_ms),
                "p99_low_ms": rounded(self.p99_low_ms), "p99_high_ms": rounded(self.p99_high_ms),
                "windows_agree": self.windows_agree}

    def sentence(self) -> str:
        hi = f"{self.p99_high_ms:.0f}" if self.p99_high_ms is not None and math.isfinite(self.p99_high_ms) else "?"
        lo = f"{self.p99_low_ms:.0f}" if self.p99_low_ms is not None and math.isfinite(self.p99_low_ms) else "?"
        return (f"{self.rate:.1f} req/s: {self.verdict} by {self.by} ({self.exceed} of {self.n} over the target or "
                f"failed; p99 {_ms(self.p99_ms)} [{lo}-{hi}] ms)")


@dataclass
class Capacity:
    """The highest passing rate (None: none passed), its bracket and every probe."""

    target_p99_ms: float
    error_budget: float
    capacity: float | None
    low: float | None  # highest passing rate
    high: float | None  # lowest failing rate (None: none failed)
    probes: list[Probe]
    note: str = ""

    @property
    def met(self) -> bool:
        return self.capacity is not None

    @property
    def trials(self) -> int:
        return sum(p.windows for p in self.probes)

    @property
    def decided(self) -> bool:
        """Every probe decided by a count or a fail-fast rule (none on the p99 estimate alone, none whose
        windows disagreed)."""
        return all(p.by not in ("estimate", "windows disagree") for p in self.probes)

    def at(self, rate: float | None) -> Probe | None:
        return next((p for p in self.probes if rate is not None and math.isclose(p.rate, rate, rel_tol=1e-9)), None)

    @property
    def best(self) -> Probe | None:
        """The passing probe at the capacity, else the probe with the lowest p99 (the closest to the target)."""
        if self.capacity is not None:
            return self.at(self.capacity)
        return min(self.probes, key=lambda p: (p.p99_ms if math.isfinite(p.p99_ms) else math.inf), default=None)

    @property
    def lowest_rate(self) -> float | None:
        return min((p.rate for p in self.probes), default=None)

    def summary(self) -> dict[str, Any]:
        best = self.best
        return {"capacity": rounded(self.capacity), "met": self.met, "bracket": [rounded(self.low), rounded(self.high)],
                "target_p99_ms": self.target_p99_ms, "error_budget": self.error_budget,
                "p99_ms": rounded(best.p99_ms) if best else None,
                "p99_interval_ms": [rounded(best.p99_low_ms), rounded(best.p99_high_ms)] if best else None,
                "p50_ms": rounded(best.p50_ms) if best else None, "decided": self.decided, "trials": self.trials,
                "note": self.note, "probes": [p.row() for p in self.probes]}

    @classmethod
    def from_summary(cls, s: dict[str, Any]) -> "Capacity":
        """Back from :meth:`summary` (a resumed run): the probes keep their figures, not their runs."""
        keys = ("rate", "verdict", "by", "passed", "windows", "n", "exceed", "errors", "offered_rate", "achieved_rate",
                "late", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms")  # windows_agree: the default
        nan = lambda v: math.nan if v is None else v  # noqa: E731
        probes = [Probe(**{k: (nan(p.get(k)) if k in ("offered_rate", "achieved_rate", "p50_ms", "p99_ms") else p.get(k))
                           for k in keys}) for p in s.get("probes") or []]
        low, high = (s.get("bracket") or [None, None])
        return cls(float(s["target_p99_ms"]), float(s["error_budget"]), s.get("capacity"), low, high, probes,
                   s.get("note") or "")

    def sentence(self) -> str:
        if self.capacity is None:
            best = self.best
            closest = f"; closest: {best.sentence()}" if best else ""
            return f"no rate met the {self.target_p99_ms:.0f} ms p99 target{closest}"
        hi = f"{self.high:.1f}" if self.high is not None else "not found"
        best = self.best
        return (f"{self.capacity:.1f} req/s at p99 <= {self.target_p99_ms:.0f} ms (next failing rate {hi}; "
                f"p99 there {_ms(best.p99_ms) if best else '?'} ms; {len(self.probes)} probes, {self.trials} load tests)")


def _ms(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.0f}"


def _pooled(trials: list[Trial]) -> np.ndarray | None:
    if any(t.latencies_ms is None for t in trials):
        return None
    return np.concatenate([np.asarray(t.latencies_ms, dtype=float) for t in trials]) if trials else np.zeros(0)


def pooled_figures(trials: list[Trial], target_p99_ms: float) -> dict[str, Any]:
    """n, exceedances, errors, p50, p99 and its interval over trials' pooled outcomes (a summary-only trial
    contributes its counts and the median of its percentiles)."""
    lat = _pooled(trials)
    errors = sum(t.failed for t in trials)
    window = sum(t.window_s for t in trials if math.isfinite(t.window_s))
    # completions: ok answers received in each window (``qps``), not the measured requests that got one later
    done = sum(t.qps * t.window_s for t in trials if math.isfinite(t.window_s) and math.isfinite(t.qps))
    out = {"n": sum(t.submitted for t in trials), "errors": errors,
           "late": sum(late_sends(t, target_p99_ms) for t in trials),
           "achieved_rate": done / window if window > 0 else known_median([t.qps for t in trials]),
           "offered_rate": sum(t.submitted for t in trials) / window if window > 0 else math.nan}
    if lat is not None and lat.size:
        lo, hi = quantile_interval(lat, 0.99)
        finite = lat[np.isfinite(lat)]
        out.update(n=int(lat.size), exceed=int((lat > target_p99_ms).sum()),
                   p50_ms=float(np.percentile(lat, 50, method="inverted_cdf")), p99_ms=p99_of(lat),
                   p99_low_ms=lo, p99_high_ms=hi, counted=True,
                   mean_ms=float(finite.mean()) if finite.size else math.nan)
    else:
        p99 = known_median([t.p99_ms for t in trials])
        out.update(exceed=None, p50_ms=known_median([t.p50_ms for t in trials]), p99_ms=p99, p99_low_ms=None,
                   p99_high_ms=None, counted=False, mean_ms=known_median([t.p50_ms for t in trials]))
    return out


def knee_reached(f: dict[str, Any]) -> bool:
    """Completions fell short of arrivals by more than chance: ok answers below :data:`KNEE_COMPLETION` of the
    offered rate *and* a deficit over 3 sigma of what a queue that keeps up leaves at its windows' edges. The
    warm-up runs at least ``warmup_s`` and its answers inside a window count, so a window's two edges largely
    cancel; what is left varies about like the arrivals, sqrt(n), near the knee. (3 sigma of the requests in
    flight at the edges, sqrt(2 x rate x mean latency), was too narrow: on this CPU it read a full investigate's
    baseline probe at 47.7 req/s as the knee, 19 of 259 short in 5 s with none over the target, so its capacity
    came out 46.7 where races passed 54-58; and a quick one's at 218.6 req/s, 66 of 650 short, p99 771 ms. In a
    review's M/D/1 simulation of the generator's windows it read 9-27% of windows at 90-95% load as past the
    knee, this one none, while this one tells 113% load in 70% of single windows and 150% in all.)"""
    offered, achieved = f["offered_rate"], f["achieved_rate"]
    if not (offered > 0 and math.isfinite(achieved)) or achieved >= KNEE_COMPLETION * offered:
        return False
    deficit = (offered - achieved) * f["n"] / offered
    return deficit > 3 * math.sqrt(max(f["n"], 1))


OVERLOAD_FACTOR = 1.5  # the open-loop window past saturation offers this many times the highest completion rate seen
OVERLOAD_SALT = 2_000_003  # its arrivals apart from every probe's
OVERLOAD_WINDOWS = 3  # at most this many, each further past the last when the server still kept up


def saturation_rate(measure: Measure, knobs: Knobs, closed_qps: float,
                    on_trial: Callable[[Trial], None] | None = None) -> tuple[float, list[Trial]]:
    """The server's completion rate when it cannot keep up: the top of a capacity search's bracket.

    A closed loop's completion rate (``closed_qps``) reads low: on this 2-core CPU 32 clients completed 10-15% below
    the rate open-loop probes later passed (a quick investigate's baseline: closed loop 47.7 req/s, a probe at 57.2
    passed with 0 of 561 over 800 ms), so a search under it ended below the capacity and was searched again past it
    (about 70 s of an 8-minute budget). This offers :data:`OVERLOAD_FACTOR` x that rate open-loop for one window:
    the ok answers per second inside the window, once the warm-up's backlog is queued, are the server's own pace.
    A window that kept up (not past the knee, :func:`knee_reached`) was not past saturation: the next offers
    :data:`OVERLOAD_FACTOR` x more, up to :data:`OVERLOAD_WINDOWS`. Returns the highest completion rate seen
    (the closed loop's included) and the windows measured."""
    measure, _ = as_measure(measure)
    best = closed_qps if math.isfinite(closed_qps) and closed_qps > 0 else 0.0
    trials: list[Trial] = []
    rate = OVERLOAD_FACTOR * best
    while best > 0 and len(trials) < OVERLOAD_WINDOWS:
        trial = measure(knobs, rate=rate, seed=_seed(rate, 0) + OVERLOAD_SALT)
        trials.append(trial)
        if on_trial:
            on_trial(trial)
        if math.isfinite(trial.qps):
            best = max(best, trial.qps)
        if knee_reached(pooled_figures([trial], math.inf)):
            break
        rate *= OVERLOAD_FACTOR
    return best, trials


def _seed(rate: float, window: int) -> int:
    """A different arrival seed per probe rate and window (windows are independent draws, not replays)."""
    return (int(round(rate * 1000)) * 7919 + window * 104729) % (2**31 - 1)


def probe(measure: Measure, knobs: Knobs, rate: float, target_p99_ms: float,
          settings: CapacitySettings = CapacitySettings(), on_trial: Callable[[Trial], None] | None = None) -> Probe:
    """Decide whether ``knobs`` meets the target at ``rate`` req/s (see the module docstring). A pass also
    needs the errors within the budget (at most ``error_budget`` of the outcomes)."""
    measure, _ = as_measure(measure)
    trials: list[Trial] = []
    while True:
        trial = measure(knobs, rate=rate, seed=_seed(rate, len(trials)))
        trials.append(trial)
        if on_trial:
            on_trial(trial)
        f = pooled_figures(trials, target_p99_ms)
        n, errors = f["n"], f["errors"]
        verdict, by = window_verdict(f, len(trials), settings)
        if verdict != "undecided" and (by != "count" or len(trials) >= settings.min_windows):
            return _probe(rate, verdict, by, verdict == "pass", trials, f)
        if len(trials) >= settings.max_windows:
            if not windows_agree(trials, target_p99_ms):  # a busy machine: the windows measured different things
                return _probe(rate, "undecided", "windows disagree", False, trials, f, agree=False)
            passed = math.isfinite(f["p99_ms"]) and f["p99_ms"] <= target_p99_ms and errors <= settings.error_budget * n
            return _probe(rate, "undecided", "estimate", passed, trials, f)


def fresh_probe(measure: Measure, knobs: Knobs, rate: float, target_p99_ms: float,
                settings: CapacitySettings = CapacitySettings(), *, salt: int) -> Probe:
    """:func:`probe` of ``knobs`` at ``rate`` on arrivals its capacity search never drew: every window's seed
    moved by ``salt``. A probe's own seeds depend only on the rate and the window, so probing a rate the search
    already passed would replay the windows it passed (the confirm run and a race's pass checked again use it,
    each with its own salt). A measure that takes no ``seed`` draws its own arrivals, fresh or not."""
    measure, _ = as_measure(measure)

    def moved(k: Knobs, *, rate: float | None = None, seed: int | None = None) -> Trial:
        return measure(k, rate=rate, seed=None if seed is None else seed + salt)
    return probe(moved, knobs, rate, target_p99_ms, settings)


def window_verdict(f: dict[str, Any], windows: int, settings: CapacitySettings) -> tuple[str, str]:
    """The probe's rule on pooled figures ``f`` of ``windows`` windows: ``(pass | fail | undecided, by)``, by the
    count, errors over the budget, late sends, or the knee (the caller waits for ``min_windows`` before a
    count decides)."""
    n, errors = f["n"], f["errors"]
    over_budget = errors > 0 and n > 0 and stats.binom.sf(errors - 1, n, settings.error_budget) <= PROBE_ALPHA
    knee = knee_reached(f)
    late = n > 0 and f["late"] > max(LATE_SHARE * n, LATE_MIN)
    verdict = count_verdict(min(f["exceed"], n), n, EXCEED_SHARE) if f["counted"] and n else "undecided"
    by = "count"
    if n == 0 or over_budget:
        verdict, by = "fail", "errors"
    elif knee and (verdict != "pass" or windows >= settings.min_windows):
        # a queue that does not keep up fails whatever its count: 3-6 s a little past the knee can still meet the
        # target (0 of 780 over 800 ms at 113% load), and a capacity set there fails its confirm; over a count
        # pass only once the count could decide (min_windows), not on one window's knee
        verdict, by = "fail", "knee"
    elif verdict == "pass" and late:
        verdict, by = "fail", "late sends"
    elif verdict == "pass" and errors > settings.error_budget * n:
        verdict = "undecided"  # fast enough, but more failures than the budget allows: look again
    elif verdict == "undecided" and late:
        verdict, by = "fail", "late sends"
    return verdict, by


@dataclass
class Race:
    """Interleaved pairs of a reference and a candidate at one rate past the reference's capacity, each arm
    decided by the probe's rule (:func:`window_verdict`) on its pooled runs. ``verdict``: ``candidate`` (it
    passes where the reference, in the same pairs, fails), ``candidate faster`` (both fail, and the paired ratio
    of their latencies there, the reference's over the candidate's as :func:`compare_at` figures them, clears
    the minimum effect at the gate's level; also judged so in an extension past the race's cap, where the
    count no longer keeps), ``reference passed`` (no evidence), ``candidate fails``, ``not distinguishable``
    (in an extension the candidate's count passed, the gate could not tell it faster), or ``undecided`` at the
    cap. ``ratio``, ``low``, ``high``: that latency ratio and its interval (NaN unless the gate judged the
    last look)."""

    rate: float
    verdict: str
    reference_by: tuple[str, str]
    candidate_by: tuple[str, str]
    reference: list[Trial]
    candidate: list[Trial]
    order: str
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan

    @property
    def pairs(self) -> int:
        return len(self.candidate)

    def figures(self, side: str, target_p99_ms: float) -> dict[str, Any]:
        return arm_figures(self.reference if side == "reference" else self.candidate, target_p99_ms)


def arm_figures(trials: list[Trial], target_p99_ms: float) -> dict[str, Any]:
    """One arm's figures over its runs in a comparison: :func:`pooled_figures` and the medians of QPS, busy
    shares and batch size, the timeouts and the run count."""
    f = pooled_figures(trials, target_p99_ms)
    f["qps"] = known_median([t.qps for t in trials])
    f["model_busy"] = known_median([t.model_busy for t in trials])
    f["device_busy"] = known_median([t.device_busy for t in trials])
    f["mean_batch"] = known_median([t.mean_batch for t in trials])
    f["timeouts"] = sum(t.timeouts for t in trials)
    f["runs"] = len(trials)
    return f


def paired_seed(seed: int, pair: int, salt: int) -> int:
    """The arrival seed of pair ``pair`` of a paired test seeded ``seed``: both arms of a pair share it (common
    random numbers), every pair draws another one; ``salt`` keeps two kinds of test from one seed apart."""
    return (seed * 1_000_003 + pair * 7919 + salt) % (2**31 - 1)


def race_at(measure: Measure, reference: Knobs, candidate: Knobs, *, rate: float, target_p99_ms: float,
            settings: CapacitySettings = CapacitySettings(), min_pairs: int = 2, max_pairs: int = 6, seed: int = 0,
            compare: "CompareSettings | None" = None, faster_pairs: int = 6, gate_level: float | None = None,
            extend_to: int | None = None, status: Callable[[str], None] | None = None) -> Race:
    """Whether ``candidate`` meets the target at ``rate`` while ``reference`` does not, in interleaved pairs
    (AB BA BA AB ...; both arms of a pair on one arrival seed). After ``min_pairs`` it stops as soon as the
    candidate fails while the reference does not, the reference passes, or the candidate passes while the
    reference fails; else ``undecided`` after ``max_pairs``. The pooled counts decide, not a ratio: past its
    knee the reference tips in some pairs and holds in others, and the ratio of shares swings by orders of
    magnitude (0.3 to 300,000 after 6 pairs in which the candidate had 0 of 12,079 over the target).

    When both arms fail there (a candidate with more capacity than the reference, but less than 20% more, is
    still near or past its own knee at 1.2x the reference's failing rate: the tuner's batch 8 had 37 of 624 over
    the target where batch 1 had 315, and was dropped as "candidate fails"), the pairs go on, to at least three
    and at most ``min(max_pairs, faster_pairs)`` (a no-op's interval straddles the bar to any cap), judged as
    :func:`compare_at` judges (the paired ratio of
    :func:`latency_figure`, the reference's over the candidate's, by :class:`~tuning.base.decide.Paired` at
    ``gate_level`` (default ``compare``'s level) and ``compare``'s minimum effect): ``candidate faster`` when
    its interval clears the minimum effect.
    Not the ratio of the shares over the target: a candidate just below its knee had 0.1% in one pair and 100%
    in the next (a stub at utilisation 0.98), an interval of 0.01-150,000; the latency figure is capped at 20x
    the target and moves with the queue in every outcome.

    ``extend_to`` (quick mode's race of 3 pairs: at 3 pairs the 99% t interval spans +-9.9 standard errors, so
    the gate could clear nothing) lets a race in which both arms fail, or the candidate is still undecided by its
    count while the reference fails, go on past that cap, judged by the gate alone, up to ``extend_to``
    pairs, while the gate's interval projected at ``extend_to`` pairs could still decide
    (:meth:`~tuning.base.decide.Paired.futile`): quick investigate's buckets step on this CPU read 1.39
    [0.73-2.66] after 3 pairs (15 of 459 over the target against 84 of 459), and stopped there, not kept."""
    measure, _ = as_measure(measure)
    compare = compare or CompareSettings()
    say = status or (lambda text: None)
    ref: list[Trial] = []
    cand: list[Trial] = []
    orders = []
    verdict = "undecided"
    rv = cv = ("undecided", "count")
    faster_cap = max(3, min(max_pairs, faster_pairs))
    extending = extend_to is not None and extend_to > max(max_pairs, faster_cap)  # an extend_to that adds pairs
    extend = extend_to if extending else faster_cap
    # futility only from the race's own cap on (then the pairs go on only while they could still decide): a race
    # promised its pairs runs them (with quick mode's cap of 3 that is from the third pair)
    faster = Paired(compare.min_effect, 3, extend, gate_level if gate_level is not None else compare.level)
    cap = 20 * target_p99_ms
    gated = False  # whether the latency gate judged the last look
    count_cap = max_pairs  # the count's last look: later only while too few outcomes let no count pass
    for i in range(max(max_pairs, extend) if extending else max_pairs):
        order = Paired.order(i)
        orders.append("".join(order))
        pair_seed = paired_seed(seed, i, salt=17)
        for arm in order:
            say(f"pair {i + 1}: {'reference' if arm == 'A' else 'candidate'} at {rate:.1f} req/s")
            trials = ref if arm == "A" else cand
            trials.append(measure(reference if arm == "A" else candidate, rate=rate, seed=pair_seed))
        faster.add(1.0 / latency_figure(ref[-1], cap), 1.0 / latency_figure(cand[-1], cap))  # bigger is better
        faster.futility = extend > faster_cap and faster.pairs >= faster_cap
        rf, cf = pooled_figures(ref, target_p99_ms), pooled_figures(cand, target_p99_ms)
        rv, cv = window_verdict(rf, len(ref), settings), window_verdict(cf, len(cand), settings)
        if i + 1 < min_pairs:
            continue
        # the outcomes a count needs: the candidate's against a failing reference (a reference past its knee
        # answers fewer within its windows), else both arms'
        thin_n = cf["n"] if rv[0] == "fail" else min(rf["n"], cf["n"])
        last = max(max_pairs, extend)
        # only while a count could still look by the last pair at this pace; else the gate judges now
        reachable = i + 1 < last and pass_limits(int(thin_n / (i + 1) * last))[0] is not None
        if (extending and i + 1 >= count_cap and cv[0] == "undecided" and rv[0] != "pass"
                and pass_limits(thin_n)[0] is None and reachable):
            # too few outcomes for any count to pass yet (under 299): quick investigate here at 20.5 req/s had 245
            # per arm after 3 pairs of 4 s windows, every step "undecided" for both arms and nothing kept; the
            # count has not had its look, so it gets it at the next pair (up to extend_to). Against a failing
            # reference too (the usual case): there the gate alone judged a candidate whose count could not yet
            # pass
            count_cap = i + 2
            gated = False  # the gate did not judge this look (its interval is not the race's)
            continue
        both_fail = cv[0] == "fail" and rv[0] == "fail"
        # a candidate still undecided by its count at the race's cap, against a reference that fails, goes on too
        # (quick investigate here: bf16 had 4 of 526 over the target against 275 of 526 after 3 pairs, and was
        # dropped as undecided); past the race's own cap (the extension) only the latency gate can keep: the
        # count rule was planned for at most max_pairs looks
        near = extending and i + 1 >= count_cap and cv[0] == "undecided" and rv[0] == "fail"
        gated = both_fail or near or (i + 1 > count_cap and cv[0] != "fail" and rv[0] != "pass")
        if gated:
            told = faster.verdict()
            verdict = {"better": "candidate faster", "not better": "candidate fails",
                       "not distinguishable": "candidate fails"}.get(told, "undecided")
            if verdict == "undecided" and i + 1 >= min(max_pairs, faster_cap) and extend == faster_cap:
                verdict = "candidate fails"
            slower = told == "not better" and faster.interval()[2] < 1
            if verdict == "candidate fails" and cv[0] == "pass" and not slower:
                # the candidate met the target by its count (late in an extension), the gate could not tell it
                # faster: it failed nothing, it was not told apart (a gate whose whole interval is below 1 told it
                # slower: that is a failure)
                verdict = "not distinguishable"
        elif cv[0] == "fail":
            verdict = "candidate fails"
        elif rv[0] == "pass":
            verdict = "reference passed"
        elif cv == ("pass", "count") and rv[0] == "fail":
            verdict = "candidate"
        if verdict != "undecided" or (i + 1 >= count_cap and not gated):
            break  # past the race's own cap only a race judged by the gate goes on (extend_to)
    ratio, lo, hi = faster.interval() if gated and faster.pairs >= 2 else (math.nan, math.nan, math.nan)
    return Race(rate, verdict, rv, cv, ref, cand, " ".join(orders), ratio, lo, hi)


def windows_agree(trials: list[Trial], target_p99_ms: float, alpha: float = 0.01) -> bool:
    """Whether the windows' shares over the target could be one share (a chi-square test of homogeneity at
    ``alpha``); True with fewer than two counted windows or no exceedance at all."""
    counts = []
    for t in trials:
        if t.latencies_ms is None or not len(t.latencies_ms):
            return True
        lat = np.asarray(t.latencies_ms, dtype=float)
        counts.append([int((lat > target_p99_ms).sum()), int((lat <= target_p99_ms).sum())])
    table = np.asarray(counts)
    if len(counts) < 2 or table[:, 0].sum() == 0 or table[:, 1].sum() == 0:
        return True
    return bool(stats.chi2_contingency(table)[1] >= alpha)


def _probe(rate: float, verdict: str, by: str, passed: bool, trials: list[Trial], f: dict[str, Any],
           agree: bool = True) -> Probe:
    return Probe(rate, verdict, by, passed, len(trials), f["n"], f["exceed"] if f["exceed"] is not None else -1,
                 f["errors"], f["offered_rate"], f["achieved_rate"], f["late"], f["p50_ms"], f["p99_ms"],
                 f["p99_low_ms"], f["p99_high_ms"], trials, agree)


def capacity_at_target(measure: Measure, knobs: Knobs, target_p99_ms: float, *, saturation: float | None = None,
                       known_pass: Probe | None = None, settings: CapacitySettings = CapacitySettings(),
                       status: Callable[[str], None] | None = None,
                       on_trial: Callable[[Trial], None] | None = None) -> Capacity:
    """The highest Poisson rate at which ``knobs`` meets ``target_p99_ms`` within the error budget.

    Start from ``saturation`` (a closed-loop completion rate: the bracket's top, assumed failing; it is never
    probed, so the capacity found is below it: here a closed loop of 32 clients completed 10-15% below the rate
    open-loop probes passed, a little more under the recorder, and the ladder takes the higher of a recorded and
    a plain one) or from ``known_pass`` (a probe that passed: doubled until a rate fails).
    """
    if not target_p99_ms > 0:
        raise ValueError(f"target_p99_ms={target_p99_ms!r} must be > 0 (milliseconds)")
    measure, _ = as_measure(measure)
    if known_pass is None and not (saturation is not None and saturation > 0):
        raise ValueError(f"capacity search needs a saturation rate > 0 or a passing probe; got saturation={saturation!r}")
    probes: list[Probe] = [known_pass] if known_pass is not None else []
    say = status or (lambda text: None)

    def at(rate: float) -> bool:
        say(f"capacity probe at {rate:.1f} req/s")
        p = probe(measure, knobs, rate, target_p99_ms, settings, on_trial)
        probes.append(p)
        return p.passed

    lo: float | None = None
    hi: float | None = None
    hi_probed = True
    note = ""
    if known_pass is not None and known_pass.passed:
        lo = known_pass.rate
        for _ in range(settings.doublings):
            if len(probes) >= settings.max_probes:
                break
            if at(lo * 2):
                lo *= 2
            else:
                hi = lo * 2
                break
        else:
            note = f"still passing at {lo:.1f} req/s after {settings.doublings} doublings: the capacity is at least that"
    else:
        # the closed loop's completion rate is the top, assumed failing and not probed: a probe of 3-6 s at the
        # rate a server only just keeps up with cannot show a queue that grows like sqrt(t), passes by its count,
        # and would make the capacity the saturation rate itself (a stub of capacity 100 req/s read 100.0)
        hi, hi_probed = float(saturation if saturation else known_pass.rate), not saturation
        r = hi / 2
        for _ in range(settings.halvings):
            if at(r):
                lo = r
                break
            hi, hi_probed, r = r, True, r / 2
        if lo is None:
            return Capacity(target_p99_ms, settings.error_budget, None, None, hi, probes,
                            f"no rate from {2 * r:.1f} req/s up met the target")
    while hi is not None and hi / lo > 1 + settings.tolerance and len(probes) < settings.max_probes:
        mid = math.sqrt(lo * hi)
        if at(mid):
            lo = mid
        else:
            hi, hi_probed = mid, True
    if hi is not None and not hi_probed:
        note = (f"the bracket's top {hi:.1f} req/s is the closed loop's completion rate (not probed: a rate the "
                "server only just keeps up with has no bounded p99 in steady state)")
    if hi is not None and hi / lo > 1 + settings.tolerance:
        note = note or f"stopped at {len(probes)} probes with the bracket {lo:.1f}-{hi:.1f} req/s still open"
    return Capacity(target_p99_ms, settings.error_budget, lo, lo, hi, probes, note)


# --- the paired comparison ------------------------------------------------------------------------

@dataclass(frozen=True)
class CompareSettings:
    min_effect: float = 0.02
    min_pairs: int = 3
    max_pairs: int = 16
    level: float = 0.99
    futility: bool = False  # stop before max_pairs once the cap could not decide (Paired.futile)

    @classmethod
    def quick(cls, min_effect: float = 0.05) -> "CompareSettings":
        return cls(min_effect=min_effect, min_pairs=3, max_pairs=6, futility=True)


@dataclass
class Comparison:
    """A reference and a candidate measured in interleaved pairs, and the verdict."""

    metric: str  # "latency at rate" (open loop) or "qps" (closed loop)
    rate: float | None
    verdict: str  # better | not better | not distinguishable
    ratio: float  # candidate over reference, larger is better (QPS, or the reference's latency over the candidate's)
    low: float
    high: float
    median_ratio: float
    min_effect: float
    level: float
    reference: list[Trial]
    candidate: list[Trial]
    order: str  # e.g. "AB BA BA AB"

    @property
    def pairs(self) -> int:
        return len(self.candidate)

    @property
    def pair_sd(self) -> float:
        """The per-pair SD of the log figure (NaN below two pairs)."""
        return spread_of(self.ratio, self.high, self.pairs, self.level)

    @property
    def pairs_needed(self) -> float:
        """About how many pairs at this spread would tell the minimum effect (see :func:`pairs_to_tell`)."""
        return pairs_to_tell(self.pair_sd, self.min_effect, self.level)

    def figures(self, side: str, target_p99_ms: float) -> dict[str, Any]:
        return arm_figures(self.reference if side == "reference" else self.candidate, target_p99_ms)

    def meets(self, target_p99_ms: float, error_budget: float) -> tuple[bool, str]:
        """Whether the candidate's pooled pair runs meet the target (by the count; else by the p99 estimate)."""
        f = pooled_figures(self.candidate, target_p99_ms)
        return _meets(f, target_p99_ms, error_budget)

    def reference_meets(self, target_p99_ms: float, error_budget: float) -> tuple[bool, str]:
        return _meets(pooled_figures(self.reference, target_p99_ms), target_p99_ms, error_budget)

    def sentence(self) -> str:
        what = "latency (reference / candidate)" if self.rate is not None else "QPS (candidate / reference)"
        at = f" at {self.rate:.1f} req/s" if self.rate is not None else ""
        return (f"{what}{at}: {self.ratio:.3f} [{self.low:.3f}-{self.high:.3f}] at {100 * self.level:.0f}% after "
                f"{self.pairs} pairs ({self.order}); median {self.median_ratio:.3f}; minimum effect "
                f"{100 * self.min_effect:.0f}%: {self.verdict}")


def _meets(f: dict[str, Any], target: float, budget: float) -> tuple[bool, str]:
    n = f["n"]
    if not n:
        return False, "no outcome"
    if f["errors"] > budget * n and stats.binom.sf(f["errors"] - 1, n, budget) <= PROBE_ALPHA:
        return False, f"{f['errors']} of {n} failed (budget {100 * budget:.1f}%)"
    if f["counted"]:
        verdict = count_verdict(min(f["exceed"], n), n)
        if verdict != "undecided":
            return verdict == "pass", f"{f['exceed']} of {n} over {target:.0f} ms: {verdict} by the count"
    ok = math.isfinite(f["p99_ms"]) and f["p99_ms"] <= target
    return ok, f"p99 {_ms(f['p99_ms'])} ms {'<=' if ok else '>'} {target:.0f} ms (estimate: too few outcomes to count)"


def latency_figure(t: Trial, cap_ms: float) -> float:
    """The open-loop comparison's figure of one run: the geometric mean latency over every outcome (a failure
    at ``cap_ms``). One window's p99 is an order statistic of the few slowest requests and swings 2-5x run to
    run near the knee; the geometric mean uses every outcome and moves with the same queueing. Whether the
    target is met is decided separately, by the count over the pooled runs."""
    lat = t.latencies_ms
    if lat is None or not len(lat):
        return min(t.p99_ms, cap_ms) if math.isfinite(t.p99_ms) and t.ok else cap_ms
    x = np.minimum(np.asarray(lat, dtype=float), cap_ms)
    return float(np.exp(np.mean(np.log(np.maximum(x, 1e-3)))))


def compare_at(measure: Measure, reference: Knobs, candidate: Knobs, *, rate: float | None,
               target_p99_ms: float, settings: CompareSettings = CompareSettings(),
               status: Callable[[str], None] | None = None,
               on_trial: Callable[[Trial], None] | None = None, seed: int = 0) -> Comparison:
    """Interleaved pairs of ``reference`` and ``candidate`` at ``rate`` (open loop; the figure is
    :func:`latency_figure`, the reference's over the candidate's) or closed loop (``rate=None``; QPS). Both
    arms of a pair get the same arrival seed (common random numbers: the same bursts for both), each pair
    another one."""
    measure, _ = as_measure(measure)
    paired = Paired(settings.min_effect, settings.min_pairs, settings.max_pairs, settings.level,
                    futility=settings.futility)
    ref_trials: list[Trial] = []
    cand_trials: list[Trial] = []
    orders = []
    say = status or (lambda text: None)
    cap = 20 * target_p99_ms

    def figure(t: Trial) -> float:  # bigger is better: the ratio is the candidate's over the reference's
        if rate is None:
            return t.qps
        return 1.0 / latency_figure(t, cap)

    while True:
        order = Paired.order(paired.pairs)
        orders.append("".join(order))
        got = {}
        pair_seed = paired_seed(seed, paired.pairs, salt=1)
        for arm in order:
            say(f"pair {paired.pairs + 1}: {'reference' if arm == 'A' else 'candidate'}")
            got[arm] = measure(reference if arm == "A" else candidate, rate=rate, seed=pair_seed)
            if on_trial:
                on_trial(got[arm])
        ref_trials.append(got["A"])
        cand_trials.append(got["B"])
        paired.add(figure(got["A"]), figure(got["B"]))
        verdict = paired.verdict()
        if verdict != "undecided":
            break
    ratio, lo, hi = paired.interval()
    return Comparison("latency at rate" if rate is not None else "qps", rate, verdict, ratio, lo, hi,
                      paired.median_ratio(), settings.min_effect, settings.level, ref_trials, cand_trials,
                      " ".join(orders))
