"""Host cores needed: how many CPU cores (in how many processes) would keep the device at a target busy share.

From one measured run (a :class:`tuning.experiments.trial.Trial` with its recorder profile, or anything with
``qps``, ``device_busy`` and ``profile.top_threads()``):

- **host CPU per request**, per thread: the thread's mean CPU (share of one core) / QPS, in core-seconds;
- **device capacity** at this configuration: QPS / device_busy, the requests per second at which the device
  would be 100% busy. It is taken from the run itself (device busy time per request = device_busy / QPS) rather
  than from :func:`tuning.sim.costmodel.predict` at some batch shape, because the run's batches (their sizes
  and padded lengths) are what the device actually got; a run at another batch mix has another capacity;
- **cores needed**: rate R = target x capacity; cores = R x total host CPU per request (on many cores: see the
  GIL's cross-core cost below).

The GIL: the Python threads of one process share one interpreter lock, so the part of their CPU spent holding
it cannot exceed about one core per process (:data:`GIL_CORE`, 0.9: the lock's hand-offs cost some). On two or
more cores the same work costs more of it (:data:`GIL_CROSS_CORE`, 1.10: hand-offs across cores), so a run on
one core predicts another core count with its GIL-bound CPU per request scaled by 1.10, and back. The
answer assumes ``processes = ceil(R x GIL-bound CPU per request / GIL_CORE)`` server processes (at least 1).
Which threads count as GIL-bound (:func:`gil_bound`): every Python thread of the server (front and its pipe,
batcher, completer, main thread, preprocessing, the model executor). The Rust fast tokenizer and torch's ops do
release the GIL inside a call, but per request the Python around each call (one short text per ``encode``,
eager dispatch op by op, the stand-in's per-launch torch op) holds it most of the time, and a thread counts
whole. ``bench/host_cores.py`` checks the prediction against runs on one core and on two (its results, with the
machine each ran on, in ``bench/results/host_cores*.json``): the cross-core factor moves from run to run, and
the lock's hand-offs keep one process's Python threads below a full core, so the process count is a lower bound.
Not GIL-bound: native threads (torch's intra-op pool, named ``... (native)``) and loader worker processes (each its
own interpreter); ``pure_python=False`` treats the fast tokenizer and the executor as releasing it (the
optimistic bound). Samplers and the load generator's process are not the service and are left out; CPU no
sampled thread held (``unattributed``) is counted, as not GIL-bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from tuning.base.format import fixed, pct, rounded

GIL_CORE = 0.9  # the most CPU one process's GIL-holding threads get (switch interval and hand-off overhead)
# GIL-bound CPU per request on 2+ cores over 1 core: the lock's hand-offs across cores (cache lines moving, a
# wake-up on the other core) cost CPU a single core's hand-offs do not. The median of the calibration run's pairs
# of one core against two (bench/host_cores.py, bench/results/host_cores.json; later runs held out). The factor
# grows the shorter the work between hand-offs, so it belongs to this server's granularity, and a what-if reads
# the process count it gives as a lower bound.
GIL_CROSS_CORE = 1.10
DEFAULT_TARGET_BUSY = 0.70  # the what-if's "fed" share (investigate.FED_DEVICE_BUSY)

# not the service: the recorder's own threads, a load generator's threads (another process's: by pid)
NOT_SERVICE = ("host-sampler", "gpu-sampler", "steal-watch", "load-client", "http-target", "parent-watch")


@dataclass
class ThreadCost:
    """One thread's host CPU per request: ``cpu_share`` (cores, 1.0 = one core busy) / QPS."""

    name: str
    cpu_share: float
    cpu_s_per_request: float
    gil_bound: bool
    why: str

    @property
    def one_thread(self) -> bool:
        """A single thread (runs on one core at a time), not the summed CPU of many (``unattributed``)."""
        return not _aggregate(self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cpu_share": _round4(self.cpu_share),
                "cpu_ms_per_request": _round4(1e3 * self.cpu_s_per_request), "gil_bound": self.gil_bound, "why": self.why}


@dataclass
class HostCores:
    """Cores (and processes) that would keep the device at ``target_busy``, from one measured run.

    Figures: ``qps`` and ``device_busy`` as measured (on the simulated device ``device_busy`` is predicted by the
    cost model and the host side measured); ``capacity`` = qps / device_busy; ``rate`` = target x capacity;
    ``cores`` = rate x the CPU per request on many cores (``cpu_s_per_request``, its GIL-bound part scaled by
    ``gil_cross_core`` when the run had one core); ``processes`` from the GIL-bound part."""

    device: str
    simulated: bool
    host_cores: int
    qps: float
    device_busy: float
    target_busy: float
    threads: list[ThreadCost] = field(default_factory=list)
    gil_cross_core: float = GIL_CROSS_CORE

    @property
    def cpu_s_per_request(self) -> float:
        return sum(t.cpu_s_per_request for t in self.threads)

    @property
    def gil_s_per_request(self) -> float:
        return sum(t.cpu_s_per_request for t in self.threads if t.gil_bound)

    def cross_core_scale(self, cores: float) -> float:
        """GIL-bound CPU per request on ``cores`` cores over this run's (:data:`GIL_CROSS_CORE` between 1 core
        and more; 1 where both are one side)."""
        def level(n: float) -> float:
            return self.gil_cross_core if n > 1 else 1.0
        return level(cores) / level(self.host_cores)

    def _on(self, cores: float) -> tuple[float, float, list[tuple[float, bool]]]:
        """(CPU, GIL-bound CPU, [(each thread's CPU, one thread)]) per request on ``cores`` cores."""
        scale = self.cross_core_scale(cores)
        per = [(t.cpu_s_per_request * (scale if t.gil_bound else 1.0), t.one_thread) for t in self.threads]
        return sum(c for c, _ in per), self.gil_s_per_request * scale, per

    @property
    def capacity(self) -> float:
        """Requests per second with the device 100% busy (device busy time per request = device_busy / qps)."""
        if not (self.device_busy > 0 and self.qps > 0):
            return math.nan
        return self.qps / self.device_busy

    @property
    def rate(self) -> float:
        return self.target_busy * self.capacity

    @property
    def cores(self) -> float:
        """Cores at :attr:`rate` (many cores: a one-core run's GIL-bound CPU scaled by :data:`GIL_CROSS_CORE`)."""
        return self.rate * self._on(math.inf)[0]

    @property
    def processes(self) -> int:
        need = self.rate * self._on(math.inf)[1] / GIL_CORE
        return max(1, math.ceil(need)) if math.isfinite(need) else 1

    def rate_on(self, cores: float, processes: int = 1, other_cpu_s_per_request: float = 0.0,
                other_cores: float = 0.0) -> float:
        """Requests per second ``cores`` cores in ``processes`` processes would serve at this configuration: the
        least of the cores' rate, the GIL's rate, each thread's (one thread runs on one core at a time, so a
        thread's rate is at most 1 / its CPU per request, times the processes; not ``unattributed``, which sums
        many short-lived threads) and the device's capacity; GIL-bound CPU scaled by :meth:`cross_core_scale`
        between one core and more. Other work on the same cores (a load generator
        pinned with the service): ``other_cpu_s_per_request`` of CPU per request, and ``other_cores`` cores it
        keeps busy whatever the rate (a client that polls)."""
        cpu, gil, per = self._on(cores)
        total = cpu + other_cpu_s_per_request
        free = max(cores - other_cores, 0.0)
        limits = [free / total if total > 0 else math.inf, processes * GIL_CORE / gil if gil > 0 else math.inf]
        limits += [processes / c for c, one in per if c > 0 and one]
        if math.isfinite(self.capacity):
            limits.append(self.capacity)
        return min(limits)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HostCores":
        """Back from :meth:`to_dict` (a results file): the figures its predictions need."""
        threads = [ThreadCost(t["name"], float(t["cpu_share"]), float(t["cpu_ms_per_request"]) / 1e3,
                              bool(t["gil_bound"]), t.get("why", "")) for t in d.get("threads", [])]
        return cls(d["device"], bool(d["simulated"]), int(d["host_cores"]), float(d["qps"]),
                   float(d["device_busy"]) if d.get("device_busy") is not None else math.nan,
                   float(d["target_busy"]), threads,
                   float(d.get("gil_cross_core", GIL_CROSS_CORE)))  # the factor the file was written with, if any

    def say(self) -> str:
        """One sentence: what this host's cores keep the device busy at, and the cores that would reach the target."""
        if not math.isfinite(self.cores):
            return (f"cores needed for {self.device}: not known (QPS {fixed(self.qps)}, device busy {pct(self.device_busy)}, "
                    f"{len(self.threads)} service threads measured)")
        procs = f"in {self.processes} process{'es' if self.processes != 1 else ''}"
        cpu, gil, _ = self._on(math.inf)
        scaled = (f" on many cores: the GIL-bound part x{self.gil_cross_core:.2f} of this single-core run's"
                  if self.cross_core_scale(math.inf) != 1 else "")
        return (f"this host's {self.host_cores} cores keep the {self.device} {pct(self.device_busy)} busy; about "
                f"{self.cores:.1f} cores ({procs}) would keep it {self.target_busy:.0%} busy "
                f"({self.rate:.0f} req/s at {1e3 * cpu:.2f} ms host CPU per request, "
                f"{1e3 * gil:.2f} ms of it holding the GIL{scaled})")

    def to_dict(self) -> dict[str, Any]:
        many_cpu, many_gil, _ = self._on(math.inf)
        return {"device": self.device, "simulated": self.simulated,
                "measured": "host CPU per thread and QPS" + ("; device busy predicted (simulated)" if self.simulated
                                                             else "; device busy"),
                "host_cores": self.host_cores, "qps": _round4(self.qps), "device_busy": _round4(self.device_busy),
                "target_busy": self.target_busy, "capacity_rps": _round4(self.capacity), "rate_rps": _round4(self.rate),
                "cpu_ms_per_request": _round4(1e3 * self.cpu_s_per_request),
                "gil_ms_per_request": _round4(1e3 * self.gil_s_per_request), "gil_core": GIL_CORE,
                "gil_cross_core": self.gil_cross_core,
                "cpu_ms_per_request_many_cores": _round4(1e3 * many_cpu),
                "gil_ms_per_request_many_cores": _round4(1e3 * many_gil),
                "cores": _round4(self.cores), "processes": self.processes, "threads": [t.to_dict() for t in self.threads],
                "sentence": self.say()}


def gil_bound(name: str, tokenizer: str | None = None, pure_python: bool = True) -> tuple[bool, str]:
    """Whether a thread's CPU holds the GIL, and why (by the names the server and loader give their threads).

    ``pure_python=False``: the fast tokenizer's threads and the model executor count as releasing it (the
    optimistic bound); the default counts the Python around their calls, which holds it."""
    n = name.lower()
    if n.startswith("loader-worker") or n.startswith("pt_data_worker"):
        return False, "a loader worker is a process of its own (its own GIL)"
    if "(native)" in n:
        return False, "a native thread (torch's intra-op pool) runs no Python"
    if _aggregate(n):
        return False, "CPU of threads too short-lived to sample (which lock they held is not known)"
    if n.startswith("model-executor"):
        if not pure_python:
            return False, "torch's ops release the GIL (optimistic: eager dispatch runs Python between them)"
        return True, "eager dispatch runs Python op by op; torch releases the GIL only inside each op"
    if n.startswith("preprocess"):
        if tokenizer != "fast":
            return True, "pure-Python tokenization holds the GIL"
        if not pure_python:
            return False, "the Rust fast tokenizer releases the GIL while it encodes"
        return True, "the fast tokenizer releases the GIL inside encode, but one short text per call is mostly Python"
    return True, "pure-Python code (the front and its pipe, batcher, completer, main thread) holds the GIL"


def _service_rows(rows: Iterable[dict[str, Any]], service_pid: int | None) -> list[dict[str, Any]]:
    """The service's threads: not a sampler, not another process (the load generator) unless a loader worker."""
    def other_process(r: dict[str, Any]) -> bool:
        worker = str(r["name"]).startswith(("loader-worker", "pt_data_worker"))
        return service_pid is not None and r.get("pid") is not None and r["pid"] != service_pid and not worker
    return [r for r in rows if r.get("name") is not None and not str(r["name"]).startswith(NOT_SERVICE)
            and r["cpu_mean"] > 0 and not other_process(r)]


def host_cores(trial: Any, target_busy: float = DEFAULT_TARGET_BUSY, host_cores: int | None = None,
               device: str | None = None, tokenizer: str | None = None, service_pid: int | None = None,
               pure_python: bool = True) -> HostCores:
    """:class:`HostCores` of one recorded run (``trial.profile`` needs its host thread table).

    ``host_cores``: the cores the run had (default: this process's usable cores); ``device``: the device's label
    (default: the run's ``device`` object's name); ``tokenizer``: the run's knob (default: from the workload's
    knobs), which decides whether preprocessing threads hold the GIL; ``service_pid``: the server's process
    (default: this one, where the measurement ran the server in-process); another process's threads (the load
    generator, a child of the recorder's process) are left out, loader workers kept; ``pure_python``: see
    :func:`gil_bound`."""
    if not 0 < target_busy <= 1:
        raise ValueError(f"target_busy={target_busy!r} must be in (0, 1]")
    profile = getattr(trial, "profile", None)
    if profile is None:
        raise ValueError("host_cores needs a recorded run (measure with record=True): trial.profile is None")
    work = getattr(profile, "workload", None)
    knobs = getattr(work, "knobs", None)
    tokenizer = tokenizer or getattr(knobs, "tokenizer", None)
    dev = (work.summary().get("device") if work is not None and hasattr(work, "summary") else None) or {}
    if host_cores is None:
        from tuning.base.machine import usable_cores

        host_cores = usable_cores()
    if service_pid is None:
        import os

        service_pid = os.getpid()
    qps = float(trial.qps)
    threads = []
    for r in _service_rows(profile.top_threads(64), service_pid):
        share = float(r["cpu_mean"]) / 100
        bound, why = gil_bound(str(r["name"]), tokenizer, pure_python)
        threads.append(ThreadCost(str(r["name"]), share, share / qps if qps > 0 else math.nan, bound, why))
    return HostCores(device or dev.get("name") or "device", bool(dev.get("kind") == "simulated"), int(host_cores),
                     qps, float(trial.device_busy), float(target_busy), threads)


def _aggregate(name: str) -> bool:
    """A row that sums the CPU of many threads (too short-lived to sample, or beyond the table's top)."""
    n = name.lower()
    return n == "unattributed" or n.startswith("other threads")


def _round4(x: float) -> float | None:
    """A figure of the JSON: 4 places, None where unknown."""
    return rounded(x, 4)
