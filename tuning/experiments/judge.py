"""The engine's judges (``docs/deciding.md``): the confirmation's group-sequential test, the target check's
verdict on a window's blocks or regeneration cycles, and the client-lag flag. Pure statistics over figures; no timing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats

from tuning.base.format import rounded

EXCEED_SHARE = 0.01  # a p99 target: at most 1% of outcomes over it
TARGET_LEVEL = 0.95  # the share's one-sided bounds
MIN_PASS_CYCLES = 299  # on cycles a window passes only with this many: with nothing over the target, 299
# independent units are the fewest that bound a share under 1% (0.99 ** 299 < 0.05), and a cycle holds at least one
TAIL_SHARE = 0.10  # the tail is extrapolated from the slowest 10% of outcomes (by their cycle's slowest)...
MIN_TAIL_CYCLES = 5  # ...and at least this many cycles
BOOTSTRAP = 400  # resamples of the cycles
TARGET_BLOCKS = 5  # without arrival times a window is cut into this many consecutive blocks (batch means)
LAG_MS = 10.0  # a client whose 99th-percentile send lag is over this and over LAG_SHARE of the target lagged
LAG_SHARE = 0.05
OUTLIER_SDS = 3.5  # a window (or pair) this many robust SDs from what its stage's model predicts is measured again


def robust_sd(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation from the median: an SD that a few lost windows do not inflate."""
    r = np.asarray(values, dtype=float)
    return 1.4826 * float(np.median(np.abs(r - np.median(r)))) if r.size else math.nan


def outlying(residuals: Sequence[float], floor: float = 0.0, limit: float = OUTLIER_SDS,
             sd: float | None = None) -> list[int]:
    """Indices of ``residuals`` beyond ``limit`` SDs from their median: a window the machine took away, not the
    configuration's pace. The SD is ``sd`` when known from elsewhere, else :func:`robust_sd`, at least
    ``floor``."""
    r = np.asarray(residuals, dtype=float)
    if r.size < 3:
        return []
    scale = sd if sd is not None else max(robust_sd(r), floor)
    if not scale > 0:
        return []
    return [int(i) for i in np.flatnonzero(np.abs(r - float(np.median(r))) > limit * scale)]


@functools.lru_cache(maxsize=None)
def pocock_level(looks: int, alpha: float) -> float:
    """The one-sided nominal level of each of ``looks`` equally spaced looks that keeps the overall false
    'better' rate at ``alpha`` (Pocock 1977): the c with P(max_k Z_k > c) = alpha for the partial sums'
    z statistics, whose correlation between looks i <= j is sqrt(i / j)."""
    if looks == 1:
        return alpha
    idx = np.arange(1, looks + 1)
    corr = np.sqrt(np.minimum.outer(idx, idx) / np.maximum.outer(idx, idx))
    mvn = stats.multivariate_normal(mean=np.zeros(looks), cov=corr, seed=0)

    def excess(c: float) -> float:
        return 1 - mvn.cdf(np.full(looks, c)) - alpha
    from scipy.optimize import brentq

    return float(stats.norm.sf(brentq(excess, 1.0, 5.0, xtol=1e-4)))


@dataclass
class Sequential:
    """The confirmation's test (``docs/deciding.md``, stage 2): a group-sequential one-sided t-test of
    H0 "mean paired log-ratio <= 0" on the pairs, looked at after every ``look_every`` pairs up to
    ``max_pairs``, each look at Pocock's nominal level so that the false 'better' rate over all looks is
    ``alpha``. It stops 'better' when the t statistic clears its level, 'not better' at a look where the
    effect's upper bound is below the minimum ``effect`` (futility, which only lowers the false rate) or
    at the cap, and otherwise ``continue``s. ``d``: the pairs' ln(winner / baseline)."""

    effect: float
    alpha: float = 0.025
    look_every: int = 4
    max_pairs: int = 8
    d: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.effect < 1:
            raise ValueError(f"effect={self.effect!r} must be a share in (0, 1): 0.10 is +10%")
        if self.look_every < 2 or self.max_pairs < self.look_every or self.max_pairs % self.look_every:
            raise ValueError(f"look_every={self.look_every}, max_pairs={self.max_pairs}: need 2 <= look_every "
                             "<= max_pairs, max_pairs a multiple of look_every")

    @property
    def looks(self) -> int:
        return self.max_pairs // self.look_every

    @property
    def level(self) -> float:
        return pocock_level(self.looks, self.alpha)

    def set(self, log_ratios: Sequence[float]) -> str:
        """The pairs so far (a pair measured again replaces its first measurement)."""
        self.d = [float(x) for x in log_ratios]
        return self.verdict

    def add(self, log_ratio: float) -> str:
        self.d.append(float(log_ratio))
        return self.verdict

    def _bounds(self) -> tuple[float, float, float]:
        n = len(self.d)
        m = float(np.mean(self.d))
        se = float(np.std(self.d, ddof=1)) / math.sqrt(n)
        return m, se, float(stats.t.ppf(1 - self.level, n - 1))

    @property
    def verdict(self) -> str:
        n = len(self.d)
        if n < self.look_every or (n % self.look_every and n < self.max_pairs):
            return "continue"
        m, se, t = self._bounds()
        if (se == 0 and m > 0) or (se > 0 and m / se > t):
            return "better"
        if n >= self.max_pairs or m + t * se < math.log1p(self.effect):
            return "not better"
        return "continue"

    @property
    def ratio(self) -> float:
        return math.exp(float(np.mean(self.d))) if self.d else math.nan

    @property
    def sd(self) -> float:
        return float(np.std(self.d, ddof=1)) if len(self.d) > 1 else math.nan

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The paired ratio's two-sided t interval (for the report; the decision is :attr:`verdict`)."""
        n = len(self.d)
        if n < 2:
            return math.nan, math.nan
        half = stats.t.ppf(0.5 + level / 2, n - 1) * float(np.std(self.d, ddof=1)) / math.sqrt(n)
        m = float(np.mean(self.d))
        return math.exp(m - half), math.exp(m + half)


@dataclass
class TargetVerdict:
    """One window's target check: the share of outcomes over the target (or failed), its one-sided bounds, and
    the verdict (``pass`` | ``fail`` | ``indeterminate``). ``cycles``: the independent units it was judged on
    (regeneration cycles; 0 when judged on blocks: ``by``)."""

    verdict: str
    mean: float
    low: float
    high: float
    n: int
    over: int
    errors: int
    fastest_ms: float
    cycles: int = 0
    by: str = "cycles"  # cycles | blocks (judged without arrival times)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def row(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "share_over": rounded(self.mean), "share_low": rounded(self.low),
                "share_high": rounded(self.high), "n": self.n, "over": self.over, "errors": self.errors,
                "cycles": self.cycles, "by": self.by, "fastest_ms": rounded(self.fastest_ms)}


def regeneration_cycles(latencies_ms: Sequence[float], arrivals_s: Sequence[float]) -> np.ndarray:
    """Each outcome's segment (outcomes in arrival order): 0 before the first regeneration, then one per
    regeneration cycle, the last one still open when the window ended. A cycle starts at an arrival that finds
    nothing in flight: every earlier request answered. The client knows that without the server's help, and
    what follows such a moment does not depend on what came before it, so cycles are independent units
    (regenerative simulation: Crane and Iglehart); the first and last segments are not complete cycles.
    A failure's answer time is not kept: it counts as in flight for the window's longest answered latency
    (fewer regenerations: wider bounds). A server that handles requests side by side rarely empties under
    load, and then has few cycles (``docs/deciding.md``)."""
    lat = np.asarray(latencies_ms, dtype=float)
    arr = np.asarray(arrivals_s, dtype=float)
    if lat.shape != arr.shape:
        raise ValueError(f"arrivals_s has {arr.size} values for {lat.size} latencies: give one arrival per outcome, "
                         "in the same order")
    if not lat.size:
        return np.zeros(0, dtype=int)
    if np.isnan(arr).any():
        raise ValueError("arrivals_s holds NaN: give every outcome's scheduled arrival time in seconds")
    finite = lat[np.isfinite(lat)]
    longest = float(finite.max()) if finite.size else 0.0
    busy_until = np.maximum.accumulate(arr + np.where(np.isfinite(lat), lat, longest) / 1000.0)
    return np.cumsum(np.r_[False, arr[1:] >= busy_until[:-1]])


def block_shares(latencies_ms: Sequence[float], target_ms: float, blocks: int = TARGET_BLOCKS) -> list[float]:
    """Each consecutive block's share of outcomes over ``target_ms`` (a failure is coded as infinity)."""
    lat = np.asarray(latencies_ms, dtype=float)
    return [float((p > target_ms).mean()) for p in np.array_split(lat, blocks) if p.size]


def block_bounds(over: int, n: int, shares: Sequence[float], level: float = TARGET_LEVEL) -> tuple[float, float]:
    """One-sided ``level`` bounds on the share over the target from consecutive blocks: Clopper-Pearson on the
    effective sample size n / deff, deff (at least 1) the blocks' variance over a binomial's. With no outcome
    over the target a window needs 299 outcomes to pass, as a binomial count would. Bursts that outlast a block
    are not seen (``docs/deciding.md`` has its error rates)."""
    if n == 0:
        return 0.0, 1.0
    p = over / n
    k = len(shares)
    deff = 1.0
    if k > 1 and 0 < p < 1:
        deff = max(1.0, float(np.var(shares, ddof=1)) / (p * (1 - p) / (n / k)))
    n_eff = n / deff
    x = p * n_eff
    low = float(stats.beta.ppf(1 - level, x, n_eff - x + 1)) if x > 0 else 0.0
    high = float(stats.beta.ppf(level, x + 1, n_eff - x)) if x < n_eff else 1.0
    return low, high


def complete_cycles(segment: np.ndarray) -> int:
    """The complete cycles among :func:`regeneration_cycles`' segments (all but the first and the last)."""
    return max(int(segment.max()) - 1, 0) if segment.size else 0


def tail_bound(latencies_ms: np.ndarray, segment: np.ndarray, target_ms: float, level: float = TARGET_LEVEL,
               resamples: int = BOOTSTRAP) -> tuple[float, float]:
    """One-sided ``level`` bounds on the share of outcomes over ``target_ms``.

    Every outcome over the target lies in a segment whose slowest outcome is over it, so the share of outcomes
    in such segments bounds the share over the target from above, whatever the server does inside one. Where
    the target lies beyond the window's slowest :data:`TAIL_SHARE` of outcomes (counted by their segment's
    slowest), that share is extrapolated with an exponential tail fitted to the segments' slowest outcomes above
    that level (peaks over a threshold; a queue's latency has an exponential tail when its service times do not
    have a heavy one). Both bounds come from resampling whole segments (a regenerative bootstrap), so that a
    burst counts as one unit; the first and last segments are resampled too, so that a queue still growing at
    the end of the window weighs in. The lower bound is the share actually over the target; a window of one
    segment (it never emptied) has no spread, and its share over the target is its lower bound."""
    units = int(segment.max()) + 1 if segment.size else 0  # segments are numbered 0, 1, ... with none empty
    if units < 2:
        return float((latencies_ms > target_ms).mean()) if latencies_ms.size else 0.0, 1.0
    size = np.bincount(segment, minlength=units).astype(float)
    over = np.bincount(segment, weights=(latencies_ms > target_ms).astype(float), minlength=units)
    slowest = np.full(units, -np.inf)
    np.maximum.at(slowest, segment, latencies_ms)
    rng = np.random.default_rng(units)  # the same window gives the same bounds (a resumed run, a test)
    weights = rng.multinomial(units, np.full(units, 1.0 / units), size=resamples).astype(float)
    outcomes = weights @ size
    direct = (weights @ over) / outcomes
    order = np.argsort(-slowest, kind="stable")
    reach = np.cumsum(size[order]) / size.sum()
    k = max(int(np.searchsorted(reach, TAIL_SHARE)) + 1, MIN_TAIL_CYCLES)
    high = direct
    if k < units and np.isfinite(slowest[order[k]]) and target_ms > slowest[order[k]]:
        u = float(slowest[order[k]])
        above = slowest > u
        reached = weights @ (size * above)
        excess = weights @ (size * np.where(above, np.minimum(slowest, 1e12) - u, 0.0))
        scale = excess / np.maximum(reached, 1e-12)
        high = np.maximum(direct, reached / outcomes * np.exp(-(target_ms - u) / np.maximum(scale, 1e-12)))
    return float(np.quantile(direct, 1 - level)), float(np.quantile(high, level))


def target_verdict(latencies_ms: Sequence[float], target_ms: float, errors: int = 0, error_budget: float = 0.001,
                   *, arrivals_s: Sequence[float] | None = None, level: float = TARGET_LEVEL) -> TargetVerdict:
    """One window judged by itself (``docs/deciding.md``, stage 3): pass when the one-sided upper bound on the
    share over the target is at most 1% and the errors are within the budget; fail when the lower bound is above
    1% or the errors are over the budget beyond chance; else indeterminate. ``latencies_ms``: every outcome, a
    failure as infinity (NaN counts as a failure). With ``arrivals_s`` (their scheduled arrivals, same order)
    the bounds come from the window's regeneration cycles (:func:`tail_bound`) and a pass needs
    :data:`MIN_PASS_CYCLES` of them; without, from :data:`TARGET_BLOCKS` consecutive blocks
    (:func:`block_bounds`)."""
    lat = np.asarray(latencies_ms, dtype=float)
    lat = np.where(np.isnan(lat), math.inf, lat)
    finite = lat[np.isfinite(lat)]
    fastest = float(finite.min()) if finite.size else math.inf
    if not lat.size:
        return TargetVerdict("fail", math.nan, math.nan, math.nan, 0, 0, errors, fastest, 0)
    if arrivals_s is not None:
        arr = np.asarray(arrivals_s, dtype=float)
        if arr.shape != lat.shape:
            raise ValueError(f"arrivals_s has {arr.size} values for {lat.size} latencies: give one arrival per "
                             "outcome, in the same order")
        order = np.argsort(arr, kind="stable")
        lat = lat[order]
        segment, by = regeneration_cycles(lat, arr[order]), "cycles"
        count = complete_cycles(segment)
        low, high = tail_bound(lat, segment, target_ms, level)
    else:
        by, count = "blocks", 0
        low, high = block_bounds(int((lat > target_ms).sum()), int(lat.size), block_shares(lat, target_ms), level)
    over = int((lat > target_ms).sum())
    errors_over = errors > 0 and stats.binom.sf(errors - 1, lat.size, error_budget) <= 1 - level
    if low > EXCEED_SHARE or errors_over:
        verdict = "fail"
    elif (high <= EXCEED_SHARE and (by == "blocks" or count >= MIN_PASS_CYCLES)
          and errors <= max(error_budget * lat.size, 0)):
        verdict = "pass"
    else:
        verdict = "indeterminate"
    return TargetVerdict(verdict, over / lat.size, low, high, int(lat.size), over, errors, fastest, count, by)


def client_lagged(lags_ms: Any, target_ms: float | None) -> bool:
    """The client fell behind its schedule in this window: its 99th-percentile send lag is over
    :data:`LAG_MS` and over :data:`LAG_SHARE` of the target (a lag that small cannot move a p99 across it)."""
    if lags_ms is None:
        return False
    lags = np.asarray(lags_ms, dtype=float)
    if not lags.size:
        return False
    limit = max(LAG_MS, LAG_SHARE * target_ms) if target_ms else LAG_MS
    return float(np.percentile(lags, 99)) > limit


def lag_explains(latencies_ms: Any, lags_ms: Any, target_ms: float) -> bool:
    """The client's lag explains the window's exceedances: more than 1% of outcomes are over the target, and
    at most 1% would be with each one's send lag taken off. A lag that does not move the share across the line
    excuses nothing: the server was over the target either way (or under it)."""
    if latencies_ms is None or lags_ms is None:
        return False
    lat = np.asarray(latencies_ms, dtype=float)
    lags = np.asarray(lags_ms, dtype=float)
    if lat.size == 0:
        return False
    if lags.shape != lat.shape:  # lags not per outcome: nothing to take off each one, so the lag cannot be ruled out
        return True
    return bool((lat > target_ms).mean() > EXCEED_SHARE >= (lat - lags > target_ms).mean())


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson interval of a rate ``k`` of ``n`` (the bench's error rates)."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)
