"""Simulated worlds the experiment engine was not built from, with their steady-state truths. SIMULATED:
every figure here is computed (Lindley's recursion, an event loop in Python), seeded, never slept.

``tests/worlds.py`` is the engine's own model: deterministic service, knob effects that multiply, i.i.d. noise,
a slow sine drift and i.i.d. dips. These worlds keep its seam and drop its assumptions:

- :class:`QueueWorld`: one FIFO server with deterministic, lognormal (sigma 1) or 97/3 short/long service, the
  mean set by the configuration's pace, and run-to-run pace noise per window (no drift, no dips). Its busy
  periods are long against a window, so the outcomes over a target come in bursts.
- :class:`BatchingWorld`: a mechanistic dynamic batcher. Texts of heavy-tailed token lengths; one server takes
  a batch when it is free (up to ``batch_size`` requests, waiting at most ``max_wait_ms`` after the batch's
  first arrival); a call costs ``c0 + c1 x batch x padded length`` (padded to its longest member, to its
  bucket, or to ``max_length``), the naive tokenizer adds a per-request CPU cost, bf16 makes a call 30%
  cheaper but sends 2% of calls down a 4x slow path, and a new server is 3x slower for its first 2 seconds.
  Its closed loop (16 clients, each sending again a short turnaround after its answer) is an event loop, so
  it splits batches as a real closed loop does.
- :class:`ClientLag`: a load generator whose send lag grows steeply as the rate approaches its ceiling, and
  which falls behind linearly above it.

The seam is ``world(knobs, *, rate=None, seed=None, window_s=None, record=False) -> Trial`` (see
``tuning/experiments/trial.py``): ``rate=None`` a closed loop of :data:`CONCURRENCY` clients over the window; a
number an open-loop Poisson window at that rate (arrivals for :data:`WARMUP_S`, then the measured window, then a
drain that answers everything). ``knobs`` is a :class:`tuning.knobs.Knobs` or a plain dict of knob values.

Each world's ``truth(knobs, target_ms)`` is the steady-state capacity: the highest Poisson rate at which at most
1% of outcomes exceed the target, from a long run (:data:`TRUTH_ARRIVALS` arrivals after a burn-in, common
random numbers across rates, the nominal pace, a warm server, no client lag: the server's capacity, not the
load generator's), found from saturation downwards and then bisected, and cached. ``best(space, target_ms)``
is the best configuration's truth over a space, and :func:`target_for` places a target so that a
configuration's truth falls at a given share of its saturation rate.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from tests.worlds import paced
from tuning.experiments.trial import Trial, p99_of
from tuning.knobs import Knobs

CONCURRENCY = 16  # the closed loop's clients
WARMUP_S = 1.0  # open loop: arrivals before the measured window (the engine's warm-up)
WINDOW_S = 3.0  # a window's length when the caller names none
OVER_SHARE = 0.01  # the target is met when at most this share of outcomes exceeds it (a p99)
TRUTH_ARRIVALS = 200_000  # measured arrivals of a truth's long run, after...
TRUTH_BURN_IN = 20_000  # ...this many arrivals from an empty server
TRUTH_SEED = 20_261_206  # the long runs' common random numbers
TRUTH_TOL = 0.005  # relative precision of a truth's bisection (the long run's own spread is about as wide)
SCOUT_TOL = 0.02  # ...which starts from a bracket this narrow found on a run a tenth as long
TRUTH_STEP = 0.9  # the downward search from saturation steps by this factor before bisecting

SERVICE_KINDS = ("deterministic", "lognormal", "mixture")
KNOB_DEFAULTS = {f.name: f.default for f in fields(Knobs)}


def knob(knobs: Any, name: str, aliases: Mapping[str, str] | None = None) -> Any:
    """A knob's value from a :class:`Knobs` or a plain dict of knob values (missing: the Knobs default); in a
    dict, ``aliases`` maps a Knobs name to the dict's own key (a service's knobs, say ``MAX_BATCH``)."""
    if isinstance(knobs, Mapping):
        return knobs.get((aliases or {}).get(name, name), KNOB_DEFAULTS[name])
    return getattr(knobs, name)


def when(name: str, *values: Any) -> Callable[[Any], bool]:
    """A rule's test: the knob ``name`` takes one of ``values``."""
    return lambda k: knob(k, name) in values


def config_key(knobs: Any) -> tuple:
    """A hashable identity of a configuration (a Knobs or a dict), for the cold start and caches."""
    items = knobs.items() if isinstance(knobs, Mapping) else ((f.name, getattr(knobs, f.name)) for f in fields(knobs))
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in items))


# --- queues ------------------------------------------------------------------------------------------

def fifo_done(arrivals: np.ndarray, service_s: np.ndarray, start_free: float = 0.0) -> np.ndarray:
    """Completion times of one FIFO server with per-request service times, in arrival order along the last axis
    (Lindley's recursion unrolled: d_i = S_i + max(start_free, max_{j<=i} a_j - S_{j-1}), S the running sum of
    service times), so a 2-D array holds independent windows, one a row."""
    total = np.cumsum(service_s, axis=-1)
    return total + np.maximum.accumulate(np.maximum(arrivals - (total - service_s), start_free), axis=-1)


def service_draws(kind: str, rng: np.random.Generator, size: Any, *, sigma: float = 1.0, long_share: float = 0.03,
                  long_factor: tuple[float, float] = (10.0, 20.0)) -> np.ndarray:
    """Service times of mean 1 (multiply by the mean): ``deterministic``; ``lognormal`` with log-sd ``sigma``;
    ``mixture``, a share ``long_share`` of long requests each ``long_factor`` (uniform) times a short one."""
    if kind == "deterministic":
        return np.ones(size)
    if kind == "lognormal":
        return np.exp(rng.normal(-sigma * sigma / 2, sigma, size))
    if kind == "mixture":
        lo, hi = long_factor
        short = 1.0 / (1 - long_share + long_share * (lo + hi) / 2)
        factor = np.where(rng.random(size) < long_share, rng.uniform(lo, hi, size), 1.0)
        return short * factor
    raise ValueError(f"service kind {kind!r} is not one of {', '.join(SERVICE_KINDS)}")


def poisson_arrivals(rng: np.random.Generator, rate: float, horizon_s: float) -> np.ndarray:
    """Poisson arrival times in [0, horizon_s)."""
    if rate <= 0:
        raise ValueError(f"rate={rate!r}: an open loop needs a rate > 0 requests/s")
    n = int(rate * horizon_s + 6 * math.sqrt(rate * horizon_s) + 20)
    a = np.cumsum(rng.exponential(1.0 / rate, n))
    while a[-1] < horizon_s:  # the draw fell short (about never): extend it
        a = np.concatenate([a, a[-1] + np.cumsum(rng.exponential(1.0 / rate, n))])
    return a[a < horizon_s]


def mg1_windows(kind: str, mu: float, rate: float, windows: int, rng: np.random.Generator, *, warmup_s: float = 0.5,
                window_s: float = 10.0, max_arrivals: int = 1000, **service: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """``windows`` independent open-loop windows of an M/G/1 FIFO server of pace ``mu`` at Poisson ``rate``,
    each from an empty server: arrivals for ``warmup_s``, then the measured window (its first ``max_arrivals``
    arrivals or ``window_s`` seconds, whichever ends first), then a drain. Returns each window's
    ``(latencies_ms, arrivals_s)`` of its measured arrivals, in arrival order. Vectorised: one row a window."""
    horizon = warmup_s + window_s
    n = int(rate * horizon + 6 * math.sqrt(rate * horizon) + 20)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, (windows, n)), axis=1)
    if (arrivals[:, -1] < horizon).any():
        raise RuntimeError("mg1_windows: the arrival draw fell short of the window; raise its margin")
    lat = (fifo_done(arrivals, service_draws(kind, rng, (windows, n), **service) / mu) - arrivals) * 1000
    out = []
    for a, x in zip(arrivals, lat):
        keep = np.flatnonzero((a >= warmup_s) & (a < horizon))[:max_arrivals]
        out.append((x[keep], a[keep]))
    return out


@dataclass(frozen=True)
class ClientLag:
    """A load generator that can send at most ``ceiling_rate`` requests/s. Below it each send is late by an
    exponential lag whose mean is ``floor_ms`` plus a queue's wait at that utilisation (``rho / (1 - rho)``
    send times), so it rises steeply near the ceiling; above it the client falls behind by
    ``(rate / ceiling - 1)`` seconds a second, on top of that lag at :attr:`NEAR`."""

    ceiling_rate: float
    floor_ms: float = 0.2
    NEAR = 0.95  # the utilisation whose lag an overloaded client's jitter keeps

    def __post_init__(self) -> None:
        if not self.ceiling_rate > 0:
            raise ValueError(f"ceiling_rate={self.ceiling_rate!r}: give the client's most sends per second (> 0)")

    def mean_ms(self, rate: float) -> float:
        rho = min(rate / self.ceiling_rate, self.NEAR)
        return self.floor_ms + 1000.0 / self.ceiling_rate * rho / (1 - rho)

    def lags_ms(self, rate: float, arrivals_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        lags = rng.exponential(self.mean_ms(rate), arrivals_s.size)
        if rate > self.ceiling_rate and arrivals_s.size:
            lags += (arrivals_s - arrivals_s[0]) * (rate / self.ceiling_rate - 1) * 1000
        return lags


def highest_passing_rate(over: Callable[[float, bool], float], saturation: float, tol: float = TRUTH_TOL) -> float:
    """The highest rate below ``saturation`` whose share over the target is at most :data:`OVER_SHARE`.
    ``over(rate, scout)`` is that share from the long run, or with ``scout`` from a run a tenth as long. The
    scout steps down from saturation by :data:`TRUTH_STEP` to the first passing rate (a batcher's waits can make
    a low rate fail where a higher one passes, so the search does not bisect from zero) and bisects to within
    :data:`SCOUT_TOL`; the long run then confirms that bracket (widening it where the scout erred) and bisects it
    to ``tol``. 0 when nothing down to a thousandth of saturation passes."""
    def passes(rate: float, scout: bool = False) -> bool:
        return over(rate, scout) <= OVER_SHARE

    floor = saturation * 1e-3
    if passes(saturation):
        return saturation
    hi, lo = saturation, saturation * TRUTH_STEP
    while not passes(lo, True) and lo >= floor:
        hi, lo = lo, lo * TRUTH_STEP
    while hi / lo - 1 > SCOUT_TOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if passes(mid, True) else (lo, mid)
    widen = 1 + 2 * SCOUT_TOL
    while not passes(lo):
        hi, lo = lo, lo / widen
        if lo < floor:
            return 0.0
    while hi < saturation and passes(hi):
        lo, hi = hi, min(hi * widen, saturation)
    while hi / lo - 1 > tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


class Best(NamedTuple):
    capacity: float
    knobs: Any


def configurations(space: Mapping[str, Sequence[Any]] | Iterable[Any], base: Any = None) -> list[Any]:
    """A space as configurations: a mapping of knob name to values is every combination (on ``base``, a Knobs
    or a dict; default Knobs()), anything else is taken as the configurations themselves."""
    if not isinstance(space, Mapping):
        return list(space)
    base = Knobs() if base is None else base
    names = list(space)
    out = []
    for values in itertools.product(*(space[n] for n in names)):
        change = dict(zip(names, values))
        out.append({**base, **change} if isinstance(base, Mapping) else base.replace(**change))
    return out


class _Truths:
    """``truth``, ``best`` and ``saturation`` for a world that gives ``_truth(knobs, target_ms)``."""

    def truth(self, knobs: Any, target_ms: float) -> float:
        """The steady-state capacity of ``knobs`` at ``target_ms`` (requests/s, see the module's docstring)."""
        if not target_ms > 0:
            raise ValueError(f"target_ms={target_ms!r}: give the p99 target in milliseconds (> 0)")
        return self._truth(knobs, float(target_ms))

    def best(self, space: Mapping[str, Sequence[Any]] | Iterable[Any], target_ms: float, base: Any = None) -> Best:
        """The configuration with the highest truth over ``space`` (see :func:`configurations`), and that truth."""
        configs = configurations(space, base)
        if not configs:
            raise ValueError("best(space): the space holds no configuration")
        return max((Best(self.truth(k, target_ms), k) for k in configs), key=lambda b: b.capacity)

    def _truth(self, knobs: Any, target_ms: float) -> float:
        raise NotImplementedError

    def saturation(self, knobs: Any) -> float:
        raise NotImplementedError

    def long_run_latencies(self, knobs: Any, rate: float) -> np.ndarray:
        raise NotImplementedError


def target_for(world: Any, knobs: Any, load: float) -> float:
    """The target (ms) at which ``knobs``' truth is ``load`` x its saturation rate: the 99th percentile (as an
    order statistic, so that at most 1% of outcomes exceed it) of the world's long run at that rate."""
    if not 0 < load < 1:
        raise ValueError(f"load={load!r}: give a share of the saturation rate between 0 and 1, e.g. 0.8")
    lat = world.long_run_latencies(knobs, load * world.saturation(knobs))
    return float(np.quantile(lat, 1 - OVER_SHARE, method="higher"))


def _open_trial(sched: np.ndarray, done: np.ndarray, lags: np.ndarray, rate: float, window: float,
                settle: float = WARMUP_S, **extra: Any) -> Trial:
    """An open-loop window's Trial from every arrival's schedule and completion (all of them, the ``settle``
    seconds of warm-up included)."""
    measured = sched >= settle
    lat = (done - sched)[measured] * 1000
    n = int(measured.sum())
    ok_in_window = int(((done >= settle) & (done < settle + window)).sum())
    return Trial(qps=ok_in_window / window, p99_ms=p99_of(lat) if n else math.nan,
                 p50_ms=float(np.median(lat)) if n else math.nan, ok=n, submitted=n, window_s=window, rate=rate,
                 offered_rate=n / window, latencies_ms=lat, lags_ms=lags[measured], arrivals_s=sched[measured],
                 **extra)


def _closed_trial(lat_ms: np.ndarray, window: float, **extra: Any) -> Trial:
    n = int(lat_ms.size)
    return Trial(qps=n / window, p99_ms=p99_of(lat_ms) if n else math.nan,
                 p50_ms=float(np.median(lat_ms)) if n else math.nan, ok=n, submitted=n, window_s=window,
                 latencies_ms=lat_ms, **extra)


# --- one FIFO server ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _mg1_long_run(kind: str, service: tuple, arrivals: int = TRUTH_ARRIVALS + TRUTH_BURN_IN
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The long run's common random numbers: unit-rate gaps and mean-1 service times."""
    rng = np.random.default_rng(TRUTH_SEED)
    return rng.exponential(1.0, arrivals), service_draws(kind, rng, arrivals, **dict(service))


def _run_length(scout: bool) -> tuple[int, int]:
    """(arrivals, burn-in) of the long run, or of the scout's run a tenth as long."""
    return (TRUTH_ARRIVALS // 10 + TRUTH_BURN_IN // 10, TRUTH_BURN_IN // 10) if scout else \
        (TRUTH_ARRIVALS + TRUTH_BURN_IN, TRUTH_BURN_IN)


def mg1_latencies(kind: str, mu: float, rate: float, service: tuple = (), scout: bool = False) -> np.ndarray:
    """Steady-state latencies (ms) of an M/G/1 FIFO server of pace ``mu`` at ``rate``: the long run after its
    burn-in (``scout``: a run a tenth as long)."""
    n, burn = _run_length(scout)
    gaps, s = _mg1_long_run(kind, service)
    a = np.cumsum(gaps[:n] / rate)
    return (fifo_done(a, s[:n] / mu) - a)[burn:] * 1000


@functools.lru_cache(maxsize=4096)
def _mg1_truth(kind: str, service: tuple, mu: float, floor_ms: float, target_ms: float) -> float:
    def over(rate: float, scout: bool) -> float:
        return float((mg1_latencies(kind, mu, rate, service, scout) + floor_ms > target_ms).mean())
    return highest_passing_rate(over, mu)


@dataclass(eq=False)
class QueueWorld(_Truths):
    """Every configuration one FIFO server of pace ``service_rate(knobs)`` (``base_rate`` times the factors of
    the ``rules`` whose test holds) with ``service`` times (:data:`SERVICE_KINDS`), each window's pace multiplied
    by a lognormal of log-sd ``noise``; ``floor_ms(knobs)`` a latency every answer carries; ``lag`` the client."""

    service: str = "lognormal"
    rules: list[tuple[Callable[[Any], bool], float]] = field(default_factory=list)
    base_rate: float = 100.0
    noise: float = 0.10
    sigma: float = 1.0
    long_share: float = 0.03
    long_factor: tuple[float, float] = (10.0, 20.0)
    floor_ms: Callable[[Any], float] = lambda k: 0.0
    lag: ClientLag | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.service not in SERVICE_KINDS:
            raise ValueError(f"service={self.service!r} is not one of {', '.join(SERVICE_KINDS)}")
        self.rng = np.random.default_rng(self.seed)
        self.calls = 0

    @property
    def _service(self) -> tuple:
        if self.service == "lognormal":
            return (("sigma", self.sigma),)
        if self.service == "mixture":
            return (("long_share", self.long_share), ("long_factor", tuple(self.long_factor)))
        return ()

    def service_rate(self, knobs: Any) -> float:
        return paced(self.base_rate, self.rules, knobs)

    def saturation(self, knobs: Any) -> float:
        return self.service_rate(knobs)

    def long_run_latencies(self, knobs: Any, rate: float) -> np.ndarray:
        return mg1_latencies(self.service, self.service_rate(knobs), rate, self._service) + self.floor_ms(knobs)

    def _truth(self, knobs: Any, target_ms: float) -> float:
        return _mg1_truth(self.service, self._service, self.service_rate(knobs), float(self.floor_ms(knobs)), target_ms)

    def __call__(self, knobs: Any, *, rate: float | None = None, record: bool = False, seed: int | None = None,
                 window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        self.calls += 1
        window = float(window_s or WINDOW_S)
        settle = WARMUP_S if warmup_s is None else warmup_s  # a hold asks for its own unmeasured start
        mu = self.service_rate(knobs) * math.exp(self.rng.normal(0.0, self.noise))
        floor = float(self.floor_ms(knobs))
        rng = np.random.default_rng(seed) if seed is not None else self.rng
        if rate is None:
            return self._closed(mu, window, floor, rng)
        sched = poisson_arrivals(rng, rate, settle + window)
        lags = self.lag.lags_ms(rate, sched, self.rng) if self.lag else np.abs(self.rng.normal(0.0, 0.3, sched.size))
        sent = sched + lags / 1000
        order = np.argsort(sent, kind="stable")
        done = np.empty_like(sched)
        done[order] = fifo_done(sent[order], service_draws(self.service, rng, sched.size, **dict(self._service)) / mu)
        return _open_trial(sched, done + floor / 1000, lags, rate, window, settle, model_busy=min(rate / mu, 1.0))

    def _closed(self, mu: float, window: float, floor: float, rng: np.random.Generator) -> Trial:
        """16 clients with no pause between answer and send keep the server busy from 0: the i-th completion is
        the running sum of service times, and request i is sent when request i - 16 is answered."""
        n = int(mu * window * 1.5 + 10 * math.sqrt(mu * window) + 2 * CONCURRENCY)
        done = np.cumsum(service_draws(self.service, rng, n, **dict(self._service)) / mu)
        sent = np.concatenate([np.zeros(CONCURRENCY), done[:-CONCURRENCY]])
        inside = done <= window
        lat = (done - sent)[inside] * 1000 + floor
        return _closed_trial(lat, window, model_busy=1.0)


# --- a dynamic batcher -------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchCosts:
    """The batching server's cost model (ms): a call costs ``(call_ms + token_ms x batch x padded length)``,
    times ``bf16_factor`` in bf16 (and ``slow_factor`` on the ``slow_share`` of bf16 calls that take a slow
    path), plus ``naive_tokenizer_ms`` (``fast_tokenizer_ms`` with the fast tokenizer) per request of CPU work;
    a new server costs ``cold_factor`` times that for its first ``cold_s`` seconds. Text lengths are lognormal
    tokens (median ``length_median``, log-sd ``length_sigma``) clipped to ``length_range`` and to max_length."""

    call_ms: float = 4.0
    token_ms: float = 0.01
    naive_tokenizer_ms: float = 0.5
    fast_tokenizer_ms: float = 0.05
    bf16_factor: float = 0.7
    slow_share: float = 0.02
    slow_factor: float = 4.0
    cold_factor: float = 3.0
    cold_s: float = 2.0
    length_median: float = 40.0
    length_sigma: float = 0.8
    length_range: tuple[int, int] = (8, 512)
    turnaround_ms: float = 0.5  # closed loop: a client's mean pause (exponential) between an answer and its next send


@dataclass(frozen=True)
class BatchConfig:
    """What a configuration's knobs mean to the batcher."""

    max_batch: int
    max_wait_s: float
    padding: str  # 'longest', 'bucket' or 'fixed'
    buckets: tuple[int, ...]  # bucket lengths, the last max_length
    max_length: int
    fast_tokenizer: bool
    bf16: bool

    @classmethod
    def of(cls, knobs: Any, aliases: Mapping[str, str] | None = None) -> "BatchConfig":
        get = functools.partial(knob, knobs, aliases=aliases)
        padding = get("padding")
        if padding not in ("dynamic", "longest", "bucket", "fixed"):
            raise ValueError(f"padding={padding!r}: the batching world knows 'longest' (or 'dynamic'), 'bucket' and "
                             "'fixed'")
        dtype = get("dtype")
        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype={dtype!r}: the batching world knows 'fp32' and 'bf16'")
        max_length = int(get("max_length"))
        buckets = tuple(int(b) for b in get("buckets") if b < max_length) + (max_length,)
        max_batch = int(get("batch_size"))
        if max_batch < 1:
            raise ValueError(f"batch_size={max_batch!r}: the batcher's max batch is at least 1")
        return cls(max_batch=max_batch, max_wait_s=float(get("max_wait_ms")) / 1000,
                   padding="longest" if padding == "dynamic" else padding, buckets=buckets, max_length=max_length,
                   fast_tokenizer=get("tokenizer") == "fast", bf16=dtype == "bf16")


def text_lengths(costs: BatchCosts, rng: np.random.Generator, size: int, max_length: int) -> np.ndarray:
    lo, hi = costs.length_range
    raw = np.round(np.exp(rng.normal(math.log(costs.length_median), costs.length_sigma, size)))
    return np.clip(raw, lo, min(hi, max_length)).astype(np.int64)


def _call_ms(costs: BatchCosts, cfg: BatchConfig, size: int, padded: int, slow: bool) -> float:
    model = costs.call_ms + costs.token_ms * size * padded
    if cfg.bf16:
        model *= costs.bf16_factor * (costs.slow_factor if slow else 1.0)
    return model + size * (costs.fast_tokenizer_ms if cfg.fast_tokenizer else costs.naive_tokenizer_ms)


def _bucket_of(cfg: BatchConfig, lengths: np.ndarray) -> np.ndarray:
    if cfg.padding != "bucket":
        return np.zeros(lengths.size, dtype=np.int64)
    return np.searchsorted(np.asarray(cfg.buckets), lengths, side="left")


def _padded(cfg: BatchConfig, bucket: int, members: Sequence[int]) -> int:
    if cfg.padding == "bucket":
        return cfg.buckets[bucket]
    if cfg.padding == "fixed":
        return cfg.max_length
    return max(members)


def serve_open(sent: np.ndarray, lengths: np.ndarray, cfg: BatchConfig, costs: BatchCosts, slow_u: np.ndarray,
               scale: float = 1.0, cold_until_s: float = 0.0, trace: list | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The batching server over arrivals known in advance (``sent``, sorted; their token ``lengths``):
    completion times in the order of ``sent`` and each call's batch size. When the server is free at ``f``,
    each queue (one, or one a bucket) is ready at ``max(f, min(head + max_wait, arrival of its max_batch-th
    request))``; the first ready one goes, with the requests it holds by then, up to ``max_batch``. Call
    ``i`` takes the slow path when ``slow_u[i % len] < slow_share``; calls starting before ``cold_until_s``
    cost ``cold_factor`` times more; every call ``scale`` times more (the window's pace). ``trace``, when
    given, gets each call's ``(start_s, first_arrival_s, size, end_s)``."""
    n = sent.size
    done = np.empty(n)
    if not n:
        return done, np.zeros(0, dtype=np.int64)
    keys = _bucket_of(cfg, lengths)
    groups = [(b, g) for b in range(len(cfg.buckets) if cfg.padding == "bucket" else 1)
              if (g := np.flatnonzero(keys == b)).size]
    times = [sent[g].tolist() for _, g in groups]
    sizes_of = [len(t) for t in times]
    lens = [lengths[g].tolist() for _, g in groups]
    bucket_len = [cfg.buckets[b] if cfg.padding == "bucket" else cfg.max_length for b, _ in groups]
    finished: list[list[float]] = [[] for _ in groups]
    ptr = [0] * len(groups)
    B, W, inf = cfg.max_batch, cfg.max_wait_s, math.inf
    longest = cfg.padding == "longest"
    call_ms, token_ms = costs.call_ms, costs.token_ms
    model_factor = costs.bf16_factor if cfg.bf16 else 1.0
    tok_ms = costs.fast_tokenizer_ms if cfg.fast_tokenizer else costs.naive_tokenizer_ms
    slow = ((slow_u < costs.slow_share) & cfg.bf16).tolist()
    n_slow, slow_factor, cold_factor = len(slow), costs.slow_factor, costs.cold_factor
    sizes: list[int] = []
    f, remaining, call, single = 0.0, n, 0, len(groups) == 1
    while remaining:
        if single:  # one queue (no buckets): the loop below without its search
            pick, tj, p = 0, times[0], ptr[0]
            head = tj[p]
            start = head + W
            q = p + B - 1
            if q < sizes_of[0] and tj[q] < start:
                start = tj[q]
            if start < f:
                start = f
        else:
            pick, start, head = -1, inf, inf
            for j, tj in enumerate(times):
                p = ptr[j]
                if p >= sizes_of[j]:
                    continue
                h = tj[p]
                ready = h + W
                q = p + B - 1
                if q < sizes_of[j] and tj[q] < ready:
                    ready = tj[q]
                if ready < f:
                    ready = f
                if ready < start or (ready == start and h < head):
                    pick, start, head = j, ready, h
            tj, p = times[pick], ptr[pick]
        end = bisect.bisect_right(tj, start, p, min(p + B, sizes_of[pick]))
        k = end - p
        padded = (max(lens[pick][p:end]) if k > 1 else lens[pick][p]) if longest else bucket_len[pick]
        model = (call_ms + token_ms * k * padded) * model_factor
        if slow[call % n_slow]:
            model *= slow_factor
        cost = (model + k * tok_ms) * scale
        if start < cold_until_s:
            cost *= cold_factor
        end_s = start + cost / 1000
        if trace is not None:
            trace.append((start, head, k, end_s))
        f = end_s
        finished[pick].extend([f] * k)
        sizes.append(k)
        ptr[pick], remaining, call = end, remaining - k, call + 1
    for (_, g), fin in zip(groups, finished):
        done[g] = fin
    return done, np.asarray(sizes, dtype=np.int64)


def serve_closed(cfg: BatchConfig, costs: BatchCosts, rng: np.random.Generator, slow_rng: np.random.Generator,
                 window_s: float, scale: float = 1.0, cold_until_s: float = 0.0, clients: int = CONCURRENCY
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The batching server under a closed loop of ``clients``, an event loop: every client sends at a short
    exponential turnaround after its last answer, the batcher forms batches by :func:`serve_open`'s rule from
    what has been sent, and a batch's answers go back together. Returns the latencies (ms) of the answers by
    ``window_s``, and each call's batch size."""
    turn = costs.turnaround_ms / 1000
    lengths = text_lengths(costs, rng, clients, cfg.max_length)
    pending = sorted(zip(rng.exponential(turn, clients).tolist(), lengths.tolist()))
    bucket_of = (lambda L: bisect.bisect_left(cfg.buckets, L)) if cfg.padding == "bucket" else (lambda L: 0)
    B, W = cfg.max_batch, cfg.max_wait_s
    f, lat, sizes = 0.0, [], []
    while True:
        queues: dict[int, list[tuple[float, int]]] = {}
        for item in pending:  # pending is sorted, so each queue is too
            queues.setdefault(bucket_of(item[1]), []).append(item)
        start, pick = math.inf, -1
        for b, q in queues.items():
            ready = q[0][0] + W
            if len(q) >= B and q[B - 1][0] < ready:
                ready = q[B - 1][0]
            ready = max(ready, f)
            if ready < start or (ready == start and q[0][0] < queues[pick][0][0]):
                start, pick = ready, b
        if start >= window_s:
            break
        members = [item for item in queues[pick][:B] if item[0] <= start]
        cost = _call_ms(costs, cfg, len(members), _padded(cfg, pick, [L for _, L in members]),
                        cfg.bf16 and slow_rng.random() < costs.slow_share) * scale
        if start < cold_until_s:
            cost *= costs.cold_factor
        f = start + cost / 1000
        if f <= window_s:
            lat.extend((f - t) * 1000 for t, _ in members)
        sizes.append(len(members))
        for m in members:
            pending.remove(m)
        pending += zip((f + rng.exponential(turn, len(members))).tolist(),
                       text_lengths(costs, rng, len(members), cfg.max_length).tolist())
        pending.sort()
    return np.asarray(lat), np.asarray(sizes, dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _batch_long_run(costs: BatchCosts, max_length: int, arrivals: int = TRUTH_ARRIVALS + TRUTH_BURN_IN
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The long run's common random numbers: unit-rate gaps, text lengths, and a uniform per call."""
    rng = np.random.default_rng(TRUTH_SEED)
    return rng.exponential(1.0, arrivals), text_lengths(costs, rng, arrivals, max_length), rng.random(arrivals)


def batch_latencies(costs: BatchCosts, cfg: BatchConfig, rate: float, scout: bool = False) -> np.ndarray:
    """Steady-state latencies (ms) of the warm batching server at its nominal pace under Poisson ``rate``
    (``scout``: a run a tenth as long)."""
    n, burn = _run_length(scout)
    gaps, lengths, slow_u = (x[:n] for x in _batch_long_run(costs, cfg.max_length))
    a = np.cumsum(gaps / rate)
    if cfg.max_batch == 1:  # one request a call: one FIFO queue whatever the buckets, so Lindley's recursion
        by_length = np.arange(cfg.max_length + 1)
        padded = [_padded(cfg, int(b), [int(L)]) for b, L in zip(_bucket_of(cfg, by_length), by_length)]
        fast, slow = (np.asarray([_call_ms(costs, cfg, 1, p, s) for p in padded]) for s in (False, True))
        per = np.where(cfg.bf16 & (slow_u < costs.slow_share), slow[lengths], fast[lengths])
        done = fifo_done(a, per / 1000)
    else:
        done, _ = serve_open(a, lengths, cfg, costs, slow_u)
    return (done - a)[burn:] * 1000


@functools.lru_cache(maxsize=4096)
def _batch_truth(costs: BatchCosts, cfg: BatchConfig, target_ms: float) -> float:
    return highest_passing_rate(lambda r, scout: float((batch_latencies(costs, cfg, r, scout) > target_ms).mean()),
                                batch_saturation(costs, cfg))


@functools.lru_cache(maxsize=4096)
def batch_saturation(costs: BatchCosts, cfg: BatchConfig, samples: int = 200_000) -> float:
    """The rate at which the batcher's queue stops being stable: ``max_batch`` over a full batch's mean cost,
    a bucket's batches drawn in proportion to its requests (an overloaded batcher serves every queue full)."""
    rng = np.random.default_rng(TRUTH_SEED + 1)
    lengths = text_lengths(costs, rng, samples, cfg.max_length)
    B = cfg.max_batch
    slow_mean = (1 - costs.slow_share) + costs.slow_share * costs.slow_factor if cfg.bf16 else 1.0
    model = lambda padded: (costs.call_ms + costs.token_ms * B * padded) * (costs.bf16_factor * slow_mean  # noqa: E731
                                                                            if cfg.bf16 else 1.0)
    tok = B * (costs.fast_tokenizer_ms if cfg.fast_tokenizer else costs.naive_tokenizer_ms)
    if cfg.padding == "bucket":
        padded = np.asarray(cfg.buckets)[_bucket_of(cfg, lengths)]
    elif cfg.padding == "fixed":
        padded = np.full(samples, cfg.max_length)
    else:
        padded = lengths[: samples // B * B].reshape(-1, B).max(axis=1)
    return B / (float(np.mean(model(padded))) + tok) * 1000


@dataclass(eq=False)
class BatchingWorld(_Truths):
    """Every configuration the dynamic batcher of :func:`serve_open` with the knobs ``batch_size`` (its max
    batch), ``max_wait_ms``, ``padding`` ('dynamic' or 'longest', 'bucket' with ``buckets``, 'fixed'),
    ``max_length``, ``tokenizer`` and ``dtype`` (other knobs, ``max_batch_tokens`` among them, change nothing but
    start a new server); ``costs`` its cost model; ``aliases`` the keys of a dict's knobs. Each window's pace is
    multiplied by a lognormal of log-sd ``noise``; the first window of a configuration after another (a new
    server) is cold for ``costs.cold_s`` seconds from its start; ``lag`` the client's lag in the open loop."""

    costs: BatchCosts = BatchCosts()
    noise: float = 0.05
    lag: ClientLag | None = None
    seed: int = 0
    aliases: Mapping[str, str] = field(default_factory=dict)  # a dict's keys for the Knobs names (see knob())

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.last: tuple | None = None
        self.calls = 0

    def saturation(self, knobs: Any) -> float:
        return batch_saturation(self.costs, BatchConfig.of(knobs, self.aliases))

    def long_run_latencies(self, knobs: Any, rate: float) -> np.ndarray:
        return batch_latencies(self.costs, BatchConfig.of(knobs, self.aliases), rate)

    def _truth(self, knobs: Any, target_ms: float) -> float:
        return _batch_truth(self.costs, BatchConfig.of(knobs, self.aliases), target_ms)

    def __call__(self, knobs: Any, *, rate: float | None = None, record: bool = False, seed: int | None = None,
                 window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        self.calls += 1
        window = float(window_s or WINDOW_S)
        settle = WARMUP_S if warmup_s is None else warmup_s  # a hold asks for its own unmeasured start
        cfg = BatchConfig.of(knobs, self.aliases)
        key = config_key(knobs)
        cold_until = self.costs.cold_s if key != self.last else 0.0  # any change of knobs starts a new server
        self.last = key
        scale = math.exp(self.rng.normal(0.0, self.noise))
        rng = np.random.default_rng(seed) if seed is not None else self.rng
        if rate is None:
            lat, sizes = serve_closed(cfg, self.costs, rng, self.rng, window, scale, cold_until)
            return _closed_trial(lat, window, mean_batch=float(sizes.mean()) if sizes.size else math.nan)
        sched = poisson_arrivals(rng, rate, settle + window)
        lengths = text_lengths(self.costs, rng, sched.size, cfg.max_length)
        lags = self.lag.lags_ms(rate, sched, self.rng) if self.lag else np.abs(self.rng.normal(0.0, 0.3, sched.size))
        sent = sched + lags / 1000
        order = np.argsort(sent, kind="stable")
        done = np.empty_like(sched)
        done[order], sizes = serve_open(sent[order], lengths[order], cfg, self.costs,
                                        self.rng.random(max(sched.size, 1)), scale, cold_until)
        return _open_trial(sched, done, lags, rate, window, settle,
                           mean_batch=float(sizes.mean()) if sizes.size else math.nan)


BATCH_SPACE: dict[str, tuple] = {  # the batching world's knobs and the values a tuner would try
    "batch_size": (1, 4, 8, 16, 32),
    "max_wait_ms": (0.0, 2.0, 5.0),
    "padding": ("dynamic", "bucket"),
    "tokenizer": ("naive", "fast"),
    "dtype": ("fp32", "bf16"),
}

# bf16's slow path 8x instead of 4x: bf16 still raises closed-loop throughput (2% of calls at 8x cost 14% more
# on average, against 30% less a call), but at the targets that put a configuration's truth at 0.6-0.9 of its
# saturation it lowers the capacity; at 4x it does so only at tight targets (a truth near a quarter of saturation)
BF16_TAIL_HEAVY = BatchCosts(slow_factor=8.0)

HARD_WORLDS: dict[str, Callable[..., Any]] = {
    "deterministic": functools.partial(QueueWorld, service="deterministic"),
    "lognormal, sigma 1": functools.partial(QueueWorld, service="lognormal"),
    "97% short, 3% long": functools.partial(QueueWorld, service="mixture"),
    # the load generator tops out just above the server (pace 100/s): its lag is about 1 ms at 10/s, 40 ms
    # at 90/s, 90 ms at 100/s, and it falls behind past 110/s; the truth is the server's, without the lag
    "lognormal, client ceiling 110/s": functools.partial(QueueWorld, service="lognormal",
                                                         lag=ClientLag(ceiling_rate=110.0)),
    "dynamic batcher": BatchingWorld,
    "dynamic batcher, bf16 slow path 8x": functools.partial(BatchingWorld, costs=BF16_TAIL_HEAVY),
}
