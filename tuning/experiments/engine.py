"""The experiment engine (``docs/deciding.md``): explore on throughput, confirm once, check the target warm
and descending, ship the highest rate that passed. ``investigate`` and ``tune`` both run it; they differ
only in their exploring strategy (:mod:`tuning.experiments.screen`, :mod:`tuning.experiments.search`).

Configurations are opaque to the engine: the caller gives ``describe(config) -> dict`` (what the log,
the report and a resume see) and a ``measure(config, *, rate=None, seed=None, window_s=None) -> Trial``.
Every window is one :class:`Window`, appended to the run's log and handed to ``on_window``; a resumed
run replays the log (:class:`Runner`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tuning.base.decide import Paired
from tuning.base.format import rounded
from tuning.experiments.judge import METHODS, Sequential, client_lagged, lag_explains, outlying, target_verdict
from tuning.experiments.trial import Trial

OBJECTIVES = ("target", "qps")
VERDICTS = tuple(METHODS)  # how a target window is judged (docs/deciding.md, stage 3)
# of the open loop's ceiling (capacity.CEILING), highest first; above the first, the check climbs (capacity.CLIMB) on
# batches only, after the first was claimed: a queue near saturation has long bursts, and a window there needs many
# arrivals
FRACTIONS = (0.90, 0.85, 0.80, 0.75, 0.70, 0.60, 0.50, 0.40, 0.30)
LAG_SALT = 1_000_033  # a re-run after the client lagged draws new arrivals
FRESH = 4  # a configuration's freshest throughput: the median of its last this many windows


@dataclass(frozen=True)
class EngineSettings:
    """How much the engine measures (``docs/deciding.md`` has the table). ``quick()`` and ``full()`` are
    the same design with fewer or more windows."""

    objective: str = "target"
    min_effect: float = 0.05  # the confirmation's H1, and the gap under which two capacities are not told apart
    window_s: float = 4.0  # a throughput window
    screen_runs: int = 32
    interactions: bool = True  # the screen's model: two-way interactions too (needs the runs to estimate them)
    grid_repeats: int = 3  # tune's grid: each configuration this many times, in randomized blocks
    line_pairs: int = 2
    max_pairs: int = 16  # the confirmation's cap, looked at every look_every pairs
    look_every: int = 4
    alpha: float = 0.025  # the confirmation's false 'better' rate over all its looks
    target_outcomes: int = 2000  # a rate's first target window holds this many arrivals...
    target_max_s: float = 20.0  # ...or lasts this long, whichever is shorter...
    target_min_outcomes: int = 400  # ...but at least this many (299 is the fewest with which a window can pass)
    target_longest_s: float = 120.0  # a longer window at a rate whose first was too short to tell lasts at most this
    ceiling_arrivals: int = 200  # an open-loop ceiling window (capacity.CEILING): judged on keeping up, not the target,
    ceiling_min_s: float = 2.0  # ...and lasting at least this long (a fast server's pace over a few batches is noise)
    fractions: tuple[float, ...] = FRACTIONS
    candidates: int = 2  # candidates confirmed and checked at the target, in rank order
    min_window_answers: int = 30  # a throughput window with fewer ok answers is measured again, longer
    max_window_factor: int = 8  # ...at most this many times as long
    error_budget: float = 0.001
    verdict: str = "blocks"  # blocks: 5 blocks, the target alone; batches: 20 batches, bursts counted, longer windows
    seed: int = 0
    unit: str = "req/s"  # what a rate counts: requests, or texts where configurations send several per request

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: use 'target' (capacity at the p99 target) or 'qps' "
                             "(closed-loop throughput, for batch jobs)")
        if not 0 < self.min_effect < 1:
            raise ValueError(f"min_effect={self.min_effect!r} must be a share in (0, 1): 0.05 is 5%")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict={self.verdict!r}: use 'blocks' (5 blocks, the default) or 'batches' (bursts "
                             "counted, longer windows where a window cannot tell)")
        if not self.target_longest_s >= self.target_max_s:
            raise ValueError(f"target_longest_s={self.target_longest_s!r} must be at least target_max_s="
                             f"{self.target_max_s!r}: a longer window is not shorter than the first")
        if not 0 <= self.error_budget < 1:
            raise ValueError(f"error_budget={self.error_budget!r} must be a share in [0, 1): 0.001 is 0.1%")
        if self.look_every < 2 or self.max_pairs % self.look_every:
            raise ValueError(f"max_pairs={self.max_pairs} must be a multiple of look_every={self.look_every} (>= 2): "
                             "the confirmation's levels are set for its number of looks")
        if list(self.fractions) != sorted(self.fractions, reverse=True) or not all(0 < f < 1 for f in self.fractions):
            raise ValueError(f"fractions={self.fractions!r} must descend within (0, 1)")

    @classmethod
    def quick(cls, **changes: Any) -> "EngineSettings":
        base = dict(min_effect=0.10, window_s=3.0, screen_runs=16, interactions=False, grid_repeats=2, max_pairs=8,
                    target_outcomes=1000, target_max_s=10.0, target_longest_s=40.0, candidates=2)
        return cls(**{**base, **changes})

    @classmethod
    def full(cls, **changes: Any) -> "EngineSettings":
        return cls(**changes)

    def longer_window_s(self, trial: Trial, window_s: float) -> float | None:
        """A throughput window holds at least ``min_window_answers`` ok answers (a throughput from 2 answers
        is noise): the window that would hold them at this one's pace, at most ``max_window_factor`` times as
        long, or None when this one held enough (or none at all: a configuration that answers nothing)."""
        if trial.ok >= self.min_window_answers or trial.ok <= 0 or not window_s > 0:
            return None
        return window_s * min(self.max_window_factor, math.ceil(1.25 * self.min_window_answers / trial.ok))

    def target_window_s(self, rate: float, arrivals: int | None = None) -> float:
        """A target window's length at ``rate``: a first window holds ``target_outcomes`` arrivals within
        ``target_max_s``, a longer one ``arrivals`` within ``target_longest_s``; never fewer than
        ``target_min_outcomes`` arrivals (a slow service gets long windows), unless asked for fewer (a ceiling
        window, judged on keeping up only)."""
        if arrivals is None:
            return max(min(self.target_max_s, self.target_outcomes / rate), self.target_min_outcomes / rate)
        return max(min(self.target_longest_s, arrivals / rate), min(self.target_min_outcomes, arrivals) / rate)

    def ceiling_window_arrivals(self, rate: float) -> int:
        """The arrivals of a ceiling window at ``rate``: ``ceiling_arrivals``, at least ``ceiling_min_s`` of them."""
        return int(max(self.ceiling_arrivals, math.ceil(self.ceiling_min_s * rate)))

    def longest_arrivals(self, rate: float) -> int:
        """The most arrivals a target window at ``rate`` holds (a longer one's cap)."""
        return int(max(self.target_longest_s * rate, self.target_min_outcomes))


# The order and kinds of windows decide() asks for, numbered: a log measured in another cannot be replayed (a
# resume asks for the windows in order). Raise it whenever a stage adds, drops or reorders its windows.
PROCEDURES = {1: "target checks from the closed-loop throughput", 2: "target checks from the open loop's ceiling"}
PROCEDURE = max(PROCEDURES)


@dataclass
class Window:
    """One load test's figures as the engine keeps them (the raw outcomes are not kept)."""

    stage: str  # screen | line | grid | confirm | target
    kind: str  # throughput | target
    config: dict[str, Any]
    rate: float | None
    seed: int
    qps: float
    p50_ms: float
    p99_ms: float
    n: int
    errors: int
    window_s: float
    verdict: str | None = None  # target windows: the window's verdict (judge.target_verdict), kept for a resume...
    over: int = 0  # ...the outcomes over the target or failed...
    share_low: float = math.nan  # ...the bounds on their share...
    share_high: float = math.nan
    deff: float = math.nan  # ...the design effect they took...
    judged_by: str | None = None  # ...by which method (judge.METHODS)...
    needed: float = math.nan  # ...and the arrivals a window at its share and design effect would need to pass
    fastest_ms: float = math.nan
    lag_p99_ms: float = math.nan
    lagged: bool = False
    rerun: bool = False  # this window replaced one whose client lagged
    model_busy: float = math.nan
    device_busy: float = math.nan
    mean_batch: float = math.nan
    steal_share: float = math.nan
    server_queue_ms: float = math.nan  # the server's own timings over the window, where it exposes them
    server_compute_ms: float = math.nan
    offered_rate: float = math.nan  # arrivals per second in the measure's unit (a ceiling window keeps up against it)
    error: str | None = None  # the configuration could not be measured (ConfigError): no figures
    procedure: int = PROCEDURE  # which order of windows it was measured in (a log of another is not replayed)
    trial: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Its figures as JSON-able values (the trial, with its raw outcomes, is not kept)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "trial"}
        out["config"] = json.loads(json.dumps(out["config"], default=str))
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Window":
        names = {f.name for f in dataclasses.fields(cls)} - {"trial"}
        kw = {k: v for k, v in d.items() if k in names}
        kw.setdefault("procedure", 1)  # logged before windows recorded it
        for k in ("qps", "p50_ms", "p99_ms", "window_s", "fastest_ms", "lag_p99_ms", "offered_rate", "model_busy",
                  "device_busy", "share_low", "share_high", "deff", "needed", "mean_batch", "steal_share",
                  "server_queue_ms", "server_compute_ms"):
            kw[k] = math.nan if kw.get(k) is None else float(kw[k])
        return cls(**kw)


def same_as_recorded(then: Any, now: Any) -> bool:
    """Whether settings ``now`` equal those a log recorded (``then``), on the keys it recorded: a setting added
    since then (its key absent) is not a difference, since the older run's behaviour did not depend on it."""
    if isinstance(then, dict) and isinstance(now, dict):
        return all(k in now and same_as_recorded(v, now[k]) for k, v in then.items())
    return then == now


def _known(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else math.nan


def window_of(t: Trial, stage: str, kind: str, config: dict[str, Any], rate: float | None, seed: int,
              target_ms: float, verdict: str = "blocks") -> Window:
    lat = None if t.latencies_ms is None else np.asarray(t.latencies_ms, dtype=float)
    lags = None if t.lags_ms is None else np.asarray(t.lags_ms, dtype=float)
    finite = lat[np.isfinite(lat)] if lat is not None else np.zeros(0)
    v = None
    if kind == "target" and lat is not None and lat.size:
        v = target_verdict(lat, target_ms, int(t.failed), arrivals_s=getattr(t, "arrivals_s", None), method=verdict)
    lagged = client_lagged(lags, target_ms) and (kind != "target" or lag_explains(lat, lags, target_ms))
    return Window(stage, kind, config, rate, seed, _known(t.qps), _known(t.p50_ms), _known(t.p99_ms),
                  int(t.submitted or (lat.size if lat is not None else 0)), int(t.failed), _known(t.window_s),
                  v.verdict if v else None, v.over if v else 0, v.low if v else math.nan, v.high if v else math.nan,
                  v.deff if v else math.nan, v.by if v else None, v.needed if v else math.nan,
                  float(finite.min()) if finite.size else math.nan,
                  float(np.percentile(lags, 99)) if lags is not None and lags.size else math.nan,
                  lagged, False, _known(t.model_busy), _known(t.device_busy),
                  _known(t.mean_batch), _known(t.steal_share), _known(getattr(t, "server_queue_ms", math.nan)),
                  _known(getattr(t, "server_compute_ms", math.nan)), offered_rate=_known(t.offered_rate), trial=t)


class ReplayMismatch(RuntimeError):
    """A resumed run asked for a window its log does not hold next (other settings, other data)."""


class ConfigError(RuntimeError):
    """A configuration could not be measured (its server did not come up, or died): that configuration's
    error, not the run's. The runner logs it, so that a resumed run meets it again at the same place."""


class Runner:
    """Runs windows through ``measure``, logs them, replays a resumed log, and re-runs once a window whose
    client lagged (``docs/deciding.md``: the client is not the server)."""

    def __init__(self, measure: Callable[..., Trial], describe: Callable[[Any], dict[str, Any]],
                 settings: EngineSettings, target_ms: float, on_window: Callable[[Window], None] | None = None,
                 replay: Sequence[dict[str, Any]] = (), status: Callable[[str], None] | None = None):
        self.measure, self.describe, self.settings, self.target_ms = measure, describe, settings, target_ms
        self.on_window = on_window
        self.status = status or (lambda s: None)
        self.windows: list[Window] = []
        self._replay = list(replay)

    def _next_logged(self, stage: str, kind: str, config: dict[str, Any], rate: float | None) -> Window | None:
        if not self._replay:
            return None
        w = Window.from_dict(self._replay.pop(0))
        if w.procedure != PROCEDURE:
            self._replay.clear()
            raise ReplayMismatch(f"--resume: the log was measured in the engine's procedure {w.procedure} "
                                 f"({PROCEDURES[w.procedure]}); this version's is {PROCEDURE} "
                                 f"({PROCEDURES[PROCEDURE]}) and asks for other windows: start afresh (a new --out)")
        if (w.kind, w.config) != (kind, config) or (rate is not None and not math.isclose(w.rate or 0, rate)):
            self._replay.clear()
            raise ReplayMismatch(f"--resume: the log's next window is {w.kind} of {w.config} at {w.rate}, this run "
                                 f"asks for {kind} of {config} at {rate} (other settings or data?): start afresh")
        return w

    def _record(self, w: Window) -> Window:
        self.windows.append(w)
        if self.on_window:
            self.on_window(w)
        return w

    def run(self, stage: str, config: Any, rate: float | None, seed: int, arrivals: int | None = None) -> Window:
        """One window of ``config`` (closed loop when ``rate`` is None; a target window of ``arrivals`` when
        given, see :meth:`EngineSettings.target_window_s`), re-run once if the client lagged; a
        :class:`ConfigError` is logged and raised again (and raised again on replay)."""
        described = self.describe(config)
        kind = "throughput" if rate is None else "target"
        first = self._next_logged(stage, kind, described, rate)
        if first is None:
            first = self._measure(stage, kind, config, described, rate, seed, arrivals)
        self._record(first)
        if first.error is not None:
            raise ConfigError(first.error)
        if not first.lagged or first.rerun:
            return first
        again = self._next_logged(stage, kind, described, rate)
        if again is None:
            again = self._measure(stage, kind, config, described, rate, seed + LAG_SALT, arrivals)
            again.rerun = True
        self._record(again)
        if again.error is not None:
            raise ConfigError(again.error)
        return again

    def _measure(self, stage: str, kind: str, config: Any, described: dict[str, Any], rate: float | None,
                 seed: int, arrivals: int | None = None) -> Window:
        window_s = self.settings.window_s if rate is None else self.settings.target_window_s(rate, arrivals)
        try:
            trial = self.measure(config, rate=rate, seed=seed, window_s=window_s)
            longer = self.settings.longer_window_s(trial, window_s) if rate is None else None
            if longer is not None:  # too few answers for a throughput: once more, long enough to hold them
                self.status(f"{stage}: {trial.ok} answers in {window_s:.0f} s, again over {longer:.0f} s")
                trial = self.measure(config, rate=rate, seed=seed, window_s=longer)
        except ConfigError as exc:
            return Window(stage, kind, described, rate, seed, math.nan, math.nan, math.nan, 0, 0, math.nan,
                          error=str(exc))
        return window_of(trial, stage, kind, described, rate, seed, self.target_ms, self.settings.verdict)

    def throughput(self, stage: str, config: Any, seed: int) -> float:
        """ln(ok answers per second) of one closed-loop window (``-inf`` when none was ok)."""
        w = self.run(stage, config, None, seed)
        return math.log(w.qps) if w.qps > 0 else -math.inf


@dataclass
class Candidate:
    """A configuration the exploring strategy ranks, with its estimated log-throughput ratio over the
    baseline and that estimate's interval (NaN when the strategy has none)."""

    config: Any
    label: str
    log_ratio: float
    low: float = math.nan
    high: float = math.nan
    qps: float = math.nan  # its throughput as explored (the target check starts from a fresher figure)
    widens: tuple[str, ...] = ()  # its factors that widen the tail (the screen's): checked without them next


@dataclass
class Explored:
    """What a strategy hands the engine: candidates best first (the baseline among them or not) and its own
    tables for the report."""

    candidates: list[Candidate]
    baseline_qps: float
    tables: dict[str, Any] = field(default_factory=dict)
    window_sd: float = math.nan  # one window's log-throughput SD, from many windows (the screen's residuals)


def paired_log_ratios(runner: Runner, stage: str, a: Any, b: Any, pairs: int, seed: int,
                      on_pair: Callable[[list[float]], bool] | None = None,
                      pair_sd: float | None = None) -> tuple[list[float], list[float], list[float]]:
    """Up to ``pairs`` interleaved pairs of closed-loop windows, both arms of a pair on one seed: the
    per-pair ln(qps_b / qps_a) and each arm's qps. With ``pair_sd`` (a pair's SD known from elsewhere, never
    from the few pairs themselves), a pair beyond :data:`~tuning.experiments.judge.OUTLIER_SDS` of them from
    the others' median is measured once more, and that measurement stands.
    ``on_pair(d so far)`` returning True stops early."""
    d: list[float] = []
    qa: list[float] = []
    qb: list[float] = []
    again: set[int] = set()

    def one(i: int, s: int) -> tuple[float, float, float]:
        got = {arm: runner.run(stage, a if arm == "A" else b, None, s).qps for arm in Paired.order(i)}
        if got["A"] > 0 and got["B"] > 0:
            ratio = math.log(got["B"] / got["A"])
        else:  # an arm with no ok answer: a large loss (or gain), finite for the statistics
            ratio = -5.0 if got["A"] > 0 else (5.0 if got["B"] > 0 else 0.0)
        return max(min(ratio, 5.0), -5.0), got["A"], got["B"]

    for i in range(pairs):
        x, ya, yb = one(i, seed + i)
        d.append(x)
        qa.append(ya)
        qb.append(yb)
        for j in [j for j in (outlying(d, sd=pair_sd) if pair_sd is not None else []) if j not in again]:
            again.add(j)
            runner.status(f"{stage}: pair {j + 1} again, beyond the others' spread")
            d[j], qa[j], qb[j] = one(j, seed + 50_000 + j)
        if on_pair is not None and on_pair(list(d)):
            break
    return d, qa, qb


@dataclass
class Confirmation:
    """The winner against the baseline on fresh pairs, judged by the group-sequential test."""

    label: str
    test: Sequential
    qps_winner: float
    qps_baseline: float

    @property
    def confirmed(self) -> bool:
        return self.test.verdict == "better"

    def row(self) -> dict[str, Any]:
        t = self.test
        low, high = t.interval()
        return {"candidate": self.label, "verdict": t.verdict, "pairs": len(t.d), "ratio": rounded(t.ratio, 4),
                "low": rounded(low, 4), "high": rounded(high, 4), "pair_sd": rounded(t.sd, 4), "effect": t.effect,
                "alpha": t.alpha, "looks": t.looks, "look_level": rounded(t.level, 4), "qps": rounded(self.qps_winner, 4),
                "baseline_qps": rounded(self.qps_baseline, 4)}


def confirm(runner: Runner, candidate: Candidate, baseline: Any, settings: EngineSettings,
            window_sd: float = math.nan, salt: int = 0) -> Confirmation:
    """The group-sequential test on fresh pairs. A pair beyond the outlier limit is measured again once, the
    limit's scale taken from ``window_sd`` (a pair's SD is sqrt(2) of a window's): a scale estimated from the
    few pairs themselves would replace honest pairs, and biased the test toward its first pairs."""
    # each of the candidates confirmed at alpha / candidates: the run's false-ship rate stays within alpha
    test = Sequential(settings.min_effect, settings.alpha / settings.candidates, settings.look_every, settings.max_pairs)
    runner.status(f"confirming {candidate.label} against the baseline")
    pair_sd = math.sqrt(2) * window_sd if math.isfinite(window_sd) and window_sd > 0 else None
    _, qa, qb = paired_log_ratios(runner, "confirm", baseline, candidate.config, settings.max_pairs,
                                  settings.seed + 10_000 + salt, on_pair=lambda d: test.set(d) != "continue",
                                  pair_sd=pair_sd)
    # the target check starts from each arm's freshest windows (its first ones ran on a server just started)
    return Confirmation(candidate.label, test, float(np.median(qb[-FRESH:])), float(np.median(qa[-FRESH:])))


@dataclass
class Decision:
    """What the engine found: the configuration to ship, and every stage's figures."""

    baseline: Any
    recommended: Any
    explored: Explored | None = None
    confirmations: list[Confirmation] = field(default_factory=list)
    checks: list[tuple[str, Any]] = field(default_factory=list)  # (label, Capacity) in the order checked
    baseline_capacity: Any = None
    capacity: Any = None  # the recommended configuration's
    indeterminate: str | None = None
    failed: dict[str, str] = field(default_factory=dict)  # candidates whose measurement raised: not shipped
    interrupted: bool = False
    stage: str = "explore"  # the stage reached: explore | confirm | target | done


def _fresh_qps(runner: Runner, config: Any, fallback: float) -> float:
    """The configuration's latest closed-loop throughput in this run (its confirmation arms are the
    freshest), else ``fallback``."""
    key = runner.describe(config)
    got = [w.qps for w in runner.windows if w.kind == "throughput" and w.config == key and w.qps > 0]
    tail = got[-FRESH:]
    return float(np.median(tail)) if tail else fallback


def decide(runner: Runner, baseline: Any, explore: Callable[[Runner], Explored], settings: EngineSettings,
           label: Callable[[Any], str], decision: Decision | None = None) -> Decision:
    """Run the four stages (``docs/deciding.md``). ``decision`` is filled as it goes, so that a Ctrl-C
    leaves in it what was decided."""
    from tuning.experiments.capacity import CLIMB, check_target

    d = decision or Decision(baseline, baseline)
    d.explored = explore(runner)
    key = runner.describe(baseline)
    ranked = [c for c in d.explored.candidates if runner.describe(c.config) != key]
    d.indeterminate = _indeterminate(d.explored.candidates, settings)
    target = runner.target_ms

    def check(config: Any, qps: float, name: str) -> Any:
        runner.status(f"target check of {name} from {qps:.1f} {settings.unit}")
        cap = check_target(lambda rate, seed, arrivals: runner.run("target", config, rate, seed, arrivals), qps,
                           target, settings.fractions, settings.error_budget, settings.seed, unit=settings.unit,
                           climb=CLIMB if settings.verdict == "batches" else (),
                           longest=settings.longest_arrivals if settings.verdict == "batches" else None,
                           ceiling_arrivals=settings.ceiling_window_arrivals)
        d.checks.append((name, cap))
        return cap

    queue = list(ranked)
    tried = 0
    while queue and tried < settings.candidates:
        cand = queue.pop(0)
        tried += 1
        d.stage = "confirm"
        try:
            conf = confirm(runner, cand, baseline, settings, d.explored.window_sd, salt=1_000 * len(d.confirmations))
        except ConfigError as exc:  # a candidate whose server fails is not shipped; the run goes on
            d.failed[cand.label] = str(exc)
            continue
        d.confirmations.append(conf)
        if not conf.confirmed:
            continue
        if settings.objective == "qps":
            d.recommended = cand.config
            break
        # what ships is compared on the objective: every confirmed candidate is checked at the target, and ships
        # only with a capacity above the baseline's and every other checked one's
        d.stage = "target"
        if d.baseline_capacity is None:
            d.baseline_capacity = check(baseline, conf.qps_baseline, "baseline")
        try:
            cap = check(cand.config, conf.qps_winner, cand.label)
        except ConfigError as exc:
            d.failed[cand.label] = str(exc)
            continue
        best = d.capacity.capacity if d.capacity is not None and d.capacity.met else (
            d.baseline_capacity.capacity if d.baseline_capacity.met else 0.0)
        if cap.met and cap.capacity > best:
            d.recommended, d.capacity = cand.config, cap
        # one of its changes may add throughput and cost capacity: its bundles less one change come next
        queue = _without_one_first(runner, baseline, cand, queue)
    if settings.objective == "target" and d.baseline_capacity is None:
        d.stage = "target"
        d.baseline_capacity = check(baseline, _fresh_qps(runner, baseline, d.explored.baseline_qps), "baseline")
    if d.capacity is None and d.recommended is baseline:
        d.capacity = d.baseline_capacity
    met = sorted(((cap.capacity, name) for name, cap in d.checks if cap.met), reverse=True)
    if len(met) >= 2:  # the shipped figure is the capacity: say when the two best are within the minimum effect
        (top, a), (second, b) = met[:2]
        gap = top / second - 1
        if gap < settings.min_effect:
            u = settings.unit
            said = (f"{a} ({top:.1f} {u}) and {b} ({second:.1f} {u}) are within {100 * gap:.1f}% of each other "
                    f"at the target, under the {100 * settings.min_effect:.0f}% minimum effect: which of the two "
                    "holds more is not known")
            d.indeterminate = f"{d.indeterminate}; {said}" if d.indeterminate else said
    d.stage = "done"
    return d


def _changes(runner: Runner, baseline: Any, config: Any) -> set[tuple[str, str]]:
    base = runner.describe(baseline)
    return {(k, json.dumps(v, default=str)) for k, v in runner.describe(config).items() if base.get(k) != v}


def _without_one_first(runner: Runner, baseline: Any, checked: Candidate, queue: list[Candidate]) -> list[Candidate]:
    """The candidates still to check, those that are ``checked``'s bundle less one of its changes first: those
    without one of its tail-widening factors before the others, each group in rank order. A knob that raises
    throughput and lowers capacity at the target must not ride along in a bundle, and the screen's tails say
    which knob to suspect first."""
    bundle = _changes(runner, baseline, checked.config)
    less_one = []
    for c in queue:
        changes = _changes(runner, baseline, c.config)
        if len(changes) == len(bundle) - 1 and changes < bundle:
            less_one.append(c)
    less_one.sort(key=lambda c: not set(checked.widens) - set(c.widens))  # stable: rank order within each group
    return less_one + [c for c in queue if c not in less_one]


def _indeterminate(candidates: list[Candidate], settings: EngineSettings) -> str | None:
    """The two best candidates within the minimum effect of each other: the order between them is not
    known (said, never hidden)."""
    if len(candidates) < 2:
        return None
    a, b = candidates[0], candidates[1]
    gap = a.log_ratio - b.log_ratio
    if math.isfinite(gap) and gap < math.log1p(settings.min_effect):
        return (f"{a.label} and {b.label} are within {100 * (math.exp(gap) - 1):.1f}% of each other in throughput, "
                f"under the {100 * settings.min_effect:.0f}% minimum effect: which of the two is faster is not known")
    return None
