"""The optimization ladder: from ``baseline``, one variable at a time, each step load-tested the
same way and kept only if it helps. Shared by ``python -m tuning investigate`` and notebook 06.

    ladder = run_ladder("data/records.jsonl", device="cpu", quick=True)
    ladder.to_frame()        # one row per step: QPS, p99, model/device busy, gain, kept, why
    ladder.recommended       # the Knobs to ship
    ladder.set_line()        # the same as copy-pasteable --set flags

Steps, in the investigation's order (INVESTIGATION.md, step 4):

1. ``workers``: more preprocessing workers and ``prefetch_factor=4`` (``pin_memory`` on a device);
2. ``batch``: ``batch_size`` = the knee of the batch sweep at the data's median length;
3. ``tokenizer``: the batched Rust tokenizer instead of per-record Python;
4. ``buckets``: ``padding='bucket'`` with lengths planned from the token-length histogram;
5. ``precision``: half precision, only if its embeddings stay within :data:`MIN_COSINE` of fp32;
6. ``graph``: CUDA-graph capture (a GPU or the simulated one) or ``torch.compile`` (CPU, not in quick mode);
7. ``batching``: dynamic batching, the ``max_wait_ms`` with the best QPS under the p99 target.

**Same load for every step**: an in-process server, a closed loop at fixed concurrency, the
same requests in the same order, warm-up excluded (:class:`LoadMeasure`). **Kept only if it
helps**: QPS (median over runs) must beat the step before by more than the run-to-run spread
(:meth:`Ladder.noise`: the larger of :data:`NOISE_FLOOR` and the median relative range of
repeated runs; the baseline always runs twice to measure it). A gain within the spread is
repeated (reference and candidate again, interleaved) before it is judged; a step that still
cannot be told from noise is not kept. A step that lifts QPS but pushes p99 over the target
(when the step before met it) is not kept either.

One exception to "one knob per step", stated where it happens: bucket padding only pays with
batches of more than one, so when the batch step was not kept (dynamic padding made batching
lose) the bucket step tries buckets together with the knee's batch size.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from tuning.base.format import rounded
from tuning.base.progress import progress_bar
from tuning.knobs import Knobs, knob_names, preset
from tuning.sim.device import device_for

MIN_COSINE = 0.999  # worst-case cosine of half-precision vs fp32 embeddings under which a dtype is not recommended
NOISE_FLOOR = 0.03  # the smallest run-to-run spread assumed (3%), whatever the repeats measured
BUCKET_WASTE_TARGET = 0.15  # planned buckets: the fewest (up to MAX_BUCKETS) whose padding waste is at most 15%
MAX_BUCKETS = 8  # shapes to compile or capture at most
DEFAULT_TARGET_P99_MS = 800.0  # the investigation's p99 target
STEPS = ("workers", "batch", "tokenizer", "buckets", "precision", "graph", "batching")
# knobs that describe the test or the machine, not a configuration to ship
_NOT_RECOMMENDED = ("concurrency", "device", "sim_profile")


@dataclass(frozen=True)
class LadderSettings:
    """How much to measure: one load test per step (``duration_s`` measured after ``warmup_s``)."""

    concurrency: int = 32
    duration_s: float = 15.0
    warmup_s: float = 2.0
    repeats: int = 2  # extra rounds (reference + candidate) while a gain is within the spread
    sweep_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    sweep_repeats: int = 3
    sweep_rounds: int = 5
    waits_ms: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 50.0)
    precision_texts: int = 256
    workers: int = field(default_factory=lambda: max(4, min(8, os.cpu_count() or 1)))
    prefetch_factor: int = 4
    compile_on_cpu: bool = True  # torch.compile costs seconds per shape on a CPU
    limit: int | None = None  # read at most this many input lines

    @classmethod
    def quick(cls) -> "LadderSettings":
        """About three minutes on a 2-core CPU: shorter load tests, fewer sweep points and waits."""
        return cls(concurrency=16, duration_s=5.0, warmup_s=1.0, repeats=1, sweep_sizes=(1, 4, 16),
                   sweep_repeats=1, sweep_rounds=2, waits_ms=(5.0, 20.0), precision_texts=32, compile_on_cpu=False)

    @classmethod
    def full(cls) -> "LadderSettings":
        return cls()


# --- what one measurement gives -----------------------------------------------------------------

@dataclass
class Trial:
    """One load test's figures (the raw load result kept in ``load``, the recorder's in ``profile``)."""

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
    load: Any = field(default=None, repr=False, compare=False)
    profile: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_load(cls, result: Any, profile: Any = None) -> "Trial":
        s = result.summary()
        num = lambda key: math.nan if s.get(key) is None else float(s[key])  # noqa: E731
        return cls(qps=num("qps"), p99_ms=num("p99_ms"), model_busy=num("model_busy"),
                   device_busy=num("device_busy"), p50_ms=num("p50_ms"), p95_ms=num("p95_ms"),
                   mean_batch=num("mean_batch"), ok=int(s.get("ok") or 0), errors=int(s.get("errors") or 0),
                   timeouts=int(s.get("timeouts") or 0), rejected=int(s.get("rejected") or 0),
                   submitted=int(s.get("submitted") or 0), window_s=num("window_s"), load=result, profile=profile)


Measure = Callable[[Knobs], Any]  # knobs -> Trial (or a LoadResult)

_MEDIAN_FIELDS = ("qps", "p50_ms", "p95_ms", "p99_ms", "model_busy", "device_busy", "mean_batch")
_SUM_FIELDS = ("ok", "errors", "timeouts", "rejected", "submitted", "window_s")


def _median(values: Sequence[float]) -> float:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(statistics.median(finite)) if finite else math.nan


@dataclass
class Experiment:
    """One measured configuration: its knobs and every run of it (figures are medians over runs)."""

    id: int
    step: str
    change: str
    knobs: Knobs
    device: str
    simulated: bool
    trials: list[Trial] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        if name in _MEDIAN_FIELDS:
            return _median([getattr(t, name) for t in self.trials])
        if name in _SUM_FIELDS:
            return sum(getattr(t, name) for t in self.trials)
        raise AttributeError(name)

    @property
    def runs(self) -> int:
        return len(self.trials)

    @property
    def spread(self) -> float:
        """Relative range of QPS over runs ((max - min) / median); NaN with fewer than two runs."""
        q = [t.qps for t in self.trials if math.isfinite(t.qps)]
        if len(q) < 2 or statistics.median(q) <= 0:
            return math.nan
        return (max(q) - min(q)) / statistics.median(q)

    @property
    def last_load(self) -> Any:
        return next((t.load for t in reversed(self.trials) if t.load is not None), None)

    def row(self) -> dict[str, Any]:
        """One flat row: what experiments.csv and summary.json both hold."""
        row: dict[str, Any] = {"experiment": self.id, "step": self.step, "change": self.change,
                               "device": self.device, "simulated": self.simulated, "runs": self.runs}
        row.update({k: rounded(getattr(self, k)) for k in _MEDIAN_FIELDS})
        row["qps_runs"] = ";".join(f"{t.qps:.3f}" for t in self.trials)
        row["spread"] = rounded(self.spread)
        row.update({k: rounded(getattr(self, k)) if k == "window_s" else getattr(self, k) for k in _SUM_FIELDS})
        row.update({f"knob_{k}": _knob_text(v) for k, v in self.knobs.as_dict().items()})
        return row


def _knob_text(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


@dataclass
class Step:
    """One rung: what changed, what it was compared with, and whether it was kept (and why)."""

    name: str
    title: str
    change: str
    status: str  # baseline | kept | not kept | skipped | refused
    reason: str
    experiment: Experiment | None = None
    reference: Experiment | None = None
    gain: float = math.nan  # QPS of the candidate / QPS of the reference - 1 (medians)
    noise: float = math.nan  # the run-to-run spread it was judged against
    candidates: list[Experiment] = field(default_factory=list)  # several values tried (max_wait_ms)

    @property
    def kept(self) -> bool:
        return self.status in ("baseline", "kept")

    def row(self) -> dict[str, Any]:
        e = self.experiment
        fig = (lambda k: rounded(getattr(e, k))) if e is not None else (lambda k: None)
        return {"step": self.name, "title": self.title, "change": self.change, "status": self.status,
                "kept": self.kept, "qps": fig("qps"), "p50_ms": fig("p50_ms"), "p99_ms": fig("p99_ms"),
                "model_busy": fig("model_busy"), "device_busy": fig("device_busy"), "mean_batch": fig("mean_batch"),
                "gain": rounded(self.gain), "noise": rounded(self.noise), "runs": e.runs if e else 0,
                "experiment": e.id if e else None, "reference": self.reference.id if self.reference else None,
                "candidates": [c.id for c in self.candidates], "reason": self.reason}


@dataclass
class LadderResult:
    """Every step, every experiment, and the configuration to ship."""

    baseline: Knobs
    recommended: Knobs
    steps: list[Step]
    experiments: list[Experiment]
    device: dict[str, Any]
    settings: LadderSettings
    target_p99_ms: float
    noise: float
    sweep: Any = None  # BatchSweepResult of the batch step
    precision: Any = None  # PrecisionReport (or a mapping dtype -> min cosine from a stub)
    buckets: dict[str, Any] | None = None
    waits: pd.DataFrame | None = None  # the max_wait_ms candidates
    data: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    @property
    def final(self) -> Experiment:
        """The experiment of the last kept step (the recommended configuration's measurement)."""
        return [s for s in self.steps if s.kept and s.experiment is not None][-1].experiment

    def to_frame(self) -> pd.DataFrame:
        """One row per step (skipped ones too, without figures)."""
        frame = pd.DataFrame([s.row() for s in self.steps])
        frame.attrs["device"] = self.device
        return frame

    def experiments_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([e.row() for e in self.experiments])
        frame.attrs["device"] = self.device
        return frame

    def changes(self) -> dict[str, Any]:
        """The recommended knobs that differ from the ``baseline`` preset (device excluded unless simulated)."""
        base = preset("baseline")
        out = {k: getattr(self.recommended, k) for k in knob_names()
               if k not in _NOT_RECOMMENDED and getattr(self.recommended, k) != getattr(base, k)}
        if self.recommended.device == "sim":
            out.update(device="sim", sim_profile=self.recommended.sim_profile)
        return out

    def set_line(self) -> str:
        """``--preset baseline --set k=v ...``: paste after ``python -m tuning serve`` (or run/loadtest)."""
        parts = ["--preset baseline"] + [f"--set {k}={_set_value(v)}" for k, v in self.changes().items()]
        return " ".join(parts)

    def python_call(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.changes().items())
        return f'tuning.preset("baseline"{", " + args if args else ""})'

    def summary(self) -> dict[str, Any]:
        first = next(s for s in self.steps if s.experiment is not None).experiment
        final = self.final
        return {
            "device": self.device, "target_p99_ms": self.target_p99_ms, "noise": rounded(self.noise),
            "min_cosine": MIN_COSINE, "noise_floor": NOISE_FLOOR,
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.settings.__dict__.items()},
            "baseline": {"qps": rounded(first.qps), "p99_ms": rounded(first.p99_ms), "model_busy": rounded(first.model_busy),
                         "device_busy": rounded(first.device_busy)},
            "result": {"qps": rounded(final.qps), "p99_ms": rounded(final.p99_ms), "model_busy": rounded(final.model_busy),
                       "device_busy": rounded(final.device_busy),
                       "qps_ratio": rounded(final.qps / first.qps) if first.qps else None},
            "steps": [s.row() for s in self.steps],
            "experiments": [e.row() for e in self.experiments],
            "recommended": {"changes": {k: _json_value(v) for k, v in self.changes().items()},
                            "set_line": self.set_line(), "python_call": self.python_call(),
                            "knobs": self.recommended.as_dict()},
            "batch_sweep": self.sweep.summary() if hasattr(self.sweep, "summary") else None,
            "precision": self.precision.summary() if hasattr(self.precision, "summary") else self.precision,
            "buckets": self.buckets,
            "waits": None if self.waits is None else self.waits.astype(object).where(self.waits.notna(), None).to_dict("records"),
            "data": self.data,
        }


def _set_value(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _json_value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


# --- the same load for every step ---------------------------------------------------------------

class LoadMeasure:
    """Closed-loop load at fixed concurrency against an in-process server: the same requests in the
    same order for every configuration, warm-up excluded. Models are built once per model-side
    configuration (device, dtype, graph...) and shared by the servers that need them."""

    def __init__(self, inputs: Sequence[Any], concurrency: int = 32, duration_s: float = 15.0,
                 warmup_s: float = 2.0, model: Any = None, on_start: Callable[[Knobs], None] | None = None):
        if not inputs:
            raise ValueError("no inputs to load-test with: the data file is empty")
        self.inputs = list(inputs)
        self.concurrency, self.duration_s, self.warmup_s = concurrency, duration_s, warmup_s
        self.model = model
        self.on_start = on_start
        self._engines: dict[tuple, Any] = {}

    @staticmethod
    def _engine_key(k: Knobs) -> tuple:
        key = (k.device, k.sim_profile, k.dtype, k.graph, k.torch_threads, k.pin_memory)
        if k.graph != "eager":  # compiled or captured shapes depend on batch and padding
            key += (k.batch_size, k.padding, k.buckets, k.max_length)
        return key

    def engine(self, knobs: Knobs) -> Any:
        from tuning.runtime.engine import Engine

        key = self._engine_key(knobs)
        if key not in self._engines:
            self._engines[key] = Engine(knobs, self.model)
        return self._engines[key]

    def __call__(self, knobs: Knobs, record: bool = False) -> Trial:
        import warnings

        from tuning.load.generator import run_load
        from tuning.online.serve import Server

        if self.on_start:
            self.on_start(knobs)
        with Server(knobs, engine=self.engine(knobs)) as server:
            if not record:
                return Trial.from_load(run_load(server, self.inputs, concurrency=self.concurrency,
                                                duration_s=self.duration_s, warmup_s=self.warmup_s))
            from tuning.profile import Recorder

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # no NVML here: the report says so
                with Recorder() as recorder:
                    result = run_load(server, self.inputs, concurrency=self.concurrency, duration_s=self.duration_s,
                                      warmup_s=self.warmup_s)
            return Trial.from_load(result, recorder.join(result))


# --- inputs ---------------------------------------------------------------------------------------

def load_inputs(data: Any = None, limit: int | None = None) -> list[Any]:
    """Raw request bodies: the lines of a JSONL file or the rows of any supported data file (bad ones
    included: they become error outcomes), or a given sequence of lines, records or texts."""
    from tuning.base.assets import DEFAULT_DATA
    from tuning.inputs.readers import read_inputs

    if data is None or isinstance(data, (str, os.PathLike)):
        return [raw for _, raw in read_inputs(data or DEFAULT_DATA, limit)]
    inputs = list(data)
    return inputs[:limit] if limit else inputs


def input_texts(inputs: Sequence[Any]) -> tuple[list[str], dict[str, int]]:
    """The model texts of the valid inputs, and the count of invalid ones by reason."""
    from tuning.runtime.engine import Preparer

    prep = Preparer(preset("baseline"), tokenizer=None)  # read + format only
    texts, bad = [], {}
    for i, raw in enumerate(inputs, start=1):
        item, text = prep.to_text(i, raw)
        if text is None:
            reason = (item.error or "invalid").split(":")[0]
            bad[reason] = bad.get(reason, 0) + 1
        else:
            texts.append(text)
    return texts, bad


def token_lengths(texts: Sequence[str], max_length: int = 256) -> list[int]:
    from tuning.base.assets import tokenizer_files
    from tuning.inputs.tokenize import FastTokenizer

    return [len(e.ids) for e in FastTokenizer(tokenizer_files()[1], max_length).encode_batch(list(texts))]


def plan_for(lengths: Sequence[int], max_length: int = 256) -> dict[str, Any]:
    """The fewest planned buckets (up to MAX_BUCKETS) with padding waste <= BUCKET_WASTE_TARGET."""
    from tuning.inputs.buckets import padded_to_buckets, plan_buckets

    arr = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    real = float(arr.sum())
    tried = []
    for k in range(1, MAX_BUCKETS + 1):
        planned = plan_buckets(arr, k, multiple_of=8)
        planned = tuple(min(b, max_length) for b in planned)
        waste = float(padded_to_buckets(arr, planned).sum()) / real - 1 if real else 0.0
        tried.append({"k": k, "buckets": list(planned), "waste": round(waste, 4)})
        if waste <= BUCKET_WASTE_TARGET:
            break
    best = tried[-1]
    return {"buckets": best["buckets"], "k": best["k"], "waste": best["waste"], "tried": tried,
            "waste_target": BUCKET_WASTE_TARGET, "lengths": {"count": int(arr.size), "p50": float(np.median(arr)),
                                                             "p90": float(np.percentile(arr, 90)), "max": int(arr.max())}}


# --- the ladder -----------------------------------------------------------------------------------

def _device_block(choice: Any, sim_profile: str | None = None) -> dict[str, Any]:
    """The ``device`` block of the ladder's summary: the contract's object (:mod:`tuning.base.contract`)."""
    if choice.knob == "sim" and sim_profile:
        choice = dataclasses.replace(choice, profile=sim_profile)
    return choice.as_dict()


class Ladder:
    """The ladder's state while it runs: experiments so far, the current configuration, the noise."""

    def __init__(self, measure: Measure, settings: LadderSettings, device: Any, target_p99_ms: float,
                 report: Callable[[str], None] | None = None, status: Callable[[str], None] | None = None):
        self.measure, self.settings, self.device = measure, settings, device
        self.target = target_p99_ms
        self.report = report or (lambda line: None)
        self.status = status or (lambda text: None)
        self.experiments: list[Experiment] = []
        self.steps: list[Step] = []
        self.current: Experiment | None = None

    def noise(self) -> float:
        """The run-to-run spread: the median relative QPS range of repeated configurations, floored."""
        spreads = [e.spread for e in self.experiments if e.runs >= 2 and math.isfinite(e.spread)]
        return max(NOISE_FLOOR, float(np.median(spreads))) if spreads else NOISE_FLOOR

    def new(self, step: str, change: str, knobs: Knobs) -> Experiment:
        e = Experiment(len(self.experiments) + 1, step, change, knobs, self.device.label, bool(self.device.simulated))
        self.experiments.append(e)
        return e

    def run(self, e: Experiment, trial: Trial | None = None) -> Experiment:
        self.status(f"{e.step}: {e.change or 'as is'} (run {e.runs + 1})")
        got = trial if trial is not None else self.measure(e.knobs)
        e.trials.append(got if isinstance(got, Trial) else Trial.from_load(got))
        return e

    def finish(self, step: Step) -> Step:
        self.steps.append(step)
        if step.kept and step.experiment is not None:
            self.current = step.experiment
        self.report(format_step(step))
        return step

    def compare(self, name: str, title: str, change: str, candidate: Experiment,
                candidates: Sequence[Experiment] = (), note: str = "") -> Step:
        """Judge a measured candidate against the current configuration, repeating while within the spread."""
        ref = self.current
        for round_ in range(self.settings.repeats + 1):
            gain, noise = candidate.qps / ref.qps - 1 if ref.qps > 0 else math.inf, self.noise()
            if abs(gain) > noise or round_ == self.settings.repeats:
                break
            self.run(ref)  # interleaved: the reference again, then the candidate
            self.run(candidate)
        gain, noise = (candidate.qps / ref.qps - 1 if ref.qps > 0 else math.inf), self.noise()
        spread = f"the run-to-run spread is ±{100 * noise:.0f}%"
        if not math.isfinite(candidate.qps) or not math.isfinite(gain):
            status, reason = "not kept", "no QPS measured (no successful responses)"
        elif gain > noise:
            if candidate.p99_ms > self.target >= ref.p99_ms:
                status, reason = "not kept", (f"QPS +{100 * gain:.0f}% but p99 {candidate.p99_ms:.0f} ms goes over the "
                                              f"{self.target:.0f} ms target (was {ref.p99_ms:.0f} ms)")
            else:
                status, reason = "kept", f"QPS +{100 * gain:.0f}% beyond the spread (±{100 * noise:.0f}%)"
        elif gain < -noise:
            status, reason = "not kept", f"slower: QPS {100 * gain:.0f}% ({spread})"
        else:
            status, reason = "not kept", (f"QPS {100 * gain:+.0f}% after {candidate.runs} run(s) each: within the spread "
                                          f"(±{100 * noise:.0f}%), not worth a change")
        reason = f"{note}; {reason}" if note else reason
        return self.finish(Step(name, title, change, status, reason, candidate, ref, gain, noise, list(candidates)))

    def skip(self, name: str, title: str, change: str, reason: str, status: str = "skipped") -> Step:
        return self.finish(Step(name, title, change, status, reason, reference=self.current))

    def try_change(self, name: str, title: str, changes: dict[str, Any], note: str = "") -> Step:
        """Measure the current knobs with ``changes`` and judge it (a knob refusing the change is reported)."""
        text = change_text(changes)
        try:
            knobs = self.current.knobs.replace(**changes)
            if knobs.device != "sim":
                import torch

                knobs.resolve(torch.cuda.is_available())
        except (ValueError, TypeError) as exc:
            return self.skip(name, title, text, f"refused by the knobs: {exc}", "refused")
        if knobs == self.current.knobs:
            return self.skip(name, title, text, "already set")
        return self.compare(name, title, text, self.run(self.new(name, text, knobs)), note=note)


def change_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_set_value(v)}" for k, v in changes.items())


def _fmt(x: float, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x * scale:{spec}}{suffix}"


def format_step(step: Step) -> str:
    """The one line printed when a step finishes."""
    e = step.experiment
    head = f"{step.name:<10} {step.change or '-':<44}"
    if e is None:
        return f"{head} {step.status}: {step.reason}"
    vs = "" if step.status == "baseline" else f" ({_fmt(step.gain, '+.0f', 100, '%')} vs previous)"
    return (f"{head} QPS {_fmt(e.qps, '.1f')}{vs}  p99 {_fmt(e.p99_ms, '.0f', suffix=' ms')}  "
            f"model busy {_fmt(e.model_busy, '.0f', 100, '%')}  device busy {_fmt(e.device_busy, '.0f', 100, '%')}"
            f"  -> {step.status}: {step.reason}")


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


def run_ladder(data: Any = None, device: Any = "auto", quick: bool = False,
               target_p99_ms: float = DEFAULT_TARGET_P99_MS, measure: Measure | None = None,
               progress: bool | Callable[[str], None] = True, settings: LadderSettings | None = None,
               steps: Sequence[str] = STEPS, first: Trial | None = None, sweep: Callable | None = None,
               accuracy: Callable | None = None, lengths: Sequence[int] | None = None,
               model: Any = None, sim_profile: str | None = None) -> LadderResult:
    """Walk the ladder from ``baseline`` on ``data`` (a JSONL path, or request bodies) and ``device``
    (``auto``: CUDA, else the real CPU; ``cpu``, ``cuda``, ``sim`` or a ``tuning.sim.device_for`` choice).

    ``measure(knobs) -> Trial`` replaces the load test (tests drive the ladder with a stub); ``sweep``
    (knobs -> result with ``.knee``), ``accuracy`` (dtypes -> {dtype: min cosine}) and ``lengths``
    (token lengths) replace the batch sweep, the precision check and the tokenizer pass. ``first`` is
    a baseline run already made (``investigate`` records it with the profilers). ``progress``: a tqdm
    bar and a line per step (True), a callable that gets each line, or nothing (False).
    """
    settings = settings or (LadderSettings.quick() if quick else LadderSettings.full())
    dev = device_for(device, sim_profile, fallback="cpu")
    sim_profile = sim_profile or (dev.profile if dev.knob == "sim" else None)
    if target_p99_ms is None or not target_p99_ms > 0:
        raise ValueError(f"target_p99_ms={target_p99_ms!r} must be a number > 0 (milliseconds)")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown ladder step(s) {unknown}; known: {', '.join(STEPS)}")
    inputs = load_inputs(data, settings.limit) if measure is None or lengths is None or accuracy is None else []
    texts, bad = input_texts(inputs) if inputs else ([], {})
    measure = measure or LoadMeasure(inputs, settings.concurrency, settings.duration_s, settings.warmup_s, model)
    if lengths is None and any(s in steps for s in ("batch", "buckets")):
        lengths = token_lengths(texts) if texts else []
    median_len = int(-(-np.median(lengths) // 8) * 8) if lengths else 64

    bar, report, status = progress_bar(progress, total=1 + len(steps), desc="ladder")
    ladder = Ladder(measure, settings, dev, target_p99_ms, report, status)
    base = preset("baseline", device=dev.knob)
    if dev.knob == "sim" and sim_profile:
        base = base.replace(sim_profile=sim_profile)
    result_extra: dict[str, Any] = {}
    try:
        baseline = ladder.new("baseline", "", base)
        ladder.run(baseline, first)
        ladder.run(baseline)  # twice: the first measure of the run-to-run spread
        ladder.finish(Step("baseline", "the investigation's starting point", "", "baseline",
                           "batch 1, 2 workers, Python tokenizer, dynamic padding, fp32, eager", baseline))
        bar.update(1)
        knee: int | None = None
        for name in steps:
            k = ladder.current.knobs
            if name == "workers":
                changes: dict[str, Any] = {"num_workers": settings.workers, "prefetch_factor": settings.prefetch_factor}
                if dev.knob in ("cuda", "sim"):
                    changes["pin_memory"] = True
                ladder.try_change(name, "more preprocessing workers, prefetch", changes)
            elif name == "batch":
                sweep_fn = sweep or _default_sweep(measure, settings, median_len)
                status(f"batch sweep at {median_len} tokens")
                result_extra["sweep"] = swept = sweep_fn(k)
                knee = getattr(swept, "knee", None)
                size = min(knee, settings.concurrency) if knee else None
                if size is None:
                    ladder.skip(name, "batch size from the sweep's knee", "", "the sweep measured no batch size")
                elif size <= k.batch_size:
                    ladder.skip(name, "batch size from the sweep's knee", f"batch_size={size}",
                                f"the knee is at batch {knee}: per-sample cost does not fall with bigger batches here")
                else:
                    capped = f" (knee {knee}, capped at the concurrency {settings.concurrency})" if size != knee else ""
                    ladder.try_change(name, "batch size from the sweep's knee", {"batch_size": size},
                                      f"knee of the sweep at {median_len} tokens: batch {size}{capped}")
            elif name == "tokenizer":
                ladder.try_change(name, "batched Rust tokenizer", {"tokenizer": "fast"})
            elif name == "buckets":
                plan = plan_for(lengths, k.max_length) if lengths else None
                result_extra["buckets"] = plan
                if plan is None:
                    ladder.skip(name, "planned length buckets", "", "no token lengths to plan from")
                    continue
                changes = {"padding": "bucket", "buckets": tuple(plan["buckets"])}
                note = (f"{plan['k']} buckets from the token-length histogram, padding waste "
                        f"{100 * plan['waste']:.0f}%")
                if k.batch_size == 1:
                    if not knee or knee <= 1:
                        ladder.skip(name, "planned length buckets", change_text(changes),
                                    "batch 1 pads nothing, and the sweep found no batch size worth batching")
                        continue
                    changes["batch_size"] = min(knee, settings.concurrency)
                    note += (f"; with batch_size={changes['batch_size']}: buckets only pay with batches, and the batch "
                             "step lost under dynamic padding (two knobs in this one step)")
                ladder.try_change(name, "planned length buckets", changes, note)
            elif name == "precision":
                wanted = ("fp16", "bf16") if dev.knob == "cuda" else ("bf16",)
                status("accuracy check of half precision against fp32")
                acc_fn = accuracy or _default_accuracy(texts[: settings.precision_texts], model)
                result_extra["precision"] = report_ = acc_fn(wanted)
                cosines = _min_cosines(report_)
                passing = [d for d in wanted if isinstance(cosines.get(d), float) and cosines[d] >= MIN_COSINE]
                why = "; ".join(f"{d}: " + (f"min cosine {c:.5f} < {MIN_COSINE}" if isinstance(c, float) else str(c))
                                for d, c in cosines.items() if d not in passing)
                if not passing:
                    ladder.skip(name, "half precision", f"dtype={wanted[0]}",
                                f"not recommended: {why or 'no half precision runs here'}", "refused")
                    continue
                dtype = passing[0]
                ladder.try_change(name, "half precision", {"dtype": dtype},
                                  f"{dtype} min cosine {cosines[dtype]:.5f} >= {MIN_COSINE}" + (f" ({why})" if why else ""))
            elif name == "graph":
                if dev.knob in ("cuda", "sim"):
                    if k.padding == "dynamic":
                        ladder.skip(name, "graph capture", "graph=cuda_graph",
                                    "capture needs fixed shapes and bucket padding was not kept")
                    else:
                        ladder.try_change(name, "graph capture", {"graph": "cuda_graph"})
                elif not settings.compile_on_cpu:
                    ladder.skip(name, "torch.compile", "graph=compile",
                                "skipped in quick mode: torch.compile costs seconds per shape on a CPU (run without --quick)")
                else:
                    ladder.try_change(name, "torch.compile", {"graph": "compile"})
            elif name == "batching":
                if k.batch_size == 1:
                    ladder.skip(name, "dynamic batching (max wait)", "max_wait_ms=...",
                                "batch size 1: there is no batch to wait for")
                    continue
                tried = []
                for wait in settings.waits_ms:
                    text = f"max_wait_ms={_set_value(float(wait))}"
                    tried.append(ladder.run(ladder.new(name, text, k.replace(max_wait_ms=float(wait)))))
                frame = pd.DataFrame([{"max_wait_ms": e.knobs.max_wait_ms, "qps": e.qps, "p50_ms": e.p50_ms,
                                       "p99_ms": e.p99_ms, "model_busy": e.model_busy, "device_busy": e.device_busy,
                                       "mean_batch": e.mean_batch, "experiment": e.id} for e in [ladder.current] + tried])
                frame.attrs["device"] = _device_block(dev, base.sim_profile)
                result_extra["waits"] = frame
                under = [e for e in tried if math.isfinite(e.p99_ms) and e.p99_ms <= target_p99_ms]
                best = max(under or tried, key=lambda e: e.qps)
                note = (f"best of {len(tried)} waits under the p99 target" if under
                        else f"no wait met the {target_p99_ms:.0f} ms p99 target; best QPS")
                ladder.compare(name, "dynamic batching (max wait)", best.change, best, tried, note)
            bar.update(1)
    finally:
        bar.close()
    return LadderResult(base, ladder.current.knobs, ladder.steps, ladder.experiments,
                        _device_block(dev, base.sim_profile), settings,
                        target_p99_ms, ladder.noise(), result_extra.get("sweep"), result_extra.get("precision"),
                        result_extra.get("buckets"), result_extra.get("waits"),
                        {"inputs": len(inputs), "invalid": sum(bad.values()), "invalid_reasons": bad})


