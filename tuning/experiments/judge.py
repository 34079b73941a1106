"""The engine's judges (``docs/deciding.md``): the confirmation's group-sequential test, the target check's
verdict on a window cut into blocks, and the client-lag flag. Pure statistics over figures; no timing.
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
TARGET_BLOCKS = 5  # a target window is cut into this many consecutive blocks (batch means)
TARGET_LEVEL = 0.95  # the share's one-sided bounds
MIN_PASS_OUTCOMES = 299  # the fewest outcomes with which a window can pass (0.99 ** 299 < 0.05)
LAG_MS = 10.0  # a client whose 99th-percentile send lag is over this and over LAG_SHARE of the target lagged
LAG_SHARE = 0.05
OUTLIER_SDS = 3.5  # a window (or pair) this many robust SDs from what its stage's model predicts is measured again


def outlying(residuals: Sequence[float], floor: float = 0.0, limit: float = OUTLIER_SDS) -> list[int]:
    """Indices of ``residuals`` beyond ``limit`` robust SDs (1.4826 x the median absolute deviation, at
    least ``floor``) from their median: a window the machine took away, not the configuration's pace."""
    r = np.asarray(residuals, dtype=float)
    if r.size < 3:
        return []
    centre = float(np.median(r))
    scale = max(1.4826 * float(np.median(np.abs(r - centre))), floor)
    if not scale > 0:
        return []
    return [int(i) for i in np.flatnonzero(np.abs(r - centre) > limit * scale)]


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
    """One rate's target check: the blocks' shares of outcomes over the target (or failed), their mean and
    one-sided bounds, and the verdict (``pass`` | ``fail`` | ``indeterminate``)."""

    verdict: str
    shares: list[float]
    mean: float
    low: float
    high: float
    n: int
    over: int
    errors: int
    fastest_ms: float

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def row(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "share_over": rounded(self.mean), "share_low": rounded(self.low),
                "share_high": rounded(self.high), "n": self.n, "over": self.over, "errors": self.errors,
                "fastest_ms": rounded(self.fastest_ms)}


def block_shares(latencies_ms: Sequence[float], target_ms: float, blocks: int = TARGET_BLOCKS) -> list[float]:
    """Each consecutive block's share of outcomes over ``target_ms`` (a failure is coded as infinity)."""
    lat = np.asarray(latencies_ms, dtype=float)
    parts = [p for p in np.array_split(lat, blocks) if p.size]
    return [float((p > target_ms).mean()) for p in parts]


def share_bounds(over: int, n: int, shares: Sequence[float], level: float = TARGET_LEVEL) -> tuple[float, float]:
    """One-sided ``level`` bounds on the share over the target: Clopper-Pearson on the effective sample size
    n / deff, where deff (at least 1) is the blocks' variance over a binomial's of that share and block size.
    Outcomes near the knee come in bursts: the blocks see it, and each outcome then counts for less. With no
    exceedance a window needs 299 outcomes to pass, as a binomial count would."""
    if n == 0:
        return 0.0, 1.0
    p = over / n
    k = len(shares)
    deff = 1.0
    if k > 1 and 0 < p < 1:
        binomial = p * (1 - p) / (n / k)
        deff = max(1.0, float(np.var(shares, ddof=1)) / binomial)
    n_eff = n / deff
    x = p * n_eff
    low = float(stats.beta.ppf(1 - level, x, n_eff - x + 1)) if x > 0 else 0.0
    high = float(stats.beta.ppf(level, x + 1, n_eff - x)) if x < n_eff else 1.0
    return low, high


def target_verdict(latencies_ms: Sequence[float], target_ms: float, errors: int = 0, error_budget: float = 0.001,
                   blocks: int = TARGET_BLOCKS, level: float = TARGET_LEVEL) -> TargetVerdict:
    """Pass when the one-sided upper bound on the share over the target (:func:`share_bounds`) is at most 1%
    and the errors are within the budget; fail when the lower bound is above 1% or the errors are over the
    budget beyond chance; else indeterminate (``docs/deciding.md``, stage 3)."""
    lat = np.asarray(latencies_ms, dtype=float)
    finite = lat[np.isfinite(lat)]
    fastest = float(finite.min()) if finite.size else math.inf
    if not lat.size:
        return TargetVerdict("fail", [], math.nan, math.nan, math.nan, 0, 0, errors, fastest)
    return verdict_of(int((lat > target_ms).sum()), int(lat.size), block_shares(lat, target_ms, blocks), errors,
                      error_budget, level, fastest)


def verdict_of(over: int, n: int, shares: Sequence[float], errors: int = 0, error_budget: float = 0.001,
               level: float = TARGET_LEVEL, fastest_ms: float = math.nan) -> TargetVerdict:
    """The target rule on counts: ``over`` of ``n`` outcomes over the target or failed, the blocks' shares."""
    if n == 0:
        return TargetVerdict("fail", list(shares), math.nan, math.nan, math.nan, 0, 0, errors, fastest_ms)
    low, high = share_bounds(over, n, shares, level)
    errors_over = errors > 0 and stats.binom.sf(errors - 1, n, error_budget) <= 1 - level
    if low > EXCEED_SHARE or errors_over:
        verdict = "fail"
    elif high <= EXCEED_SHARE and errors <= max(error_budget * n, 0):
        verdict = "pass"
    else:
        verdict = "indeterminate"
    return TargetVerdict(verdict, list(shares), over / n, low, high, n, over, errors, fastest_ms)


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
    """The client's lag explains the window's exceedances: more than 1% of outcomes are over the target, and at
    most 1% would be with each one's send lag taken off. A lag that does not move the share across that line
    excuses nothing: the server was over the target either way, or under it."""
    if latencies_ms is None or lags_ms is None:
        return False
    lat = np.asarray(latencies_ms, dtype=float)
    lags = np.asarray(lags_ms, dtype=float)
    if lat.size == 0:
        return False
    if lags.shape != lat.shape:  # lags not per outcome: nothing to take off each one, so the lag is flagged
        return True
    return bool((lat > target_ms).mean() > EXCEED_SHARE >= (lat - lags > target_ms).mean())


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson interval of a rate ``k`` of ``n`` (the bench's error rates)."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)
