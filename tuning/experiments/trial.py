"""One measurement of one configuration: :class:`Trial`, and the measurement seam every experiment uses.

The seam is ``measure(knobs, *, rate=None, record=False, seed=None, window_s=None) -> Trial``: ``rate=None``
is a closed loop at the measurement's concurrency, a number an open loop at that Poisson rate (latency from
the scheduled arrival), ``record=True`` runs the profilers too, ``window_s`` the window the engine asks for
(passed only to a ``fn`` that takes it, as ``seed`` is). :class:`tuning.experiments.measure.LoadMeasure` is the real one;
tests and ``bench/`` scripts pass their own. :func:`as_measure` adapts the older one-argument form.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from tuning.knobs import Knobs


@dataclass
class Trial:
    """One load test's figures (the raw load result kept in ``load``, the recorder's in ``profile``).

    ``latencies_ms``: every measured outcome's latency (from the scheduled arrival in an open loop), an
    outcome other than ``ok`` as infinity, so that counting those over a target counts failures too; None
    when the measurement gave only its summary (a capacity probe then decides on the p99 estimate).
    """

    qps: float
    p99_ms: float
    model_busy: float = math.nan
    device_busy: float = math.nan
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    mean_batch: float = math.nan
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    rejected: int = 0
    submitted: int = 0
    window_s: float = math.nan
    rate: float | None = None  # the open loop's requested rate (None: closed loop)
    offered_rate: float = math.nan  # arrivals scheduled in the window per second (open loop)
    late: int = 0  # open loop: sends more than LATE_MS after their scheduled arrival
    steal_share: float = math.nan  # the CPU time the hypervisor gave other guests during the run (a busy host)
    server_queue_ms: float = math.nan  # the server's own mean queue wait per request (its metrics, --metrics-url)
    server_compute_ms: float = math.nan  # the server's own mean inference time per request (its metrics)
    latencies_ms: Any = field(default=None, repr=False, compare=False)
    lags_ms: Any = field(default=None, repr=False, compare=False)  # open loop: each send's lag after its schedule
    # each measured outcome's scheduled arrival (seconds, any clock), in the order of ``latencies_ms``: the target
    # verdict's batches follow arrival order
    arrivals_s: Any = field(default=None, repr=False, compare=False)
    first_error: str | None = None
    load: Any = field(default=None, repr=False, compare=False)
    profile: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_load(cls, result: Any, profile: Any = None) -> "Trial":
        s = result.summary()
        num = lambda key: math.nan if s.get(key) is None else float(s[key])  # noqa: E731
        lat = np.asarray(result.latencies_ms(), dtype=float)
        if lat.size == len(result.responses):
            lat[[r.outcome != "ok" for r in result.responses]] = math.inf
        timings = getattr(result, "timings", None)
        lags = np.asarray(result.send_lags_ms(), dtype=float) if timings else np.zeros(0)
        arrivals = np.asarray([scheduled for scheduled, _, _ in timings], dtype=float) if timings else None
        reasons = s.get("error_reasons") or []
        return cls(qps=num("qps"), p99_ms=num("p99_ms"), model_busy=num("model_busy"),
                   device_busy=num("device_busy"), p50_ms=num("p50_ms"), p95_ms=num("p95_ms"),
                   mean_batch=num("mean_batch"), ok=int(s.get("ok") or 0), errors=int(s.get("errors") or 0),
                   timeouts=int(s.get("timeouts") or 0), rejected=int(s.get("rejected") or 0),
                   submitted=int(s.get("submitted") or 0), window_s=num("window_s"), rate=s.get("rate"),
                   offered_rate=num("offered_rate"), late=int((lags > LATE_MS).sum()), latencies_ms=lat,
                   lags_ms=lags if lags.size else None,
                   arrivals_s=arrivals if arrivals is not None and arrivals.size == lat.size else None,
                   first_error=reasons[0]["reason"] if reasons else None, load=result, profile=profile)

    @property
    def failed(self) -> int:
        """Outcomes other than ok (errors, timeouts, rejections)."""
        return max(self.submitted - self.ok, 0)

    @property
    def completion_rate(self) -> float:
        """Ok answers per second of the window (``qps``)."""
        return self.qps


LATE_MS = 10.0  # an open-loop send this late after its scheduled arrival counts as late (the client fell behind)
LATE_SHARE_OF_TARGET = 0.05  # ...or, against a latency target, this share of it (whichever is larger)


def late_sends(t: "Trial", target_p99_ms: float | None = None) -> int:
    """Sends later than :data:`LATE_MS`, or than 5% of the target: a lag that small cannot move a p99 across
    it, and a client that shares a loaded host with the server is often scheduled that late without falling behind."""
    if t.lags_ms is None or target_p99_ms is None:
        return t.late
    return int((np.asarray(t.lags_ms) > max(LATE_MS, LATE_SHARE_OF_TARGET * target_p99_ms)).sum())


class Measure(Protocol):
    def __call__(self, knobs: Knobs, *, rate: float | None = None, record: bool = False,
                 seed: int | None = None) -> Trial: ...


def as_trial(got: Any) -> Trial:
    return got if isinstance(got, Trial) else Trial.from_load(got)


def as_measure(fn: Callable[..., Any]) -> tuple[Measure, bool]:
    """``(measure(knobs, *, rate=None, record=False, seed=None, window_s=None) -> Trial, open_loop)``: ``fn`` itself when it
    takes ``rate`` (``seed``, the open loop's arrival seed, is passed only to a ``fn`` that takes it); a
    one-argument ``fn(knobs)`` (the older seam) is wrapped with a DeprecationWarning and can measure only the
    closed loop (``open_loop`` False)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    takes = {name: name in params or any_kw for name in ("rate", "record", "seed", "window_s")}
    if takes["rate"]:
        def measure(knobs: Knobs, *, rate: float | None = None, record: bool = False, seed: int | None = None,
                    window_s: float | None = None) -> Trial:
            kw: dict[str, Any] = {"rate": rate}
            if takes["record"]:
                kw["record"] = record
            if takes["seed"] and seed is not None:
                kw["seed"] = seed
            if takes["window_s"] and window_s is not None:
                kw["window_s"] = window_s
            return as_trial(fn(knobs, **kw))
        return measure, True
    warnings.warn("measure(knobs) with one argument is deprecated: give measure(knobs, *, rate=None, record=False) "
                  "-> Trial (rate: an open loop at that Poisson rate); the one-argument form only works with "
                  "objective='qps'", DeprecationWarning, stacklevel=3)

    def closed(knobs: Knobs, *, rate: float | None = None, record: bool = False, seed: int | None = None,
               window_s: float | None = None) -> Trial:
        if rate is not None:
            raise ValueError("this measure takes only knobs and cannot run an open loop at a rate: use "
                             "objective='qps', or give measure(knobs, *, rate=None, record=False)")
        return as_trial(fn(knobs))
    return closed, False


def p99_of(latencies_ms: Any) -> float:
    """The 99th percentile as an order statistic (no interpolation: a failure coded as infinity gives infinity,
    never NaN), the same sample the exceedance count uses."""
    lat = np.asarray(latencies_ms, dtype=float)
    return float(np.percentile(lat, 99, method="inverted_cdf")) if lat.size else math.nan
