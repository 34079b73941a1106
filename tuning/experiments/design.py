"""Two-level factorial screens and their effects (``docs/deciding.md``, stage 1).

Written here rather than taken from pyDOE: the designs needed are the full 2^k and the half fraction
whose last factor is the product of the others (resolution k), a few lines each, and the fit needs a
time covariate and pruning by interval that no design library provides.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

FULL_UP_TO = 4  # up to this many factors: the full 2^k; more: the half fraction of resolution k
# a term stays when its two-sided interval at this level excludes zero: a screening level (the confirmation, not
# the screen, bounds the false ships)
EFFECT_LEVEL = 0.80


def two_level_design(k: int, min_runs: int, rng: np.random.Generator, interactions: bool = True) -> np.ndarray:
    """Rows of -1/+1 levels for ``k`` factors: the full 2^k (k <= :data:`FULL_UP_TO`) or its half fraction
    with the last column the product of the others, repeated until it has ``min_runs`` rows and at least 4
    more rows than the effects model has terms, each repetition in its own random order (a block)."""
    if k < 1:
        raise ValueError(f"k={k}: a screen needs at least one factor")
    full = np.array(list(itertools.product((-1, 1), repeat=k)), dtype=int)
    block = full if k <= FULL_UP_TO else full[np.prod(full[:, :-1], axis=1) == full[:, -1]]
    terms = 2 + k + (k * (k - 1) // 2 if interactions else 0)  # intercept, time, mains, two-way interactions
    rows: list[np.ndarray] = []
    while sum(len(b) for b in rows) < max(min_runs, terms + 4):
        half = len(rows) % 2 == 1 and k > FULL_UP_TO  # the other half next: together the full factorial
        b = full[np.prod(full[:, :-1], axis=1) != full[:, -1]] if half else block
        rows.append(b[rng.permutation(len(b))])
    return np.vstack(rows)


def term_names(factors: Sequence[str], interactions: bool = True) -> list[str]:
    mains = list(factors)
    pairs = [f"{a}:{b}" for a, b in itertools.combinations(factors, 2)] if interactions else []
    return mains + pairs


def model_matrix(levels: np.ndarray, order: np.ndarray | None = None, interactions: bool = True) -> np.ndarray:
    """Columns: intercept, the run order centred (drift), each factor, each two-way product (``interactions``)."""
    levels = np.asarray(levels, dtype=float)
    n, k = levels.shape
    order = None if order is None else np.asarray(order, dtype=float)
    time = np.zeros(n) if order is None else (order - order.mean()) / max(n, 1)
    cols = [np.ones(n), time] + [levels[:, i] for i in range(k)]
    if interactions:
        cols += [levels[:, i] * levels[:, j] for i, j in itertools.combinations(range(k), 2)]
    return np.column_stack(cols)


@dataclass
class Effects:
    """A least-squares fit of log-throughput on the factors: every term's estimate (half the change from
    the low to the high level, in log units), its standard error and whether it was kept."""

    factors: list[str]
    names: list[str]
    estimate: np.ndarray
    se: np.ndarray
    dof: int
    kept: np.ndarray
    intercept: float
    drift: float
    residuals: np.ndarray
    leverage: np.ndarray
    interactions: bool = True
    sigma: float = math.nan  # the residual SD of one window's log-throughput

    def active(self) -> list[str]:
        """Factors with a kept main effect or a kept interaction."""
        on = set()
        for name, keep in zip(self.names, self.kept):
            if keep:
                on.update(name.split(":"))
        return [f for f in self.factors if f in on]

    def predict(self, levels: Sequence[int]) -> float:
        """Predicted log-throughput at ``levels`` (-1/+1 per factor) from the kept terms."""
        x = model_matrix(np.asarray([levels]), interactions=self.interactions)[0, 2:]
        return self.intercept + float(np.sum(np.where(self.kept, self.estimate, 0.0) * x))

    def rows(self) -> list[dict]:
        t = stats.t.ppf(0.5 + EFFECT_LEVEL / 2, max(self.dof, 1))
        return [{"term": n, "ratio": math.exp(2 * e), "low": math.exp(2 * (e - t * s)), "high": math.exp(2 * (e + t * s)),
                 "kept": bool(k)} for n, e, s, k in zip(self.names, self.estimate, self.se, self.kept)]


    def outliers(self, levels: np.ndarray, log_y: Sequence[float], order: Sequence[int] | None = None) -> list[int]:
        """Runs the model cannot explain, such as a window during which the machine was taken away:
        :func:`tuning.experiments.judge.outlying` of the residuals of a robust fit (soft-L1 loss), where a
        least-squares fit would spread two such runs over the effects and hide them."""
        from scipy.optimize import least_squares

        from tuning.experiments.judge import outlying, robust_sd

        x = model_matrix(levels, None if order is None else np.asarray(order), self.interactions)
        y = np.asarray(log_y, dtype=float)
        start = np.linalg.lstsq(x, y, rcond=None)[0]
        scale = robust_sd(y - x @ start)  # the data's own spread: the least-squares residuals' robust SD
        if not scale > 0:
            return []
        fit = least_squares(lambda b: x @ b - y, start, loss="soft_l1", f_scale=scale)
        return outlying(y - x @ fit.x, floor=scale)


def fit_effects(factors: Sequence[str], levels: np.ndarray, log_y: Sequence[float],
                order: Sequence[int] | None = None, interactions: bool = True) -> Effects:
    """Fit and prune (``docs/deciding.md``): terms whose 80% interval excludes zero are kept, and the main
    effects under a kept interaction with them."""
    factors = list(factors)
    y = np.asarray(log_y, dtype=float)
    x = model_matrix(levels, None if order is None else np.asarray(order), interactions)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    rank = np.linalg.matrix_rank(x)
    dof = int(len(y) - rank)
    sigma2 = float(resid @ resid) / dof if dof > 0 else math.inf
    xtx_inv = np.linalg.pinv(x.T @ x)
    cov = sigma2 * xtx_inv
    leverage = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    se = np.sqrt(np.clip(np.diag(cov), 0, None))[2:]
    est = beta[2:]
    t = stats.t.ppf(0.5 + EFFECT_LEVEL / 2, max(dof, 1))
    kept = np.abs(est) > t * se if dof > 0 else np.zeros(len(est), dtype=bool)
    names = term_names(factors, interactions)
    for i, name in enumerate(names):  # hierarchy: a kept interaction keeps its main effects
        if kept[i] and ":" in name:
            for f in name.split(":"):
                kept[names.index(f)] = True
    return Effects(factors, names, est, se, dof, kept, float(beta[0]), float(beta[1]), resid, leverage, interactions,
                   math.sqrt(sigma2) if math.isfinite(sigma2) else math.nan)


def ranked_levels(effects: Effects) -> list[tuple[tuple[int, ...], float]]:
    """Every combination of the active factors' levels (the others at their low level), best predicted
    first; ties go to the combination with fewer factors changed."""
    active = effects.active()
    idx = [effects.factors.index(f) for f in active]
    out = []
    for combo in itertools.product((-1, 1), repeat=len(active)):
        levels = [-1] * len(effects.factors)
        for i, v in zip(idx, combo):
            levels[i] = v
        out.append((tuple(levels), effects.predict(levels)))
    out.sort(key=lambda p: (-round(p[1], 12), sum(v > 0 for v in p[0])))
    return out
