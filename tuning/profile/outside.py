"""A diagnosis from outside a process: what ``nvidia-smi`` and ``top -H`` show during a load test.

Watching another process (``python -m tuning watch --pid PID``) sees its threads' CPU, its memory
and disk rates, the GPU's NVML series (and that process's own share where NVML reports it), and,
when the watch drives the load, what a client sees (QPS, latency). It does not see inside: which
stage a request spends its time in, whether the model waits for input or batches wait for the
model, batch sizes, kernel launches, except what the server's answers (stage times, batch sizes) or
its own metrics (queue wait, inference, mean batch) give. The verdict uses only what was read and
says what it could not see, and how to see it (run the service under :class:`tuning.profile.Recorder`).
Watched by URL alone (a service remote or in a container), no process is read: no thread, CPU or
disk evidence, so the rules that need it end ``inconclusive`` and say so.

Rules (the investigation's, INVESTIGATION.md steps 1-2), thresholds shared with
:mod:`tuning.profile.diagnose` plus :data:`LOW_POWER_FRAC`, :data:`HEARTBEAT_LOW_UTIL` and
:data:`HEARTBEAT_PEAK_UTIL`:

1. a GPU is seen and its utilization >= SATURATED_BUSY: ``fragmented`` if its power stays under
   LOW_POWER_FRAC of the limit (kernels keep the counter up without working the chip), else ``saturated``;
2. a GPU is seen and idles: ``starved`` when a host thread works (>= WORKING_CPU) or the disk is busy,
   or when the utilization beats like a heart (peaks >= HEARTBEAT_PEAK_UTIL between samples under
   HEARTBEAT_LOW_UTIL); else ``blocked`` (nothing works: locks, queues, network, or too little load);
   A GPU that idles while the service's own metrics say its model call is busy >= SATURATED_BUSY is
   ``fragmented``: the host side of the model call (launches, Python) holds the device back;
3. no GPU seen (the CPU is the device): ``saturated`` when the process uses >= SATURATED_BUSY of every
   core, or the service's own metrics say its model call is busy >= SATURATED_BUSY; ``contended`` when
   the machine's cores are >= CONTENDED_MACHINE_CPU busy but this process is not what fills them;
   ``fragmented`` (before ``contended``) when the service's own metrics say requests wait in its queue at
   least as long as they compute while its batches average SMALL_BATCH or fewer requests;
   ``single-threaded`` when one thread is pegged (>= PEGGED_THREAD_CPU) and the cores are not full;
   ``starved`` when the disk is busy; ``blocked`` when nothing works; else ``inconclusive``;
4. ``idle`` when no load was driven and nothing in the process works;
0. before any of these, with load driven: ``failing`` when at least FAILING_ERROR_RATE of the requests
   failed (a diagnosis of a service that answers errors reads its error path, not its performance), and
   ``client-bound`` when the load client's own loop used at least CLIENT_BOUND_CPU of a core while nothing
   in the service is saturated (the QPS measured the client); a smaller error rate is a reason beside the
   verdict.

Model busy is read from the service's ``/metrics`` when it exports tuning's
``tuning_model_busy_seconds_total``; other services do not, and that is listed as unseen.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from tuning.profile.diagnose import DISK_BUSY_MB_S, PEGGED_THREAD_CPU, SATURATED_BUSY, SMALL_BATCH, WORKING_CPU
from tuning.profile.gpu import GpuSeries
from tuning.profile.host import HostSeries

LOW_POWER_FRAC = 0.35  # power under 35% of the limit while "busy": the chip is not really working
HEARTBEAT_LOW_UTIL = 5.0  # a sample under 5% utilization is a gap...
HEARTBEAT_PEAK_UTIL = 25.0  # ...and one at 25% or more a beat (the investigation's 3% / 30% heartbeat)
HEARTBEAT_GAP_SHARE = 0.3  # at least 30% of the samples are gaps
CONTENDED_MACHINE_CPU = 0.90  # the machine's cores 90% busy: whatever runs here competes for them
FAILING_ERROR_RATE = 0.05  # 5% of the requests failed: the service's error path, not its speed, is what is seen
CLIENT_BOUND_CPU = 0.80  # the load client's loop at 80% of a core: its requests wait for the client

OUTSIDE_KINDS = ("failing", "client-bound", "saturated", "fragmented", "starved", "contended", "single-threaded",
                 "blocked", "inconclusive", "idle")

STAGES = ("read", "preprocess", "queue wait", "inference", "postprocess")  # a request's stages, as listed unseen
NO_PROCESS = "no local process: the service is remote or in a container; give --pid when it is local"

INSIDE = ("python -m tuning profile / loadtest --profile, or tuning.profile.Recorder around the service's own "
          "load test, in its process")


@dataclass
class OutsideSignals:
    """What a watch from outside measured over its window; NaN where unseen."""

    process_cpu: float = math.nan  # % of one core, the process and its children
    cpu_capacity: float = math.nan  # 100 x cores
    machine_cpu: float = math.nan  # share of all the machine's cores busy (every process), 0-1
    watcher_cpu: float = math.nan  # % of one core the watch itself used (its load generator included)
    max_thread_cpu: float = math.nan
    max_thread_name: str = ""
    busy_threads: int = 0  # threads at >= WORKING_CPU
    disk_mb_s: float = math.nan
    rss_mb_max: float = math.nan
    gpu_available: bool = False
    gpu_reason: str | None = None
    gpu_util_mean: float = math.nan  # NVML util.gpu, %
    gpu_util_max: float = math.nan
    gpu_gap_share: float = math.nan  # share of samples under HEARTBEAT_LOW_UTIL
    gpu_power_frac: float = math.nan
    proc_gpu_util_mean: float = math.nan  # the watched process's own SM share, where NVML gives it
    process_gpu_mb: float = math.nan  # GPU memory the watched process holds (NVML's compute processes)
    load_driven: bool = False
    qps: float = math.nan
    p99_ms: float = math.nan
    error_rate: float = math.nan
    first_error: str = ""  # the commonest failure's reason, when any failed
    client_cpu: float = math.nan  # share of a core the load client's loop used
    # the service's own Prometheus metrics (tuning.load.scrape), where it exports them
    metrics_exporter: str = ""  # tuning, tei, triton; "" when none was read
    metrics_reason: str = ""  # why none was read
    metrics_url_given: bool = False  # --metrics-url was given (else the default /metrics beside the URL was tried)
    metrics_lacked: tuple[str, ...] = ()
    server_mean_batch: float = math.nan
    server_queue_ms: float = math.nan  # mean time a request waited in the server's queue
    server_inference_ms: float = math.nan  # mean inference time per request
    server_gpu_util: float = math.nan  # 0-1, the server's own (Triton's nv_gpu_utilization)
    model_busy: float = math.nan  # from the service's own metrics, when it exports tuning's
    answer_mean_batch: float = math.nan  # the batch size the server's answers reported (this package's server does)
    stages_seen: tuple[str, ...] = ()  # request stages whose times the server's answers carried (STAGES' names)
    process_reason: str = ""  # why no process was sampled ("" when one was: its threads, memory and disk)


@dataclass
class OutsideDiagnosis:
    kind: str
    reasons: list[str]
    next_step: str
    evidence: dict[str, Any]
    cannot_see: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _known(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def outside_signals(host: HostSeries, gpu: GpuSeries, t0: float, t1: float, load: dict[str, Any] | None = None,
                    process_gpu_mb: float = math.nan, machine_cpu: float = math.nan,
                    watcher_cpu: float = math.nan, server_metrics: Any = None,
                    process_reason: str = "", metrics_url_given: bool = False) -> OutsideSignals:
    """The signals of the window ``[t0, t1]`` (the last host sample lands just after it closes).
    ``process_reason``: why no process was sampled (``host`` is then empty), said where its signals are missing.
    ``metrics_url_given``: ``server_metrics`` were scraped from a URL the user gave (no hint to give one)."""
    slack = 1.0 if host.samples else 0.0
    hf = host.to_frame()
    hf = hf[(hf.t >= t0) & (hf.t <= t1 + slack)]
    threads = host.threads_frame()
    threads = threads[(threads.t >= t0) & (threads.t <= t1 + slack)]
    per = (threads.groupby(["pid", "tid", "start", "name"])["cpu_percent"].sum() / max(len(hf), 1)
           if len(threads) else pd.Series(dtype=float)).sort_values(ascending=False)
    gf = gpu.to_frame()
    gf = gf[(gf.t >= t0) & (gf.t <= t1)]
    util = gf.sm_util.dropna() if len(gf) else pd.Series(dtype=float)
    power = (gf.power_w / gf.power_limit_w).dropna() if len(gf) else pd.Series(dtype=float)
    proc = gf.proc_sm_util.dropna() if len(gf) else pd.Series(dtype=float)
    s = OutsideSignals(
        process_cpu=float(hf.cpu_percent.mean()) if len(hf) else math.nan,
        cpu_capacity=100.0 * host.cpu_count, machine_cpu=machine_cpu, watcher_cpu=watcher_cpu,
        max_thread_cpu=float(per.iloc[0]) if len(per) else math.nan,
        max_thread_name=str(per.index[0][3]) if len(per) else "",
        busy_threads=int((per >= WORKING_CPU).sum()),
        disk_mb_s=float((hf.read_mb_s + hf.write_mb_s).mean()) if len(hf) else math.nan,
        rss_mb_max=float(hf.rss_mb.max()) if len(hf) else math.nan,
        gpu_available=gpu.available, gpu_reason=gpu.reason,
        gpu_util_mean=float(util.mean()) if len(util) else math.nan,
        gpu_util_max=float(util.max()) if len(util) else math.nan,
        gpu_gap_share=float((util < HEARTBEAT_LOW_UTIL).mean()) if len(util) else math.nan,
        gpu_power_frac=float(power.mean()) if len(power) else math.nan,
        proc_gpu_util_mean=float(proc.mean()) if len(proc) else math.nan,
        process_gpu_mb=process_gpu_mb, process_reason=process_reason, metrics_url_given=metrics_url_given,
    )
    if load is not None:
        s.load_driven = True
        s.qps, s.p99_ms, s.error_rate = (float(load[k]) if load.get(k) is not None else math.nan
                                         for k in ("qps", "p99_ms", "error_rate"))
        s.model_busy = float(load["model_busy"]) if load.get("model_busy") is not None else math.nan
        reasons = load.get("error_reasons") or []
        s.first_error = str(reasons[0]["reason"]) if reasons else ""
        s.client_cpu = float(load["client_cpu"]) if load.get("client_cpu") is not None else math.nan
        s.answer_mean_batch = float(load["mean_batch"]) if load.get("mean_batch") is not None else math.nan
        s.stages_seen = answered_stages(load.get("stages") or {})
    if server_metrics is not None:
        v = server_metrics.values
        s.metrics_exporter = server_metrics.exporter or ""
        s.metrics_reason = server_metrics.reason or ""
        s.metrics_lacked = tuple(server_metrics.lacked)
        s.server_mean_batch = v.get("mean_batch", math.nan)
        s.server_queue_ms = v.get("queue_ms", math.nan)
        s.server_inference_ms = v.get("inference_ms", math.nan)
        s.server_gpu_util = v.get("gpu_util", math.nan)
        if not _known(s.model_busy) and "model_busy" in v:
            s.model_busy = v["model_busy"]
    return s


def answered_stages(ledger: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """The stages (:data:`STAGES`' names) whose times the answers carried: a load summary's ``stages`` ledger
    with a p99 above zero (an answer without a stage's time counts it as 0)."""
    return tuple(name.replace("_", " ") for name, figures in ledger.items()
                 if isinstance(figures, dict) and (figures.get("p99_ms") or 0) > 0)


def _stages_read(s: OutsideSignals) -> set[str]:
    """Request stages whose times were read: from the answers, or as means from the server's metrics."""
    seen = set(s.stages_seen)
    if _known(s.server_queue_ms):
        seen.add("queue wait")
    if _known(s.server_inference_ms):
        seen.add("inference")
    return seen


def _unseen_inside(s: OutsideSignals) -> list[str]:
    """What only the inside of the service shows, less what its answers or its metrics gave."""
    stages = _stages_read(s)
    unseen = [stage for stage in STAGES if stage not in stages]
    out = [f"per-request stage times ({', '.join(unseen)}): {INSIDE}"] if unseen else []
    if not (_known(s.model_busy) and "queue wait" in stages):  # the model's idle share and the queue's wait tell both
        out.append("whether the model waited for input (starved) or ready batches waited for the model (back-pressure)")
    batch_read = _known(s.server_mean_batch) or _known(s.answer_mean_batch)
    out.append(("" if batch_read else "batch sizes per model call and ")
               + "kernel launch overhead (torch.profiler inside the process)")
    return out


def _unseen_process(s: OutsideSignals) -> list[str]:
    """The watched process's own signals, or why there is no process to read them from."""
    if s.process_reason:
        return [f"per-thread CPU, memory, disk and GPU share of the service: {s.process_reason}"]
    if not s.gpu_available:
        return []
    out = []
    if not _known(s.proc_gpu_util_mean):
        out.append("this process's own share of the GPU: NVML gave no per-process utilization for it (util.gpu "
                   "counts every process's kernels; in a container NVML may list host pids)")
    if not _known(s.process_gpu_mb):
        out.append("which GPU this process uses: NVML does not list it among the compute processes (no GPU "
                   "work, or another pid namespace); every GPU NVML sees is shown")
    return out


def cannot_see(s: OutsideSignals) -> list[str]:
    """What a watch from outside could not see in this window, and where to see it: computed from what was read
    (the answers' stage times and batch sizes, the server's metrics, a process or none)."""
    out = _unseen_inside(s) + _unseen_process(s)
    if not s.gpu_available:
        out.append(f"the accelerator: {s.gpu_reason or 'no GPU sampled'}")
    if s.load_driven and not s.metrics_exporter:
        out.append("the server's own queue, batch and inference times: " + (s.metrics_reason or "no metrics read")
                   + (" at --metrics-url" if s.metrics_url_given else " (pass --metrics-url where it exports "
                      "Prometheus metrics: Triton on port 8002, TEI and this package's server at /metrics)"))
    elif s.metrics_lacked:
        out.append(f"from the server's own metrics ({s.metrics_exporter}): {', '.join(s.metrics_lacked)} (not exported)")
    if not s.load_driven:
        out.append("QPS and latency: no load was driven (pass --url to drive it, or watch during your own load test)")
    elif not _known(s.model_busy):
        out.append("model busy %: the service exports no tuning_model_busy_seconds_total on /metrics")
    return out


def diagnose_outside(s: OutsideSignals) -> OutsideDiagnosis:
    """The verdict from outside (rules in the module's docstring), with what could not be seen."""
    evidence = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(s).items() if _known(v) and v != ""}
    reasons: list[str] = []
    pegged = _known(s.max_thread_cpu) and s.max_thread_cpu >= PEGGED_THREAD_CPU
    working = _known(s.max_thread_cpu) and s.max_thread_cpu >= WORKING_CPU
    disk = _known(s.disk_mb_s) and s.disk_mb_s >= DISK_BUSY_MB_S
    cpu_full = _known(s.process_cpu) and s.process_cpu >= SATURATED_BUSY * s.cpu_capacity
    thread = f"thread '{s.max_thread_name}' at {s.max_thread_cpu:.0f}% of a core" if working else ""
    cores = (f"process CPU {s.process_cpu:.0f}% of {s.cpu_capacity:.0f}% ({s.cpu_capacity / 100:.0f} cores)"
             if _known(s.process_cpu) else "process CPU unseen")
    model_busy = _known(s.model_busy) and s.model_busy >= SATURATED_BUSY
    contended = (_known(s.machine_cpu) and s.machine_cpu >= CONTENDED_MACHINE_CPU and not cpu_full)
    contention = (f"the machine's cores are {s.machine_cpu:.0%} busy while this process uses {cores}: other "
                  "processes compete for them" + (f" (this watch and its load generator: {s.watcher_cpu:.0f}% of a core)"
                                                  if _known(s.watcher_cpu) else "") if contended else "")

    def verdict(kind: str, step: str) -> OutsideDiagnosis:
        return OutsideDiagnosis(kind, reasons, step, evidence, cannot_see(s))

    def no_process() -> OutsideDiagnosis:
        """Without a process, no thread, CPU or disk evidence: what was read does not decide the verdict."""
        reasons.append(f"{s.process_reason} (its threads, CPU and disk were not read)")
        return verdict("inconclusive", "What was read from outside does not decide it: watch where the service runs "
                                       "(its host, or inside its container) with --pid"
                       + ("" if s.metrics_exporter or s.metrics_url_given else
                          ", or pass --metrics-url for the server's own queue, batch and inference times") + ".")

    server = [f"{name} {value}" for name, value in (
        ("mean batch", f"{s.server_mean_batch:.1f}" if _known(s.server_mean_batch) else None),
        ("queue wait", f"{s.server_queue_ms:.1f} ms" if _known(s.server_queue_ms) else None),
        ("inference", f"{s.server_inference_ms:.1f} ms" if _known(s.server_inference_ms) else None),
        ("GPU", f"{s.server_gpu_util:.0%}" if _known(s.server_gpu_util) else None)) if value is not None]
    if server:
        reasons.append(f"the server's own metrics ({s.metrics_exporter}): {', '.join(server)} per request")
    # requests wait in the queue longer than they compute while the server runs batches of about one
    queued_unbatched = (_known(s.server_mean_batch) and s.server_mean_batch <= SMALL_BATCH
                        and _known(s.server_queue_ms) and _known(s.server_inference_ms)
                        and s.server_queue_ms >= s.server_inference_ms)

    if not s.load_driven and not working and not disk and not (_known(s.gpu_util_mean) and s.gpu_util_mean >= 5):
        reasons.append(f"no load driven and nothing works ({cores})")
        return verdict("idle", "Nothing to diagnose while the service is idle: drive load with --url URL "
                               "(and --concurrency), or watch it during your own load test.")
    if s.load_driven and _known(s.error_rate) and s.error_rate >= FAILING_ERROR_RATE:
        reasons.append(f"{s.error_rate:.1%} of the requests failed" + (f" (commonest: {s.first_error})"
                                                                       if s.first_error else ""))
        return verdict("failing", "Fix the errors first: check that --api or --body is the request the service "
                                  "expects, --timeout, and the service's log; then watch again.")
    if s.load_driven and _known(s.error_rate) and s.error_rate > 0:
        reasons.append(f"{s.error_rate:.2%} of the requests failed" + (f" (commonest: {s.first_error})"
                                                                        if s.first_error else ""))
    gpu_saturated = s.gpu_available and _known(s.gpu_util_mean) and s.gpu_util_mean >= 100 * SATURATED_BUSY
    if (s.load_driven and _known(s.client_cpu) and s.client_cpu >= CLIENT_BOUND_CPU
            and not (cpu_full or model_busy or gpu_saturated)):
        reasons.append(f"the load client's loop used {s.client_cpu:.0%} of a core while nothing in the service is "
                       f"saturated ({cores}): the QPS measured the client")
        return verdict("client-bound", "Drive more load than one client loop can: `loadtest --engine locust "
                                       "--workers N`, or the load from another machine; then watch again.")
    if s.gpu_available and _known(s.gpu_util_mean):
        util = s.gpu_util_mean
        if util >= 100 * SATURATED_BUSY:
            if _known(s.gpu_power_frac) and s.gpu_power_frac < LOW_POWER_FRAC:
                reasons.append(f"GPU utilization {util:.0f}% but power only {s.gpu_power_frac:.0%} of its limit "
                               f"(< {LOW_POWER_FRAC:.0%}): kernels keep the counter up without working the chip")
                return verdict("fragmented", "Give the device bigger pieces: batch requests (max batch size, max "
                                             "wait), fixed shapes, then graph capture to cut the launches.")
            reasons.append(f"GPU utilization {util:.0f}% (>= {100 * SATURATED_BUSY:.0f}%)"
                           + (f", power {s.gpu_power_frac:.0%} of its limit" if _known(s.gpu_power_frac) else ""))
            return verdict("saturated", "The device is the bottleneck (healthy): per-sample efficiency (batch size "
                                        "at the knee, half precision), then replicas or a faster device.")
        reasons.append(f"GPU utilization {util:.0f}% (< {100 * SATURATED_BUSY:.0f}%)")
        if contended:
            reasons.append(contention)
        if model_busy:
            reasons.append(f"yet the service's model call is busy {s.model_busy:.0%} of the time (its /metrics): the "
                           "host side of the call (launches, Python) holds the device back")
            return verdict("fragmented", "Cut the host's part of each model call: bigger batches, fixed shapes, "
                                         "then graph capture (one replay instead of a launch per kernel).")
        heartbeat = (_known(s.gpu_gap_share) and s.gpu_gap_share >= HEARTBEAT_GAP_SHARE
                     and s.gpu_util_max >= HEARTBEAT_PEAK_UTIL)
        if heartbeat:
            reasons.append(f"heartbeat: peaks to {s.gpu_util_max:.0f}%, {s.gpu_gap_share:.0%} of samples under "
                           f"{HEARTBEAT_LOW_UTIL:.0f}%")
        if not (working or disk or heartbeat) and s.process_reason:
            return no_process()
        if working or disk or heartbeat:
            if working:
                reasons.append(thread + (" (a single-threaded choke point)" if pegged else " (working)"))
            if disk:
                reasons.append(f"disk at {s.disk_mb_s:.0f} MB/s (>= {DISK_BUSY_MB_S:.0f})")
            return verdict("starved", "Feed the device: more preprocessing workers and prefetch, a vectorized "
                                      "tokenizer, pinned memory" + (f"; thread '{s.max_thread_name}' is the choke point"
                                                                    if pegged else "") + ".")
        reasons.append(f"no thread at {WORKING_CPU:.0f}% or more, disk idle ({cores})")
        return verdict("blocked", "Nothing works while the device idles: look for locks, a serialized queue or "
                                  "network waits, or a client sending too little (raise --concurrency).")
    if cpu_full or model_busy:
        if model_busy:
            reasons.append(f"the service's model call is busy {s.model_busy:.0%} of the time (its /metrics)")
        reasons.append(f"{cores}" + (": the CPU is full" if cpu_full else "") + " (no accelerator seen: the CPU is "
                       "the device here)")
        if contended:
            reasons.append(contention)
        return verdict("saturated", "The CPU is the bottleneck: per-sample efficiency (batching, bucketed padding, "
                                    "bf16), fewer threads competing, or an accelerator.")
    if queued_unbatched:
        reasons.append(f"requests queue {s.server_queue_ms:.1f} ms for {s.server_inference_ms:.1f} ms of inference while "
                       f"batches average {s.server_mean_batch:.1f}: nothing batches the queue")
        return verdict("fragmented", "Batch the queue: raise the server's max batch size (and its batch wait), then "
                                     "watch again; the mean batch should rise and the queue wait fall.")
    if contended:
        reasons.append(contention)
        return verdict("contended", "Other processes hold the cores: measure on a quiet machine, pin the service "
                                    "to its own cores, or give it more; only then tune.")
    if s.process_reason:
        return no_process()
    if pegged:
        reasons.append(f"{thread} while the cores are not full ({cores}): a single-threaded choke point")
        return verdict("single-threaded", f"Spread thread '{s.max_thread_name}''s work: a worker pool, batched and "
                                          "vectorized preprocessing, or less work per request in that thread.")
    if disk:
        reasons.append(f"disk at {s.disk_mb_s:.0f} MB/s (>= {DISK_BUSY_MB_S:.0f}): reading is slow")
        return verdict("starved", "Read less or earlier: cache, prefetch, or faster storage.")
    if not working:
        reasons.append(f"no thread at {WORKING_CPU:.0f}% or more, disk idle ({cores})")
        return verdict("blocked", "Nothing works while requests wait: look for locks, a serialized queue or network "
                                  "waits, or a client sending too little (raise --concurrency).")
    reasons.append(f"{s.busy_threads} thread(s) working, none pegged, cores not full ({cores})")
    return verdict("inconclusive", f"Work is spread and nothing outside is saturated: see where requests wait, "
                                   f"inside ({INSIDE}).")
