"""The stand-in for the model call on the simulated accelerator.

Everything on the host runs for real; only the forward is replaced. Each call

1. runs the predicted host time as real CPU work on the calling thread (:class:`~tuning.sim.dispatch.HostPart`):
   this host's dispatch per launch and the profile's launch constant, with the GIL released in as many
   segments as a real eager forward hands it to a busy Python thread (one per
   :data:`~tuning.sim.dispatch.SEGMENT_S` of host time, each after a real tiny torch op), held otherwise; it
   competes with preprocessing threads for cores, lets other Python threads run about as often as a real eager
   forward does, and stretches when the scheduler preempts it (under ``cuda_graph``: one replay and the
   runner's copies); on a synchronous (CPU) profile the whole call is host work: it runs a fixed amount of real
   matrix work on torch's intra-op thread pool (:class:`IntraOpBurner`), so it takes the cores, the
   GIL pattern (released inside each op) and the slowdown under contention a CPU model's forward has,
2. sleeps for the rest of the predicted call without holding the GIL (the host is free
   while the device computes, as with a real GPU),
3. records the device's busy time (the kernel sum: device busy) on a binned timeline, from which NVML's util.gpu
   is computed apart, the way NVML samples (:mod:`tuning.sim.timeline`), and
4. returns deterministic, L2-normalised embeddings of the right shape, computed cheaply, so
   every downstream stage, count and outcome runs unchanged. They are marked simulated and
   are never compared with real embeddings.

A batch whose predicted memory exceeds the device's raises ``torch.OutOfMemoryError`` the
way the real path reports it.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Sequence

import numpy as np
import torch

from tuning.base.refusals import batch_too_large, uncaptured_shape
from tuning.sim.costmodel import CallCost, ModelProfile, copy_seconds, predict
from tuning.sim.dispatch import HostPart, host_dispatch_s
from tuning.sim.profiles import DeviceProfile
from tuning.sim.timeline import DeviceTimeline

MEMORY_USABLE = 0.92  # share of device memory a process can allocate (context, fragmentation)


SPIN_TAIL_S = 50e-6  # the most a device wait spins (holding the GIL) to land on time after its sleep


def spin_cpu(seconds: float, wall_cap: float = 0.25) -> None:
    """Host work holding the GIL: burn ``seconds`` of this thread's CPU time in a Python loop. Preempted by the
    scheduler, it takes longer in wall time (capped at ``wall_cap`` extra). The reference that holds the GIL
    throughout; the stand-in's host part is :func:`host_part`, which releases it as torch's ops do, so that a busy
    Python thread beside it gets the GIL about as often as beside a real forward."""
    if seconds <= 0:
        return
    cpu_end = time.thread_time() + seconds
    wall_end = time.perf_counter() + seconds + wall_cap
    while time.thread_time() < cpu_end and time.perf_counter() < wall_end:
        pass


class IntraOpBurner:
    """CPU work shaped like a CPU model's forward: ``torch.mm`` calls on the intra-op pool.

    A real forward on a CPU runs its kernels on every intra-op thread, releases the GIL inside each op
    (and takes it back between ops) and takes longer when preprocessing threads want the same cores.
    Burning a *fixed amount of work* reproduces all three: about ``ops`` matrix products per call (the
    model's kernel count, so the GIL changes hands as often as in the real forward), each sized so the
    call's work takes the predicted seconds on an idle machine. A unit's idle time is measured once per
    size and intra-op thread count (the fastest of a few tries). Not one Python thread spinning for a wall-clock
    time: that takes one core where the real forward takes every intra-op thread's, holds the GIL throughout, and
    does not stretch under contention."""

    DIM = 384
    ROWS = tuple(16 << k for k in range(9))  # 16 ... 4096 rows per product
    # (rows, intra-op threads) -> idle seconds, shared by every burner of the process: measured once, so a
    # later burner (a new pipeline, a server's warm-up next to busy workers) does not re-measure under load
    _UNIT_S: dict[tuple[int, int], float] = {}

    def __init__(self, ops: int = 1):
        self.ops = max(int(ops), 1)
        self._b = torch.ones(self.DIM, self.DIM) / self.DIM  # no draw from torch's global generator
        self._unit_s = IntraOpBurner._UNIT_S
        self._operands: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rows -> (input, output), reused

    def _pair(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rows not in self._operands:  # allocated once: a call's time is the products, not allocation
            self._operands[rows] = (torch.ones(rows, self.DIM), torch.empty(rows, self.DIM))
        return self._operands[rows]

    def unit_s(self, rows: int) -> float:
        """Seconds one product of ``rows`` rows takes on an idle machine at the current thread count
        (the fastest of 7 tries of 3, after a warm-up; the machine's load at that moment only slows tries)."""
        key = (rows, torch.get_num_threads())
        if key not in self._unit_s:
            a, out = self._pair(rows)
            with torch.inference_mode():
                for _ in range(3):  # warm: the thread pool and the kernel's first-call set-up
                    torch.mm(a, self._b, out=out)
                tries = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    for _ in range(3):
                        torch.mm(a, self._b, out=out)
                    tries.append((time.perf_counter() - t0) / 3)
            self._unit_s[key] = min(tries)
        return self._unit_s[key]

    def measure_all(self) -> dict[int, float]:
        """Measure every unit size now (e.g. on a quiet machine before a benchmark); returns rows -> seconds."""
        return {rows: self.unit_s(rows) for rows in self.ROWS}

    def plan(self, seconds: float) -> tuple[int, int]:
        """(rows per product, products) for ``seconds`` of idle-machine work in about ``ops`` products."""
        if seconds <= 0:
            return self.ROWS[0], 0
        per_op = seconds / self.ops
        smallest = self.unit_s(self.ROWS[0])
        # time grows about linearly with rows: start from that estimate, then use the measured unit
        rows = min(self.ROWS, key=lambda r: abs(math.log(smallest * r / self.ROWS[0] / per_op)))
        return rows, max(1, int(round(seconds / self.unit_s(rows))))

    def burn(self, seconds: float) -> int:
        """Run the work an idle machine does in ``seconds``; returns the products run."""
        rows, units = self.plan(seconds)
        if units:
            a, out = self._pair(rows)
            with torch.inference_mode():
                for _ in range(units):
                    torch.mm(a, self._b, out=out)
        return units


def host_part(cost: CallCost) -> HostPart:
    """The stand-in's host work for a call: this host's measured dispatch per launch (fewer launches' worth when
    ``host_s`` is smaller than that, e.g. a test's zero-cost host) and the rest of ``host_s`` as the driver's
    part, GIL-free in one segment per :data:`~tuning.sim.dispatch.SEGMENT_S` of host time."""
    if cost.host_s <= 0:
        return HostPart(0, 0.0)
    dispatch = host_dispatch_s()
    ops = min(cost.launches, int(cost.host_s / dispatch)) if dispatch > 0 else 0
    return HostPart(ops, cost.host_s - ops * dispatch)


class SimulatedDevice:
    """A device profile, a model profile, a timeline of calls and the clock they share.

    ``host_dispatch_s``: the host's eager cost per launched kernel the predictions assume, beside the driver's
    ``launch_s`` (None: this host's tiny-op dispatch, measured once per process; the engine passes the model's
    own, :func:`tuning.runtime.engine.sim_host_dispatch`; a fixed value makes them deterministic, and the host
    part still runs real tiny ops for as much of it as they cover); ``dispatch_source``: where it comes from."""

    def __init__(self, device: DeviceProfile, model: ModelProfile, clock: Callable[[], float] = time.perf_counter,
                 host_dispatch_s: float | None = None, dispatch_source: str | None = None):
        self.profile = device
        self.dispatch_source = dispatch_source or ("given" if host_dispatch_s is not None else
                                                  "tiny op on this host (tuning.sim.dispatch.host_dispatch_s)")
        self.model = model
        self.clock = clock
        self.host_dispatch_s = host_dispatch_s
        self.timeline = DeviceTimeline()
        self._costs: dict[tuple, CallCost] = {}
        self._plans: dict[tuple[int, float], HostPart] = {}
        self._plans_lock = threading.Lock()
        self._overshoot = 60e-6  # learnt: how late time.sleep wakes up here
        self.burner = IntraOpBurner(ops=model.kernels) if device.synchronous else None
        rng = np.random.default_rng(0)
        table = rng.standard_normal((1024, model.output_dim)).astype(np.float32)
        self._table = table / np.linalg.norm(table, axis=1, keepdims=True)

    def use_profile(self, device: DeviceProfile) -> None:
        """Price the calls that follow with ``device`` (a recalibrated profile of the same card): the cached
        costs and host-part plans of the old one are dropped; the timeline and the burner are kept."""
        with self._plans_lock:
            self.profile = device
            self._costs = {}
            self._plans = {}

    def info(self) -> dict:
        """The profile's ``device`` block, with the host cost per launch the predictions charge and its source."""
        if not self.profile.host_dispatch_separate:  # whole host costs (a format-1 profile): no dispatch added
            return {**self.profile.info(), "host_dispatch_us": 0.0,
                    "host_dispatch_source": "none added: the profile's launch_s is a whole host cost"}
        dispatch = self.host_dispatch_s if self.host_dispatch_s is not None else host_dispatch_s()
        return {**self.profile.info(), "host_dispatch_us": round(dispatch * 1e6, 3),
                "host_dispatch_source": self.dispatch_source}

    def label(self) -> str:
        return self.profile.label()

    def cost(self, batch: int, length: int, dtype: str, graph: str, rows: int | None = None) -> CallCost:
        """The predicted cost of one call (cached); ``rows``: the rows passed under ``cuda_graph`` when fewer than
        the captured ``batch`` (the runner pads the rest)."""
        key = (batch, length, dtype, graph) if rows is None or rows >= batch else (batch, length, dtype, graph, rows)
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = predict(self.model, self.profile, batch, length, dtype, graph, rows=rows,
                                              host_dispatch_s=self.host_dispatch_s)
        return cost

    def sleep(self, seconds: float) -> None:
        """Device time: ``seconds`` of wall time with the GIL released, except a short spin at the end.

        ``time.sleep`` wakes late (tens of microseconds idle, milliseconds on a loaded host), so the sleep
        is shortened by the lateness learnt so far (at most half the wait, so it always sleeps and keeps
        learning) and the rest is spun, at most :data:`SPIN_TAIL_S` of it."""
        if seconds <= 0:
            return
        deadline = time.perf_counter() + seconds
        ahead = seconds - min(self._overshoot, 0.5 * seconds)
        t = time.perf_counter()
        time.sleep(ahead)
        late = time.perf_counter() - t - ahead
        self._overshoot = 0.8 * self._overshoot + 0.2 * min(max(late, 0.0), 2e-3)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            if left > SPIN_TAIL_S:
                time.sleep(left - SPIN_TAIL_S / 2)
            else:
                while time.perf_counter() < deadline:
                    pass
                return

    def host_work(self, cost: CallCost) -> None:
        """A call's host part (:func:`host_part`): real CPU work on this thread, the GIL released about as often
        as a real eager forward hands it over. Plans are cached per host cost."""
        # keyed by what the host part costs, not the call: in eager mode every shape has the same launches, so
        # one plan (tuned once) serves them all and a new shape mid-run does not tune again
        key = (cost.launches, round(cost.host_s, 12))
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = host_part(cost)
                plan.run()  # the first run tunes it, under the lock: two threads never time each other
                return
        plan.run()

    def wait(self, seconds: float, spin: bool) -> None:
        """``seconds`` of host work (``spin``: this thread's CPU time) or of device time (a sleep)."""
        spin_cpu(seconds) if spin else self.sleep(seconds)

    def copy_in(self, nbytes: float, pinned: bool) -> float:
        """A host-to-device copy: sleeps for its predicted time (DMA, not host work); returns it."""
        seconds = copy_seconds(self.profile, nbytes, pinned)
        self.sleep(seconds)
        return seconds

    def copy_out(self, nbytes: float) -> float:
        """The result's device-to-host copy (into pageable memory, as ``.cpu()`` does); returns its time."""
        seconds = copy_seconds(self.profile, nbytes, pinned=False)
        self.sleep(seconds)
        return seconds

    def run(self, batch: int, length: int, dtype: str, graph: str, rows: int | None = None) -> CallCost:
        """Take the time one forward takes on the device and record it on the timeline."""
        cost = self.cost(batch, length, dtype, graph, rows)
        limit = self.profile.mem_bytes * MEMORY_USABLE
        if cost.memory_bytes > limit:
            raise torch.OutOfMemoryError(
                f"simulated {self.profile.name}: batch {batch} x {length} needs {cost.memory_bytes / 2**30:.1f} GiB "
                f"of {limit / 2**30:.1f} GiB usable (predicted)")
        t0 = self.clock()
        start = time.perf_counter()
        if self.burner is not None:  # a CPU-like device: its compute is host CPU work on the intra-op pool
            self.burner.burn(cost.call_s)
        else:
            self.host_work(cost)
            self.sleep(cost.call_s - (time.perf_counter() - start))
        self.timeline.add(t0, self.clock(), cost.device_s, cost.call_s, cost.memory_bytes)
        return cost

    def embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Deterministic unit vectors, one per row, from the row's tokens (cheap; not a model)."""
        # numpy, not torch: a torch op here would wake the intra-op thread pool, real CPU work a device call lacks
        ids, mask = input_ids.numpy(), attention_mask.numpy()
        key = (ids * mask).sum(axis=1) + 7 * mask.sum(axis=1)
        return torch.from_numpy(self._table[key % len(self._table)])


def window_device_busy(device: dict, timeline: DeviceTimeline | None, t0: float, t1: float, window_s: float,
                       model_busy: float) -> float:
    """Device busy of a measured window by device kind, as :data:`tuning.profile.busy.DEVICE_BUSY_IS` defines it
    (kernel sum / wall): the simulated timeline's kernel sum; on a CPU the model call is the device's work (model
    busy); on CUDA unknown here (NaN: no profiler runs during a load window; NVML's util.gpu is another figure and
    keeps its own name)."""
    kind = device.get("kind")
    if kind == "simulated":
        if timeline is None or window_s <= 0:
            return float("nan")
        return min(timeline.totals(t0, t1).busy / window_s, 1.0)
    if kind == "cpu":
        return model_busy
    return float("nan")


class SimulatedModel:
    """A callable with the model's signature ``(input_ids, attention_mask) -> [B, D]`` that runs on a
    :class:`SimulatedDevice` in one dtype and graph mode.

    Under ``compile`` and ``cuda_graph``, a batch smaller than the captured size is padded to the
    smallest captured size that holds it (as the real graph runner does), so it costs that size.
    Under ``cuda_graph`` it keeps the real :class:`~tuning.runtime.graphs.CudaGraphRunner`'s shape book:
    a (batch, length) first seen before :meth:`seal` is captured (three warm-up forwards and the capture's
    launches, taken as time); after it, an uncaptured shape is refused with the real runner's
    ``ValueError``, and so is a batch larger than every captured size. Row counts restart at the seal.
    """

    simulated = True
    CAPTURE_WARMUP = 3  # forwards cuda_capture runs on a side stream before capturing

    def __init__(self, device: SimulatedDevice, dtype: str, graph: str, captured_batches: Sequence[int] = (),
                 compile_mode: str = "default", tf32: bool = False):
        self.device = device
        self.dtype = "tf32" if tf32 and dtype == "fp32" else dtype
        self.graph = "compile_graph" if graph == "compile" and compile_mode == "reduce-overhead" else graph
        self.captured_batches = tuple(sorted(set(captured_batches)))
        self.sealed = False
        self.late_shapes: list[tuple[int, int]] = []
        self.graphs: set[tuple[int, int]] = set()  # the (batch, length) shapes captured
        self.capture_s = 0.0  # time spent capturing (warm-up forwards and the capture's launches)
        self.rows_requested = 0
        self.rows_computed = 0

    def seal(self) -> None:
        """Warm-up is over: under ``cuda_graph`` a shape not captured by now is refused (as the real runner
        refuses it). Row counts restart here."""
        self.sealed = True
        self.rows_requested = self.rows_computed = 0

    @property
    def padded_rows_share(self) -> float:
        """Rows computed only as padding / rows requested (0: none)."""
        return (self.rows_computed - self.rows_requested) / self.rows_requested if self.rows_requested else 0.0

    def shape_cost_batch(self, batch: int) -> int:
        if self.graph == "eager" or not self.captured_batches:
            return batch
        for size in self.captured_batches:
            if size >= batch:
                return size
        if self.graph == "cuda_graph":
            raise ValueError(batch_too_large(batch, self.captured_batches))
        return batch  # larger than every compiled size: the compiled runner compiles it

    def _capture(self, batch: int, length: int) -> None:
        key = (batch, length)
        if key in self.graphs:
            return
        if self.sealed:
            self.late_shapes.append(key)
            raise ValueError(uncaptured_shape(key, self.graphs))
        t0 = time.perf_counter()
        for _ in range(self.CAPTURE_WARMUP):
            self.device.run(batch, length, self.dtype, "eager")
        self.device.host_work(self.device.cost(batch, length, self.dtype, "eager"))  # the capture records every launch
        self.capture_s += time.perf_counter() - t0
        self.graphs.add(key)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected [batch, length]")
        batch, length = input_ids.shape
        size = self.shape_cost_batch(batch)
        if self.graph == "cuda_graph":
            self._capture(size, length)
            self.device.run(size, length, self.dtype, self.graph, rows=batch)
        else:
            self.device.run(size, length, self.dtype, self.graph)
        self.rows_requested += batch
        self.rows_computed += size
        return self.device.embeddings(input_ids, attention_mask)
