"""Classify a window from its joined signals: starved, fragmented, blocked or saturated.

The three families of cause that all read "low utilization" (INVESTIGATION.md), plus the
healthy case. Each verdict carries its evidence as numbers and the next knob to try.

Two utilizations, kept apart (DESIGN.md): **model busy** is the share of wall time inside
the model call, host work included (on CUDA: from the first kernel launch to the
synchronize); **device busy** is the share of wall time the device computes (NVML's
``util.gpu`` on a GPU, kernel time under the profiler, or the simulated device's timeline).
A launch-bound eager model at batch 1 is busy for the host and idle for the device, so
``saturated`` reads device busy whenever it is known, and launch-bound is checked first.

Thresholds (named so they can be read and argued with):
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SATURATED_BUSY = 0.70  # device busy (model busy when unknown) >= 70%: healthy; the investigation stopped near 80%
IDLE_BUSY = 0.30  # model busy under 30%: the model is mostly idle
STARVED_WAIT_SHARE = 0.30  # the model waited for input >= 30% of the window
PEGGED_THREAD_CPU = 80.0  # one thread >= 80% of a core: a single-threaded choke point
WORKING_CPU = 50.0  # a thread above this is doing real work; none above it with the disk idle: nothing works
DISK_BUSY_MB_S = 50.0  # read+write rate above which reading counts as busy
FRAGMENT_SPAN_MS = 5.0  # median busy burst shorter than this is "short"
SMALL_BATCH = 2.0  # mean batch size at or under this is "batch of one"
LAUNCH_BOUND_SHARE = 0.30  # launch overhead >= 30% of busy time: launch-bound

KINDS = ("starved", "fragmented", "blocked", "saturated")


@dataclass
class Signals:
    """What one window measured; NaN where a signal is missing (e.g. no GPU).

    ``model_busy`` (model busy): share of wall time inside the model call, host launch included
    (what the engine's spans cover; device-agnostic). ``device_busy`` (device busy): share of
    wall time with a kernel running (the profiler's kernel sum, or the simulated device's timeline); NaN
    when unknown, e.g. on a CPU, where the two are the same thing. ``gpu_util``: NVML's
    ``util.gpu`` in percent (share of the sample period in which any kernel ran, any process).
    ``launch_share``: the most graph capture could save, as a share of wall time per batch.
    """

    model_busy: float
    wait_for_input_share: float
    device_busy: float = math.nan
    wait_for_model_share: float = math.nan
    median_span_ms: float = math.nan
    mean_batch: float = math.nan
    max_thread_cpu: float = math.nan
    max_thread_name: str = ""
    max_thread_wait: float = math.nan  # that thread's run-queue wait: runnable, but no CPU free (% of a core)
    process_cpu: float = math.nan
    disk_mb_s: float = math.nan
    launch_share: float = math.nan
    gpu_util: float = math.nan
    gpu_power_frac: float = math.nan
    batch_size_knob: int | None = None
    dtype_knob: str | None = None
    padding_knob: str | None = None


@dataclass
class Diagnosis:
    kind: str
    evidence: dict[str, Any]
    next_step: str
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _known(x: float) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _round(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v)


GRAPH_STEP = ("graph='cuda_graph' on a GPU (default-mode graph='compile' still launches every kernel from "
              "the host; only torch.compile(mode='reduce-overhead') removes the launches; on a CPU graph='compile' "
              "fuses operators)")


def diagnose(s: Signals) -> Diagnosis:
    """The verdict for one window. Rules, in order:

    1. ``fragmented`` if launch-bound (launch overhead >= LAUNCH_BOUND_SHARE of wall time) and the
       model is not waiting for input: the host's launches, not the device, fill the model call.
    2. ``saturated``: device busy >= SATURATED_BUSY (model busy when device busy is unknown).
    3. the model waited for input >= STARVED_WAIT_SHARE of the window: ``starved`` if the input
       side works (a thread >= WORKING_CPU, one >= PEGGED_THREAD_CPU being a choke point, or the disk
       busy), else ``blocked`` (nothing works: locks, queues, network).
    4. ``fragmented``: short busy bursts with a batch of one, or model busy >= SATURATED_BUSY while
       the device is not (the host side of the model call holds the device back).
    5. ``blocked`` if the model is idle (< IDLE_BUSY) and no thread works (< WORKING_CPU);
       otherwise ``fragmented`` for small batches, ``blocked`` for large ones.
    """
    evidence = {k: _round(v) for k, v in asdict(s).items() if _known(v) and not k.endswith("_knob")}
    reasons: list[str] = []
    disk_busy = _known(s.disk_mb_s) and s.disk_mb_s >= DISK_BUSY_MB_S
    # a thread's demand is the CPU it used plus the time it was runnable but waited for a CPU: on an
    # oversubscribed host a thread that wants to work gets less than it asks for, and is still working
    demand = (s.max_thread_cpu + (s.max_thread_wait if _known(s.max_thread_wait) else 0.0)
              if _known(s.max_thread_cpu) else math.nan)
    pegged = _known(demand) and demand >= PEGGED_THREAD_CPU
    working = _known(demand) and demand >= WORKING_CPU
    short = _known(s.median_span_ms) and s.median_span_ms < FRAGMENT_SPAN_MS
    small = _known(s.mean_batch) and s.mean_batch <= SMALL_BATCH
    launch_bound = _known(s.launch_share) and s.launch_share >= LAUNCH_BOUND_SHARE
    waiting = _known(s.wait_for_input_share) and s.wait_for_input_share >= STARVED_WAIT_SHARE
    device_known = _known(s.device_busy)
    busy, busy_name = (s.device_busy, "device busy") if device_known else (s.model_busy, "model busy")
    host_bound = device_known and s.model_busy >= SATURATED_BUSY and s.device_busy < SATURATED_BUSY

    def fragmented(extra: list[str]) -> Diagnosis:
        if short:
            reasons.append(f"median busy burst {s.median_span_ms:.1f} ms (< {FRAGMENT_SPAN_MS} ms)")
        if small:
            reasons.append(f"mean batch {s.mean_batch:.1f} (<= {SMALL_BATCH:.0f})")
        if launch_bound:
            reasons.append(f"launch overhead {s.launch_share:.0%} of wall time (>= {LAUNCH_BOUND_SHARE:.0%})")
        reasons.extend(extra)
        return Diagnosis("fragmented", evidence, "Give the model bigger pieces: raise batch_size (or max_wait_ms "
                         f"online), then fixed shapes (padding='bucket') and {GRAPH_STEP}.", reasons)

    def host_side() -> list[str]:
        return [f"model busy {s.model_busy:.0%} but device busy {s.device_busy:.0%}: the host side of the model "
                "call (launches, Python) holds the device back"] if host_bound else []

    if launch_bound and not waiting:
        return fragmented(host_side())

    if busy >= SATURATED_BUSY:
        reasons.append(f"{busy_name} {busy:.0%} >= {SATURATED_BUSY:.0%}")
        steps = []
        if s.batch_size_knob is not None and s.batch_size_knob < 8:
            steps.append("raise batch_size (run the batch sweep for the knee)")
        if s.dtype_knob == "fp32":
            steps.append("dtype='bf16' (or 'fp16' on a GPU)")
        if s.padding_knob in (None, "dynamic", "fixed"):
            steps.append("padding='bucket' to stop paying for padded tokens")
        advice = ("for more per-sample efficiency: " + "; ".join(steps) + ". Otherwise add" if steps
                  else "the cheap knobs are set; add")
        return Diagnosis("saturated", evidence, f"The model is the bottleneck (healthy); {advice} replicas "
                         "or a faster device.", reasons)

    if waiting:
        reasons.append(f"model waited for input {s.wait_for_input_share:.0%} of the window (>= {STARVED_WAIT_SHARE:.0%})")
        if working or disk_busy:
            if working:
                what = "a single-threaded choke point" if pegged else "working"
                waited = (f" plus {s.max_thread_wait:.0f}% waiting for a free CPU (the host is oversubscribed)"
                          if _known(s.max_thread_wait) and s.max_thread_wait >= 5 else "")
                reasons.append(f"thread '{s.max_thread_name}' at {s.max_thread_cpu:.0f}% of a core{waited} ({what})")
            if disk_busy:
                reasons.append(f"disk at {s.disk_mb_s:.0f} MB/s (>= {DISK_BUSY_MB_S:.0f})")
            return Diagnosis("starved", evidence, "Feed the model faster: raise num_workers (with prefetch_factor=4), "
                             "tokenizer='fast' (batched, vectorized), pin_memory=True on CUDA.", reasons)
        reasons.append("yet no thread is busy and the disk is idle")
        return Diagnosis("blocked", evidence, "Nothing is working while the model waits: look for locks, a "
                         "serialized queue or network waits; raise concurrency or max_queue.", reasons)

    if (short and small) or host_bound:
        return fragmented(host_side())

    if s.model_busy < IDLE_BUSY and not working and not disk_busy:
        reasons.append(f"model busy {s.model_busy:.0%} (< {IDLE_BUSY:.0%}) and no thread using or waiting for "
                       f"{WORKING_CPU:.0f}% of a core")
        return Diagnosis("blocked", evidence, "Everything is idle: look for locks, a serialized queue or network "
                         "waits; raise concurrency.", reasons)
    reasons.append(f"model busy {s.model_busy:.0%} with neither input waits nor launch-bound bursts dominating")
    if small:
        return Diagnosis("fragmented", evidence, "Raise batch_size (or max_wait_ms online) so each call does more work.",
                         reasons)
    return Diagnosis("blocked", evidence, "Time goes outside the model and its input: check postprocess, "
                     "back-pressure (wait_for_model) and the client.", reasons)
