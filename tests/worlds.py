"""Simulated worlds with known answers for the engine's tests and ``bench/keep_rule.py``: every
configuration an M/D/1 server (deterministic service, Poisson arrivals, computed, never slept), with
lognormal run-to-run noise, a slow drift, deep dips, and a client that sometimes lags. SIMULATED: nothing
here is a measurement.

A window is what the real measure does with a server it keeps warm: arrivals at the window's rate for a
warm-up, then the measured window, then a cool-down that answers everything the window queued (so the next
window starts from an empty queue, unless ``carry_queue``: a harsher world whose backlog waits for the next
window of the same configuration).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from tuning.experiments.trial import Trial

GAP_S = 0.5  # between two windows the server drains this long
WARMUP_S = 1.0  # arrivals before the measured window (the engine's warm-up)
CONCURRENCY = 16  # the closed loop's clients


def served(arrivals: np.ndarray, service_s: float, start_free: float) -> np.ndarray:
    """Completion times of one deterministic server in arrival order, free from ``start_free`` on
    (Lindley's recursion, vectorised: d_i = max(a_i, d_{i-1}) + s)."""
    i = np.arange(arrivals.size, dtype=float)
    shifted = np.maximum(arrivals - i * service_s, start_free)
    return np.maximum.accumulate(shifted) + (i + 1) * service_s


def paced(base_rate: float, rules: list[tuple[Callable[[Any], bool], float]], knobs: Any) -> float:
    """``base_rate`` times the factor of every rule whose test holds for ``knobs``."""
    return base_rate * math.prod(factor for test, factor in rules if test(knobs))


@dataclass
class World:
    """``rules``: (test(knobs), factor) pairs multiplying the service rate; ``floor_ms(knobs)``: a fixed
    latency every answer of that configuration carries (a wait, a slow path)."""

    rules: list[tuple[Callable[[Any], bool], float]] = field(default_factory=list)
    base_rate: float = 100.0
    noise: float = 0.10
    drift: float = 0.20  # peak to peak, a sine over drift_period_s of simulated time
    drift_period_s: float = 1200.0
    dip_share: float = 0.05
    dip: float = 0.5
    lag_share: float = 0.0  # windows in which the client lags
    floor_ms: Callable[[Any], float] = lambda k: 0.0
    carry_queue: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.phase = self.rng.uniform(0, 2 * math.pi)
        self.clock = 0.0
        self.last: Any = None
        self.free_at = 0.0  # when the kept server's queue empties, relative to the next window's start
        self.calls = 0

    def service_rate(self, knobs: Any) -> float:
        return paced(self.base_rate, self.rules, knobs)

    def _pace(self, knobs: Any) -> float:
        mu = self.service_rate(knobs) * math.exp(self.rng.normal(0.0, self.noise))
        mu *= 1 + self.drift / 2 * math.sin(2 * math.pi * self.clock / self.drift_period_s + self.phase)
        if self.rng.random() < self.dip_share:
            mu *= self.dip
        return mu

    def __call__(self, knobs: Any, *, rate: float | None = None, record: bool = False, seed: int | None = None,
                 window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        self.calls += 1
        window = float(window_s or 3.0)
        settle = WARMUP_S if warmup_s is None else warmup_s  # a hold asks for its own unmeasured start
        mu = self._pace(knobs)
        floor = self.floor_ms(knobs)
        warm = knobs == self.last
        self.last = knobs
        self.clock += window + settle + GAP_S
        if rate is None:
            return self._closed(mu, window, floor)
        return self._open(mu, rate, window, floor, seed, warm, settle)

    def _closed(self, mu: float, window: float, floor: float) -> Trial:
        n = max(int(round(mu * window)), 0)  # a saturated deterministic server: its pace, not a Poisson count
        lat = np.full(max(n, 1), CONCURRENCY / mu * 1000 + floor)
        self.free_at = 0.0
        return Trial(qps=n / window, p99_ms=float(lat[0]), p50_ms=float(lat[0]), ok=n, submitted=n, window_s=window,
                     latencies_ms=lat[:n], model_busy=1.0)

    def _open(self, mu: float, rate: float, window: float, floor: float, seed: int | None, warm: bool,
              settle: float = WARMUP_S) -> Trial:
        rng = np.random.default_rng(seed) if seed is not None else self.rng
        total = settle + window
        arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * total * 1.2) + 20))
        arrivals = arrivals[arrivals < total]
        start_free = max(self.free_at - GAP_S, 0.0) if warm and self.carry_queue else 0.0
        done = served(arrivals, 1.0 / mu, start_free)
        measured = arrivals >= settle
        lags = np.abs(self.rng.normal(0.0, 0.3, measured.sum()))
        if self.rng.random() < self.lag_share:  # the client fell behind: 5% of its sends 20-200 ms late
            late = self.rng.random(lags.size) < 0.05
            lags[late] += self.rng.uniform(20, 200, late.sum())
        lat = (done - arrivals)[measured] * 1000 + floor + lags
        self.free_at = max(float(done[-1]) - total, 0.0) if done.size else 0.0
        ok_in_window = int(((done >= settle) & (done < total)).sum())
        n = int(measured.sum())
        return Trial(qps=ok_in_window / window, p99_ms=float(np.percentile(lat, 99)) if n else math.nan,
                     p50_ms=float(np.median(lat)) if n else math.nan, ok=n, submitted=n, window_s=window, rate=rate,
                     offered_rate=n / window, latencies_ms=lat, lags_ms=lags, arrivals_s=arrivals[measured],
                     model_busy=min(rate / mu, 1.0))


def seam_kwargs(knee: int = 16, cosine: float = 0.9999, lengths: int = 64) -> dict[str, Any]:
    """What ``run_ladder`` needs besides the measure to run without the model: the sweep's knee, half
    precision's accuracy and the token lengths."""
    return {"sweep": lambda k: SimpleNamespace(knee=knee, summary=lambda: {"knee": knee}),
            "accuracy": lambda dtypes: {d: cosine for d in dtypes},
            "lengths": [lengths // 2] * 50 + [lengths] * 50 + [2 * lengths] * 20}


def batched(k: Any) -> bool:
    return k.batch_size > 1


def bf16(k: Any) -> bool:
    return k.dtype == "bf16"


def fast_tokenizer(k: Any) -> bool:
    return k.tokenizer == "fast"


def bucketed_batches(k: Any) -> bool:
    return k.padding == "bucket" and k.batch_size > 1


WORLDS: dict[str, dict[str, Any]] = {
    "no knob matters": {"rules": []},
    "two knobs matter, with an interaction": {"rules": [(batched, 1.4), (bf16, 1.2), (bucketed_batches, 1.1)]},
    "one knob worth +10%": {"rules": [(fast_tokenizer, 1.1)]},
    "a knob gains throughput but breaks the target": {"rules": [(fast_tokenizer, 1.3)],
                                                       "floor_ms": lambda k: 600.0 if k.tokenizer == "fast" else 0.0},
    "unreachable target": {"rules": [(batched, 1.4)], "floor_ms": lambda k: 400.0},
}
TARGET_MS = 300.0


def best_rate(world: World) -> float:
    """The best configuration's service rate in a world (every rule that helps, on)."""
    return world.base_rate * math.prod(f for _, f in world.rules if f > 1)


@functools.lru_cache(maxsize=None)
def steady_capacity(mu: float, target_ms: float, floor_ms: float = 0.0, arrivals: int = 400_000) -> float:
    """The highest Poisson rate at which an M/D/1 server of pace ``mu`` keeps at most 1% of its answers over
    ``target_ms`` in steady state (a long run after a burn-in, bisected): the truth a capacity is scored
    against. 0 when even an idle server misses the target."""
    if 1000.0 / mu + floor_ms > target_ms:
        return 0.0
    rng = np.random.default_rng(12345)
    gaps = rng.exponential(1.0, arrivals)

    def over(rate: float) -> float:
        a = np.cumsum(gaps / rate)
        lat = (served(a, 1.0 / mu, 0.0) - a)[arrivals // 10:] * 1000 + floor_ms
        return float((lat > target_ms).mean())
    lo, hi = 0.3 * mu, mu
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if over(mid) <= 0.01 else (lo, mid)
    return lo
