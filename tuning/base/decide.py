"""Intervals used where a figure is reported: the p99's distribution-free interval, and the paired ratio of
two arms measured in interleaved pairs (``bench/sim_fidelity.py``). Pure statistics (no timing, no torch).
The engine's decisions are in :mod:`tuning.experiments.judge` (``docs/deciding.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats

P99_LEVEL = 0.95  # the p99 interval's coverage


def quantile_interval(values: Sequence[float], q: float = 0.99, level: float = P99_LEVEL,
                      deff: float = 1.0) -> tuple[float | None, float | None]:
    """Distribution-free interval of the ``q`` quantile from order statistics (None where the sample cannot
    bound it: an upper bound of the p99 at 95% needs at least 368 values). ``deff``: the values' design effect
    (outcomes that move together in bursts): the order statistics' ranks are taken on n / deff independent
    values and read at the same fraction of the whole sample."""
    x = np.sort(np.asarray(values, dtype=float))
    total = x.size
    if total == 0:
        return None, None
    if not deff >= 1:
        raise ValueError(f"deff={deff!r}: a design effect is at least 1 (1: independent values)")
    n = max(int(total / deff), 1)
    a = (1 - level) / 2
    # lower: the largest k with P(Bin(n, q) < k) <= a, i.e. x_(k) (1-based) is below the quantile with 1 - a
    k_lo = int(stats.binom.ppf(a, n, q))
    while k_lo > 0 and stats.binom.cdf(k_lo - 1, n, q) > a:
        k_lo -= 1
    k_hi = int(stats.binom.ppf(1 - a, n, q)) + 1
    while k_hi <= n and stats.binom.cdf(k_hi - 1, n, q) < 1 - a:
        k_hi += 1
    # rank k of n read at its fraction of the whole sample: rounded down for the lower end, up for the upper
    lo = float(x[min(max(math.floor(k_lo * total / n), 1), total) - 1]) if k_lo >= 1 else None
    hi = float(x[min(max(math.ceil(k_hi * total / n), 1), total) - 1]) if k_hi <= n else None
    return lo, hi


@dataclass
class Paired:
    """Interleaved pairs of arms A and B; ``d`` per pair is log(B / A) of a figure where larger is better,
    with its t interval at ``level``."""

    level: float = 0.95
    d: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.5 < self.level < 1:
            raise ValueError(f"level={self.level!r} must be in (0.5, 1): the interval's two-sided coverage")

    @staticmethod
    def order(i: int) -> tuple[str, str]:
        """The arms of pair ``i`` (0-based): AB, BA, BA, AB, AB, BA, BA, AB, ... (every four runs ABBA or BAAB: a
        linear drift cancels over every two pairs)."""
        flips = (i % 2) ^ ((i // 2) % 2)
        return ("B", "A") if flips else ("A", "B")

    def add(self, reference: float, candidate: float) -> None:
        """One pair's figures (larger is better); zero or a non-finite figure is floored, never dropped."""
        self.d.append(math.log(_floor(candidate)) - math.log(_floor(reference)))

    @property
    def pairs(self) -> int:
        return len(self.d)

    def interval(self) -> tuple[float, float, float]:
        """(ratio, low, high) of B over A at ``level``; NaN below two pairs."""
        n = len(self.d)
        if n == 0:
            return math.nan, math.nan, math.nan
        mean = float(np.mean(self.d))
        if n < 2:
            return math.exp(mean), math.nan, math.nan
        half = float(stats.t.ppf(1 - (1 - self.level) / 2, n - 1)) * float(np.std(self.d, ddof=1)) / math.sqrt(n)
        return math.exp(mean), math.exp(mean - half), math.exp(mean + half)

    def median_ratio(self) -> float:
        """exp(median d): a cross-check (a tenant's dip hits one arm and shows as one outlying d)."""
        return math.exp(float(np.median(self.d))) if self.d else math.nan


def _floor(x: float) -> float:
    if x is None or not math.isfinite(x):
        return 1e9 if x == math.inf else 1e-9
    return max(float(x), 1e-9)
