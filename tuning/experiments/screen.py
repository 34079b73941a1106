"""``investigate``'s exploring strategy (``docs/deciding.md``, stage 1): a two-level factorial screen of the
pipeline's binary knobs on sustained throughput, then a line search along batch size and max wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tuning.experiments.design import fit_effects, ranked_levels, term_names, two_level_design
from tuning.experiments.engine import Candidate, EngineSettings, Explored, Runner, paired_log_ratios
from tuning.experiments.factors import apply_levels

MAX_MOVES = 3  # the line search moves at most this many times along one knob


@dataclass
class LineSpace:
    """What the line search walks: batch sizes (x2 and /2 from the winner's, within ``max_batch``) and the
    batcher's max waits."""

    max_batch: int = 256
    waits_ms: tuple[float, ...] = (5.0,)


def screen(base: Any, highs: dict[str, dict[str, Any]], settings: EngineSettings, label: Callable[[Any], str],
           line: LineSpace | None = None) -> Callable[[Runner], Explored]:
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
        y = []
        for i, cfg in enumerate(configs):
            runner.status(f"screen {i + 1}/{len(configs)}: {label(cfg)}")
            y.append(runner.throughput("screen", cfg, settings.seed + i))
        y = np.maximum(np.asarray(y), -20.0)  # a configuration with no ok answer: a large loss, finite
        order = np.arange(len(y))
        effects = fit_effects(factors, design, y, order, interactions)
        again = effects.outliers(design, y, order)
        for i in again:  # measured once more, at its own place in time (the drift term); the second one stands
            runner.status(f"screen run {i + 1} again: the model cannot explain it")
            y[i] = max(runner.throughput("screen", configs[i], settings.seed + 50_000 + int(i)), -20.0)
            order[i] = len(y) + again.index(i)
        if again:
            effects = fit_effects(factors, design, y, order, interactions)
        low = effects.predict([-1] * len(factors))
        base_qps = math.exp(low)
        candidates = []
        for levels, pred in ranked_levels(effects):
            cfg = apply_levels(base, highs, dict(zip(factors, levels)))
            candidates.append(Candidate(cfg, label(cfg), pred - low, qps=math.exp(pred)))
        rows = [{"run": i, **dict(zip(factors, map(int, row))), "change": label(c), "qps": round(math.exp(v), 4)}
                for i, (row, c, v) in enumerate(zip(design, configs, y))]
        tables: dict[str, Any] = {"effects": effects.rows(), "design": rows, "factors": factors, "measured_again": again,
                                  "drift_per_run": round(effects.drift / max(len(y), 1), 6), "dof": effects.dof}
        if line is not None and candidates and runner.describe(candidates[0].config) != runner.describe(base):
            winner, moves = line_search(runner, candidates[0], settings, line, label)
            tables["line"] = moves
            candidates[0] = winner
        tables["window_sd"] = round(effects.sigma, 6) if math.isfinite(effects.sigma) else None
        return Explored(candidates, base_qps, tables, effects.sigma)
    return explore


def line_search(runner: Runner, start: Candidate, settings: EngineSettings, line: LineSpace,
                label: Callable[[Any], str]) -> tuple[Candidate, list[dict[str, Any]]]:
    """Along batch size (up, else down) and then max wait: a neighbour whose mean paired log-ratio over
    ``line_pairs`` pairs clears the minimum effect becomes the winner."""
    current, gain = start.config, start.log_ratio
    moves: list[dict[str, Any]] = []
    bar = math.log1p(settings.min_effect)
    seed = settings.seed + 20_000
    if current.batch_size > 1:
        moved_up = False
        for step in (2.0, 0.5):  # up while it helps; down only when the first step up did not
            if step == 0.5 and moved_up:
                break
            for _ in range(MAX_MOVES):
                size = int(current.batch_size * step)
                if size < 2 or size > line.max_batch:
                    break
                nxt = current.replace(batch_size=size)
                d, _, _ = paired_log_ratios(runner, "line", current, nxt, settings.line_pairs, seed)
                seed += settings.line_pairs
                moved = float(np.mean(d)) > bar
                moves.append(_move_row("batch_size", size, d, moved, label(nxt)))
                if not moved:
                    break
                current, gain = nxt, gain + float(np.mean(d))
                moved_up = moved_up or step > 1
        for wait in line.waits_ms:
            if current.max_wait_ms == wait:
                continue
            nxt = current.replace(max_wait_ms=float(wait))
            d, _, _ = paired_log_ratios(runner, "line", current, nxt, settings.line_pairs, seed)
            seed += settings.line_pairs
            moved = float(np.mean(d)) > bar
            moves.append(_move_row("max_wait_ms", wait, d, moved, label(nxt)))
            if moved:
                current, gain = nxt, gain + float(np.mean(d))
    return Candidate(current, label(current), gain, qps=start.qps), moves


def _move_row(knob: str, value: Any, d: Sequence[float], moved: bool, change: str) -> dict[str, Any]:
    return {"knob": knob, "value": value, "ratio": round(math.exp(float(np.mean(d))), 4), "pairs": len(d),
            "moved": moved, "change": change}
