"""The engine's judges (``docs/deciding.md``): the confirmation's group-sequential test, the target check's
verdict on a window's batches, and the client-lag flag. Pure statistics over figures; no timing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np
from scipy import stats

from tuning.base.format import rounded

EXCEED_SHARE = 0.01  # a p99 target: at most 1% of outcomes over it
TARGET_LEVEL = 0.95  # the share's one-sided bounds
BATCHES = 20  # a target window's outcomes are cut into this many consecutive batches (batch means)...
DEFF_QUANTILES = (0.98, 0.95)  # ...for the outcomes over the target and over these quantiles of the window...
DEFF_LEVEL = 0.75  # ...and the design effect taken at this upper confidence limit of its batches' variance: the
# estimate alone passed 5.5-18% of windows whose true share was exactly 1% (it came out low in many)
TARGET_BLOCKS = 5  # the blocks verdict: 5 consecutive blocks, the outcomes over the target alone, the estimate as is


class Method(NamedTuple):
    """How a window's design effect is taken: batches, the quantiles besides the target, the confidence limit."""

    batches: int
    quantiles: tuple[float, ...]
    level: float | None


METHODS = {"batches": Method(BATCHES, DEFF_QUANTILES, DEFF_LEVEL), "blocks": Method(TARGET_BLOCKS, (), None)}
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
    the verdict (``pass`` | ``fail`` | ``indeterminate``). ``deff``: the design effect the bounds took (how many
    outcomes count as one independent one); ``needed``: the arrivals a window would need to pass if its share
    and design effect held (infinite at a share of 1% or more)."""

    verdict: str
    mean: float
    low: float
    high: float
    n: int
    over: int
    errors: int
    fastest_ms: float
    deff: float = 1.0
    needed: float = math.inf
    by: str = "batches"  # the method (METHODS)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def row(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "share_over": rounded(self.mean), "share_low": rounded(self.low),
                "share_high": rounded(self.high), "n": self.n, "over": self.over, "errors": self.errors,
                "deff": rounded(self.deff), "needed": rounded(self.needed) if math.isfinite(self.needed) else None,
                "by": self.by, "fastest_ms": rounded(self.fastest_ms)}


def batches_for(n: int, batches: int) -> int:
    """The batches a window of ``n`` outcomes is cut into: ``batches``, fewer for a short window (two outcomes
    a batch at least); under 2, the window is one unit."""
    return min(batches, n // 2)


def batch_design_effect(over: np.ndarray, batches: int = BATCHES) -> float:
    """Batch means: the variance of the share over consecutive batches (:func:`batches_for`) over a binomial's
    (how many outcomes in a row move together); at least 1. ``over``: 0/1 in arrival order. A window too short
    for two batches is one unit (its length)."""
    n = over.size
    k = batches_for(n, batches)
    if k < 2:
        return float(max(n, 1))
    p = float(over.mean())
    if not 0 < p < 1:
        return 1.0
    shares = [float(part.mean()) for part in np.array_split(over.astype(float), k)]
    return max(1.0, float(np.var(shares, ddof=1)) / (p * (1 - p) / (n / k)))


def design_effect(latencies_ms: np.ndarray, target_ms: float, batches: int = BATCHES,
                  quantiles: Sequence[float] = DEFF_QUANTILES, level: float | None = None) -> float:
    """The window's design effect: the largest batch-means design effect of the outcomes over the target and
    over the window's own ``quantiles`` (each level at most the target). Exceedances come in bursts (a queue's
    busy period), and a window with few of them over the target can miss the bursts' length; the lower levels
    have many exceedances in the same bursts, whose length changes little from level to level in a queue, so
    the largest of the three is not fooled by a window that held no burst over the target. ``level``: the
    estimate is raised to that upper confidence limit of its batches' variance (a chi-square on the batches
    less one)."""
    levels = [target_ms] + [min(target_ms, float(np.quantile(latencies_ms, q, method="inverted_cdf")))
                            for q in quantiles]
    deff = max(batch_design_effect(latencies_ms > cut, batches) for cut in levels)
    k = batches_for(latencies_ms.size, batches)
    if level is None or k < 2:
        return deff
    return deff * (k - 1) / float(stats.chi2.ppf(1 - level, k - 1))


def share_bounds(over: float, n: float, level: float = TARGET_LEVEL) -> tuple[float, float]:
    """One-sided ``level`` Clopper-Pearson bounds on a share from ``over`` of ``n`` (effective counts: they
    need not be whole)."""
    if n <= 0:
        return 0.0, 1.0
    low = float(stats.beta.ppf(1 - level, over, n - over + 1)) if over > 0 else 0.0
    high = float(stats.beta.ppf(level, over + 1, n - over)) if over < n else 1.0
    return low, high


def arrivals_needed(share: float, deff: float, level: float = TARGET_LEVEL) -> float:
    """The arrivals a window needs for its upper bound to reach 1% if its share and design effect hold (299 x
    deff at a share of 0): what a window too short to pass would need, for sizing a longer one."""
    if not share < EXCEED_SHARE:
        return math.inf
    lo, hi = 1.0, 1e9
    if share_bounds(share * hi, hi, level)[1] > EXCEED_SHARE:
        return math.inf
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if share_bounds(share * mid, mid, level)[1] <= EXCEED_SHARE else (mid, hi)
    return hi * deff


def target_verdict(latencies_ms: Sequence[float], target_ms: float, errors: int = 0, error_budget: float = 0.001,
                   *, arrivals_s: Sequence[float] | None = None, level: float = TARGET_LEVEL,
                   method: str = "batches") -> TargetVerdict:
    """One window judged by itself (``docs/deciding.md``, stage 3): pass when the one-sided upper bound on the
    share over the target is at most 1% and the errors are within the budget; fail when the lower bound is above
    1% or the errors are over the budget beyond chance; else indeterminate. ``latencies_ms``: every outcome in
    arrival order, a failure as infinity (NaN counts as a failure); ``arrivals_s``, when given, puts them in
    that order. The bounds are Clopper-Pearson on the effective counts, the counts over the
    :func:`design_effect`: on ``method`` "batches", :data:`BATCHES` batches, the largest of the target's and
    :data:`DEFF_QUANTILES`' design effects at its :data:`DEFF_LEVEL` upper limit (valid under bursts,
    ``docs/deciding.md``); on "blocks",
    :data:`TARGET_BLOCKS` blocks and the target's alone (bursts longer than a block are not seen)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: use 'batches' (bursts counted) or 'blocks' (5 blocks, the target alone)")
    lat = np.asarray(latencies_ms, dtype=float)
    lat = np.where(np.isnan(lat), math.inf, lat)
    if arrivals_s is not None:
        arr = np.asarray(arrivals_s, dtype=float)
        if arr.shape != lat.shape:
            raise ValueError(f"arrivals_s has {arr.size} values for {lat.size} latencies: give one arrival per "
                             "outcome, in the same order")
        if np.isnan(arr).any():
            raise ValueError("arrivals_s holds NaN: give every outcome's scheduled arrival time in seconds")
        lat = lat[np.argsort(arr, kind="stable")]
    finite = lat[np.isfinite(lat)]
    fastest = float(finite.min()) if finite.size else math.inf
    if not lat.size:
        return TargetVerdict("fail", math.nan, math.nan, math.nan, 0, 0, errors, fastest)
    over = int((lat > target_ms).sum())
    deff = design_effect(lat, target_ms, *METHODS[method])
    low, high = share_bounds(over / deff, lat.size / deff, level)
    errors_over = errors > 0 and stats.binom.sf(errors - 1, lat.size, error_budget) <= 1 - level
    if low > EXCEED_SHARE or errors_over:
        verdict = "fail"
    elif high <= EXCEED_SHARE and errors <= max(error_budget * lat.size, 0):
        verdict = "pass"
    else:
        verdict = "indeterminate"
    return TargetVerdict(verdict, over / lat.size, low, high, int(lat.size), over, errors, fastest, deff,
                         arrivals_needed(over / lat.size, deff, level), method)


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
