"""``investigate``'s exploring strategy (``docs/deciding.md``, stage 1): a two-level factorial screen of the
pipeline's binary knobs on sustained throughput. Its ranking only proposes: the confirmation and the target
check decide what ships. The same runs' tails (ln p99 / p50 of each window) name the knobs that widen the tail,
so that a bundle is checked without them next (:func:`tail_wideners`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tuning.experiments.design import fit_effects, ranked_levels, term_names, two_level_design
from tuning.experiments.engine import Candidate, EngineSettings, Explored, Runner
from tuning.experiments.factors import apply_levels


def screen(base: Any, highs: dict[str, dict[str, Any]], settings: EngineSettings,
           label: Callable[[Any], str]) -> Callable[[Runner], Explored]:
    """The strategy: ``highs`` maps each screened factor to its high level's changes (the low level is
    ``base``'s)."""
    def explore(runner: Runner) -> Explored:
        factors = list(highs)
        if not factors:
            qps = runner.run("screen", base, None, settings.seed).qps
            return Explored([Candidate(base, label(base), 0.0, qps=qps)], qps, {"effects": [], "design": []})
        rng = np.random.default_rng(settings.seed)
        design = two_level_design(len(factors), settings.screen_runs, rng, settings.interactions)
        # two-way interactions too whenever the design holds the runs to estimate them with 8 degrees of freedom
        # left (a half fraction of 6 factors has 32): a knob that pays only without another shows in none of the mains
        interactions = settings.interactions or len(design) >= 2 + len(term_names(factors)) + 8
        configs = [apply_levels(base, highs, dict(zip(factors, row))) for row in design]
        y, tails = [], []
        for i, cfg in enumerate(configs):
            runner.status(f"screen {i + 1}/{len(configs)}: {label(cfg)}")
            y.append(runner.throughput("screen", cfg, settings.seed + i))
            tails.append(tail_of(runner.windows[-1]))
        y = np.maximum(np.asarray(y), -20.0)  # a configuration with no ok answer: a large loss, finite
        order = np.arange(len(y))
        effects = fit_effects(factors, design, y, order, interactions)
        again = effects.outliers(design, y, order)
        for i in again:  # measured once more, at its own place in time (the drift term); the second one stands
            runner.status(f"screen run {i + 1} again: the model cannot explain it")
            y[i] = max(runner.throughput("screen", configs[i], settings.seed + 50_000 + int(i)), -20.0)
            tails[i] = tail_of(runner.windows[-1])
            order[i] = len(y) + again.index(i)
        if again:
            effects = fit_effects(factors, design, y, order, interactions)
        low = effects.predict([-1] * len(factors))
        base_qps = math.exp(low)
        wideners, tail_rows = tail_wideners(factors, design, tails, order)
        candidates = []
        for levels, pred in ranked_levels(effects):
            cfg = apply_levels(base, highs, dict(zip(factors, levels)))
            on = tuple(f for f, v in zip(factors, levels) if v > 0 and f in wideners)
            candidates.append(Candidate(cfg, label(cfg), pred - low, qps=math.exp(pred), widens=on))
        rows = [{"run": i, **dict(zip(factors, map(int, row))), "change": label(c), "qps": round(math.exp(v), 4)}
                for i, (row, c, v) in enumerate(zip(design, configs, y))]
        tables: dict[str, Any] = {"effects": effects.rows(), "design": rows, "factors": factors, "measured_again": again,
                                  "drift_per_run": round(effects.drift / max(len(y), 1), 6), "dof": effects.dof}
        tables["window_sd"] = round(effects.sigma, 6) if math.isfinite(effects.sigma) else None
        tables["tail"] = tail_rows
        return Explored(candidates, base_qps, tables, effects.sigma)
    return explore


def tail_of(w: Any) -> float:
    """A closed-loop window's tail: ln(p99 / p50) (NaN when either is unknown or not positive)."""
    if math.isfinite(w.p99_ms) and math.isfinite(w.p50_ms) and w.p50_ms > 0 and w.p99_ms > 0:
        return math.log(w.p99_ms / w.p50_ms)
    return math.nan


def tail_wideners(factors: list[str], design: np.ndarray, tails: list[float],
                  order: np.ndarray) -> tuple[set[str], list[dict[str, Any]]]:
    """The factors whose high level widens the tail: a main effect on ln(p99 / p50) above zero whose interval
    at the screen's level excludes zero (a mains-only fit on the screen's own runs). A knob can raise throughput
    and fatten the tail (a cheaper call with a slow path); at a p99 target the second can cost more than the
    first gives, which only the target check can tell, so the engine checks a bundle without it next. Windows
    whose tail is unknown are left out; none are named when fewer than 4 runs more than factors are left.
    Returns the factors and the fit's rows for the report."""
    t = np.asarray(tails, dtype=float)
    known = np.isfinite(t)  # a window without a tail (no answers) is left out, not the whole fit
    if known.sum() < len(factors) + 4:
        return set(), []
    fit = fit_effects(factors, np.asarray(design)[known], t[known], np.asarray(order)[known], interactions=False)
    wide = {f for f, e, k in zip(fit.names, fit.estimate, fit.kept) if k and e > 0}
    return wide, [{**row, "widens": row["term"] in wide} for row in fit.rows()]
