"""This host's share of a kernel launch: its eager dispatch cost per op, and host work that releases the GIL.

A launched kernel costs the host two things: Python and torch's dispatcher for the op (argument parsing,
dispatch key selection, the output's allocation), which depends on this host's core and load, and the CUDA
driver's part (``cudaLaunchKernel`` enqueueing the kernel), which is the device profile's ``launch_s``.
:func:`host_dispatch_s` measures the first on this host, once per process, with one tiny torch op on the
CPU (no device): the fastest of several tries of a loop of ``torch.add(a, b, out=c)`` on 1-element tensors.
It is cached module-level (as :class:`tuning.sim.standin.IntraOpBurner` caches its units), so a pipeline
built later on a busy machine does not re-measure under load.

The stand-in's host part follows torch's GIL pattern: a torch op binding holds the GIL while it parses its
arguments and releases it (pybind11 ``gil_scoped_release``) around the dispatcher call and the launch. So
per launched kernel the stand-in runs one real tiny op (:func:`tiny_op`: its real cost and real GIL
pattern) and burns the driver's part with the GIL released (:func:`burn_released`): SHA-256 over a buffer,
which CPython's hashlib computes without the GIL for more than 2047 bytes. Both are fixed amounts of real
CPU work, so they stretch when other threads want the cores. 1-element tensors stay far under the
intra-op pool's grain size: the tiny op never wakes the pool.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from typing import Callable

import torch

# CPython's hashlib releases the GIL while hashing more than this many bytes (HASHLIB_GIL_MINSIZE is 2048)
GIL_FREE_BYTES = 2048
_CHUNK = 1 << 16  # the largest update of one burn: ~60 us here, so a long burn checks its CPU time often
_BUFFER = memoryview(bytes(_CHUNK))
_OPERANDS = (torch.ones(1), torch.ones(1), torch.empty(1))

# measured once per process (None: not yet): seconds per tiny op, hashed bytes per second of CPU, and the
# fixed seconds of one hashlib update call (the Python call, the GIL's release and retake)
_DISPATCH_S: float | None = None
_BURN_BPS: float | None = None
_UPDATE_S: float | None = None
_PAIR_S: float | None = None  # what one op followed by one update costs beyond the two apart (measured here: ~0.7 us)
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


def tiny_op() -> None:
    """One real eager torch op on 1-element CPU tensors (``torch.add(a, b, out=c)``): this host's dispatch,
    with the binding's GIL pattern, and no intra-op threads."""
    a, b, c = _OPERANDS
    torch.add(a, b, out=c)


def host_dispatch_s(refresh: bool = False) -> float:
    """This host's eager dispatch cost per op (seconds): Python and torch's dispatcher for :func:`tiny_op`'s
    op in a loop, the fastest of 15 tries of 100 ops after a warm-up, 1 ms apart (load only slows tries; spread
    out, some land in a quiet moment of a shared VM). Measured once per process (about 25 ms); ``refresh``:
    measure again."""
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
    """The host part of one stand-in call: ``ops`` tiny ops, each followed by its share of ``released_s``
    seconds burnt with the GIL released.

    Planned once: where one op's share is shorter than :func:`min_released_s`, every ``group`` ops share one
    update (the GIL still changes hands inside every op's dispatch). Interleaved, an op and an update cost more
    than each timed alone (by about a microsecond here, and it varies), so at its first run the plan is tuned:
    the update size is corrected until the fastest of 5 runs takes ``ops`` dispatches + ``released_s`` of this
    thread's CPU (to 3%, at most 4 re-plans, the last one checked), so the part costs what the cost model
    charges. A share of more than a millisecond per group burns on this thread's CPU clock instead
    (:func:`burn_released`)."""

    def __init__(self, ops: int, released_s: float):
        self.ops = max(int(ops), 0)
        self.released_s = max(float(released_s), 0.0)
        self.group, self._view, self._long_s, self._tuned = 1, None, 0.0, False
        if self.ops and self.released_s > 0:
            per_op = self.released_s / self.ops
            group = min(self.ops, max(1, math.ceil(min_released_s() / per_op)))
            if per_op * group > 1e-3:
                self.group, self._long_s = group, per_op * group
            else:
                self._plan(group, int((per_op * group - update_overhead_s() - pair_overhead_s()) * burn_rate_bps()))
        self._groups, self._tail = divmod(self.ops, self.group)

    def _plan(self, group: int, nbytes: int) -> None:
        self.group = group
        self._view = memoryview(bytes(max(nbytes, GIL_FREE_BYTES + 1)))
        self._groups, self._tail = divmod(self.ops, self.group)

    def target_s(self) -> float:
        """What the part costs an idle host: ``ops`` dispatches (:func:`host_dispatch_s`) + ``released_s``."""
        return self.ops * host_dispatch_s() + self.released_s

    def _tune(self) -> None:
        self._tuned = True
        if self._view is None:
            return
        target, rate = self.target_s(), burn_rate_bps()
        for round_ in range(5):  # 4 re-plans at most, each checked by the next round's runs
            tries = []
            for _ in range(5):
                t0 = time.thread_time()  # the model charges CPU: a wait for a core or the GIL is not the part's
                self._run()
                tries.append(time.thread_time() - t0)
            error = target - min(tries)  # > 0: the part ran short
            if abs(error) <= 0.03 * target or round_ == 4:
                return
            nbytes = len(self._view) + int(error / max(self._groups, 1) * rate)
            if nbytes <= GIL_FREE_BYTES and self.group < self.ops:  # at the floor: fewer, larger updates
                group = min(self.ops, 2 * self.group)
                self._plan(group, int(len(self._view) * group / self.group + error / max(self.ops // group, 1) * rate))
            else:
                self._plan(self.group, nbytes)

    def run(self) -> None:
        """Run it on the calling thread (the first run tunes the plan)."""
        if not self._tuned:
            self._tune()
        self._run()

    def _run(self) -> None:
        if self.ops == 0:
            burn_released(self.released_s)
            return
        a, b, c = _OPERANDS
        add = torch.add
        if self._view is None and not self._long_s:
            for _ in range(self.ops):
                add(a, b, out=c)
            return
        burn = hashlib.sha256().update if self._view is not None else None
        view, group, long_s = self._view, self.group, self._long_s
        for _ in range(self._groups):
            for _ in range(group):
                add(a, b, out=c)
            if burn is not None:
                burn(view)
            else:
                burn_released(long_s)
        for _ in range(self._tail):
            add(a, b, out=c)
        if self._tail:
            burn_released(self.released_s * self._tail / self.ops)
