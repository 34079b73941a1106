"""``investigate``'s decision on the package's own pipeline: the engine (``docs/deciding.md``) with the
factorial screen of the knobs as its exploring strategy.

    result = run_ladder("data/records.jsonl", device="cpu", quick=True)
    result.to_frame()        # one row per stage: effects, confirmations, target checks
    result.recommended       # the Knobs to ship
    result.set_line()        # the same as copy-pasteable --set flags
    result.target_met        # False: no configuration met the p99 target (investigate exits 3)

Before the screen it measures what the factors' levels need (:mod:`tuning.experiments.factors`): the batch
sweep's knee at the data's median length, the planned buckets, half precision's accuracy against fp32.

**The seam**: ``measure(knobs, *, rate=None, record=False, seed=None, window_s=None) -> Trial`` replaces the
load test (``rate=None``: a closed loop at the settings' concurrency; a number: an open loop at that
Poisson rate; ``window_s``: the window the engine asks for); ``sweep`` (knobs -> result with ``.knee``),
``accuracy`` (dtypes -> {dtype: min cosine}) and ``lengths`` (token lengths) replace the batch sweep, the
precision check and the tokenizer pass.

**Nothing lost**: ``on_step`` gets the partial result after every window; Ctrl-C returns what was measured
(``interrupted``); ``resume`` (a partial ``summary.json``) replays its logged windows and goes on.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tuning.base.machine import usable_cores
from tuning.base.progress import progress_bar
from tuning.experiments.defaults import DEFAULT_TARGET_P99_MS
from tuning.experiments.engine import OBJECTIVES, Decision, EngineSettings, Runner, Window, decide, same_as_recorded
from tuning.experiments.factors import FACTORS, MIN_COSINE, Context, screened
from tuning.experiments.measure import LoadMeasure
from tuning.experiments.result import LadderResult, Step, change_text, changes_of, format_step
from tuning.experiments.screen import screen
from tuning.experiments.trial import Measure, Trial, as_measure
from tuning.experiments.workload import device_block, input_texts, load_inputs, plan_for, token_lengths
from tuning.knobs import Knobs, preset
from tuning.sim.device import device_for

__all__ = ["LadderSettings", "LadderResult", "LadderError", "Step", "Trial", "LoadMeasure", "Measure", "run_ladder",
           "load_inputs", "input_texts", "token_lengths", "plan_for", "MIN_COSINE", "FACTOR_NAMES", "OBJECTIVES",
           "DEFAULT_TARGET_P99_MS", "device_block"]

FACTOR_NAMES = tuple(FACTORS)


class LadderError(RuntimeError):
    """The run cannot start: the baseline got no ok answer (the message names the first error)."""


@dataclass(frozen=True)
class LadderSettings:
    """The engine's settings (windows, pairs, fractions) and what the factors' levels need measured."""

    engine: EngineSettings = field(default_factory=EngineSettings.full)
    concurrency: int = 16  # the closed loop's clients (the throughput windows)
    warmup_s: float = 1.0
    sweep_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    sweep_repeats: int = 2
    sweep_rounds: int = 3
    precision_texts: int = 128
    workers: int = field(default_factory=lambda: max(4, min(8, os.cpu_count() or 1)))
    workers_min_cores: int = 3
    # torch.compile on a CPU costs tens of seconds per shape, half the screen's runs: screened only when asked
    compile_on_cpu: bool = False
    limit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency!r} must be an integer >= 1")

    @classmethod
    def _make(cls, engine: EngineSettings, base: dict[str, Any], changes: dict[str, Any]) -> "LadderSettings":
        engine_keys = {f.name for f in dataclasses.fields(EngineSettings)}
        engine = dataclasses.replace(engine, **{k: v for k, v in changes.items() if k in engine_keys})
        own = {**base, **{k: v for k, v in changes.items() if k not in engine_keys}}
        return cls(engine=engine, **own)

    @classmethod
    def quick(cls, **changes: Any) -> "LadderSettings":
        """The same design with fewer windows: 16 screen runs, up to 8 confirmation pairs at a 10% effect,
        target windows of 1,000 outcomes or 10 s, three batch sizes swept, one wait."""
        base = dict(warmup_s=0.5, sweep_sizes=(1, 4, 16), sweep_repeats=1, sweep_rounds=2,
                    precision_texts=32)
        return cls._make(EngineSettings.quick(), base, changes)

    @classmethod
    def full(cls, **changes: Any) -> "LadderSettings":
        """32 screen runs, up to 16 confirmation pairs at a 5% effect, target windows of 2,000 outcomes or
        20 s, two candidates checked at the target."""
        return cls._make(EngineSettings.full(), {}, changes)

    @property
    def objective(self) -> str:
        return self.engine.objective

    @property
    def min_effect(self) -> float:
        return self.engine.min_effect

    @property
    def error_budget(self) -> float:
        return self.engine.error_budget

    def as_dict(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return list(v) if isinstance(v, tuple) else v
        return plain(dataclasses.asdict(self))


def _default_sweep(measure: Any, settings: LadderSettings, length: int) -> Callable[[Knobs], Any]:
    def sweep(knobs: Knobs) -> Any:
        from tuning.experiments.sweeps import batch_sweep, run_batch_sweep

        engine = measure.engine(knobs) if hasattr(measure, "engine") else None
        sizes = list(settings.sweep_sizes)
        if engine is not None and knobs.graph == "eager":  # one untimed warm-up call per size is enough for eager
            return batch_sweep(engine.runner, engine.device, sizes, length, settings.sweep_repeats, warmup=1,
                               dtype=knobs.dtype, graph=knobs.graph, rounds=settings.sweep_rounds)
        return run_batch_sweep(knobs, sizes, length, settings.sweep_repeats, engine=engine, rounds=settings.sweep_rounds)
    return sweep


def _default_accuracy(texts: Sequence[str], model: Any = None) -> Callable[[Sequence[str]], Any]:
    def accuracy(dtypes: Sequence[str]) -> Any:
        from tuning.experiments.precision import precision_report

        return precision_report(list(texts), tuple(dtypes), model=model)  # real model, real device: never simulated
    return accuracy


def _min_cosines(report: Any) -> dict[str, Any]:
    """dtype -> min cosine (float) or the reason it was refused (str)."""
    if isinstance(report, dict):
        return dict(report)
    out: dict[str, Any] = {d: float(np.min(c)) for d, c in report.cosines.items()}
    out.update(report.refused)
    return out


def measure_for(inputs: Sequence[Any], settings: LadderSettings, model: Any = None, tokenizer: Any = None,
                formatter: Any = None) -> LoadMeasure:
    """The real measurement with the run's load settings (concurrency, warm-up, seed)."""
    return LoadMeasure(inputs, settings.concurrency, settings.engine.window_s, settings.warmup_s, model,
                       seed=settings.engine.seed, tokenizer=tokenizer, formatter=formatter)


def _context(dev: Any, settings: LadderSettings, base: Knobs, measure: Any, sweep: Callable | None,
             accuracy: Callable | None, lengths: Sequence[int], texts: Sequence[str], model: Any,
             names: Sequence[str], extra: dict[str, Any], status: Callable[[str], None],
             saved: dict[str, Any] | None = None) -> Context:
    """What the factors' levels need, measured before the screen (only for the factors asked for); a resumed
    run takes what its first part measured (``saved``), so that its screen asks for the same windows."""
    median_len = int(-(-np.median(lengths) // 8) * 8) if len(lengths) else 64
    ctx = Context(dev.knob, usable_cores(), workers=settings.workers, workers_min_cores=settings.workers_min_cores,
                  compile_on_cpu=settings.compile_on_cpu,
                  max_batch=settings.concurrency if settings.objective == "qps" else None)
    if saved:
        ctx.knee, ctx.plan, ctx.cosines = saved.get("knee"), saved.get("plan"), dict(saved.get("cosines") or {})
        ctx.cores = saved.get("cores", ctx.cores)
        extra.update(knee=ctx.knee, buckets=ctx.plan, precision=ctx.cosines or None)
        return ctx
    if "batch" in names:
        status(f"batch sweep at {median_len} tokens")
        extra["sweep"] = (sweep or _default_sweep(measure, settings, median_len))(base)
        ctx.knee = extra["knee"] = getattr(extra["sweep"], "knee", None)
    if lengths and ("buckets" in names or "graph" in names):
        ctx.plan = extra["buckets"] = plan_for(lengths, base.max_length)
    if "precision" in names:
        status("accuracy check of half precision against fp32")
        wanted = ("fp16", "bf16") if dev.knob == "cuda" else ("bf16",)
        extra["precision"] = (accuracy or _default_accuracy(texts[: settings.precision_texts], model))(wanted)
        ctx.cosines = _min_cosines(extra["precision"])
    return ctx


def run_ladder(data: Any = None, device: Any = "auto", quick: bool = False,
               target_p99_ms: float = DEFAULT_TARGET_P99_MS, measure: Callable[..., Any] | None = None,
               progress: bool | Callable[[str], None] = True, settings: LadderSettings | None = None,
               factors: Sequence[str] | None = None, first: Trial | None = None, sweep: Callable | None = None,
               accuracy: Callable | None = None, lengths: Sequence[int] | None = None,
               model: Any = None, sim_profile: str | None = None, objective: str | None = None,
               on_step: Callable[[LadderResult], None] | None = None,
               tokenizer: Any = None, formatter: Any = None, resume: dict[str, Any] | None = None) -> LadderResult:
    """Decide what to ship for ``data`` (a JSONL path, or request bodies) on ``device`` (``auto``: CUDA,
    else the real CPU; ``cpu``, ``cuda``, ``sim`` or a ``tuning.sim.device_for`` choice); see the module
    docstring for the seam. ``factors``: the screened factors (default: every one that applies). ``first``:
    a baseline run already made (``investigate`` records one under the profilers). Raises
    :class:`LadderError` when the baseline gets no ok answer."""
    settings = settings or (LadderSettings.quick() if quick else LadderSettings.full())
    if objective is not None:
        settings = dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, objective=objective))
    if target_p99_ms is None or not target_p99_ms > 0:
        raise ValueError(f"target_p99_ms={target_p99_ms!r} must be a number > 0 (milliseconds)")
    names = tuple(factors) if factors is not None else FACTOR_NAMES
    unknown = [s for s in names if s not in FACTORS]
    if unknown:
        raise ValueError(f"unknown factor(s) {unknown}; known: {', '.join(FACTORS)}")
    dev = device_for(device, sim_profile, fallback="cpu")
    sim_profile = sim_profile or (dev.profile if dev.knob == "sim" else None)
    inputs = load_inputs(data, settings.limit) if measure is None or lengths is None or accuracy is None else []
    texts, bad = input_texts(inputs, formatter) if inputs else ([], {})
    own_measure = measure is None
    raw_measure = measure or measure_for(inputs, settings, model, tokenizer, formatter)
    measure_fn, open_loop = as_measure(raw_measure)
    if settings.objective == "target" and not open_loop:
        raise ValueError("objective='target' needs an open loop: give measure(knobs, *, rate=None, record=False), "
                         "or use objective='qps' with a one-argument measure")
    if lengths is None:
        lengths = token_lengths(texts) if texts and any(s in names for s in ("batch", "buckets", "graph")) else []
    base = preset("baseline", device=dev.knob)
    if dev.knob == "sim" and sim_profile:
        base = base.replace(sim_profile=sim_profile)
    bar, report, status = progress_bar(progress, total=1, desc="decide")
    extra: dict[str, Any] = {"data": {"inputs": len(inputs), "invalid": sum(bad.values()), "invalid_reasons": bad},
                             "factors": list(names)}
    result = LadderResult(base, base, None, settings, device_block(dev, sim_profile), target_p99_ms, [], {}, {},
                          extra=extra)

    def on_window(w: Window) -> None:
        status(f"{w.stage}: {change_text(w.config)[:60] or 'baseline'}")
        if on_step is not None:
            on_step(result)

    state = (resume or {}).get("state") or {}
    _check_resumable(state, settings, target_p99_ms, names)
    runner = Runner(measure_fn, _describe, settings.engine, target_p99_ms, on_window, state.get("log") or [], status)
    result.windows = runner.windows
    try:
        if first is not None and first.ok == 0:
            raise LadderError(f"the baseline got no ok answer ({first.submitted} sent); first error: "
                              f"{first.first_error or 'none recorded'}")
        ctx = _context(dev, settings, base, raw_measure, sweep, accuracy, lengths, texts, model, names, extra, status,
                       state.get("context"))
        extra["context"] = {"knee": ctx.knee, "plan": ctx.plan, "cosines": ctx.cosines, "cores": ctx.cores}
        result.screened, result.not_screened = screened(ctx, names)
        strategy = screen(base, result.screened, settings.engine, _label)
        result.decision = Decision(base, base)
        decide(runner, base, _guarded_first(strategy, first), settings.engine, _label, result.decision)
        result.recommended = result.decision.recommended
        for s in result.steps:
            report(format_step(s))
    except KeyboardInterrupt:
        result.interrupted = True
        report("interrupted: what was measured is kept")
    finally:
        bar.close()
        if own_measure:
            raw_measure.close()
    if result.decision is not None:
        result.recommended = result.decision.recommended
    return result


def _check_resumable(state: dict[str, Any], settings: LadderSettings, target_p99_ms: float,
                     names: Sequence[str]) -> None:
    """A resumed run goes on only under the settings its log was measured with (else ValueError naming them)."""
    if not state.get("log"):
        return
    then = {"target_p99_ms": state.get("target_p99_ms"), "settings": state.get("settings"),
            "factors": state.get("factors")}
    now = {"target_p99_ms": target_p99_ms, "settings": settings.as_dict(), "factors": list(names)}
    differ = [k for k in now if then[k] is not None and not same_as_recorded(then[k], now[k])]
    if differ or any(then[k] is None for k in now):
        named = ", ".join(differ) or "settings that run did not record"
        raise ValueError(f"--resume: that run's windows were measured with other {named}; give the same "
                         "--target-p99-ms, --quick and settings, or run without --resume")


def _guarded_first(strategy: Callable[[Runner], Any], first: Trial | None) -> Callable[[Runner], Any]:
    """The strategy, after checking that the baseline answers at all (its first window)."""
    def explore(runner: Runner) -> Any:
        got = strategy(runner)
        base_windows = [w for w in runner.windows if w.kind == "throughput"]
        if base_windows and all(w.qps <= 0 for w in base_windows):
            trial = base_windows[0].trial
            why = getattr(trial, "first_error", None) if trial is not None else None
            raise LadderError(f"no configuration got an ok answer; first error: {why or 'none recorded'}")
        return got
    return explore


def _describe(k: Knobs) -> dict[str, Any]:
    return {key: (list(v) if isinstance(v, tuple) else v) for key, v in changes_of(k).items()}


def _label(k: Knobs) -> str:
    return change_text(changes_of(k)) or "baseline"
