"""``tune``'s exploring strategies over a ``--space`` (``docs/deciding.md``, stage 1): the grid up to
:data:`GRID_MAX` configurations, coordinate descent beyond. A configuration is a dict of the space's values;
each is measured ``repeats`` closed-loop windows in a row (its server started once and kept warm), and the
candidates are ranked by their mean log-throughput. A configuration whose server fails is left out with its
error (:attr:`Explored.tables` ``errors``); the baseline (the first value of every knob) must come up.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from tuning.experiments.engine import Candidate, ConfigError, EngineSettings, Explored, Runner

GRID_MAX = 16
STRATEGIES = ("grid", "coordinate")
AS_IT_RUNS = "the service as it runs"  # the one configuration of an empty space (a running service, no lever)


def shown(key: str) -> str:
    """A configuration's label as a reader sees it: an empty space's one configuration has a name too."""
    return key or AS_IT_RUNS


def combos(space: dict[str, list[str]]) -> list[dict[str, str]]:
    names = list(space)
    return [dict(zip(names, vals)) for vals in itertools.product(*space.values())]


def strategy_for(space: dict[str, list[str]], name: str | None = None) -> str:
    """The strategy to use: ``name`` when given (checked), else the grid up to :data:`GRID_MAX` configurations."""
    if name is not None:
        if name not in STRATEGIES:
            raise ValueError(f"--strategy {name!r}: use one of {', '.join(STRATEGIES)}")
        return name
    return "grid" if len(combos(space)) <= GRID_MAX else "coordinate"


class _Scores:
    """Each configuration's log-throughput windows, and the errors of those that could not be measured."""

    def __init__(self, runner: Runner, settings: EngineSettings, label: Callable[[Any], str]):
        self.runner, self.settings, self.label = runner, settings, label
        self.logs: dict[str, list[float]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.errors: dict[str, str] = {}
        self.seed = settings.seed

    def measure(self, config: dict[str, str]) -> float:
        """The configuration's mean log-throughput (measured once; -inf after an error)."""
        key = self.label(config)
        if key in self.errors:
            return -math.inf
        if key not in self.logs:
            self.configs[key] = config
            got = []
            try:
                for _ in range(self.settings.grid_repeats):
                    self.runner.status(f"{shown(key)}: window {len(got) + 1} of {self.settings.grid_repeats}")
                    got.append(max(self.runner.throughput("grid", config, self.seed), -20.0))
                    self.seed += 1
            except ConfigError as exc:
                self.errors[key] = str(exc)
                return -math.inf
            self.logs[key] = got
        return float(np.mean(self.logs[key]))

    def explored(self, baseline: dict[str, str]) -> Explored:
        base_key = self.label(baseline)
        if base_key in self.errors:
            raise ConfigError(f"the baseline ({shown(base_key)}) could not be measured: {self.errors[base_key]}")
        base = self.logs[base_key]
        candidates = []
        for key, ys in self.logs.items():
            d = float(np.mean(ys)) - float(np.mean(base))
            low, high = _welch(ys, base)
            candidates.append(Candidate(self.configs[key], key, d, low, high, qps=math.exp(float(np.mean(ys)))))
        candidates.sort(key=lambda c: -c.log_ratio)
        rows = [{"configuration": c.label, "throughput_ratio": round(math.exp(c.log_ratio), 4),
                 "low": _exp(c.low), "high": _exp(c.high), "qps": round(c.qps, 3),
                 "windows": len(self.logs[c.label])} for c in candidates]
        # no window SD for the confirmation's pair re-measure: a configuration's windows run back to back, so
        # their spread leaves out the drift between them and would replace honest pairs
        return Explored(candidates, math.exp(float(np.mean(base))), {"ranked": rows, "errors": dict(self.errors)})


def _exp(x: float) -> float | None:
    return round(math.exp(x), 4) if math.isfinite(x) else None


def _welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The 95% Welch interval of mean(a) - mean(b) (NaN with fewer than two windows on a side)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        d = float(np.mean(a) - np.mean(b))
        return d, d
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se
    d = float(np.mean(a) - np.mean(b))
    return d - half, d + half


def grid(space: dict[str, list[str]], settings: EngineSettings, label: Callable[[Any], str]) -> Callable[[Runner], Explored]:
    """Every configuration, in a random order (the baseline first: it must come up)."""
    def explore(runner: Runner) -> Explored:
        scores = _Scores(runner, settings, label)
        configs = combos(space)
        rest = configs[1:]
        order = np.random.default_rng(settings.seed).permutation(len(rest))
        for config in [configs[0]] + [rest[i] for i in order]:
            scores.measure(config)
        return scores.explored(configs[0])
    return explore


def coordinate(space: dict[str, list[str]], settings: EngineSettings, label: Callable[[Any], str],
               rounds: int = 3) -> Callable[[Runner], Explored]:
    """Coordinate descent from the baseline: each knob's values in turn, the others fixed, moving to the best
    mean, until a round changes nothing (at most ``rounds``)."""
    def explore(runner: Runner) -> Explored:
        scores = _Scores(runner, settings, label)
        names = list(space)
        current = {n: space[n][0] for n in names}
        best = scores.measure(current)
        for _ in range(rounds):
            moved = False
            for n in names:
                for v in space[n]:
                    trial = {**current, n: v}
                    got = scores.measure(trial)
                    if got > best + math.log1p(settings.min_effect):
                        best, current, moved = got, trial, True
            if not moved:
                break
        return scores.explored({n: space[n][0] for n in names})
    return explore


SEARCHES: dict[str, Callable[..., Callable[[Runner], Explored]]] = {"grid": grid, "coordinate": coordinate}
