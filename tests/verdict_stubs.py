"""Measurements with known answers for the verdict's tests: a deterministic-service queue (M/D/1 under
Poisson arrivals, computed, not slept) and a closed loop with gaussian run-to-run noise."""

from __future__ import annotations

import math

import numpy as np

from tuning.experiments.trial import Trial


def md1_latencies(rate: float, service_s: float, n: int, warm: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Latencies (ms) of ``n`` requests after ``warm`` discarded ones, one worker, completion at
    max(arrival, previous completion) + service; and the measured window's length (s)."""
    gaps = rng.exponential(1.0 / rate, n + warm)
    arrivals = np.cumsum(gaps)
    done = np.empty_like(arrivals)
    prev = 0.0
    for i, a in enumerate(arrivals):
        prev = (a if a > prev else prev) + service_s
        done[i] = prev
    lat = (done - arrivals)[warm:] * 1000
    window = arrivals[-1] - arrivals[warm]
    return lat, window


class QueueStub:
    """A configuration's service rate is ``base_rate`` times the factor of every rule its knobs match, times
    a lognormal run-to-run noise of ``noise``; open loop: M/D/1 at the asked rate; closed loop: saturated.

    ``p99_floor_ms(knobs)`` adds a fixed latency to every request (a step that makes every request slower)."""

    def __init__(self, rules=(), base_rate: float = 100.0, noise: float = 0.05, seed: int = 0, window: int = 400,
                 warm: int = 60, p99_floor_ms=None, fail=None, overload: str = "fixed"):
        if overload not in ("fixed", "queue"):
            raise ValueError(f"overload={overload!r}: 'fixed' (the same latencies past the knee whatever the "
                             "rate) or 'queue' (a queue that grows at rate - mu: the latency gate can tell arms)")
        self.rules, self.base_rate, self.noise, self.overload = list(rules), base_rate, noise, overload
        self.rng = np.random.default_rng(seed)
        self.window, self.warm = window, warm
        self.floor = p99_floor_ms or (lambda k: 0.0)
        self.fail = fail
        self.calls: list[tuple] = []

    def service_rate(self, knobs) -> float:
        mu = self.base_rate
        for test, factor in self.rules:
            if test(knobs):
                mu *= factor
        return mu

    def __call__(self, knobs, *, rate=None, record=False, seed=None):
        self.calls.append((knobs, rate))
        if self.fail is not None:
            self.fail(knobs)
        mu = self.service_rate(knobs) * math.exp(self.rng.normal(0.0, self.noise))
        if rate is None:
            n = self.window
            lat = np.full(n, 16 / mu * 1000) + self.floor(knobs)
            return Trial(qps=mu, p99_ms=float(np.percentile(lat, 99)), p50_ms=float(np.median(lat)), ok=n,
                         submitted=n, window_s=n / mu, latencies_ms=lat, model_busy=0.9)
        if rate >= mu:  # past the knee the queue only grows: in steady state every latency is unbounded
            n = self.window
            if self.overload == "queue":  # arrival k at k / rate, served at (k + 1) / mu after the warm-up's backlog
                k = np.arange(self.warm, self.warm + n, dtype=float)
                lat = ((k + 1) / mu - k / rate) * 1000.0 + self.floor(knobs)
            else:
                lat = np.linspace(1000, 60000, n)
            return Trial(qps=mu, p99_ms=float(np.percentile(lat, 99)), p50_ms=float(np.median(lat)), ok=n, submitted=n,
                         window_s=n / rate, rate=rate, offered_rate=rate, latencies_ms=lat)
        arrivals = self.rng if seed is None else np.random.default_rng(seed)  # the same seed: the same bursts
        lat, window = md1_latencies(rate, 1.0 / mu, self.window, self.warm, arrivals)
        served = float((lat / 1000 <= window).sum()) / window  # answered before the window closed (roughly)
        lat = lat + self.floor(knobs)
        return Trial(qps=served, p99_ms=float(np.percentile(lat, 99)), p50_ms=float(np.median(lat)), ok=lat.size,
                     submitted=lat.size, window_s=window, rate=rate, offered_rate=lat.size / window, latencies_ms=lat,
                     model_busy=min(rate / mu, 1.0))


class ClosedStub:
    """Closed loop only (the one-argument seam or rate=None): QPS 10 x rules' factors x lognormal noise."""

    def __init__(self, rules=(), noise: float = 0.05, seed: int = 0, p99=None):
        self.rules, self.noise, self.p99 = list(rules), noise, p99
        self.rng = np.random.default_rng(seed)

    def __call__(self, knobs, *, rate=None, record=False):
        assert rate is None
        qps = 10.0
        for test, factor in self.rules:
            if test(knobs):
                qps *= factor
        qps *= math.exp(self.rng.normal(0.0, self.noise))
        return Trial(qps=qps, p99_ms=self.p99(knobs) if self.p99 else 10_000 / qps, ok=100, submitted=100, window_s=10.0)


class SmoothStub:
    """The review's noise model at the target: a configuration's capacity scale ``mu`` (``base_rate`` times its
    rules' factors); at rate r the p99 is ``base_ms / (1 - r / mu)`` (a queue's shape, capped at 100x) times a
    lognormal figure noise of ``noise``, with exponential latencies whose 99th percentile is that p99 (so
    the count over a target is ``n * 100 ** (-target / p99)``, exactly). ``extra_ms(knobs)`` adds a fixed
    latency to every request (a batch wait: light-load latency as the reference's though the capacity is higher)."""

    def __init__(self, rules=(), base_rate: float = 100.0, base_ms: float = 40.0, noise: float = 0.05, seed: int = 0,
                 window: int = 1000, extra_ms=None):
        self.rules, self.base_rate, self.base_ms, self.noise = list(rules), base_rate, base_ms, noise
        self.rng = np.random.default_rng(seed)
        self.window = window
        self.quantiles = -np.log1p(-(np.arange(window) + 0.5) / window)  # Exp(1) at evenly spaced probabilities
        self.extra = extra_ms or (lambda k: 0.0)

    def __call__(self, knobs, *, rate=None, record=False):
        mu = self.base_rate
        for test, factor in self.rules:
            if test(knobs):
                mu *= factor
        wobble = math.exp(self.rng.normal(0.0, self.noise))
        if rate is None:
            return Trial(qps=mu * wobble, p99_ms=self.base_ms * 10 * wobble, ok=self.window, submitted=self.window,
                         window_s=self.window / mu)
        p99 = self.base_ms / max(1 - rate / mu, 0.01) * wobble
        lat = p99 * self.quantiles / math.log(100) + self.extra(knobs)
        served = min(rate, mu)
        return Trial(qps=served, p99_ms=float(np.percentile(lat, 99)), ok=self.window, submitted=self.window,
                     window_s=self.window / rate, rate=rate, offered_rate=rate, latencies_ms=lat)
