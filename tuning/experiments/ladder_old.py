"""The optimization ladder: from ``baseline``, one variable at a time, each step judged against the
configuration before it in interleaved pairs and kept only when it helps beyond the noise. Shared by
``python -m tuning investigate`` and notebook 06.

    ladder = run_ladder("data/records.jsonl", device="cpu", quick=True)
    ladder.to_frame()        # one row per step: ratio [interval], pairs, p50/p99, capacity, kept, why
    ladder.recommended       # the Knobs to ship
    ladder.set_line()        # the same as copy-pasteable --set flags
    ladder.target_met        # False: no configuration met the p99 target (investigate exits 3)

Steps, in the investigation's order (INVESTIGATION.md, step 4), then a joint pass:

1. ``workers``: more preprocessing workers (``pin_memory`` on a device; skipped on a CPU host with fewer than 3
   usable cores, :attr:`LadderSettings.workers_min_cores`);
2. ``batch``: ``batch_size`` = the knee of the batch sweep at the data's median length;
3. ``tokenizer``: the batched Rust tokenizer instead of per-record Python;
4. ``buckets``: ``padding='bucket'`` with lengths planned from the token-length histogram;
5. ``precision``: half precision, only if its embeddings stay within :data:`MIN_COSINE` of fp32;
6. ``graph``: CUDA-graph capture (a GPU or the simulated one; with planned buckets if they were not kept,
   since capture needs fixed shapes) or ``torch.compile`` (CPU, not in quick mode);
7. ``batching``: dynamic batching, each ``max_wait_ms`` in turn;
8. ``joint``: the knobs that interact (``batch_size``, ``max_wait_ms``, ``max_batch_tokens``) by coordinate descent from the
   ladder's result (batch 1 too: a batch size that lost while the Python tokenizer limited the host is tried
   again, and a batch that loses alone again over the planned buckets), a line search along each knob (up
   while kept, else down), with the knee re-measured under the final dtype and graph mode, until a round
   keeps nothing (coordinate descent and not a Bayesian search: two or three knobs with a handful of values
   each, where every trial is a paired comparison that costs seconds; a search model would need more trials
   than the whole grid);
9. ``again``: a host-side step that was not kept (:data:`HOST_STEPS`) judged once more when a model-side
   knob (:data:`MODEL_KNOBS`) changed since (:func:`_host_steps_again`).

**The objective is the target** (``objective="target"``, the default): a configuration's figure is its
capacity, the highest Poisson rate at which its open-loop p99 (from the scheduled arrival, every outcome)
stays within ``target_p99_ms`` with errors within the budget (:mod:`tuning.experiments.capacity`). A step
is measured against its reference in interleaved pairs at the same offered rate, 60% of the reference's
capacity (``compare_at``; see :meth:`Ladder.judge` for why not at the capacity itself); it is kept when the
paired latency ratio's interval clears the minimum effect *and* the candidate meets the target there, or
when it meets the target where the reference did not; its own capacity is then searched and it becomes
the next reference. A step not kept there runs again in interleaved pairs past the reference's capacity
(``race_at``: 1.2x its failing rate), kept when the candidate passes by the count over its pooled runs
there and the reference fails in the same pairs (a change that raises the capacity, such as batching, can
leave light-load latency as it was), or when both fail there and the paired latency ratio clears the minimum
effect and the candidate's own capacity then beats the reference's by it (a candidate with 10-20% more
capacity is itself near its knee at that rate: the tuner's batch 8 had 37 of 624 over the target where batch
1 had 315, and was dropped before). A step that
misses the target is never kept. ``objective="qps"`` (batch
jobs): the same pairs in a closed loop at ``concurrency``, judged on QPS, and a step that takes a closed-loop
p99 the reference met over the target is not kept. What each step shows is what was judged, frozen at its
decision (:mod:`tuning.base.decide`: the ratio, its interval, the pairs); a later run never rewrites it.

**Nothing lost**: ``on_step`` gets the partial result after every step (``investigate`` writes its files
from it); an exception in one step (a compile failure, out of memory, anything) makes that step
``failed`` with its error and the ladder goes on; Ctrl-C ends the ladder with what was done
(``result.interrupted``); ``resume`` continues from a partial ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from tuning.base.decide import COUNT_PASS_MIN, count_verdict
from tuning.base.format import fixed, rounded
from tuning.base.machine import usable_cores
from tuning.base.progress import progress_bar
from tuning.base.stats import known_median
from tuning.experiments.capacity import (
    DEFAULT_ERROR_BUDGET,
    Capacity,
    CapacitySettings,
    CompareSettings,
    Comparison,
    Probe,
    Race,
    capacity_at_target,
    compare_at,
    fresh_probe,
    pooled_figures,
    race_at,
    saturation_rate,
)
from tuning.experiments.measure import LoadMeasure
from tuning.experiments.trial import Measure, Trial, as_measure
from tuning.knobs import Knobs, knob_names, preset
from tuning.sim.device import device_for

__all__ = ["LadderSettings", "LadderResult", "LadderError", "Step", "Experiment", "Trial", "LoadMeasure", "Measure",
           "run_ladder", "load_inputs", "input_texts", "token_lengths", "plan_for", "MIN_COSINE", "STEPS",
           "OBJECTIVES", "DEFAULT_TARGET_P99_MS"]

MIN_COSINE = 0.999  # worst-case cosine of half-precision vs fp32 embeddings under which a dtype is not recommended
BUCKET_WASTE_TARGET = 0.15  # planned buckets: the fewest (up to MAX_BUCKETS) whose padding waste is at most 15%
MAX_BUCKETS = 8  # shapes to compile or capture at most
REPLICATE_SALT = 1_000_033  # a race's pass probed again: arrivals apart from the search's and the confirm's
# a capacity searched under this much hypervisor steal, then pairs under half of it: the machine recovered
# (66.7% steal was seen here mid-run; 0.07% on a quiet run)
RECOVERED_STEAL = 0.10
DEFAULT_TARGET_P99_MS = 800.0  # the investigation's p99 target
STEPS = ("workers", "batch", "tokenizer", "buckets", "precision", "graph", "batching", "joint", "again")
HOST_STEPS = ("tokenizer", "workers")  # host-side rungs: judged once more after the model side got faster ("again")
MODEL_KNOBS = ("batch_size", "dtype", "graph", "padding", "buckets", "max_batch_tokens")  # what changes the model's time
OBJECTIVES = ("target", "qps")
# knobs that describe the test or the machine, or that the served path does not read (prefetch_factor is the
# offline DataLoader's), never part of the line to ship
_NOT_RECOMMENDED = ("concurrency", "device", "sim_profile", "prefetch_factor")


class LadderError(RuntimeError):
    """The ladder cannot start: the baseline got no ok answer (the message names the first error)."""


@dataclass(frozen=True)
class LadderSettings:
    """How much to measure. Every load test is ``duration_s`` after ``warmup_s``; a comparison takes
    ``min_pairs`` to ``max_pairs`` interleaved pairs at a 99% level and a ``min_effect`` to clear."""

    concurrency: int = 32  # the closed loop's clients (saturation rate; the qps objective)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    min_outcomes: int = 1000  # an open-loop window is stretched to hold this many arrivals (a p99 needs outcomes)...
    max_window_s: float | None = None  # ...up to this long (None: 3 x duration_s)
    warmup_requests: int = 200  # open loop: up to this many arrivals warm the queue (at most 2 x warmup_s of them)
    objective: str = "target"
    min_effect: float = 0.02
    min_pairs: int = 3
    max_pairs: int = 16
    level: float | None = None  # each look's two-sided level; None: 0.998 for the target, 0.99 for qps
    compare_at: float = 0.6  # pairs run at this share of the reference's capacity (see Ladder.judge)
    race_at: float = 1.2  # ...at this multiple of the reference's failing rate (its capacity bracket's top)
    race_pairs: int | None = None  # a step not told apart at compare_at is compared again past the reference's
    # capacity (race_at), with at most this many pairs (None: max_pairs)
    futility: bool = False  # a comparison stops before max_pairs once the cap could not decide (Paired.futile)
    # the level of the race's "candidate faster" gate (both arms fail past the reference's capacity): lower than a
    # keep's, because it only sends the candidate to its own capacity search, which must then beat the reference's
    # by min_effect (two tests in series). Past the knee the paired latency figure swings: quick investigate on this
    # CPU, bf16 against fp32 (AMX), 6 pairs at 1.3x the capacity: ratio 9.08, at 99.8% 0.88-93.2 (not told apart;
    # its completions were 22-33 req/s against the reference's 6-28); at 99% about 1.8-45.
    race_level: float = 0.99
    light_load: bool = True  # False: a step is judged by the race alone (Ladder.judge_past_capacity: quick mode)
    error_budget: float = DEFAULT_ERROR_BUDGET
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    sweep_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    sweep_repeats: int = 3
    sweep_rounds: int = 5
    waits_ms: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 50.0)
    joint_max_wait_ms: float | None = None  # the joint pass's highest max_wait_ms (None: the highest of waits_ms)
    joint_rounds: int = 3
    joint_moves: int | None = None  # the joint pass tries at most this many moves (None: until a round keeps none)
    precision_texts: int = 256
    workers: int = field(default_factory=lambda: max(4, min(8, os.cpu_count() or 1)))
    # the workers step is skipped on a host with fewer usable cores (0: never skipped); see LadderSettings.quick
    workers_min_cores: int = 0
    compile_on_cpu: bool = True  # torch.compile costs seconds per shape on a CPU
    limit: int | None = None  # read at most this many input lines
    seed: int = 0  # the open loop's arrivals

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: use 'target' (capacity at the p99 target) or 'qps' "
                             "(closed-loop throughput, for batch jobs)")
        if not 0 <= self.min_effect < 1:
            raise ValueError(f"min_effect={self.min_effect!r} must be a share in [0, 1): 0.02 is 2%")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency!r} must be an integer >= 1")
        if not 0.5 < self.race_level < 1:
            raise ValueError(f"race_level={self.race_level!r} must be in (0.5, 1): the gate's two-sided coverage")
        if self.race_pairs is not None and (not isinstance(self.race_pairs, int) or self.race_pairs < 2):
            raise ValueError(f"race_pairs={self.race_pairs!r} must be an integer >= 2 (a paired interval needs two "
                             "pairs), or None for max_pairs")
        if self.capacity.error_budget != self.error_budget:  # one budget: the probes use the ladder's
            object.__setattr__(self, "capacity", dataclasses.replace(self.capacity, error_budget=self.error_budget))

    @classmethod
    def quick(cls, **changes: Any) -> "LadderSettings":
        """A few minutes on a 2-core CPU: 3-4 s windows (300 outcomes where the rate allows), a 5% minimum effect,
        at most 6 pairs per step, stopped after 3 once 6 could not decide (futility, as in the full settings; at
        the SD of 3 pairs itself it cut a no-op ladder's load tests 30% in the stubs' Monte-Carlo), a 12% capacity
        bracket, three batch sizes and one wait (5 ms: in 4 quick runs here neither 5 nor 20 ms was kept, and
        the second wait cost 6-8 load tests, 50-60 s), one joint move; and no light-load pairs: a step is judged past
        the reference's capacity alone (:meth:`Ladder.judge_past_capacity`; 3 pairs, up to 6 while a race in
        which both arms fail, or the candidate is undecided by its count, could still decide), and on fewer than 3
        usable cores no workers step (:attr:`workers_min_cores`). Measured on a quiet 2-core Xeon (AMX), capacity at
        p99 <= 800 ms: 478 s, 59.2 -> 202.8 req/s; 592 s and 583 s with the workers step judged twice (README has
        what each kept). The stubs' Monte-Carlo (``bench/keep_rule.py``, a queue that grows past the knee): 5 of 100
        no-op ladders ship a knob, 7 of 100 with 80 outcomes a window (a slow machine's thin races); +10% steps kept
        100 of 300 times, +30% 282."""
        base = dict(concurrency=16, duration_s=3.0, warmup_s=0.5, min_outcomes=300, max_window_s=4.0,
                    warmup_requests=10, min_effect=0.05, max_pairs=6,
                    capacity=CapacitySettings.quick(), sweep_sizes=(1, 4, 16), sweep_repeats=1, sweep_rounds=2,
                    waits_ms=(5.0,), joint_rounds=1, joint_moves=1, precision_texts=32, compile_on_cpu=False,
                    futility=True, light_load=False, race_pairs=3, workers_min_cores=3)
        base.update(changes)
        return cls(**base)

    @classmethod
    def full(cls, **changes: Any) -> "LadderSettings":
        """``investigate`` without ``--quick``: cut toward 30 minutes on a 2-core CPU. What it keeps of the defaults:
        the light-load pairs before the race, up to 16 pairs at a 2% minimum effect (in the stubs' Monte-Carlo they
        are what keeps true +10% steps: 158 of 180 with 16 pairs, 32 with 6). What it trades for time: 4-5 s windows
        (500 arrivals where the rate allows) after a warm-up of at least 1 s and 50 arrivals; futility, which stops
        pairs that 16 could not decide once the per-pair SD's lower bound says so (on a shared VM their SD was
        14-113% a pair: the default settings ran 16 pairs undecided in 9 of 12 steps of ``bench/sim_ladder.py``);
        races of 3 pairs (no extension: that is race-only judging's, quick mode's; so the race's latency gate looks
        once, at 3 pairs, and rarely keeps); a 4% capacity bracket (a 6% one kept 95 of 120 true +10% steps, 4% and
        3% 105: a coarser bracket sets the race's rate higher) in at most 10 probes; one batching wait (5 ms; the
        joint pass's line search along ``max_wait_ms`` goes on from it), at most 2 joint moves and no workers step on
        a CPU host with fewer than 3 usable cores (:attr:`workers_min_cores`). On a quiet 2-core Xeon (AMX),
        2026-12-05: 1,346 s (22.4 minutes), 65.5 -> 211.1 req/s confirmed; before the workers skip 1,853 s (workers
        and its again rung 260 s, not kept), before the 2-move cap 1,895 s (the third move, ``max_batch_tokens``,
        213 s), with waits of 5 and 20 ms 2,049 s (the 20 ms wait 3.5 minutes, not kept; no wait was in any run
        here). Each rung's cost is in ``Step.seconds``; the baseline's capacity searched again inside the tokenizer
        step cost 272-362 s of each run. The stubs'
        Monte-Carlo (``bench/keep_rule.py``, these settings on a 2-core host, so no workers step): 3 of 100 no-op
        ladders ship a knob (2 with 80 outcomes a window), +10% steps kept 168 of 200 times, +20% 200."""
        base = dict(duration_s=4.0, warmup_s=1.0, min_outcomes=500, max_window_s=5.0, warmup_requests=50,
                    futility=True, race_pairs=3, waits_ms=(5.0,), joint_max_wait_ms=20.0, joint_moves=2, sweep_repeats=2,
                    sweep_rounds=3, precision_texts=128, workers_min_cores=3,
                    capacity=CapacitySettings(max_windows=3, min_windows=2, tolerance=0.04, max_probes=10,
                                              halvings=3, doublings=3))
        base.update(changes)
        return cls(**base)

    @property
    def look_level(self) -> float:
        """The comparison's level: stricter at the target, where p99s near the knee have heavier tails than the
        t interval assumes (with a queue's own physics, 99% kept 3% of no-op decisions; 99.8% keeps 0.5%)."""
        if self.level is not None:
            return self.level
        return 0.998 if self.objective == "target" else 0.99

    def compare_settings(self) -> CompareSettings:
        return CompareSettings(self.min_effect, self.min_pairs, self.max_pairs, self.look_level, self.futility)


    def as_dict(self) -> dict[str, Any]:
        out = {}
        for k, v in dataclasses.asdict(self).items():
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


# --- what was measured ----------------------------------------------------------------------------

@dataclass
class Experiment:
    """One group of runs of one configuration in one role (a step's reference or candidate, a capacity
    probe, the baseline): its figures are pooled over its own runs and never change after its step."""

    id: int
    step: str
    role: str  # baseline | reference | candidate | probe
    change: str
    knobs: Knobs | None  # None for a row restored from a resumed run
    device: str
    simulated: bool
    rate: float | None = None  # open-loop rate (None: closed loop)
    trials: list[Trial] = field(default_factory=list)
    target_p99_ms: float = DEFAULT_TARGET_P99_MS
    frozen: dict[str, Any] | None = None  # a row restored from a resumed run

    @property
    def runs(self) -> int:
        return len(self.trials) if self.frozen is None else int(self.frozen.get("runs") or 0)

    def figures(self) -> dict[str, Any]:
        f = pooled_figures(self.trials, self.target_p99_ms)
        med = lambda k: float(np.median([getattr(t, k) for t in self.trials])) if self.trials else math.nan  # noqa: E731
        f.update(qps=med("qps"), model_busy=known_median([t.model_busy for t in self.trials]),
                 device_busy=known_median([t.device_busy for t in self.trials]),
                 mean_batch=known_median([t.mean_batch for t in self.trials]),
                 steal_share=known_median([t.steal_share for t in self.trials]))
        f["ok"] = sum(t.ok for t in self.trials)
        for k in ("errors", "timeouts", "rejected", "submitted"):
            f[k] = sum(getattr(t, k) for t in self.trials)
        f["window_s"] = sum(t.window_s for t in self.trials if math.isfinite(t.window_s))
        return f

    def row(self) -> dict[str, Any]:
        """One flat row: what experiments.csv and summary.json both hold."""
        if self.frozen is not None:
            return dict(self.frozen)
        f = self.figures()
        row: dict[str, Any] = {"experiment": self.id, "step": self.step, "role": self.role, "change": self.change,
                               "device": self.device, "simulated": self.simulated, "rate": rounded(self.rate),
                               "runs": self.runs}
        for k in ("qps", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms", "model_busy", "device_busy", "mean_batch",
                  "steal_share"):
            row[k] = rounded(f.get(k))
        row["qps_runs"] = ";".join(f"{t.qps:.3f}" for t in self.trials)
        row["p99_runs"] = ";".join(f"{t.p99_ms:.1f}" for t in self.trials)
        row["exceed"] = f.get("exceed")
        row.update(ok=f["ok"], errors=f["errors"], timeouts=f["timeouts"],
                   rejected=f["rejected"], submitted=f["submitted"], window_s=rounded(f["window_s"]))
        row.update({f"knob_{k}": _knob_text(v) for k, v in self.knobs.as_dict().items()})
        return row


def _knob_text(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


@dataclass
class Step:
    """One rung: what changed, what it was judged against, the verdict, and the figures it was judged on
    (``figures``, frozen when the step was decided)."""

    name: str
    title: str
    change: str
    status: str  # baseline | kept | not kept | skipped | refused | failed
    reason: str
    knobs: Knobs | None = None  # the candidate
    reference: Knobs | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    experiments: list[int] = field(default_factory=list)
    comparison: Comparison | None = field(default=None, repr=False)
    capacity: Capacity | None = field(default=None, repr=False)  # the candidate's, when kept (the baseline's)
    error: str | None = None
    # what the rung cost: wall seconds and load tests run since the previous rung was decided (a sweep's time, a
    # capacity search's and every pair's tests included, and those of a rung that failed mid-way; investigate's first
    # recorded run counts for the baseline without its seconds); None for a row restored from a resumed run that
    # predates them
    seconds: float | None = None
    load_tests: int | None = None

    @property
    def kept(self) -> bool:
        return self.status in ("baseline", "kept")

    def row(self) -> dict[str, Any]:
        f = self.figures
        return {"step": self.name, "title": self.title, "change": self.change, "status": self.status,
                "kept": self.kept, **{k: f.get(k) for k in _STEP_FIGURES}, "experiments": list(self.experiments),
                "reason": self.reason, "error": self.error, "seconds": rounded(self.seconds),
                "load_tests": self.load_tests}


_STEP_FIGURES = ("metric", "rate", "ratio", "low", "high", "median_ratio", "pairs", "order", "min_effect", "level",
                 "verdict", "pair_sd", "pairs_needed", "qps", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms", "errors",
                 "timeouts", "n", "exceed", "reference_qps", "reference_p50_ms", "reference_p99_ms", "reference_errors",
                 "model_busy", "device_busy", "mean_batch", "capacity", "capacity_bracket", "reference_capacity",
                 "meets_target", "gain")


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
    baseline_capacity: Capacity | None = None
    capacity: Capacity | None = None  # the recommended configuration's
    sweep: Any = None  # BatchSweepResult of the batch step
    sweep_final: Any = None  # the sweep re-measured under the final dtype and graph mode (joint pass)
    precision: Any = None  # PrecisionReport (or a mapping dtype -> min cosine from a stub)
    buckets: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    baseline_figures: dict[str, Any] = field(default_factory=dict)
    final_figures: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # what ``resume`` needs to go on from here

    @property
    def objective(self) -> str:
        return self.settings.objective

    def step(self, name: str) -> Step:
        """The step called ``name`` (the kept one when several rows share it, as the waits do; else the last)."""
        rows = [s for s in self.steps if s.name == name]
        if not rows:
            raise KeyError(f"no step {name!r}; steps: {', '.join(dict.fromkeys(s.name for s in self.steps))}")
        return next((s for s in reversed(rows) if s.status == "kept"), rows[-1])

    @property
    def target_met(self) -> bool:
        """Whether the recommended configuration meets the p99 target (its capacity; the closed-loop p99 for
        the qps objective)."""
        if self.objective == "target":
            return self.capacity is not None and self.capacity.met
        p99 = self.final_figures.get("p99_ms")
        return p99 is not None and math.isfinite(p99) and p99 <= self.target_p99_ms

    def to_frame(self) -> pd.DataFrame:
        """One row per step (skipped ones too, without figures)."""
        frame = pd.DataFrame([s.row() for s in self.steps])
        frame.attrs["device"] = self.device
        return frame

    def experiments_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([e.row() for e in self.experiments])
        frame.attrs["device"] = self.device
        return frame

    @property
    def waits(self) -> pd.DataFrame | None:
        """The ``max_wait_ms`` steps (batching and joint): each one's verdict and figures at its rate."""
        rows = [dict(max_wait_ms=s.knobs.max_wait_ms, batch_size=s.knobs.batch_size, step=s.name, status=s.status,
                     **{k: s.figures.get(k) for k in ("ratio", "low", "high", "pairs", "rate", "qps", "p50_ms",
                                                      "p99_ms", "capacity")})
                for s in self.steps if s.knobs is not None and s.figures and "max_wait_ms" in s.change]
        if not rows:
            return None
        frame = pd.DataFrame(rows)
        frame.attrs["device"] = self.device
        return frame

    def top(self, n: int = 5) -> pd.DataFrame:
        """The best configurations measured: by capacity (target) or QPS (qps), with their knobs' changes."""
        key = "capacity" if self.objective == "target" else "qps"
        rows = []
        for s in self.steps:
            if s.knobs is None or not s.figures:
                continue
            value = s.figures.get(key) if key == "qps" or s.status in ("kept", "baseline") else None
            status = s.status
            # a capacity searched again later (the machine drifted, a reference passed past its top) stands for its
            # configuration here; the step's own row keeps the figure it was judged on
            if s.status == "baseline":
                latest = self.baseline_capacity
            else:
                latest = self.capacity if s.status == "kept" and s.knobs == self.recommended else None
            if (key == "capacity" and latest is not None and s.capacity is not None and latest is not s.capacity
                    and value is not None and latest.capacity is not None):
                status, value = f"{s.status} (searched again; first {value:.1f})", latest.capacity
            rows.append({"step": s.name, "change": s.change or "(baseline)", "status": status, key: value,
                         "p99_ms": s.figures.get("p99_ms"), "ratio": s.figures.get("ratio"),
                         "knobs": change_text(_changes(s.knobs))})
        frame = pd.DataFrame(rows)
        if frame.empty:
            return frame
        return frame.sort_values(key, ascending=False, na_position="last").head(n).reset_index(drop=True)

    def changes(self) -> dict[str, Any]:
        """The recommended knobs that differ from the ``baseline`` preset and that the served path reads."""
        return _changes(self.recommended)

    def why_unchanged(self) -> str | None:
        """When no step was kept and some could not be told apart: how noisy their pairs were, how many pairs
        that noise would need, and the steal during them (None when a step was kept or none was undecided)."""
        if any(s.status == "kept" for s in self.steps):
            return None
        undecided = [s for s in self.steps if s.figures.get("verdict") == "not distinguishable"]
        sds = [s.figures["pair_sd"] for s in undecided if isinstance(s.figures.get("pair_sd"), (int, float))]
        needed = [s.figures["pairs_needed"] for s in undecided if isinstance(s.figures.get("pairs_needed"), (int, float))]
        if not sds or not needed:
            return None
        decided = [s for s in self.steps if s.status in ("kept", "not kept")]
        ids = {i for s in undecided for i in s.experiments}
        steal = known_median([t.steal_share for e in self.experiments if e.id in ids for t in e.trials])
        said = f"; steal {100 * steal:.0f}% of the CPU during them" if math.isfinite(steal) else ""
        return (f"nothing kept: {len(undecided)} of {len(decided)} steps decided were not told apart; their pairs' "
                f"median SD {float(np.median(sds)):.0%} per pair needs about {float(np.median(needed)):,.0f} pairs "
                f"for a {self.settings.min_effect:.0%} bar (at most {self.settings.max_pairs} here){said}")

    def set_line(self) -> str:
        """``--preset baseline --set k=v ...``: paste after ``python -m tuning serve`` (or run/loadtest)."""
        parts = ["--preset baseline"] + [f"--set {k}={_set_value(v)}" for k, v in self.changes().items()]
        return " ".join(parts)

    def python_call(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.changes().items())
        return f'tuning.preset("baseline"{", " + args if args else ""})'

    def summary(self) -> dict[str, Any]:
        base_cap, cap = self.baseline_capacity, self.capacity
        ratio = None
        drifts = self.state.get("drifts") or []
        comparable = not any(not d["baseline_searched_again"] for d in drifts)  # one machine before and after
        if (self.objective == "target" and base_cap is not None and cap is not None and base_cap.met and cap.met
                and comparable):
            ratio = rounded(cap.capacity / base_cap.capacity)
        elif self.objective == "qps" and self.baseline_figures.get("qps") and self.final_figures.get("qps"):
            ratio = rounded(self.final_figures["qps"] / self.baseline_figures["qps"])
        current = self.recommended
        return {
            "device": self.device, "objective": self.objective, "target_p99_ms": self.target_p99_ms,
            "error_budget": self.settings.error_budget, "target_met": self.target_met, "interrupted": self.interrupted,
            "min_cosine": MIN_COSINE, "settings": self.settings.as_dict(),
            "baseline": {**_figures_summary(self.baseline_figures),
                         "capacity": base_cap.summary() if base_cap is not None else None},
            "result": {**_figures_summary(self.final_figures), "capacity": cap.summary() if cap is not None else None,
                       "ratio": ratio, "ratio_of": "capacity" if self.objective == "target" else "qps"},
            "machine_changed": drifts, "why_unchanged": self.why_unchanged(),
            "steps": [s.row() for s in self.steps],
            "experiments": [e.row() for e in self.experiments],
            "top": self.top().astype(object).where(lambda f: f.notna(), None).to_dict("records"),
            "recommended": {"changes": {k: _json_value(v) for k, v in self.changes().items()},
                            "set_line": self.set_line(), "python_call": self.python_call(),
                            "knobs": current.as_dict()},
            "batch_sweep": self.sweep.summary() if hasattr(self.sweep, "summary") else None,
            "batch_sweep_final": self.sweep_final.summary() if hasattr(self.sweep_final, "summary") else None,
            "precision": self.precision.summary() if hasattr(self.precision, "summary") else self.precision,
            "buckets": self.buckets,
            "waits": None if self.waits is None else self.waits.astype(object).where(self.waits.notna(), None).to_dict("records"),
            "data": self.data,
            "state": self.state,
        }


def _figures_summary(f: dict[str, Any]) -> dict[str, Any]:
    return {k: (rounded(f.get(k)) if isinstance(f.get(k), float) else f.get(k))
            for k in ("qps", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms", "model_busy", "device_busy", "errors",
                      "n", "rate")}


def _changes(knobs: Knobs) -> dict[str, Any]:
    base = preset("baseline")
    return {k: getattr(knobs, k) for k in knob_names()
            if k not in _NOT_RECOMMENDED and getattr(knobs, k) != getattr(base, k)}


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


def input_texts(inputs: Sequence[Any], formatter: Any = None) -> tuple[list[str], dict[str, int]]:
    """The model texts of the valid inputs (formatted with ``formatter``, the knob), and the count of invalid
    ones by reason."""
    from tuning.runtime.engine import Preparer

    prep = Preparer(preset("baseline"), None, *([formatter] if formatter is not None else []))  # read + format only
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

def device_block(choice: Any, sim_profile: str | None = None) -> dict[str, Any]:
    """The ``device`` block of the ladder's summary: the contract's object (:mod:`tuning.base.contract`)."""
    if choice.knob == "sim" and sim_profile:
        choice = dataclasses.replace(choice, profile=sim_profile)
    return choice.as_dict()


class Ladder:
    """The ladder's state while it runs: the experiments and steps so far, the reference and its capacity."""

    def __init__(self, measure: Measure, open_loop: bool, settings: LadderSettings, device: Any, target_p99_ms: float,
                 report: Callable[[str], None] | None = None, status: Callable[[str], None] | None = None):
        self.open_loop, self.settings, self.device = open_loop, settings, device
        self._tests = 0  # load tests run through the seam, recorded as experiments or not (a step that failed mid-way)

        def counted(knobs: Knobs, **kw: Any) -> Trial:
            self._tests += 1
            return measure(knobs, **kw)
        self.measure = counted
        self.target = target_p99_ms
        self.report = report or (lambda line: None)
        self.status = status or (lambda text: None)
        self.experiments: list[Experiment] = []
        self.steps: list[Step] = []
        self.current: Knobs | None = None
        self.capacity: Capacity | None = None  # the reference's (objective "target")
        self.figures: dict[str, Any] = {}  # the reference's latest figures
        self.baseline_capacity: Capacity | None = None
        self.baseline_figures: dict[str, Any] = {}
        self.done: list[str] = []
        self.drifts: list[dict[str, Any]] = []  # the machine changed under the ladder (see drifted)
        self.on_step: Callable[[Step], None] | None = None
        self._mark = (time.monotonic(), 0)  # when and after how many load tests the last rung was decided

    @property
    def target_mode(self) -> bool:
        return self.settings.objective == "target"

    def experiment(self, step: str, role: str, change: str, knobs: Knobs, trials: Sequence[Trial],
                   rate: float | None = None) -> Experiment:
        e = Experiment(max((x.id for x in self.experiments), default=0) + 1, step, role, change, knobs, self.device.label,
                       bool(self.device.simulated), rate, list(trials), self.target)
        self.experiments.append(e)
        return e

    def load_tests(self) -> int:
        """Load tests run so far: through the seam, a step that failed mid-way included, and those run before it
        (a resumed run's earlier ones, investigate's first recorded run)."""
        return self._tests

    def finish(self, step: Step) -> Step:
        now, tests = time.monotonic(), self.load_tests()
        step.seconds, step.load_tests = now - self._mark[0], tests - self._mark[1]
        self._mark = (now, tests)
        self.steps.append(step)
        if step.status in ("baseline", "kept") and step.knobs is not None:
            self.current = step.knobs
            if step.capacity is not None:
                self.capacity = step.capacity
            self.figures = dict(step.figures)
        self.report(format_step(step))
        if self.on_step:
            self.on_step(step)
        return step

    def skip(self, name: str, title: str, change: str, reason: str, status: str = "skipped") -> Step:
        return self.finish(Step(name, title, change, status, reason, reference=self.current))

    # --- measuring ---

    def search(self, name: str, knobs: Knobs, *, saturation: float | None = None,
               known_pass: Probe | None = None, label: str = "") -> tuple[Capacity, list[int]]:
        cap = capacity_at_target(self.measure, knobs, self.target, saturation=saturation, known_pass=known_pass,
                                 settings=self.settings.capacity, status=lambda t: self.status(f"{name}: {label}{t}"))
        ids = [self.experiment(name, "probe", f"{label}capacity probe at {p.rate:.1f} req/s", knobs, p.trials,
                               p.rate).id for p in cap.probes if p is not known_pass]
        return cap, ids

    def saturation(self, name: str, role: str, knobs: Knobs, closed_qps: float) -> tuple[float, list[int]]:
        """The top of a capacity search for ``knobs`` whose closed loop completed ``closed_qps``: the server's pace in
        an open-loop window past it (:func:`tuning.experiments.capacity.saturation_rate`; the closed loop, recorded
        or not, reads low). Returns the rate and the windows' experiment ids."""
        self.status(f"{name}: open loop past saturation")
        rate, trials = saturation_rate(self.measure, knobs, closed_qps)
        ids = [self.experiment(name, role, f"open loop at {t.rate or math.nan:.1f} req/s, past saturation: "
                                           f"{t.qps:.1f} answered a second", knobs, [t], t.rate).id for t in trials]
        return rate, ids

    def start(self, knobs: Knobs, first: Trial | None) -> Step:
        """The baseline: a closed-loop run, then an open-loop window past its completion rate (the server's pace tops
        the capacity search: :meth:`saturation`), then its capacity."""
        self.status("baseline: closed loop")
        if first is not None:
            self._tests += 1  # investigate's recorded run, made before the ladder
        trial = first if first is not None else self.measure(knobs)
        if trial.ok == 0:
            raise LadderError(f"the baseline got no ok answer ({trial.submitted} sent, {trial.errors} errors, "
                              f"{trial.timeouts} timeouts, {trial.rejected} rejected); first error: "
                              f"{trial.first_error or 'none recorded'}. Fix the service or the data, then run again")
        ids = [self.experiment("baseline", "baseline", "", knobs, [trial]).id]
        figures = _trial_figures(trial, self.target)
        cap = None
        if self.target_mode:
            saturation, over_ids = self.saturation("baseline", "baseline", knobs, trial.qps)
            ids += over_ids
            cap, probe_ids = self.search("baseline", knobs, saturation=saturation)
            ids += probe_ids
            best = cap.best
            figures.update(_probe_figures(best), capacity=rounded(cap.capacity),
                           capacity_bracket=[rounded(cap.low), rounded(cap.high)], meets_target=cap.met)
            self.baseline_capacity = cap
        else:
            figures["meets_target"] = bool(math.isfinite(trial.p99_ms) and trial.p99_ms <= self.target)
        self.baseline_figures = dict(figures)
        reason = "batch 1, 2 workers, Python tokenizer, dynamic padding, fp32, eager"
        if cap is not None:
            reason += f"; capacity: {cap.sentence()}"
        return self.finish(Step("baseline", "the investigation's starting point", "", "baseline", reason, knobs, None,
                                figures, ids, capacity=cap))

    def judge(self, name: str, title: str, change: str, knobs: Knobs, note: str = "", *, again: bool = False,
              carried: Sequence[int] = ()) -> Step:
        """Pairs of the reference and ``knobs`` at ``compare_at`` (60%) of the reference's capacity (or closed
        loop), the verdict, a second comparison past the capacity for a step not kept there, and the candidate's
        own capacity when it is kept (a kept step whose capacity comes out below the reference's is refused
        after all)."""
        ref = self.current
        s = self.settings
        if self.target_mode and self.capacity.met and not s.light_load:
            return self.judge_past_capacity(name, title, change, knobs, note, again=again, carried=carried)
        if self.target_mode:
            # below the knee: at the capacity itself 5% of run-to-run noise moves the latency 2-5x, and a run past
            # the knee is a queue that only grows. Measured on the tuner's device (tokenizer naive -> fast, 6
            # pairs each, one run): per-pair SD of the log figure 0.117 at 90% of the capacity, 0.069 at 60%,
            # for the same signal-to-noise (3.7 and 3.5); and at 90% a reference whose capacity came out a little
            # high reached its knee in some pairs (an interval of 0.73-10.8 from 6 pairs). At 60% no pair does.
            cap = self.capacity
            rate = cap.capacity * s.compare_at if cap.met else cap.lowest_rate
        else:
            cap, rate = None, None
        cmp = compare_at(self.measure, ref, knobs, rate=rate, target_p99_ms=self.target, settings=s.compare_settings(),
                         status=lambda t: self.status(f"{name}: {change}: {t}"), seed=s.seed + len(self.steps))
        ids = [*carried, self.experiment(name, "reference", change, ref, cmp.reference, rate).id,
               self.experiment(name, "candidate", change, knobs, cmp.candidate, rate).id]
        if self.target_mode and cap.met and not again:
            drift = self.drifted(name, ref, cmp, rate)
            if drift is not None:  # judged again against the reference's new capacity (met or not)
                why, probe_ids = drift
                note = f"{note}; {why}" if note else why
                return self.judge(name, title, change, knobs, note, again=True, carried=ids + probe_ids)
        cand, refd = cmp.figures("candidate", self.target), cmp.figures("reference", self.target)
        figures = {"metric": cmp.metric, "rate": rounded(rate), "ratio": rounded(cmp.ratio), "low": rounded(cmp.low),
                   "high": rounded(cmp.high), "median_ratio": rounded(cmp.median_ratio), "pairs": cmp.pairs,
                   "order": cmp.order, "min_effect": cmp.min_effect, "level": cmp.level, "verdict": cmp.verdict,
                   "pair_sd": _round(cmp.pair_sd), "pairs_needed": _round(cmp.pairs_needed),
                   **{k: _round(cand.get(k)) for k in ("qps", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms", "errors",
                                                       "timeouts", "n", "exceed", "model_busy", "device_busy",
                                                       "mean_batch")},
                   **{f"reference_{k}": _round(refd.get(k)) for k in ("qps", "p50_ms", "p99_ms", "errors")}}
        what = "latency ratio (reference / candidate)" if self.target_mode else "QPS ratio"
        interval = f"{what} {cmp.ratio:.2f} [{cmp.low:.2f}-{cmp.high:.2f}] after {cmp.pairs} pairs"
        at = f" at {rate:.1f} req/s" if rate is not None else " (closed loop)"
        bar = f"+{100 * cmp.min_effect:.0f}%"
        meets, why = cmp.meets(self.target, s.error_budget)
        ref_meets = cap.met if self.target_mode else cmp.reference_meets(self.target, s.error_budget)[0]
        figures.update(meets_target=meets, reference_capacity=rounded(cap.capacity) if cap is not None else None)
        if ref_meets and not meets:
            status, reason = "not kept", f"misses the {self.target:.0f} ms target{at} ({why})"
        elif meets and not ref_meets:
            status, reason = "kept", f"meets the target{at} where the reference did not ({why}); {interval}"
        elif cmp.verdict == "better":
            status, reason = "kept", f"{interval} clears {bar}{at}" + (f"; meets the target there ({why})" if meets else
                                                                      "; neither meets the target yet: closer to it")
        elif cmp.verdict == "not better":
            status, reason = "not kept", f"not better: {interval}{at}, below {bar}"
        else:
            cut = ("the cap" if cmp.pairs >= s.max_pairs else
                   f"stopped: {s.max_pairs} pairs at this spread would still straddle it")
            if math.isfinite(cmp.pairs_needed):  # why: the spread against the effect, in pairs
                cut += (f"; at {cmp.pair_sd:.0%} SD per pair, an interval as narrow as the {s.min_effect:.0%} bar "
                        f"needs about {cmp.pairs_needed:,.0f} pairs")
            status, reason = "not kept", f"not distinguishable: {interval}{at} ({cut}) straddles {bar}"
        race, race_known = None, None
        if (self.target_mode and status == "not kept" and meets and cap.met
                and cmp.verdict in ("not distinguishable", "not better")):
            # below the knee a change that raises the capacity (batching above all) can leave the latency as it
            # was, or add a little (a batch wait); past the reference's capacity it shows (see :meth:`race`)
            race, race_ids, race_figures, told = self.race(name, change, ref, knobs)
            ids += race_ids
            figures.update(race_figures)
            if race.verdict == "candidate":
                figures["meets_target"] = True
                race_known, held, again_ids = self.race_pass_holds(name, change, knobs, race, figures)
                ids += again_ids
                if race_known is not None:
                    status, meets = "kept", True
                    reason = f"{reason}; but {told}: {held}"
                else:
                    reason += f"; {told}: {held}, not kept there either"
            elif race.verdict == "candidate faster":  # kept only if its own capacity then beats the reference's
                status, reason = "kept", (f"{reason}; but {told}: neither meets the target there by its count, the "
                                          f"candidate clearly faster (clears +{100 * s.min_effect:.0f}%)")
            elif race.verdict == "reference passed" and not again:
                why, probe_ids = self.passed_past(name, ref, race)
                return self.judge(name, title, change, knobs, f"{note}; {why}" if note else why, again=True,
                                  carried=ids + probe_ids)
            else:
                reason += f"; {told}: {race.verdict}, not kept there either"
        figures["gain"] = rounded(cmp.ratio - 1) if not self.target_mode else None
        new_cap, saturation = None, None
        if status == "kept" and self.target_mode:
            if race is not None and race.verdict == "candidate":
                known = race_known
            elif meets:
                known = _probe_from(rate, cmp.candidate, self.target)
            else:  # closer to the target but not there: search from its own closed-loop rate
                closed = self.measure(knobs)
                ids.append(self.experiment(name, "candidate", f"{change} (closed loop)", knobs, [closed]).id)
                saturation, over_ids = self.saturation(name, "candidate", knobs, closed.qps)
                known = None
                ids += over_ids
            status, reason, new_cap, probe_ids = self.kept_capacity(
                name, knobs, status, reason, figures, known=known, saturation=saturation,
                faster=race is not None and race.verdict == "candidate faster")
            ids += probe_ids
        reason = f"{note}; {reason}" if note else reason
        return self.finish(Step(name, title, change, status, reason, knobs, ref, figures, ids, cmp, new_cap))

    def race(self, name: str, change: str, ref: Knobs, knobs: Knobs) -> tuple[Race, list[int], dict[str, Any], str]:
        """``ref`` and ``knobs`` in interleaved pairs at ``race_at`` x the rate where the reference's capacity search
        failed (its bracket's top): at the failing rate itself the reference still held in 2 of 6 pairs of a stub
        with 2% noise, and at 1.2x the capacity a quick search's 12% bracket let no-op knobs through (13 of 80
        runs). Decided by the counts, not a ratio: the candidate passes by the probe's rule over its pooled runs
        there while the reference fails in the same pairs (a ratio of shares swung 0.3-300,000 over 6 pairs in
        which the candidate had 0 of 12,079 over the target and the reference 3,836). Returns the race, the
        experiments' ids, its figures and a sentence of what it told."""
        s, cap = self.settings, self.capacity
        failing = cap.high if cap.high is not None and math.isfinite(cap.high) else cap.capacity
        race_rate = s.race_at * failing  # 20% past a rate the reference already failed
        race = race_at(self.measure, ref, knobs, rate=race_rate, target_p99_ms=self.target, settings=s.capacity,
                       max_pairs=s.race_pairs if s.race_pairs is not None else s.max_pairs,
                       seed=s.seed + 7 * len(self.steps) + 1, compare=s.compare_settings(),
                       gate_level=s.race_level, extend_to=s.max_pairs if s.race_pairs is not None and not s.light_load else None,
                       status=lambda t: self.status(f"{name}: {change}: past the reference's capacity: {t}"))
        ids = [self.experiment(name, "reference", f"{change} (past the capacity)", ref, race.reference, race_rate).id,
               self.experiment(name, "candidate", f"{change} (past the capacity)", knobs, race.candidate,
                               race_rate).id]
        cf, rf = pooled_figures(race.candidate, self.target), pooled_figures(race.reference, self.target)
        figures: dict[str, Any] = dict(
            race_rate=rounded(race_rate), race_pairs=race.pairs, race_verdict=race.verdict,
            race_candidate=f"{cf['exceed']} of {cf['n']} ({race.candidate_by[0]} by {race.candidate_by[1]})",
            race_reference=f"{rf['exceed']} of {rf['n']} ({race.reference_by[0]} by {race.reference_by[1]})")
        told = (f"at {race_rate:.1f} req/s, past the reference's capacity, after {race.pairs} pairs: candidate "
                f"{figures['race_candidate']} over {self.target:.0f} ms, reference {figures['race_reference']}")
        if math.isfinite(race.ratio):
            figures.update(race_ratio=rounded(race.ratio), race_low=rounded(race.low), race_high=rounded(race.high),
                           race_level=s.race_level)  # the gate's level, not the step's (``level``)
            told += f"; latency ratio there {race.ratio:.2f} [{race.low:.2f}-{race.high:.2f}] at {100 * s.race_level:g}%"
        return race, ids, figures, told

    def replicate(self, name: str, change: str, knobs: Knobs, rate: float,
                  per_window: float | None = None) -> tuple[Probe, list[int]]:
        """The race's pass of ``knobs`` at ``rate``, probed once more on fresh arrivals (the capacity search's
        rule) before it stands as the lower end of the candidate's capacity. Near the knee 3-4 s windows let a
        no-op through: a window a little past the capacity still meets the target within it, and in the stubs'
        Monte-Carlo (a queue that grows past the knee) 14 of 100 quick no-op ladders shipped a knob without it, 8
        with, and 10 of 100 full ones, 4 with (the full settings race a step their light-load pairs could not tell
        apart); and on this CPU the confirm at a capacity set by such a pass failed by the knee twice. Returns the probe and
        its experiment's id. It holds only by its count (:meth:`race_pass_holds`), so it runs up to the windows
        a count needs at the race's ``per_window`` outcomes."""
        self.status(f"{name}: {change}: the race's pass again at {rate:.1f} req/s")
        settings = self.settings.capacity
        if per_window and per_window > 0:  # windows enough for the count to pass at all (299 outcomes)
            settings = dataclasses.replace(settings, max_windows=max(settings.max_windows,
                                                                     math.ceil(COUNT_PASS_MIN / per_window)))
        p = fresh_probe(self.measure, knobs, rate, self.target, settings, salt=REPLICATE_SALT)
        return p, [self.experiment(name, "probe", f"{change} (the race's pass, again)", knobs, p.trials, rate).id]

    def race_pass_holds(self, name: str, change: str, knobs: Knobs, race: Race,
                        figures: dict[str, Any]) -> tuple[Probe | None, str, list[int]]:
        """A race the candidate passed (``candidate``), checked by :meth:`replicate`: (the probe that stands as
        the lower end of its capacity, or None when the pass did not hold; the sentence; the experiments' ids).
        Sets ``figures['race_again']`` (whether the row's own figures meet the target is the caller's to say:
        quick mode's row holds the race's figures, the full settings' the light-load pairs')."""
        per_window = known_median([t.submitted for t in race.candidate]) if race.candidate else None
        again, ids = self.replicate(name, change, knobs, race.rate, per_window)
        figures["race_again"] = f"{again.exceed} of {again.n} ({again.verdict} by {again.by})"
        over = f"({figures['race_again']} over {self.target:.0f} ms)"
        # a count's pass, not a p99 estimate's: in thin windows (80 outcomes) a 'pass' by the estimate let no-op
        # knobs through the stubs' Monte-Carlo: 21 of 100 quick ladders shipped one, 19 by a race's pass (by the
        # count: 13 and 11)
        if again.verdict == "pass":
            return again, f"it meets the target where the reference does not, and again on fresh arrivals {over}", ids
        return None, (f"it met the target where the reference did not, but not again on fresh arrivals {over}: "
                      "a pass at the knee that did not replicate"), ids

    def kept_capacity(self, name: str, knobs: Knobs, status: str, reason: str, figures: dict[str, Any], *,
                      known: Probe | None, saturation: float | None,
                      faster: bool) -> tuple[str, str, Capacity | None, list[int]]:
        """A kept step's own capacity (from ``known``, a passing probe, else from ``saturation``), and the step
        refused after all when it is below the reference's (beyond the bracket), or, for a step kept as
        ``faster`` past the reference's capacity, not above it by the minimum effect: that evidence is about
        overload, and what ships is the capacity at the target. Returns (status, reason, capacity or None, ids)."""
        s, cap = self.settings, self.capacity
        new_cap, ids = self.search(name, knobs, known_pass=known, saturation=saturation)
        gain = new_cap.capacity / cap.capacity - 1 if cap.met and new_cap.met else None
        figures.update(capacity=rounded(new_cap.capacity), capacity_bracket=[rounded(new_cap.low), rounded(new_cap.high)],
                       gain=rounded(gain))
        if cap.met and not new_cap.met:  # what ships must meet the target: a step whose own search met it nowhere
            return "not kept", (f"{reason}; but its own capacity search met the {self.target:.0f} ms target at no rate "
                                "tried: not kept"), None, ids
        if gain is not None and (gain <= s.min_effect if faster else gain < -s.capacity.tolerance):
            short = f"not above the reference's {cap.capacity:.1f} by +{100 * s.min_effect:.0f}%" if faster else \
                f"below the reference's {cap.capacity:.1f}"
            return "not kept", f"{reason}; but its capacity {new_cap.capacity:.1f} req/s is {short} ({100 * gain:+.0f}%): " \
                "not kept", None, ids
        return status, f"{reason}; capacity now {new_cap.sentence()}", new_cap, ids

    def judge_past_capacity(self, name: str, title: str, change: str, knobs: Knobs, note: str = "", *,
                            again: bool = False, carried: Sequence[int] = ()) -> Step:
        """Quick mode's comparison (``light_load=False``): the race past the reference's capacity alone
        (:meth:`race`), no pairs below the knee. In quick investigate on this 2-core CPU the light-load pairs
        stopped at 3 with intervals of 0.1-10 (a 14-26% SD per pair, 80-270 pairs for the 5% bar) in 9 of 10
        decisions, and the one they decided (bf16, 1.89) the race decides as well: they cost 6 load tests a step
        for nothing. What it trades: a step is kept only when the candidate meets the target at the race's rate
        (capacity about 20-35% above the reference's: ``race_at`` over a 12% bracket) or is faster there by the
        gate and then by ``min_effect`` in its own capacity; and a machine that slows under the run is not seen
        (the light-load pairs are the ladder's check for it), one that speeds up is (the reference passes)."""
        ref, s = self.current, self.settings
        race, ids, figures, told = self.race(name, change, ref, knobs)
        ids = [*carried, *ids]
        cf, rf = race.figures("candidate", self.target), race.figures("reference", self.target)
        figures.update(metric="count past the capacity", rate=figures["race_rate"], pairs=race.pairs,
                       order=race.order, min_effect=s.min_effect, level=s.race_level, verdict=race.verdict,
                       ratio=figures.get("race_ratio"), low=figures.get("race_low"), high=figures.get("race_high"),
                       reference_capacity=rounded(self.capacity.capacity),
                       **{k: _round(cf.get(k)) for k in ("qps", "p50_ms", "p99_ms", "p99_low_ms", "p99_high_ms", "errors",
                                                         "timeouts", "n", "exceed", "model_busy", "device_busy",
                                                         "mean_batch")},
                       **{f"reference_{k}": _round(rf.get(k)) for k in ("qps", "p50_ms", "p99_ms", "errors")})
        figures["meets_target"] = race.verdict == "candidate"
        new_cap = None
        if race.verdict == "reference passed" and not again:
            why, probe_ids = self.passed_past(name, ref, race)
            return self.judge_past_capacity(name, title, change, knobs, f"{note}; {why}" if note else why,
                                            again=True, carried=ids + probe_ids)
        if race.verdict == "candidate":
            known, held, again_ids = self.race_pass_holds(name, change, knobs, race, figures)
            ids += again_ids
            figures["meets_target"] = known is not None  # this row's figures are the race's: the pass did not hold
            status, reason = ("kept" if known is not None else "not kept"), f"{told}: {held}"
        elif race.verdict == "candidate faster":
            status, reason = "kept", (f"{told}: neither meets the target there by its count, the candidate clearly "
                                      f"faster (clears +{100 * s.min_effect:.0f}%)")
            known = None
        else:
            status, reason, known = "not kept", f"{told}: {race.verdict}", None
        if status == "kept":
            status, reason, new_cap, probe_ids = self.kept_capacity(
                name, knobs, status, reason, figures, known=known, saturation=None if known else race.rate,
                faster=race.verdict == "candidate faster")
            ids += probe_ids
        reason = f"quick mode, judged past the capacity only; {reason}"
        reason = f"{note}; {reason}" if note else reason
        return self.finish(Step(name, title, change, status, reason, knobs, ref, figures, ids, None, new_cap))

    def drifted(self, name: str, ref: Knobs, cmp: Comparison, rate: float) -> tuple[str, list[int]] | None:
        """Whether the machine changed under the ladder (a hypervisor's steal, another tenant), not the knobs,
        since the reference's capacity was found; then its capacity is searched again and becomes the
        reference's (met or not), and the caller judges the step once more. Two ways:

        - **slowed**: the reference fails by the count at ``compare_at`` of the capacity it was found to have,
          and its median p50 there is above 1.5x the p50 it had at that capacity (a stall moves a p99, not a
          p50): the pairs judged nothing;
        - **recovered**: the capacity was searched under a steal of at least :data:`RECOVERED_STEAL` and these
          pairs ran under half of it or less: the pairs hold, but at a rate below the machine's, and a kept
          step's capacity would be set against one found on a slower machine.

        When the reference is the baseline's configuration the baseline's capacity is replaced too (the headline
        then compares one machine); otherwise the ladder records the change and its summary gives no
        before/after ratio. Returns (what happened, the experiments' ids), or None."""
        f = pooled_figures(cmp.reference, self.target)
        failed = bool(f["counted"] and f["n"]) and count_verdict(min(f["exceed"], f["n"]), f["n"]) == "fail"
        old = self.capacity
        then = old.best.p50_ms if old.best is not None else math.nan
        now = known_median([t.p50_ms for t in cmp.reference])
        steal_then = known_median([t.steal_share for p in old.probes for t in p.trials])
        steal_now = known_median([t.steal_share for t in (*cmp.reference, *cmp.candidate)])
        slowed = failed and math.isfinite(then) and math.isfinite(now) and now > 1.5 * then
        recovered = (not failed and math.isfinite(steal_then) and math.isfinite(steal_now)
                     and steal_then >= RECOVERED_STEAL and steal_now <= 0.5 * steal_then)
        if not (slowed or recovered):
            return None
        new, ids = self.search_again(name, ref, "slowed" if slowed else "recovered", rate, steal_now, steal_then)
        cap_at = f"{100 * self.settings.compare_at:.0f}% of the capacity it was found to have ({old.capacity:.1f} req/s)"
        if slowed:
            said = f", steal {100 * steal_now:.0f}% of the CPU during its pairs" if math.isfinite(steal_now) else ""
            why = (f"the reference failed at {rate:.1f} req/s ({f['exceed']} of {f['n']} over {self.target:.0f} ms, "
                   f"p50 {now:.0f} ms against {then:.0f} ms at its capacity), {cap_at}: the machine changed{said}")
        else:
            why = (f"the machine recovered: steal {100 * steal_then:.0f}% of the CPU while the reference's capacity was "
                   f"searched, {100 * steal_now:.0f}% during these pairs at {rate:.1f} req/s, {cap_at}")
        self.not_judged(name, ids[0], "before the machine changed", rate)
        return f"{why}; its capacity searched again: {new.sentence()}", ids

    def search_again(self, name: str, ref: Knobs, kind: str, rate: float, steal_now: float = math.nan,
                     steal_then: float = math.nan, known_pass: Probe | None = None) -> tuple[Capacity, list[int]]:
        """The reference's capacity searched again (from ``known_pass``, else from a closed loop and a window past
        it, :meth:`saturation`, as the baseline's was); it becomes the reference's, and the baseline's too when the
        reference is the baseline's configuration (the headline then compares one machine). Recorded in ``drifts``."""
        old = self.capacity
        ids: list[int] = []
        saturation = None
        if known_pass is None:  # a closed loop and a window past it bracket the search, as the baseline's did
            closed = self.measure(ref)
            ids.append(self.experiment(name, "reference", "the reference again (closed loop)", ref, [closed]).id)
            saturation, over_ids = self.saturation(name, "reference", ref, closed.qps)
            ids += over_ids
        new, probe_ids = self.search(name, ref, saturation=saturation, known_pass=known_pass,
                                     label="the reference again: ")
        ids += probe_ids
        self.capacity = new
        baseline = next((st.knobs for st in self.steps if st.status == "baseline"), None)
        if ref == baseline:
            self.baseline_capacity = new
        self.drifts.append({"step": name, "kind": kind, "rate": rounded(rate),
                            "capacity_before": rounded(old.capacity), "capacity_after": rounded(new.capacity),
                            "steal_share": rounded(steal_now), "steal_share_at_capacity": rounded(steal_then),
                            "baseline_searched_again": ref == baseline})
        return new, ids

    def not_judged(self, name: str, before_id: int, why: str, rate: float | None = None) -> None:
        """The step's rows listed before ``before_id`` (at ``rate``; None: any) judged nothing: say so there."""
        for e in self.experiments:
            if (e.step == name and e.role in ("reference", "candidate") and e.id < before_id
                    and (rate is None or e.rate == rate) and "not judged" not in e.change):
                e.change = f"{e.change} ({why}: not judged)"

    def passed_past(self, name: str, ref: Knobs, race: Race) -> tuple[str, list[int]]:
        """The reference passed by the count at ``race_at`` x the rate where its capacity search had failed: that
        capacity is below the reference's now (the machine sped up, or the search met a bad window), and a step
        raced there is judged against a reference that holds. Its capacity is searched again, upward from the
        race's pooled runs (a passing probe), and the caller judges the step once more."""
        old = self.capacity
        steal_now = known_median([t.steal_share for t in (*race.reference, *race.candidate)])
        steal_then = known_median([t.steal_share for p in old.probes for t in p.trials])
        known = _probe_from(race.rate, race.reference, self.target)
        new, ids = self.search_again(name, ref, "passed past its capacity", race.rate, steal_now, steal_then,
                                     known_pass=known)
        self.not_judged(name, ids[0] if ids else len(self.experiments), "against a capacity since searched again")
        f = pooled_figures(race.reference, self.target)
        failed_at = old.high if old.high is not None and math.isfinite(old.high) else old.capacity
        return (f"the reference passed at {race.rate:.1f} req/s ({f['exceed']} of {f['n']} over {self.target:.0f} ms), "
                f"past the rate where its capacity search had failed ({failed_at:.1f} req/s): its capacity searched "
                f"again: {new.sentence()}"), ids

    def try_change(self, name: str, title: str, changes: dict[str, Any], note: str = "") -> Step:
        """Measure the current knobs with ``changes`` and judge it. A knob refusing the change is ``refused``;
        any error while measuring makes the step ``failed`` with that error, and the ladder goes on."""
        text = change_text(changes)
        try:
            knobs = self.current.replace(**changes)
            if knobs.device != "sim":
                import torch

                knobs.resolve(torch.cuda.is_available())
        except (ValueError, TypeError) as exc:
            return self.skip(name, title, text, f"refused by the knobs: {exc}", "refused")
        if knobs == self.current:
            return self.skip(name, title, text, "already set")
        return self.guarded(name, title, text, lambda: self.judge(name, title, text, knobs, note))

    def guarded(self, name: str, title: str, change: str, fn: Callable[[], Step]) -> Step:
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a compile failure, out of memory, a broken server: this step only
            error = f"{type(exc).__name__}: {exc}"
            step = Step(name, title, change, "failed", f"failed while measuring: {error}", reference=self.current,
                        error=error)
            return self.finish(step)

    def result(self, base: Knobs, extra: dict[str, Any], interrupted: bool = False) -> LadderResult:
        dev = self.device
        started = any(st.status == "baseline" for st in self.steps)
        state = {} if not started else {"done": list(self.done), "current": (self.current or base).as_dict(),
                 "capacity": self.capacity.summary() if self.capacity is not None else None,
                 "baseline_capacity": self.baseline_capacity.summary() if self.baseline_capacity is not None else None,
                 "baseline_figures": self.baseline_figures, "figures": self.figures, "knee": extra.get("knee"),
                 "objective": self.settings.objective, "target_p99_ms": self.target, "drifts": list(self.drifts)}
        return LadderResult(base, self.current or base, list(self.steps), list(self.experiments),
                            device_block(dev, base.sim_profile), self.settings, self.target,
                            self.baseline_capacity, self.capacity, extra.get("sweep"), extra.get("sweep_final"),
                            extra.get("precision"), extra.get("buckets"), extra.get("data", {}), interrupted,
                            dict(self.baseline_figures), dict(self.figures), state)

    def restore(self, summary: dict[str, Any]) -> None:
        """Go on from a partial ``summary.json``: the finished steps' rows as they were, the reference and its
        capacity; a step that was cut short is measured again."""
        state = summary.get("state") or {}
        if not state.get("current"):
            raise ValueError("cannot resume: the summary has no ladder state (it was written before the baseline "
                             "finished, or by another version); run without --resume")
        if state.get("objective") != self.settings.objective or state.get("target_p99_ms") != self.target:
            raise ValueError(f"cannot resume: that run used objective={state.get('objective')!r} and "
                             f"target_p99_ms={state.get('target_p99_ms')!r}; give the same, or run without --resume")
        done = list(state.get("done") or [])
        for row in summary.get("steps") or []:  # every row was decided before it was written: all stay
            figures = {k: row.get(k) for k in _STEP_FIGURES if row.get(k) is not None}
            self.steps.append(Step(row["step"], row["title"], row["change"], row["status"], row["reason"],
                                   None, None, figures, list(row.get("experiments") or []), error=row.get("error"),
                                   seconds=row.get("seconds"), load_tests=row.get("load_tests")))
        self.experiments = [Experiment(int(r["experiment"]), r["step"], r["role"], r["change"], None, r["device"],
                                       bool(r["simulated"]), r.get("rate"), [], self.target, frozen=r)
                            for r in summary.get("experiments") or []]
        # a step that failed mid-way ran tests no experiment records: its row's cost has them
        self._tests = max(sum(e.runs for e in self.experiments), sum(st.load_tests or 0 for st in self.steps))
        self._mark = (time.monotonic(), self._tests)
        self.current = Knobs(**{k: tuple(v) if isinstance(v, list) else v for k, v in state["current"].items()})
        self.capacity = Capacity.from_summary(state["capacity"]) if state.get("capacity") else None
        self.baseline_capacity = (Capacity.from_summary(state["baseline_capacity"])
                                  if state.get("baseline_capacity") else None)
        self.baseline_figures, self.figures = dict(state.get("baseline_figures") or {}), dict(state.get("figures") or {})
        self.done = done
        self.drifts = list(state.get("drifts") or [])


def _round(x: Any) -> Any:
    return rounded(x) if isinstance(x, float) else x


def _trial_figures(t: Trial, target: float) -> dict[str, Any]:
    f = pooled_figures([t], target)
    return {"metric": "closed loop", "qps": rounded(t.qps), "p50_ms": rounded(f["p50_ms"]), "p99_ms": rounded(f["p99_ms"]),
            "p99_low_ms": rounded(f["p99_low_ms"]), "p99_high_ms": rounded(f["p99_high_ms"]), "errors": t.failed,
            "timeouts": t.timeouts, "n": t.submitted, "exceed": f.get("exceed"), "model_busy": rounded(t.model_busy),
            "device_busy": rounded(t.device_busy), "mean_batch": rounded(t.mean_batch)}


def _probe_figures(p: Probe | None) -> dict[str, Any]:
    if p is None:
        return {}
    return {"rate": rounded(p.rate), "p50_ms": rounded(p.p50_ms), "p99_ms": rounded(p.p99_ms),
            "p99_low_ms": rounded(p.p99_low_ms), "p99_high_ms": rounded(p.p99_high_ms), "errors": p.errors,
            "n": p.n, "exceed": p.exceed if p.exceed >= 0 else None}


def _probe_from(rate: float, trials: list[Trial], target: float) -> Probe:
    """The candidate's pair runs at ``rate`` as a passing probe (the capacity search's known lower end)."""
    f = pooled_figures(trials, target)
    return Probe(rate, "pass", "pairs", True, len(trials), f["n"], f["exceed"] if f["exceed"] is not None else -1,
                 f["errors"], f["offered_rate"], f["achieved_rate"], f["late"], f["p50_ms"], f["p99_ms"],
                 f["p99_low_ms"], f["p99_high_ms"], list(trials))


def change_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_set_value(v)}" for k, v in changes.items())


def format_step(step: Step) -> str:
    """The one line printed when a step finishes: what was judged (ratio, interval, pairs), p50/p99, errors."""
    f = step.figures
    head = f"{step.name:<10} {step.change or '-':<40}"
    if not f:
        return f"{head} {step.status}: {step.reason}"
    cap = f" capacity {fixed(f.get('capacity'), '.1f', suffix=' req/s')}" if f.get("capacity") is not None else ""
    return (f"{head} p50 {fixed(f.get('p50_ms'), '.0f', suffix=' ms')} p99 {fixed(f.get('p99_ms'), '.0f', suffix=' ms')}"
            f" QPS {fixed(f.get('qps'), '.1f')} errors {f.get('errors', 0)}/{f.get('n', 0)}{cap} -> {step.status}: "
            f"{step.reason}")


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
    """The real measurement with the ladder's load settings (windows, warm-up, seed)."""
    max_window = settings.max_window_s if settings.max_window_s is not None else 3 * settings.duration_s
    return LoadMeasure(inputs, settings.concurrency, settings.duration_s, settings.warmup_s, model, seed=settings.seed,
                       tokenizer=tokenizer, formatter=formatter, min_outcomes=settings.min_outcomes,
                       max_window_s=max_window, warmup_requests=settings.warmup_requests)


def run_ladder(data: Any = None, device: Any = "auto", quick: bool = False,
               target_p99_ms: float = DEFAULT_TARGET_P99_MS, measure: Callable[..., Any] | None = None,
               progress: bool | Callable[[str], None] = True, settings: LadderSettings | None = None,
               steps: Sequence[str] = STEPS, first: Trial | None = None, sweep: Callable | None = None,
               accuracy: Callable | None = None, lengths: Sequence[int] | None = None,
               model: Any = None, sim_profile: str | None = None, objective: str | None = None,
               on_step: Callable[[LadderResult], None] | None = None,
               tokenizer: Any = None, formatter: Any = None, resume: dict[str, Any] | None = None) -> LadderResult:
    """Walk the ladder from ``baseline`` on ``data`` (a JSONL path, or request bodies) and ``device``
    (``auto``: CUDA, else the real CPU; ``cpu``, ``cuda``, ``sim`` or a ``tuning.sim.device_for`` choice).

    The seam: ``measure(knobs, *, rate=None, record=False) -> Trial`` replaces the load test (``rate=None``: a
    closed loop at the ladder's concurrency; a number: an open loop at that Poisson rate; ``record``: run the
    profilers); the Trial needs at least ``qps``, ``p99_ms``, ``ok`` and ``submitted`` (and ``latencies_ms``
    for the capacity probes to count rather than estimate). A one-argument ``measure(knobs)`` still works
    for ``objective="qps"`` (with a DeprecationWarning). ``sweep`` (knobs -> result with ``.knee``),
    ``accuracy`` (dtypes -> {dtype: min cosine}) and ``lengths`` (token lengths) replace the batch sweep, the
    precision check and the tokenizer pass. ``model``, ``tokenizer`` and ``formatter`` are the user's own
    (``--model``, ``--formatter``), passed to every server. ``first`` is a closed-loop baseline run already made
    (``investigate`` records it with the profilers). ``objective`` overrides ``settings.objective``.
    ``on_step(partial_result)`` runs after every step; ``resume`` (a partial ``summary.json``, loaded) goes on
    from its finished steps. ``progress``: a tqdm bar and a line per step (True),
    a callable that gets each line, or nothing (False).

    Raises :class:`LadderError` when the baseline gets no ok answer. Ctrl-C returns what was done, with
    ``interrupted=True``.
    """
    settings = settings or (LadderSettings.quick() if quick else LadderSettings.full())
    if objective is not None:
        settings = dataclasses.replace(settings, objective=objective)
    dev = device_for(device, sim_profile, fallback="cpu")
    sim_profile = sim_profile or (dev.profile if dev.knob == "sim" else None)
    if target_p99_ms is None or not target_p99_ms > 0:
        raise ValueError(f"target_p99_ms={target_p99_ms!r} must be a number > 0 (milliseconds)")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown ladder step(s) {unknown}; known: {', '.join(STEPS)}")
    inputs = load_inputs(data, settings.limit) if measure is None or lengths is None or accuracy is None else []
    texts, bad = input_texts(inputs, formatter) if inputs else ([], {})
    own_measure = measure is None
    raw_measure = measure or measure_for(inputs, settings, model, tokenizer, formatter)
    measure_fn, open_loop = as_measure(raw_measure)
    if settings.objective == "target" and not open_loop:
        raise ValueError("objective='target' needs an open loop: give measure(knobs, *, rate=None, record=False), "
                         "or use objective='qps' with a one-argument measure")
    if lengths is None and any(s in steps for s in ("batch", "buckets", "graph")):
        lengths = token_lengths(texts) if texts else []
    median_len = int(-(-np.median(lengths) // 8) * 8) if lengths else 64

    bar, report, status = progress_bar(progress, total=1 + len(steps), desc="ladder")
    ladder = Ladder(measure_fn, open_loop, settings, dev, target_p99_ms, report, status)
    base = preset("baseline", device=dev.knob)
    if dev.knob == "sim" and sim_profile:
        base = base.replace(sim_profile=sim_profile)
    extra: dict[str, Any] = {"data": {"inputs": len(inputs), "invalid": sum(bad.values()), "invalid_reasons": bad}}
    if on_step is not None:
        ladder.on_step = lambda step: on_step(ladder.result(base, extra))
    interrupted = False
    cap_batch = (lambda b: min(b, settings.concurrency)) if settings.objective == "qps" else (lambda b: b)
    try:
        knee: int | None = None
        if resume is not None:
            ladder.restore(resume)
            knee = (resume.get("state") or {}).get("knee")
            if knee:
                extra["knee"] = knee  # the joint pass starts from it
            for s_ in ladder.steps:
                report(f"(resumed) {format_step(s_)}")
        else:
            ladder.start(base, first)
        bar.update(1)
        for name in steps:
            if name in ladder.done:
                bar.update(1)
                continue
            k = ladder.current
            # on CUDA and the simulated device the step also pins memory, so it is judged there on any host
            if name == "workers" and dev.knob == "cpu" and (cores := usable_cores()) < settings.workers_min_cores:
                ladder.skip(name, "more preprocessing workers", f"num_workers={settings.workers}",
                            f"skipped on a CPU host with {cores} usable cores (fewer than {settings.workers_min_cores}): "
                            "the served path's preprocess workers are threads of one process, and torch's intra-op "
                            "threads already use every core (kept in 1 of 11 quick runs on two 2-core VMs and in none "
                            "of 3 full runs on a 2-core Xeon; its judgments cost 60-70 s of a quick run, 3-5 minutes "
                            "of a full one); to measure it anyway: run_ladder(..., settings=LadderSettings.full("
                            "workers_min_cores=0))")
            elif name == "workers":
                changes: dict[str, Any] = {"num_workers": settings.workers}
                if dev.knob in ("cuda", "sim"):
                    changes["pin_memory"] = True
                ladder.try_change(name, "more preprocessing workers", changes)
            elif name == "batch":
                sweep_fn = sweep or _default_sweep(raw_measure, settings, median_len)
                status(f"batch sweep at {median_len} tokens")
                swept = ladder.guarded(name, "batch size from the sweep's knee", "batch sweep",
                                       lambda: extra.__setitem__("sweep", sweep_fn(k)))
                if isinstance(swept, Step):  # the sweep failed: reported as the step
                    bar.update(1)
                    continue
                knee = extra["knee"] = getattr(extra["sweep"], "knee", None)
                size = cap_batch(knee) if knee else None
                if size is None:
                    ladder.skip(name, "batch size from the sweep's knee", "", "the sweep measured no batch size")
                elif size <= k.batch_size:
                    ladder.skip(name, "batch size from the sweep's knee", f"batch_size={size}",
                                f"the knee is at batch {knee}: per-sample cost does not fall with bigger batches here")
                else:
                    capped = (f" (knee {knee}, capped at the closed loop's concurrency {settings.concurrency})"
                              if size != knee else "")
                    ladder.try_change(name, "batch size from the sweep's knee", {"batch_size": size},
                                      f"knee of the sweep at {median_len} tokens: batch {size}{capped}")
            elif name == "tokenizer":
                ladder.try_change(name, "batched Rust tokenizer", {"tokenizer": "fast"})
            elif name == "buckets":
                plan = plan_for(lengths, k.max_length) if lengths else None
                extra["buckets"] = plan
                if plan is None:
                    ladder.skip(name, "planned length buckets", "", "no token lengths to plan from")
                    bar.update(1)
                    continue
                changes = {"padding": "bucket", "buckets": tuple(plan["buckets"])}
                note = (f"{plan['k']} buckets from the token-length histogram, padding waste "
                        f"{100 * plan['waste']:.0f}%")
                if k.batch_size == 1:
                    if not knee or knee <= 1:
                        ladder.skip(name, "planned length buckets", change_text(changes),
                                    "batch 1 pads nothing, and the sweep found no batch size worth batching")
                        bar.update(1)
                        continue
                    changes["batch_size"] = cap_batch(knee)
                    note += (f"; with batch_size={changes['batch_size']}: buckets only pay with batches, and the batch "
                             "step lost under dynamic padding (two knobs in this one step)")
                ladder.try_change(name, "planned length buckets", changes, note)
            elif name == "precision":
                wanted = ("fp16", "bf16") if dev.knob == "cuda" else ("bf16",)
                status("accuracy check of half precision against fp32")
                acc_fn = accuracy or _default_accuracy(texts[: settings.precision_texts], model)
                got = ladder.guarded(name, "half precision", f"dtype={wanted[0]}",
                                     lambda: extra.__setitem__("precision", acc_fn(wanted)))
                if isinstance(got, Step):
                    bar.update(1)
                    continue
                cosines = _min_cosines(extra["precision"])
                passing = [d for d in wanted if isinstance(cosines.get(d), float) and cosines[d] >= MIN_COSINE]
                why = "; ".join(f"{d}: " + (f"min cosine {c:.5f} < {MIN_COSINE}" if isinstance(c, float) else str(c))
                                for d, c in cosines.items() if d not in passing)
                if not passing:
                    ladder.skip(name, "half precision", f"dtype={wanted[0]}",
                                f"not recommended: {why or 'no half precision runs here'}", "refused")
                    bar.update(1)
                    continue
                dtype = passing[0]
                ladder.try_change(name, "half precision", {"dtype": dtype},
                                  f"{dtype} min cosine {cosines[dtype]:.5f} >= {MIN_COSINE}" + (f" ({why})" if why else ""))
            elif name == "graph":
                if dev.knob in ("cuda", "sim"):
                    changes = {"graph": "cuda_graph"}
                    note = ""
                    if k.padding == "dynamic":
                        plan = extra.get("buckets") or (plan_for(lengths, k.max_length) if lengths else None)
                        if plan is None:
                            ladder.skip(name, "graph capture", "graph=cuda_graph",
                                        "capture needs fixed shapes and there are no token lengths to plan buckets from")
                            bar.update(1)
                            continue
                        changes.update(padding="bucket", buckets=tuple(plan["buckets"]))
                        note = "capture needs fixed shapes: with the planned buckets (two knobs in this one step)"
                    ladder.try_change(name, "graph capture", changes, note)
                elif not settings.compile_on_cpu:
                    ladder.skip(name, "torch.compile", "graph=compile",
                                "skipped in quick mode: torch.compile costs seconds per shape on a CPU (run without --quick)")
                else:
                    ladder.try_change(name, "torch.compile", {"graph": "compile"})
            elif name == "batching":
                if k.batch_size == 1:
                    ladder.skip(name, "dynamic batching (max wait)", "max_wait_ms=...",
                                "batch size 1: there is no batch to wait for (the joint pass tries batch sizes again)")
                    bar.update(1)
                    continue
                for wait in settings.waits_ms:
                    ladder.try_change(name, "dynamic batching (max wait)", {"max_wait_ms": float(wait)})
            elif name == "joint":
                plan = extra.get("buckets") or (plan_for(lengths, k.max_length) if lengths else None)
                _joint_pass(ladder, settings, extra, sweep or _default_sweep(raw_measure, settings, median_len),
                            median_len, cap_batch, plan)
            elif name == "again":
                _host_steps_again(ladder)
            ladder.done.append(name)
            if ladder.on_step and ladder.steps:
                ladder.on_step(ladder.steps[-1])  # the checkpoint again, now with the step marked done
            bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
        report("interrupted: the ladder stops here; what was measured is kept")
    finally:
        bar.close()
        if own_measure:
            raw_measure.close()
    return ladder.result(base, extra, interrupted)


def _host_steps_again(ladder: Ladder) -> None:
    """The host-side rungs that were not kept (:data:`HOST_STEPS`: the tokenizer, the workers), judged once more
    against the ladder's configuration now, when a model-side knob (:data:`MODEL_KNOBS`) has changed since. They
    come early in the ladder, at batch 1 in fp32, where the model limits: quick investigate on a 2-core Xeon, the
    fast tokenizer at batch 1 fp32, 99% model-busy, both arms failed the race alike (521 and 541 of 834 over the
    target) in 3 of 3 runs; once batching and half precision cut the model's time per request 3-5x, the host's
    share is what a tokenizer changes. A step that lost with the model side unchanged since is not judged again
    (a repeat is only another chance at a false keep), nor one whose change is already set."""
    for name in HOST_STEPS:
        lost = [st for st in ladder.steps if st.name == name and st.status == "not kept"
                and st.knobs is not None and st.reference is not None]
        if not lost:
            continue
        st = lost[-1]
        changes = {f.name: getattr(st.knobs, f.name) for f in dataclasses.fields(st.knobs)
                   if getattr(st.knobs, f.name) != getattr(st.reference, f.name)}
        now = ladder.current
        moved = [k for k in MODEL_KNOBS if getattr(now, k) != getattr(st.reference, k)]
        if not changes or now.replace(**changes) == now or not moved:
            continue
        then = ", ".join(f"{k}={_set_value(getattr(st.reference, k))}" for k in moved)
        ladder.try_change("again", f"{st.title}, again", changes,
                          f"not kept at {then} (the {name} step); judged again now that "
                          + ", ".join(f"{k}={_set_value(getattr(now, k))}" for k in moved))


def _joint_pass(ladder: Ladder, settings: LadderSettings, extra: dict[str, Any], sweep_fn: Callable,
                length: int, cap_batch: Callable[[int], int], plan: dict[str, Any] | None) -> None:
    """Coordinate descent over batch_size, max_wait_ms and (with buckets) max_batch_tokens from the ladder's
    result, a line search along each knob: up while each move is kept, else down (a batch move over the planned
    buckets first once a batch under dynamic padding lost in this ladder). It starts at batch 1 too (a
    batch step that lost while the Python tokenizer or fp32 limited the host gets its chance here), from the
    knee re-measured under the final dtype and graph mode. Rounds until one keeps nothing (or ``joint_rounds``),
    at most ``joint_moves`` moves."""
    k = ladder.current
    knee = extra.get("knee")
    if k.dtype != "fp32" or k.graph != "eager":
        ladder.status(f"batch sweep again under {k.dtype}/{k.graph}")
        got = ladder.guarded("joint", "batch sweep under the final dtype and graph mode", "batch sweep",
                             lambda: extra.__setitem__("sweep_final", sweep_fn(k)))
        if not isinstance(got, Step):
            knee = getattr(extra["sweep_final"], "knee", None) or knee
    top = cap_batch(max(settings.sweep_sizes) * 2)  # one doubling past the sweep's largest batch at most
    budget = [settings.joint_moves if settings.joint_moves is not None else 10 ** 6]
    title = "batch size and max wait together"

    def dynamic_batch_lost() -> bool:
        return any(st.status == "not kept" and st.knobs is not None and st.knobs.batch_size > 1
                   and st.knobs.padding == "dynamic" and st.reference is not None
                   and st.knobs.batch_size != st.reference.batch_size for st in ladder.steps)

    def batch_moves(up: bool) -> Callable[[Knobs], list[dict[str, Any]]]:
        def moves(k: Knobs) -> list[dict[str, Any]]:
            b = k.batch_size
            if not up:
                return [{"batch_size": b // 2}] if b // 2 >= 2 else []
            nxt = cap_batch(knee) if knee and cap_batch(knee) > b else min(top, b * 2)
            if nxt <= b:
                return []
            # padding and batch size interact: a batch padded to its longest request can cost more than it
            # saves, while the same batch over planned buckets pays; so a move that loses alone is tried again
            # with the buckets (the buckets step lost while the host limited, or at a smaller batch); a jump
            # to the knee that loses both ways falls back to one doubling
            out = [{"batch_size": nxt}]
            if plan and k.padding == "dynamic":
                bucketed = {"batch_size": nxt, "padding": "bucket", "buckets": tuple(plan["buckets"])}
                # a batch under dynamic padding already lost in this ladder: the bucketed move goes first (quick
                # investigate on this CPU spent 50 s of its one joint round on batch 16 alone, lost again)
                out = [bucketed, *out] if dynamic_batch_lost() else [*out, bucketed]
            if nxt > min(top, b * 2) > b:
                out.append({"batch_size": min(top, b * 2)})
            return out
        return moves

    def wait_moves(up: bool) -> Callable[[Knobs], list[dict[str, Any]]]:
        def moves(k: Knobs) -> list[dict[str, Any]]:
            if k.batch_size == 1:
                return []  # nothing to wait for
            w = k.max_wait_ms
            if not up and not w:
                return []
            nxt = (w * 2 if w else min(settings.waits_ms)) if up else (w / 2 if w / 2 >= 0.5 else 0.0)
            cap = settings.joint_max_wait_ms if settings.joint_max_wait_ms is not None else max(settings.waits_ms)
            nxt = float(min(nxt, cap))
            return [{"max_wait_ms": nxt}] if nxt != w else []
        return moves

    def budget_moves(up: bool) -> Callable[[Knobs], list[dict[str, Any]]]:
        def moves(k: Knobs) -> list[dict[str, Any]]:
            if not up or k.padding != "bucket" or k.batch_size == 1 or k.max_batch_tokens is not None:
                return []
            # a padded-token budget: long buckets get smaller batches, short ones the full batch size
            return [{"max_batch_tokens": int(max(k.max_length, k.batch_size * length))}]
        return moves

    # every pair of configurations already judged, either way round (a step of the ladder's, or a move here):
    # judged once, never again (a repeat is only another chance at a false keep)
    tried: set[frozenset] = {frozenset((st.reference, st.knobs)) for st in ladder.steps if st.reference is not None}
    for round_ in range(settings.joint_rounds):
        kept_in_round = False
        for moves_for in (batch_moves, wait_moves, budget_moves):
            for up in (True, False):
                moved = False
                while budget[0] > 0:
                    todo = [c for c in moves_for(up)(ladder.current)
                            if frozenset((ladder.current, ladder.current.replace(**c))) not in tried]
                    kept = False
                    for n, change in enumerate(todo):  # the move, then its alternatives while none is kept
                        if budget[0] <= 0:
                            break
                        budget[0] -= 1
                        tried.add(frozenset((ladder.current, ladder.current.replace(**change))))
                        how = "" if n == 0 else (" (lost alone: again with the planned buckets, two knobs)"
                                                 if "padding" in change else " (the jump lost: one doubling)")
                        step = ladder.try_change("joint", title, change, f"round {round_ + 1} of the coordinate "
                                                 f"descent, {'up' if up else 'down'} along {next(iter(change))}{how}")
                        if step.status == "kept":
                            kept = True
                            break
                    if not kept:
                        break
                    moved = kept_in_round = True
                if moved:
                    break  # kept going up: no need to look down
        if not kept_in_round:
            break
