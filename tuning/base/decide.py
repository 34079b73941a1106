"""Deciding under noise: the counting rule of a capacity probe and the paired comparison of two configurations.

Pure statistics (no timing, no torch), used by :mod:`tuning.experiments.capacity` and the ladder.

**A probe at one rate passes or fails on a count** (``../shared/DECIDING.md``): of ``n`` outcomes, ``c``
exceeded the latency target or failed. The p99 is within the target when fewer than 1% exceed it; the
probe *passes* when ``P(Bin(n, 0.01) <= c) <= alpha`` (so few exceedances that a true share of 1% would
rarely give them), *fails* when ``P(Bin(n, 0.01) >= c) <= alpha``, and is *undecided* otherwise (measure
more). At ``n = 1000`` and ``alpha = 0.05``: pass at ``c <= 4``, fail at ``c >= 16``. Fewer than 299
outcomes can never pass (``0.99 ** 299 > 0.05``): a p99 from so few samples has no bound.

**Two configurations are compared in interleaved pairs** (AB, BA, BA, AB, ...: every four runs are ABBA
or BAAB, which cancels a linear drift). Per pair ``d = log(better-is-larger figure of B / that of A)``;
the ratio is ``exp(mean d)`` with a t interval. The ladder looks after every pair from ``min_pairs`` to
``max_pairs``: *kept* when the interval's lower end clears ``1 + min_effect``, *dropped* when its upper end
is below it, *not distinguishable* at the cap. Looking after every pair with a fixed-n interval inflates
false keeps; the chosen guard is a strict level (99%, two-sided) together with the minimum effect, checked
by simulation rather than assumed (``tests/test_verdict.py``): with 5% run-to-run noise and no real effect,
3 to 16 pairs keep 0.7% of decisions (so about 5-7% of ladders with 7-10 decisions ship any no-op knob),
while a true +10% is kept 92% of the time after about 19 runs; 3 to 8 pairs (quick) keep 0.4% and 79%.
Bonferroni over the 14 looks (each at 1 - 0.02/14) kept a true +10% only half the time at 12 pairs: the
looks are strongly correlated, so it pays for independence they do not have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats

EXCEED_SHARE = 0.01  # a p99 target: at most 1% of outcomes may exceed it
PROBE_ALPHA = 0.05  # one-sided error of each probe's pass/fail call
# the fewest outcomes a count can pass at (none over the target: 0.99 ** n <= 0.05): 299
COUNT_PASS_MIN = math.ceil(math.log(PROBE_ALPHA) / math.log(1 - EXCEED_SHARE))
# futility judges the cap's interval at the per-pair SD's one-sided 98% lower bound, not at the SD of 3 pairs
# itself (at 2 degrees of freedom that estimate swings from a fifth to twice and more the true SD): in the stubs'
# Monte-Carlo (bench/keep_rule.py's queue, 60 ladders, true +10% steps, light-load pairs up to 16) the plain SD
# stopped true steps early, 118 of 180 kept against 158 without futility; the bound keeps 153 (90%: 144, 95%:
# 147). On this VM's 14-113% SD per pair the bound (0.51 x at 3 pairs) still stops a no-op at 3 pairs
FUTILITY_SD_ALPHA = 0.02
P99_LEVEL = 0.95  # the p99 interval's coverage


def exceed_pvalues(c: int, n: int, share: float = EXCEED_SHARE) -> tuple[float, float]:
    """(P(Bin(n, share) <= c), P(Bin(n, share) >= c)): how surprising ``c`` of ``n`` is at the share."""
    if n <= 0:
        return 1.0, 1.0
    return float(stats.binom.cdf(c, n, share)), float(stats.binom.sf(c - 1, n, share))


def count_verdict(c: int, n: int, share: float = EXCEED_SHARE, alpha: float = PROBE_ALPHA) -> str:
    """``pass``, ``fail`` or ``undecided`` for ``c`` exceedances among ``n`` outcomes (see the module docstring)."""
    if n < 0 or c < 0 or c > n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    low, high = exceed_pvalues(c, n, share)
    if low <= alpha:
        return "pass"
    if high <= alpha:
        return "fail"
    return "undecided"


def pass_limits(n: int, share: float = EXCEED_SHARE, alpha: float = PROBE_ALPHA) -> tuple[int | None, int | None]:
    """(the largest c that passes, the smallest c that fails) at ``n`` outcomes (None: no such c)."""
    passing = int(stats.binom.ppf(alpha, n, share))
    while passing >= 0 and stats.binom.cdf(passing, n, share) > alpha:
        passing -= 1
    failing = int(stats.binom.isf(alpha, n, share))
    while failing <= n and stats.binom.sf(failing - 1, n, share) > alpha:
        failing += 1
    return (passing if passing >= 0 else None), (failing if failing <= n else None)


def quantile_interval(values: Sequence[float], q: float = 0.99,
                      level: float = P99_LEVEL) -> tuple[float | None, float | None]:
    """Distribution-free interval of the ``q`` quantile from order statistics (None where the sample cannot
    bound it: an upper bound of the p99 at 95% needs at least 368 values)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 0:
        return None, None
    a = (1 - level) / 2
    # lower: the largest k with P(Bin(n, q) < k) <= a, i.e. x_(k) (1-based) is below the quantile with 1 - a
    k_lo = int(stats.binom.ppf(a, n, q))
    while k_lo > 0 and stats.binom.cdf(k_lo - 1, n, q) > a:
        k_lo -= 1
    k_hi = int(stats.binom.ppf(1 - a, n, q)) + 1
    while k_hi <= n and stats.binom.cdf(k_hi - 1, n, q) < 1 - a:
        k_hi += 1
    lo = float(x[k_lo - 1]) if k_lo >= 1 else None
    hi = float(x[k_hi - 1]) if k_hi <= n else None
    return lo, hi


@dataclass
class Paired:
    """Interleaved pairs of a reference A and a candidate B; ``d`` per pair is log(B / A) of a figure where
    larger is better (QPS; or the reference's p99 over the candidate's). See the module docstring."""

    min_effect: float = 0.02
    min_pairs: int = 3
    max_pairs: int = 16
    level: float = 0.99  # two-sided coverage of each look's t interval
    futility: bool = False  # stop as not distinguishable once the cap could not decide (see futile)
    d: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 2 <= self.min_pairs <= self.max_pairs:
            raise ValueError(f"need 2 <= min_pairs <= max_pairs, got {self.min_pairs} and {self.max_pairs}")
        if not 0.5 < self.level < 1:
            raise ValueError(f"level={self.level!r} must be in (0.5, 1): the interval's two-sided coverage")
        if self.min_effect < 0:
            raise ValueError(f"min_effect={self.min_effect!r} must be >= 0 (a share: 0.02 is 2%)")

    @staticmethod
    def order(i: int) -> tuple[str, str]:
        """The arms of pair ``i`` (0-based): AB, BA, BA, AB, AB, BA, BA, AB, ... (every four runs ABBA or BAAB; a
        linear drift cancels over every two pairs, and leaves a third of one run's drift after an odd count)."""
        flips = (i % 2) ^ ((i // 2) % 2)
        return ("B", "A") if flips else ("A", "B")

    def add(self, reference: float, candidate: float) -> None:
        """One pair's figures (larger is better); zero or a non-finite figure is floored, never dropped."""
        self.d.append(math.log(_floor(candidate)) - math.log(_floor(reference)))

    @property
    def pairs(self) -> int:
        return len(self.d)

    def interval(self) -> tuple[float, float, float]:
        """(ratio, low, high) of candidate over reference at this look's level; NaN below two pairs."""
        n = len(self.d)
        if n == 0:
            return math.nan, math.nan, math.nan
        mean = float(np.mean(self.d))
        if n < 2:
            return math.exp(mean), math.nan, math.nan
        half = float(stats.t.ppf(1 - (1 - self.level) / 2, n - 1)) * float(np.std(self.d, ddof=1)) / math.sqrt(n)
        return math.exp(mean), math.exp(mean - half), math.exp(mean + half)

    def verdict(self) -> str:
        """``better`` (the interval clears 1 + min_effect), ``not better`` (its upper end is below it),
        ``undecided`` (look again), or ``not distinguishable`` (at the cap, still undecided; or earlier when
        :meth:`futile`)."""
        if self.pairs < self.min_pairs:
            return "undecided"
        _, lo, hi = self.interval()
        bar = 1 + self.min_effect
        if lo > bar:
            return "better"
        if hi < bar:
            return "not better"
        return "not distinguishable" if self.pairs >= self.max_pairs or self.futile() else "undecided"

    def futile(self) -> bool:
        """Whether the pairs left cannot decide: with this mean and spread, the interval at ``max_pairs`` would
        still hold both 1 and 1 + min_effect (a no-op's interval on a noisy machine; measured on this 2-core VM,
        every step of a quick ``investigate`` ran to its cap of 6 pairs at intervals like 0.60-1.47). Stopping
        there can only drop a keep, never add one: the false-keep rate does not grow."""
        n = len(self.d)
        if self.futility is False or n < max(self.min_pairs, 3) or n >= self.max_pairs:
            return False
        mean, sd = float(np.mean(self.d)), float(np.std(self.d, ddof=1))
        sd *= math.sqrt((n - 1) / float(stats.chi2.ppf(1 - FUTILITY_SD_ALPHA, n - 1)))  # its lower bound
        half = float(stats.t.ppf(1 - (1 - self.level) / 2, self.max_pairs - 1)) * sd / math.sqrt(self.max_pairs)
        return mean - half < 0.0 and mean + half > math.log(1 + self.min_effect)

    def median_ratio(self) -> float:
        """exp(median d): a cross-check (a tenant's dip hits one arm and shows as one outlying d)."""
        return math.exp(float(np.median(self.d))) if self.d else math.nan


def spread_of(ratio: float, high: float, pairs: int, level: float) -> float:
    """The per-pair SD of the log figure behind a t interval (``ratio`` and its upper end ``high`` from
    ``pairs`` pairs at ``level``); NaN below two pairs."""
    if pairs < 2 or not (math.isfinite(ratio) and math.isfinite(high)) or ratio <= 0:
        return math.nan
    t = float(stats.t.ppf(1 - (1 - level) / 2, pairs - 1))
    return math.log(high / ratio) * math.sqrt(pairs) / t


def pairs_to_tell(sd: float, min_effect: float, level: float, cap: int = 100_000) -> float:
    """The fewest pairs whose t interval at ``level`` is no wider on each side than the minimum effect, at a
    per-pair SD ``sd`` of the log figure: the smallest ``n`` with ``t(n - 1) * sd / sqrt(n) <= log(1 + min_effect)``
    (NaN for no spread or no effect; ``cap`` when even that many would not do). That many pairs tell a true
    effect of twice the bar, or none, from the bar; one nearer the bar needs more. It tells a reader why a step
    was "not distinguishable": 3 pairs at a 34% SD and a 5% bar at 99.8% need about 450."""
    if not math.isfinite(sd) or sd <= 0 or min_effect <= 0:
        return math.nan
    bar = math.log1p(min_effect)
    z = float(stats.norm.ppf(1 - (1 - level) / 2))
    n = max(2, math.ceil((z * sd / bar) ** 2))  # the normal answer: a lower bound of the t one
    while n < cap and float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) * sd / math.sqrt(n) > bar:
        n += 1
    return float(min(n, cap))


def _floor(x: float) -> float:
    if x is None or not math.isfinite(x):
        return 1e9 if x == math.inf else 1e-9
    return max(float(x), 1e-9)
