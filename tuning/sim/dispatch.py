"""This host's share of a kernel launch: its eager dispatch cost per op, and host work that releases the GIL.

A launched kernel costs the host two things: Python and torch's dispatcher for the op (argument parsing,
dispatch key selection, the output's allocation), which depends on this host's core and load, and the CUDA
driver's part (``cudaLaunchKernel`` enqueueing the kernel), which is the device profile's ``launch_s``.
:func:`host_dispatch_s` measures the first on this host, once per process, with one tiny torch op on the
CPU (no device): the fastest of several tries of a loop of ``torch.add(a, b, out=c)`` on 1-element tensors.
It is cached module-level (as :class:`tuning.sim.standin.IntraOpBurner` caches its units), so a pipeline
built later on a busy machine does not re-measure under load.

The stand-in's host part (:class:`HostPart`) costs a call's host time on this thread's CPU and lets a busy
Python thread take the GIL about as often as a real eager forward does: one GIL-free segment per
:data:`SEGMENT_S` of host time on average (SHA-256 over a buffer, which CPython's hashlib computes without the
GIL for more than 2047 bytes), each after one real tiny torch op (:func:`tiny_op`); the other launches'
dispatch and a call's driver part outside its segments are hashed in updates small enough to keep the GIL.
A torch op binding holds the GIL while it parses its arguments and releases it (pybind11
``gil_scoped_release``) around the dispatcher call; beside a busy Python thread, each release long enough for
that thread to wake hands it the GIL, and the caller waits up to the 5 ms switch interval to take it back.
Why segments rather than one real tiny op per launch, each releasing the GIL: how many of a hundred brief
releases hand the GIL over depends on the machine's load, so such a stand-in stretches far more than the real
forward beside a busy thread, and by an amount no profile can predict (``bench/standin_gil.py`` times both
against the real CPU forward; its results in ``bench/results/standin_gil.json``). All of it is a fixed amount of
real CPU work, so it stretches when other threads want the cores. 1-element tensors stay far under the intra-op
pool's grain size: the tiny op never wakes the pool.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import threading
import time
from typing import Any, Callable

import torch

# CPython's hashlib releases the GIL while hashing this many bytes or more (``len >= HASHLIB_GIL_MINSIZE``), and
# keeps it for fewer: tests/test_gil_rule.py measures both on the running interpreter with a spinning thread
GIL_FREE_BYTES = 2048
HELD_BYTES = GIL_FREE_BYTES - 1  # the largest update hashed with the GIL held
_CHUNK = 1 << 16  # the largest update of one burn: well under a millisecond of CPU, so a long burn checks its CPU time often
_BUFFER = memoryview(bytes(_CHUNK))
_OPERANDS = (torch.ones(1), torch.ones(1), torch.empty(1))
_ZEROS = [_BUFFER]  # the largest zero buffer a plan has asked for (segments hash slices of it)

# One GIL-free segment of the host part per this many seconds of host time. Beside a busy Python thread, each
# time a call releases the GIL for long enough, that thread takes it and the call waits up to the interpreter's
# switch interval (5 ms) to get it back; a real eager forward lets that happen about once per SEGMENT_S of its
# call: its wall alone / ((its wall beside a busy thread - alone) / switch interval). Source: bench/standin_gil.py
# times the real eager MiniLM forward (batch 1, length 16, fp32) alone and beside a counting thread; its result
# (bench/results/standin_gil.json, with the machine it ran on) gives this interval. Taken from a quiet run: on cores
# that other processes keep busy the forward's wall alone grows, and so does the interval derived from it.
SEGMENT_S = 1.95e-3
# A host part longer than this sizes its GIL-free segments (and tops up a held one) on the thread's CPU clock as it
# runs, instead of tuning sizes over test runs at its first call (5 runs of a 30 ms part would cost 150 ms at least)
CLOCKED_S = 1e-3

# measured once per process (None: not yet): seconds per tiny op, hashed bytes per second of CPU, and the
# fixed seconds of one hashlib update call (the Python call, the GIL's release and retake)
_DISPATCH_S: float | None = None
_BURN_BPS: float | None = None
_UPDATE_S: float | None = None
_HELD_BPS: float | None = None  # bytes per second of CPU hashed in GIL-held updates of HELD_BYTES, calls included
_PAIR_S: float | None = None  # what one op followed by one update costs beyond the two apart (the switch between them)
# one measurement at a time (two threads measuring at once would slow each other), and every try on this
# thread's CPU clock: waiting for the GIL or a core is not CPU, so a busy Python thread beside the first
# measurement does not inflate the value cached for the process
_MEASURE = threading.RLock()


def _fastest(body: Callable[[], None], tries: int, per: int, pause_s: float = 0.0) -> float:
    """Seconds of this thread's CPU per unit of ``body`` (which runs ``per`` units): the fastest of ``tries``
    runs, ``pause_s`` apart (load only slows a try)."""
    best = math.inf
    for _ in range(tries):
        t0 = time.thread_time()
        body()
        best = min(best, (time.thread_time() - t0) / per)
        if pause_s:
            time.sleep(pause_s)
    return best


def _zeros(nbytes: int) -> memoryview:
    """A read-only view of ``nbytes`` zero bytes, sliced from one buffer that grows as plans need."""
    if len(_ZEROS[0]) < nbytes:
        _ZEROS[0] = memoryview(bytes(nbytes))
    return _ZEROS[0][:nbytes]


def tiny_op() -> None:
    """One real eager torch op on 1-element CPU tensors (``torch.add(a, b, out=c)``): this host's dispatch,
    with the binding's GIL pattern, and no intra-op threads."""
    a, b, c = _OPERANDS
    torch.add(a, b, out=c)


def host_dispatch_s(refresh: bool = False) -> float:
    """This host's eager dispatch cost per op (seconds): Python and torch's dispatcher for :func:`tiny_op`'s
    op in a loop, the fastest of 15 tries of 100 ops after a warm-up, 1 ms apart (load only slows tries; spread
    out, some land in a quiet moment of a shared VM). Measured once per process (some tens of milliseconds, mostly
    the pauses); ``refresh``: measure again."""
    global _DISPATCH_S
    with _MEASURE:
        if _DISPATCH_S is None or refresh:
            _DISPATCH_S = _measure_dispatch()
    return _DISPATCH_S


def _measure_dispatch() -> float:
    a, b, c = _OPERANDS
    add = torch.add
    for _ in range(50):
        add(a, b, out=c)
    def ops() -> None:
        for _ in range(100):
            add(a, b, out=c)
    return _fastest(ops, tries=15, per=100, pause_s=1e-3)


def burn_rate_bps(refresh: bool = False) -> float:
    """Bytes of SHA-256 this host hashes per second of one thread's CPU (the fastest of 7 tries of 4 updates
    of 64 KiB); measured once per process, with :func:`update_overhead_s`."""
    global _BURN_BPS, _UPDATE_S
    with _MEASURE:
        if _BURN_BPS is None or refresh:
            _BURN_BPS, _UPDATE_S = _measure_burn()
    return _BURN_BPS


def _measure_burn() -> tuple[float, float]:
    update = hashlib.sha256().update
    update(_BUFFER)
    small = _BUFFER[:4 * GIL_FREE_BYTES]
    big, short = [], []
    for _ in range(7):
        t0 = time.thread_time()
        for _ in range(4):
            update(_BUFFER)
        t1 = time.thread_time()
        for _ in range(32):
            update(small)
        big.append((t1 - t0) / 4)
        short.append((time.thread_time() - t1) / 32)
    bps = _CHUNK / max(min(big), 1e-9)
    return bps, max(min(short) - len(small) / bps, 0.0)


def held_rate_bps(refresh: bool = False) -> float:
    """Bytes per second of this thread's CPU hashed in updates of :data:`HELD_BYTES` (which keep the GIL), the
    Python calls included: the fastest of 7 tries of 64 updates on a fresh hash object, once per process."""
    global _HELD_BPS
    with _MEASURE:
        if _HELD_BPS is None or refresh:
            small = _BUFFER[:HELD_BYTES]

            def held() -> None:
                update = hashlib.sha256().update
                for _ in range(64):
                    update(small)
            held()
            _HELD_BPS = HELD_BYTES / max(_fastest(held, tries=7, per=64), 1e-9)
    return _HELD_BPS


def update_overhead_s() -> float:
    """Seconds one GIL-free hashlib update costs beyond its bytes (the call, the GIL's release and retake)."""
    burn_rate_bps()
    return float(_UPDATE_S or 0.0)


def pair_overhead_s(refresh: bool = False) -> float:
    """Seconds a tiny op followed by a GIL-free update costs beyond the op and the update timed apart (the two
    interleaved run slower than each in its own loop); the fastest of 7 tries of 50 pairs, once per process."""
    global _PAIR_S
    with _MEASURE:
        if _PAIR_S is None or refresh:
            _PAIR_S = _measure_pair()
    return _PAIR_S


def _measure_pair() -> float:
    a, b, c = _OPERANDS
    add, update = torch.add, hashlib.sha256().update
    view = _BUFFER[:3 * GIL_FREE_BYTES]
    apart = host_dispatch_s() + update_overhead_s() + len(view) / burn_rate_bps()
    def pairs() -> None:
        for _ in range(50):
            add(a, b, out=c)
            update(view)
    return max(_fastest(pairs, tries=7, per=50) - apart, 0.0)


def min_released_s() -> float:
    """The shortest burn that releases the GIL (:data:`GIL_FREE_BYTES` of hashing): shorter debts wait for
    the next launch's."""
    return (GIL_FREE_BYTES + 1) / burn_rate_bps() + update_overhead_s()


def burn_released(seconds: float, wall_cap: float = 0.25) -> float:
    """Burn about ``seconds`` of this thread's CPU with the GIL released (hashing); returns the seconds burnt
    as planned (0 for a burn shorter than :func:`min_released_s`, which could not release the GIL).

    Updates of up to 64 KiB while more than one is left, checked against this thread's CPU time (preempted,
    the burn takes longer in wall time, at most ``wall_cap`` extra, as :func:`tuning.sim.standin.spin_cpu`);
    the rest as one update sized from :func:`burn_rate_bps`."""
    rate = burn_rate_bps()
    if seconds * rate <= GIL_FREE_BYTES:
        return 0.0
    planned = seconds
    h = hashlib.sha256()
    chunk_s = _CHUNK / rate
    if seconds > 2 * chunk_s:
        cpu_end = time.thread_time() + seconds
        wall_end = time.perf_counter() + seconds + wall_cap
        while True:
            left = cpu_end - time.thread_time()
            if left <= chunk_s:
                break
            if time.perf_counter() > wall_end:  # preempted past the cap: stop here, as spin_cpu does
                return planned
            h.update(_BUFFER)
        seconds = max(left, 0.0)
    nbytes = int(seconds * rate)
    while nbytes > _CHUNK:
        h.update(_BUFFER)
        nbytes -= _CHUNK
    if nbytes > GIL_FREE_BYTES:
        h.update(_BUFFER[:nbytes])
    return planned


class HostPart:
    """The host part of one stand-in call: ``ops`` launches' dispatch (this host's, :func:`host_dispatch_s`) and
    ``released_s`` seconds of driver work, with the GIL released in about one segment per ``segment_s`` of the call.

    A call's segments (:meth:`segments`) follow ``target_s() / segment_s`` per call on average (default
    :data:`SEGMENT_S`, calibrated from a real eager forward's GIL hand-offs): the running count of calls sets them,
    so a part shorter than ``segment_s`` releases once every few calls and a longer one about once per
    ``segment_s``. A call with ``k`` segments splits its launches into ``k`` even groups; each group's last launch
    runs one real tiny op (:func:`tiny_op`, whose binding releases the GIL briefly, as torch's do), the group's
    other launches' dispatch is hashed with the GIL held (updates of at most :data:`HELD_BYTES`, which hashlib
    runs without releasing it), and the group ends in one GIL-free SHA-256 update of ``released_s / k``. A call
    without segments hashes all of it with the GIL held. No segment is shorter than :func:`min_released_s` (a
    group without a launch has no tiny op). ``real_ops="launch"``: one real tiny op per launch instead (the stand-in before
    :data:`SEGMENT_S`; each op's brief release can hand the GIL to a busy thread, how often depends on the load).

    Each segment count a call can have is planned once and tuned at the first run: its sizes are corrected until
    the fastest of 5 runs takes ``ops`` dispatches + ``released_s`` of this thread's CPU (to 3%, at most 4
    re-plans, the last one checked), so every call costs what the cost model charges on an idle host; the
    tuning runs under :data:`_MEASURE`, so two threads never time each other. A part longer than
    :data:`CLOCKED_S` is not tuned: each segment is sized as it starts from the CPU still owed on this thread's
    clock (and the rate long updates have been running at), and a held one hashes until the clock reaches it."""

    def __init__(self, ops: int, released_s: float, segment_s: float | None = None, real_ops: str = "segment"):
        if real_ops not in ("segment", "launch"):
            raise ValueError(f"real_ops={real_ops!r}: 'segment' or 'launch'")
        self.ops = max(int(ops), 0)
        self.released_s = max(float(released_s), 0.0)
        self.segment_s = SEGMENT_S if segment_s is None else max(float(segment_s), 0.0)
        self.real_ops = real_ops
        self._target_s = self.ops * host_dispatch_s() + self.released_s  # the dispatch is measured once per process
        self._clocked = self._target_s > CLOCKED_S
        most = int(self.released_s / min_released_s()) if self.released_s > 0 else 0
        per_call = self.target_s() / self.segment_s if self.segment_s > 0 else math.inf
        self.segments_per_call = float(min(per_call, most))  # on average over calls
        self._calls = itertools.count()
        # segments in a call -> its groups: (real tiny ops, GIL-held bytes), and the bytes of each GIL-free update
        self._groups: dict[int, list[tuple[int, int]]] = {}
        self._free: dict[int, memoryview] = {}
        self._rate = burn_rate_bps()  # bytes per second of one long GIL-free update (learnt as clocked parts run)
        self._tuned = False

    def segments(self, call: int) -> int:
        """GIL-free segments of the ``call``-th run (from 0): the running total rounds ``call * segments_per_call``."""
        r = self.segments_per_call
        return math.floor((call + 1) * r + 0.5) - math.floor(call * r + 0.5)

    def counts(self) -> list[int]:
        """The segment counts a call can have (one, or two neighbours)."""
        lo = math.floor(self.segments_per_call)
        return [lo] if lo == self.segments_per_call else [lo, lo + 1]

    def real_ops_per_call(self, k: int) -> int:
        """Real tiny ops a call with ``k`` segments runs."""
        return sum(real for real, _ in self._plan_groups(k))

    def target_s(self) -> float:
        """What the part costs an idle host: ``ops`` dispatches (:func:`host_dispatch_s`) + ``released_s``."""
        return self._target_s

    def _plan_groups(self, k: int) -> list[tuple[int, int]]:
        # a clocked part sizes its segments as it runs: the hashing rate stands in for the held one (not measured)
        dispatch = host_dispatch_s()
        held_bps = burn_rate_bps() if self._clocked else held_rate_bps()
        bounds = [self.ops * (j + 1) // max(k, 1) for j in range(max(k, 1))]
        groups, done = [], 0
        for bound in bounds:
            n = bound - done
            done = bound
            real = n if self.real_ops == "launch" else min(n, 1 if k else 0)
            held_s = (n - real) * dispatch + (self.released_s if k == 0 else 0.0)
            if k == 0 and self._clocked:
                held_s *= 0.9  # the rest hashed until the thread's CPU clock reaches the target
            groups.append((real, int(held_s * held_bps)))
        return groups

    def _plan(self, k: int) -> None:
        self._groups[k] = self._plan_groups(k)
        if k:
            per = update_overhead_s() + (pair_overhead_s() if self.ops and not self._clocked else 0.0)
            self._segment(k, int((self.released_s / k - per) * burn_rate_bps()))

    def _segment(self, k: int, nbytes: int) -> None:
        self._free[k] = _zeros(max(nbytes, GIL_FREE_BYTES + 1))  # a segment's update must release the GIL

    def _tune(self) -> None:
        target = self.target_s()
        for k in self.counts():
            self._plan(k)
            if self._clocked:  # sized on the thread's CPU clock as it runs: no tuning runs
                continue
            for round_ in range(5):  # 4 re-plans at most, each checked by the next round's runs
                tries = []
                for _ in range(5):
                    t0 = time.thread_time()  # the model charges CPU: a wait for a core or the GIL is not the part's
                    self._run(k)
                    tries.append(time.thread_time() - t0)
                error = target - min(tries)  # > 0: the part ran short
                if abs(error) <= 0.03 * target or round_ == 4:
                    break
                if k:  # the GIL-free updates take the correction
                    self._segment(k, len(self._free[k]) + int(error / k * burn_rate_bps()))
                else:  # the held hashing does
                    (real, held), = self._groups[0]
                    self._groups[0] = [(real, max(held + int(error * held_rate_bps()), 0))]

    def run(self) -> None:
        """Run it on the calling thread (the first run tunes the plan)."""
        if not self._tuned:
            with _MEASURE:
                if not self._tuned:
                    self._tune()
                    self._tuned = True
        self._run(self.segments(next(self._calls)))

    def _run(self, k: int) -> None:
        a, b, c = _OPERANDS
        add = torch.add
        held = hashlib.sha256().update  # its own object: one that has released the GIL once releases it always
        small = _BUFFER[:HELD_BYTES]
        free = hashlib.sha256().update if k else None
        view = self._free.get(k)
        clocked = self._clocked
        if clocked:
            end, per = time.thread_time() + self._target_s, _UPDATE_S or 0.0
        groups = self._groups[k]
        for j, (real, nbytes) in enumerate(groups):
            for _ in range(nbytes // HELD_BYTES):
                held(small)
            if nbytes % HELD_BYTES:
                held(_BUFFER[:nbytes % HELD_BYTES])
            for _ in range(real):
                add(a, b, out=c)
            if free is None:
                continue
            if not clocked:
                free(view)  # one GIL-free segment: a busy Python thread takes the GIL here
                continue
            t0 = time.thread_time()  # this segment's share of the CPU still owed, at the rate one long update runs
            nbytes = max(int(((end - t0) / (k - j) - per) * self._rate), GIL_FREE_BYTES + 1)
            free(_zeros(nbytes))
            spent = time.thread_time() - t0 - per
            if spent > 0:  # learnt: a long update hashes a little slower than the 64 KiB ones measured
                rate = _BURN_BPS or self._rate  # measured at construction (min_released_s)
                self._rate = min(max(0.5 * self._rate + 0.5 * nbytes / spent, 0.5 * rate), 1.5 * rate)
        if clocked and not k:  # held throughout: top up to the CPU owed
            while time.thread_time() < end:
                for _ in range(8):
                    held(small)


# per model structure (its configuration less the sizes the miniature replaces): seconds per launched kernel
_MODEL_DISPATCH: dict[tuple, tuple[float, int]] = {}
MINIATURE_TOKENS = 2  # the miniature forward's length (batch 1): no op's compute is more than a few hundred flops


def model_dispatch_s(small: Any, launches: int = 0, refresh: bool = False) -> tuple[float, str]:
    """This host's eager host cost per launched kernel of a model's own forward (seconds), and its source.

    A real eager forward on an accelerator costs the host, per launched kernel, more than one tiny op's
    dispatch (:func:`host_dispatch_s`): its modules' Python, every op the forward dispatches (views and
    allocations too, which launch nothing), and each op's arguments. ``small`` is the model's own code at a
    miniature size (``tuning.runtime.model.miniature``), called here with batch 1 and :data:`MINIATURE_TOKENS`
    tokens on the CPU, where its ops compute next to nothing; this divides the forward's thread CPU time
    (the fastest of 7 tries of 10 forwards after 10 warm-up ones, at one intra-op thread) by ``launches``, the
    kernels that forward launches (the caller counts them with :func:`tuning.sim.costmodel.record_ops`: the op
    sequence does not depend on the sizes). The driver's part of each launch (``launch_s``) is the device
    profile's. Measured once per model structure and process. ``small`` None (a module this package cannot
    rebuild small, such as a ``module:factory`` model) gets :func:`host_dispatch_s`, the tiny op: a lower
    bound, said in the source.

    Why the miniature and not the tiny op: on a GPU host the real eager forward's host time per launched kernel is
    several times the miniature's, and the miniature's several times a tiny op's (``bench/gpu_check.py`` measures
    the three on the same host; its results in ``bench/results/gpu_check_h200_run*``)."""
    if small is None or launches <= 0:
        return host_dispatch_s(refresh), "tiny op (tuning.sim.dispatch.host_dispatch_s): a lower bound; " \
            "this model's own code could not be rebuilt small to time"
    config = getattr(small, "config", None)
    key = tuple(sorted(dataclasses.asdict(config).items())) if dataclasses.is_dataclass(config) else None
    with _MEASURE:
        if key is None or key not in _MODEL_DISPATCH or refresh:
            ids = torch.zeros(1, MINIATURE_TOKENS, dtype=torch.long)
            mask = torch.ones(1, MINIATURE_TOKENS, dtype=torch.long)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # a CUDA launch wakes no intra-op pool; the CPU kernels' pool checks are not its
            try:
                with torch.inference_mode():
                    for _ in range(10):
                        small(ids, mask)

                    def forwards() -> None:
                        for _ in range(10):
                            small(ids, mask)
                    per_forward = _fastest(forwards, tries=7, per=10)
            finally:
                torch.set_num_threads(threads)
            value = (per_forward / max(launches, 1), launches)
            if key is None:
                return value[0], _model_source(launches)
            _MODEL_DISPATCH[key] = value
        seconds, launches = _MODEL_DISPATCH[key]
    return seconds, _model_source(launches)


def _model_source(launches: int) -> str:
    return (f"this host: the model's own eager code at a miniature size, per launched kernel ({launches} a forward; "
            "tuning.sim.dispatch.model_dispatch_s)")
