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
import time

import torch

# CPython's hashlib releases the GIL while hashing more than this many bytes (HASHLIB_GIL_MINSIZE is 2048)
GIL_FREE_BYTES = 2048
_CHUNK = 1 << 16  # the largest update of one burn: ~60 us here, so a long burn checks its CPU time often
_BUFFER = memoryview(bytes(_CHUNK))
_OPERANDS = (torch.ones(1), torch.ones(1), torch.empty(1))

# measured once per process (None: not yet): seconds per tiny op, hashed bytes per second of CPU
_DISPATCH_S: float | None = None
_BURN_BPS: float | None = None


def tiny_op() -> None:
    """One real eager torch op on 1-element CPU tensors (``torch.add(a, b, out=c)``): this host's dispatch,
    with the binding's GIL pattern, and no intra-op threads."""
    a, b, c = _OPERANDS
    torch.add(a, b, out=c)


def host_dispatch_s(refresh: bool = False) -> float:
    """This host's eager dispatch cost per op (seconds): Python and torch's dispatcher for :func:`tiny_op`,
    the fastest of 15 tries of 100 ops after a warm-up, 1 ms apart (load only slows tries; spread out, some
    land in a quiet moment of a shared VM). Measured once per process (about 25 ms); ``refresh``: again."""
    global _DISPATCH_S
    if _DISPATCH_S is None or refresh:
        for _ in range(50):
            tiny_op()
        tries = []
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(100):
                tiny_op()
            tries.append((time.perf_counter() - t0) / 100)
            time.sleep(1e-3)
        _DISPATCH_S = min(tries)
    return _DISPATCH_S


def burn_rate_bps(refresh: bool = False) -> float:
    """Bytes of SHA-256 this host hashes per second of one thread's CPU (the fastest of 7 tries of 4 updates
    of 64 KiB); measured once per process."""
    global _BURN_BPS
    if _BURN_BPS is None or refresh:
        h = hashlib.sha256()
        h.update(_BUFFER)
        tries = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(4):
                h.update(_BUFFER)
            tries.append(4 * _CHUNK / (time.perf_counter() - t0))
        _BURN_BPS = max(tries)
    return _BURN_BPS


def min_released_s() -> float:
    """The shortest burn that releases the GIL (:data:`GIL_FREE_BYTES` of hashing): shorter debts wait for
    the next launch's."""
    return (GIL_FREE_BYTES + 1) / burn_rate_bps()


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
            if left <= chunk_s or time.perf_counter() > wall_end:
                break
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
    seconds burnt with the GIL released (a debt below :func:`min_released_s` carries to the next op)."""

    def __init__(self, ops: int, released_s: float):
        self.ops = max(int(ops), 0)
        self.released_s = max(float(released_s), 0.0)

    def run(self) -> None:
        """Run it on the calling thread."""
        if self.ops == 0:
            burn_released(self.released_s)
            return
        per_op = self.released_s / self.ops
        floor = min_released_s() if per_op > 0 else 0.0
        debt = 0.0
        for _ in range(self.ops):
            tiny_op()
            debt += per_op
            if debt >= floor and debt > 0:
                debt -= burn_released(debt)
        if debt > 0:
            burn_released(max(debt, floor))  # the tail: at least one GIL-free update
