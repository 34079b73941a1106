"""Capacity at a p99 target (``docs/deciding.md``, stage 3): one configuration on a warm server, its open-loop
ceiling found first, then a window at each of the descending fractions of it, each judged on its blocks (the default)
or its batches (:func:`tuning.experiments.judge.target_verdict`; on batches, longer windows where one was too
short to tell); the capacity is the highest rate claimed, in a look and a fresh window.

:class:`Probe` is one rate's window and verdict, :class:`Capacity` the check's result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tuning.base.decide import quantile_interval
from tuning.base.format import rounded
from tuning.base.stats import known_median
from tuning.experiments.judge import EXCEED_SHARE, METHODS, TargetVerdict, lag_explains, target_verdict
from tuning.experiments.trial import Trial, late_sends, p99_of

DEFAULT_ERROR_BUDGET = 0.001
TARGET_SALT = 2_000_003  # the target windows' arrivals: apart from every throughput window's
CEILING_SALT = 3_000_017  # the ceiling windows' arrivals: apart from the target windows'


@dataclass
class Probe:
    """One rate's target window: its verdict (``pass`` | ``fail`` | ``indeterminate``), what decided it
    (``by``: the verdict's method, ``errors``, ``no answers``, ``client lag``, ``p99 only``) and its figures."""

    rate: float
    verdict: str
    by: str
    passed: bool
    windows: int
    n: int
    exceed: int  # outcomes over the target or failed
    errors: int
    offered_rate: float
    achieved_rate: float
    late: int
    p50_ms: float
    p99_ms: float
    p99_low_ms: float | None
    p99_high_ms: float | None
    trials: list[Trial] = field(default_factory=list, repr=False)
    share: float | None = None  # the share over the target, and its one-sided bounds
    share_low: float | None = None
    share_high: float | None = None
    lag_p99_ms: float | None = None  # the client's 99th-percentile send lag (reported as the client's)
    fastest_ms: float | None = None
    deff: float | None = None  # the design effect its bounds took (outcomes that count as one)
    needed: float | None = None  # the arrivals a window at this share and design effect would need to pass
    role: str = "look"  # look: the search's window at this rate; longer: a longer one after an indeterminate
    # look; again: the fresh window a claim needs

    def row(self) -> dict[str, Any]:
        return {"rate": rounded(self.rate), "verdict": self.verdict, "by": self.by, "passed": self.passed,
                "role": self.role, "deff": rounded(self.deff), "needed": rounded(self.needed),
                "windows": self.windows, "n": self.n, "exceed": self.exceed, "errors": self.errors,
                "offered_rate": rounded(self.offered_rate), "achieved_rate": rounded(self.achieved_rate),
                "late": self.late, "p50_ms": rounded(self.p50_ms), "p99_ms": rounded(self.p99_ms),
                "p99_low_ms": rounded(self.p99_low_ms), "p99_high_ms": rounded(self.p99_high_ms),
                "share": rounded(self.share), "share_low": rounded(self.share_low),
                "share_high": rounded(self.share_high), "lag_p99_ms": rounded(self.lag_p99_ms),
                "fastest_ms": rounded(self.fastest_ms)}

    def sentence(self, unit: str = "req/s") -> str:
        share = (f"{100 * self.share:.2f}% over [{100 * (self.share_low or 0):.2f}-{100 * (self.share_high or 0):.2f}%]"
                 if self.share is not None else f"{self.exceed} of {self.n} over")
        return (f"{self.rate:.1f} {unit}: {self.verdict} by {self.by} ({share} the target or failed; "
                f"p99 {_ms(self.p99_ms)} ms)")


def judged(probes: list[Probe]) -> list[Probe]:
    """The windows judged against the target: all but the ceiling's, judged on keeping up only."""
    return [p for p in probes if p.role != "ceiling"]


@dataclass
class Capacity:
    """The highest passing rate (None: none passed), the lowest rate that did not pass above it, and every
    window of the check. ``throughput``: the sustained closed-loop throughput the ceiling's climb started from."""

    target_p99_ms: float
    error_budget: float
    capacity: float | None
    low: float | None  # highest passing rate
    high: float | None  # the rate above it that did not pass (None: the first fraction passed)
    probes: list[Probe]
    note: str = ""
    throughput: float | None = None
    unit: str = "req/s"  # what its rates count (texts/s where a request carries several)
    at_least: bool = False  # the highest rate the check may try passed: the capacity is at least this
    ceiling: float | None = None  # the open loop's ceiling (check_target): what the fractions were taken of
    stopped: bool = False  # the check ended before it could decide (a stop): neither met nor unmet is known
    bursts: dict[str, Any] | None = None  # the claimed rate's windows judged together with bursts counted (under_bursts)

    @property
    def judged(self) -> list[Probe]:
        """The windows judged against the target (the ceiling's are judged on keeping up only)."""
        return judged(self.probes)

    @property
    def met(self) -> bool:
        return self.capacity is not None

    @property
    def certified(self) -> bool | None:
        """Whether the claim holds with bursts counted (None: not known, e.g. a run resumed from figures)."""
        return None if self.bursts is None else self.bursts.get("verdict") == "pass"

    @property
    def trials(self) -> int:
        return sum(p.windows for p in self.probes)

    @property
    def decided(self) -> bool:
        return not self.stopped and all(p.verdict != "indeterminate" for p in self.judged)

    def at(self, rate: float | None) -> Probe | None:
        return next((p for p in self.judged if rate is not None and math.isclose(p.rate, rate, rel_tol=1e-9)), None)

    @property
    def best(self) -> Probe | None:
        """The passing window at the capacity, else the one with the lowest p99 (the closest to the target)."""
        if self.capacity is not None:
            return self.at(self.capacity)
        return min(self.judged, key=lambda p: (p.p99_ms if math.isfinite(p.p99_ms) else math.inf), default=None)

    @property
    def lowest_rate(self) -> float | None:
        return min((p.rate for p in self.judged), default=None)

    def summary(self) -> dict[str, Any]:
        best = self.best
        return {"capacity": rounded(self.capacity), "met": self.met, "bracket": [rounded(self.low), rounded(self.high)],
                "target_p99_ms": self.target_p99_ms, "error_budget": self.error_budget,
                "throughput": rounded(self.throughput), "ceiling": rounded(self.ceiling),
                "p99_ms": rounded(best.p99_ms) if best else None,
                "p99_interval_ms": [rounded(best.p99_low_ms), rounded(best.p99_high_ms)] if best else None,
                "p50_ms": rounded(best.p50_ms) if best else None, "decided": self.decided, "trials": self.trials,
                "note": self.note, "unit": self.unit, "at_least": self.at_least, "stopped": self.stopped,
                "bursts": self.bursts,
                "probes": [p.row() for p in self.judged],
                "ceiling_probes": [p.row() for p in self.probes if p.role == "ceiling"]}

    @classmethod
    def from_summary(cls, s: dict[str, Any]) -> "Capacity":
        """Back from :meth:`summary` (a resumed run): the windows keep their figures, not their outcomes."""
        nan = lambda v: math.nan if v is None else v  # noqa: E731
        probes = []
        for p in [*(s.get("ceiling_probes") or []), *(s.get("probes") or [])]:
            kw = {k: p.get(k) for k in ("rate", "verdict", "by", "passed", "windows", "n", "exceed", "errors", "late",
                                        "p99_low_ms", "p99_high_ms", "share", "share_low", "share_high",
                                        "lag_p99_ms", "fastest_ms", "deff", "needed")}
            kw["role"] = p.get("role") or "look"
            kw.update({k: nan(p.get(k)) for k in ("offered_rate", "achieved_rate", "p50_ms", "p99_ms")})
            probes.append(Probe(**kw))
        low, high = (s.get("bracket") or [None, None])
        return cls(float(s["target_p99_ms"]), float(s["error_budget"]), s.get("capacity"), low, high, probes,
                   s.get("note") or "", s.get("throughput"), s.get("unit") or "req/s", bool(s.get("at_least")),
                   s.get("ceiling"), bool(s.get("stopped")), s.get("bursts"))

    def sentence(self) -> str:
        if self.capacity is None and self.stopped:
            return f"not decided against the {self.target_p99_ms:.0f} ms p99 target: {self.note}"
        if self.capacity is None:
            best = self.best
            closest = f"; closest: {best.sentence(self.unit)}" if best else ""
            return f"no rate met the {self.target_p99_ms:.0f} ms p99 target{closest}{'; ' + self.note if self.note else ''}"
        above = self.at(self.high) if self.high is not None else None
        nxt = (f"next rate up {above.rate:.1f}: {above.verdict}, p99 {_ms(above.p99_ms)} ms" if above is not None
               else "the highest fraction tried")
        best = self.best
        there = _ms(best.p99_ms) if best else "?"
        return (f"{'at least ' if self.at_least else ''}{self.capacity:.1f} {self.unit} at p99 <= "
                f"{self.target_p99_ms:.0f} ms (p99 there {there} "
                f"ms; {nxt}; {len(self.probes)} windows)")


def _ms(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.0f}"


def _pooled(trials: list[Trial]) -> np.ndarray | None:
    if any(t.latencies_ms is None for t in trials):
        return None
    return np.concatenate([np.asarray(t.latencies_ms, dtype=float) for t in trials]) if trials else np.zeros(0)


def _offered(trials: list[Trial], window: float) -> float:
    """Arrivals scheduled per second: the trials' own offered rates (in the measure's unit: texts/s where a
    request carries several), else their submitted requests over the window."""
    own = [(t.offered_rate, t.window_s) for t in trials if math.isfinite(t.offered_rate) and math.isfinite(t.window_s)]
    if own and window > 0:
        return sum(rate * w for rate, w in own) / sum(w for _, w in own)
    return sum(t.submitted for t in trials) / window if window > 0 else math.nan


def pooled_figures(trials: list[Trial], target_p99_ms: float) -> dict[str, Any]:
    """n, exceedances, errors, p50, p99 and its interval over trials' pooled outcomes (a summary-only trial
    contributes its counts and the median of its percentiles)."""
    lat = _pooled(trials)
    errors = sum(t.failed for t in trials)
    window = sum(t.window_s for t in trials if math.isfinite(t.window_s))
    done = sum(t.qps * t.window_s for t in trials if math.isfinite(t.window_s) and math.isfinite(t.qps))
    out = {"n": sum(t.submitted for t in trials), "errors": errors,
           "late": sum(late_sends(t, target_p99_ms) for t in trials),
           "achieved_rate": done / window if window > 0 else known_median([t.qps for t in trials]),
           "offered_rate": _offered(trials, window)}
    if lat is not None and lat.size:
        lo, hi = quantile_interval(lat, 0.99)
        finite = lat[np.isfinite(lat)]
        out.update(n=int(lat.size), exceed=int((lat > target_p99_ms).sum()),
                   p50_ms=float(np.percentile(lat, 50, method="inverted_cdf")), p99_ms=p99_of(lat),
                   p99_low_ms=lo, p99_high_ms=hi, counted=True,
                   mean_ms=float(finite.mean()) if finite.size else math.nan)
    else:
        p99 = known_median([t.p99_ms for t in trials])
        out.update(exceed=None, p50_ms=known_median([t.p50_ms for t in trials]), p99_ms=p99, p99_low_ms=None,
                   p99_high_ms=None, counted=False, mean_ms=known_median([t.p50_ms for t in trials]))
    return out


def probe_of(rate: float, trial: Trial | None, figures: Any, target_p99_ms: float, error_budget: float,
             lag_p99_ms: float | None = None) -> Probe:
    """A window's verdict and figures: the verdict the runner gave it (logged, so a resumed run has it too),
    else judged on its outcomes, else on its p99 alone (``by`` says "p99 only": no bound)."""
    if figures is not None and getattr(figures, "verdict", None):  # the runner judged it
        v = TargetVerdict(figures.verdict, figures.over / figures.n if figures.n else math.nan, figures.share_low,
                          figures.share_high, figures.n, figures.over, figures.errors, figures.fastest_ms,
                          figures.deff, figures.needed, figures.judged_by or "blocks")
        by = v.by
    elif trial is not None and trial.latencies_ms is not None and len(trial.latencies_ms):
        v = target_verdict(trial.latencies_ms, target_p99_ms, trial.failed, error_budget,
                           arrivals_s=getattr(trial, "arrivals_s", None))
        by = v.by
    else:
        v, by = _p99_verdict(figures, target_p99_ms), "p99 only"
    f = pooled_figures([trial], target_p99_ms) if trial is not None else {}
    by = "no answers" if v.n == 0 else "errors" if v.verdict == "fail" and not v.low > 0.01 else by
    return Probe(rate, v.verdict, by, v.passed, 1, v.n, v.over, v.errors,
                 f.get("offered_rate", math.nan), f.get("achieved_rate", figures.qps if figures else math.nan),
                 f.get("late", 0), f.get("p50_ms", figures.p50_ms if figures else math.nan),
                 f.get("p99_ms", figures.p99_ms if figures else math.nan), f.get("p99_low_ms"), f.get("p99_high_ms"),
                 [trial] if trial is not None else [], v.mean, v.low, v.high, lag_p99_ms,
                 v.fastest_ms if math.isfinite(v.fastest_ms) else None, v.deff,
                 v.needed if math.isfinite(v.needed) else None)


def _p99_verdict(w: Any, target_p99_ms: float) -> TargetVerdict:
    """A window with neither outcomes nor a logged verdict: its p99 alone."""
    p99 = w.p99_ms if w is not None else math.nan
    verdict = "pass" if math.isfinite(p99) and p99 <= target_p99_ms else "fail"
    return TargetVerdict(verdict, math.nan, math.nan, math.nan, w.n if w else 0, 0, w.errors if w else 0,
                         w.fastest_ms if w else math.nan)


# of the closed-loop throughput: the open loop's rates, each tried while the last was kept up with. A closed loop of
# a few clients splits a dynamic batcher's batches, so its throughput can be a fraction of what open arrivals get
CEILING = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
CEILING_TRIES = 2  # a rate is past the ceiling when this many windows in a row at it fell behind
KEEP_UP = 0.95  # a window keeps up when its ok answers per second are at least this share of its arrivals per second
CLIMB = (1.0,)  # of the ceiling: where the check climbs after its first fraction held (batches only)
LONGER = 4  # a longer window holds at least this many times the last one's arrivals...
NEEDED_MARGIN = 1.5  # ...and this many times the arrivals the last one said it would need...
MAX_LONGER = 3  # ...and a rate gets at most this many, the last of them the longest


def next_length(verdict: str, needed: float | None, arrivals: int, longest: int) -> int | None:
    """The arrivals of the next, fresh window at a rate whose window of ``arrivals`` was ``verdict``
    (indeterminate) and said it ``needed`` so many: at least :data:`LONGER` times as many and
    :data:`NEEDED_MARGIN` times its need, at most ``longest``. None when the window was decided, when even the
    longest could not pass at its share and design effect (its share is at 1% or more, or its bursts too long:
    ``needed`` over ``longest`` or unknown), or when the longest has been tried."""
    if verdict != "indeterminate" or needed is None or not needed <= longest or arrivals >= longest:
        return None
    return int(min(longest, max(LONGER * arrivals, NEEDED_MARGIN * needed)))


def keeps_up(w: Any) -> bool:
    """Whether an open-loop window (a runner's :class:`~tuning.experiments.engine.Window`) answered ok at
    least :data:`KEEP_UP` of the rate at which its arrivals came: a server past its ceiling answers at its own
    pace while its queue grows."""
    offered = getattr(w, "offered_rate", math.nan)  # in the measure's unit (texts/s where a request holds several)
    if not math.isfinite(offered):
        offered = w.n / w.window_s if w.n > 0 and w.window_s > 0 else math.nan
    return answered_enough(w.qps, offered)


def answered_enough(qps: float, offered: float) -> bool:
    """Ok answers per second at least :data:`KEEP_UP` of the arrivals' ``offered`` rate (one unit for both)."""
    return bool(offered > 0 and math.isfinite(qps) and qps >= KEEP_UP * offered)


def check_target(run_window: Callable[[float, int, int | None], Any], throughput: float, target_p99_ms: float,
                 fractions: tuple[float, ...], error_budget: float = DEFAULT_ERROR_BUDGET, seed: int = 0,
                 stop: Callable[[Probe], bool] | None = None, unit: str = "req/s",
                 climb: tuple[float, ...] = CLIMB, longest: Callable[[float], int] | None = None,
                 ceiling: tuple[float, ...] = CEILING,
                 ceiling_arrivals: Callable[[float], int] | None = None) -> Capacity:
    """The capacity at the target (``docs/deciding.md``, stage 3). First the open loop's ceiling: windows of
    ``ceiling_arrivals`` at each multiple in ``ceiling`` of the closed-loop ``throughput``, while each keeps up
    (:func:`keeps_up`; a rate is past it when :data:`CEILING_TRIES` windows in a row fell behind, since a server
    just started may be slow for its first seconds; ``ceiling_arrivals(rate)`` their length). Where open arrivals
    were kept up with above the throughput, the ceiling is the pace of the last window that fell behind (past it a
    server answers at its own pace) when that is at least the climb's first multiple of the throughput, the top
    multiple when every rate was kept up with; else the throughput itself (a median of several windows, steadier
    than one window's pace, which a lucky window would raise). A ceiling window whose client lagged ends the climb
    at the last rate kept up with (the client's limit, not the server's). Then a window at each fraction of the
    ceiling, highest first, continuing at the fractions of the throughput below them (a tight target), until one
    passes; a window too short to tell (indeterminate) is followed by fresh, longer ones (:func:`next_length`) up
    to ``longest(rate)`` arrivals. A rate is claimed only when a fresh window at it, as long as the passing one,
    passes too (the search chose it among several looks: the fresh one alone is the test). When the first fraction
    is claimed, the check climbs through ``climb`` (multiples of the ceiling) while each rate is claimed the same
    way; a claim at the top is "at least" (as is a claim at the first fraction when ``climb`` is empty).
    ``run_window(rate, seed, arrivals) -> Window`` measures one (the engine's runner; ``arrivals`` None: the first
    look's length); ``stop(probe)`` returning True ends the check early (Ctrl-C's caller, a test)."""
    probes: list[Probe] = []
    if not (throughput > 0 and math.isfinite(throughput)):
        return Capacity(target_p99_ms, error_budget, None, None, None, [], "no sustained throughput to start from",
                        throughput, unit)
    salt = iter(range(seed + TARGET_SALT, seed + TARGET_SALT + 1_000_000))

    # the ceiling's windows draw their own arrivals, so that every configuration's looks at a rate share theirs
    ceiling_salt = iter(range(seed + CEILING_SALT, seed + CEILING_SALT + 1_000_000))

    def window(rate: float, role: str, arrivals: int | None = None, salt: Any = salt) -> Probe:
        w = run_window(rate, next(salt), arrivals)
        p = probe_of(rate, w.trial, w, target_p99_ms, error_budget, None if math.isnan(w.lag_p99_ms) else w.lag_p99_ms)
        if w.lagged:  # its re-run lagged too, and the lag explains its exceedances: the client's figure, not the server's
            p.verdict, p.by, p.passed = "indeterminate", "client lag", False
        if role == "ceiling":  # judged on keeping up, never claimed
            p.passed, p.achieved_rate = keeps_up(w) and not w.lagged, w.qps
            p.verdict, p.by = (("kept up" if p.passed else "fell behind"), "keeping up") if not w.lagged else (
                "indeterminate", "client lag")
        p.role = role
        probes.append(p)
        return p

    def longer(p: Probe, rate: float, asked: int) -> int | None:
        """The next longer window's arrivals, judged against what the last one was asked for (a window holds a
        Poisson count, often under it): None once the longest was asked for."""
        if p.by not in METHODS or longest is None:
            return None
        return next_length(p.verdict, p.needed, max(p.n, asked), longest(rate))

    def claimed(rate: float) -> bool | None:
        """Look at ``rate`` (longer while too short to tell, :data:`MAX_LONGER` times at most), then take a fresh
        window when a look passed. None: stopped."""
        look, asked = window(rate, "look"), 0
        for turn in range(MAX_LONGER + 1):
            if stop is not None and stop(look):
                return None
            size = longer(look, rate, asked) if turn < MAX_LONGER else None
            if size is None:
                break
            look, asked = window(rate, "longer", size), size
        if not look.passed:
            return False
        again = window(rate, "again", look.n if look.role == "longer" else None)
        if stop is not None and stop(again):
            return None
        return again.passed

    top, kept, note = throughput, 0.0, ""
    for m in ceiling:
        for _ in range(CEILING_TRIES):  # a window that fell behind may be a just-started server's: once more
            p = window(m * throughput, "ceiling", ceiling_arrivals(m * throughput) if ceiling_arrivals else None,
                       salt=ceiling_salt)
            if stop is not None and stop(p):
                return Capacity(target_p99_ms, error_budget, None, None, None, probes,
                                "stopped while finding the open loop's ceiling", throughput, unit, False, None,
                                stopped=True)
            if p.passed or p.by == "client lag":
                break
        if p.by == "client lag":
            top = max(kept, throughput)
            note = f"the client lagged at {p.rate:.1f} {unit}: the ceiling is at least {top:.1f}"
            break
        if not p.passed:  # past it, where the server answered at its own pace, when that is clearly above the throughput
            top = p.achieved_rate if kept > 0 and p.achieved_rate >= ceiling[0] * throughput else throughput
            break
        top = kept = m * throughput

    def result(capacity: float | None, high: float | None, at_least: bool = False, stopped: bool = False) -> Capacity:
        said = "; ".join(x for x in (note, "stopped during the target check" if stopped else "") if x)
        return Capacity(target_p99_ms, error_budget, capacity, capacity, high, probes, said, throughput, unit,
                        at_least or (stopped and capacity is not None), top, stopped,
                        under_bursts(probes, capacity, target_p99_ms, error_budget) if capacity is not None else None)

    rates = [f * top for f in fractions]
    rates += [f * throughput for f in fractions if f * throughput < rates[-1] * (1 - 1e-9)] if rates else []
    for i, rate in enumerate(rates):
        got = claimed(rate)
        if got is None:
            tried = judged(probes)
            return result(None, tried[-1].rate if tried else None, stopped=True)
        if not got:
            continue
        capacity = rate
        if i > 0:
            return result(capacity, rates[i - 1])
        for m in climb:
            if m * top <= capacity:
                continue
            up = claimed(m * top)
            if up is None:  # what was claimed stands; how far above it is not known
                return result(capacity, None, stopped=True)
            if not up:
                return result(capacity, m * top)
            capacity = m * top
        return result(capacity, None, at_least=True)
    tried = judged(probes)
    return result(None, tried[-1].rate if tried else None)


def under_bursts(probes: list[Probe], rate: float, target_p99_ms: float,
                 error_budget: float = DEFAULT_ERROR_BUDGET) -> dict[str, Any] | None:
    """The windows that claimed ``rate``, their outcomes judged together by the batches verdict (bursts counted,
    :func:`~tuning.experiments.judge.target_verdict`): whether they certify the p99 there, whatever verdict made
    the claim (the default, blocks, does not see bursts longer than a fifth of a window), and if not, the
    arrivals and the seconds at their pace that a hold at that share and design effect would need (None: never,
    at a share of 1% or more). None where the windows kept no outcomes (a run resumed from its figures)."""
    trials = [t for p in judged(probes) if math.isclose(p.rate, rate, rel_tol=1e-9) for t in p.trials]
    if not trials or any(t.latencies_ms is None for t in trials):
        return None
    ordered = []
    for t in trials:  # each window in its arrival order, the windows in the order they ran
        lat = np.asarray(t.latencies_ms, dtype=float)
        arrivals = getattr(t, "arrivals_s", None)
        if arrivals is not None and len(arrivals) == lat.size:
            lat = lat[np.argsort(np.asarray(arrivals, dtype=float), kind="stable")]
        ordered.append(lat)
    lat = np.concatenate(ordered)
    if not lat.size:
        return None
    v = target_verdict(lat, target_p99_ms, int(sum(t.failed for t in trials)), error_budget, method="batches")
    seconds = sum(t.window_s for t in trials if math.isfinite(t.window_s))
    hold_s = v.needed * seconds / lat.size if math.isfinite(v.needed) and seconds > 0 else None
    return {"verdict": v.verdict, "n": v.n, "share": rounded(v.mean), "share_high": rounded(v.high),
            "deff": rounded(v.deff), "needed": rounded(v.needed) if math.isfinite(v.needed) else None,
            "hold_s": rounded(hold_s)}


def hold_check(trial: Trial, target_p99_ms: float, error_budget: float = DEFAULT_ERROR_BUDGET) -> dict[str, Any]:
    """One open-loop hold judged against the target (``loadtest --rate R --target-p99-ms T``, the check a
    claimed capacity is held to): the batches verdict, the share over the target with its one-sided bounds,
    the p99 with its interval (both with the outcomes' bursts counted), the hold a verdict would need when
    this one could not tell, and the client's send lag (the client's figure, not the server's)."""
    lat = None if trial.latencies_ms is None else np.asarray(trial.latencies_ms, dtype=float)
    if lat is None or not lat.size:
        raise ValueError("the hold has no outcomes to judge: run it with --duration S at --rate R")
    v = target_verdict(lat, target_p99_ms, trial.failed, error_budget, arrivals_s=trial.arrivals_s)
    rate = trial.offered_rate if math.isfinite(trial.offered_rate) else (trial.rate or math.nan)
    lo, hi = quantile_interval(lat, 0.99, deff=v.deff)
    lags = None if trial.lags_ms is None else np.asarray(trial.lags_ms, dtype=float)
    explains = bool(lags is not None and lag_explains(lat, lags, target_p99_ms))
    verdict = "indeterminate" if explains else v.verdict  # the client's lag: the client's figure, as the engine says
    share_open = verdict == "indeterminate" and not explains and v.high > EXCEED_SHARE
    needed_s = v.needed / rate if share_open and math.isfinite(v.needed) and rate > 0 else None
    why = ("client lag" if explains else "share" if share_open else "errors" if verdict == "indeterminate" else None)
    return {"target_p99_ms": target_p99_ms, "verdict": verdict, "undecided_by": why, "n": v.n, "over": v.over,
            "errors": v.errors, "error_budget": error_budget,
            "share": rounded(v.mean), "share_low": rounded(v.low), "share_high": rounded(v.high),
            "deff": rounded(v.deff), "independent": rounded(v.n / v.deff), "p99_ms": rounded(p99_of(lat)),
            "p99_low_ms": rounded(lo), "p99_high_ms": rounded(hi), "rate": rounded(rate),
            "needed_s": rounded(needed_s),
            "lag_p99_ms": rounded(float(np.percentile(lags, 99))) if lags is not None and lags.size else None,
            "lag_explains": explains}
