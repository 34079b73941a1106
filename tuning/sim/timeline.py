"""The simulated device's activity over time, in fixed bins on the shared clock.

Bins, not a list of calls: a server on the simulated device makes thousands of calls a second,
and a list of spans would grow by about 2 GB an hour and make every sampling pass scan it. Each
call's predicted device compute, predicted call time and launch count are spread evenly over its
wall span across the bins it overlaps (10 ms by default: far finer than any sampling interval);
memory is the peak per bin. Queries over a window take the covered bins, edge bins pro rata.

Two utilizations come from it, never one for the other: device busy (:meth:`DeviceTimeline.busy_share`), the kernel
sum over the wall time, and NVML's ``util.gpu`` (:meth:`DeviceTimeline.active_share`), the share of sample periods
in which any kernel ran, each bin standing for one period: a device that runs short kernels spread over its calls
reads a low kernel sum and a high util.gpu, as a real one does under NVML.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

FIELDS = ("busy", "call", "calls")  # device compute s, predicted call s, number of calls


@dataclass(frozen=True)
class Totals:
    """What the device did inside a window (seconds, except ``calls``)."""

    busy: float  # device compute: the kernel sum (device busy), not NVML's util.gpu (see active_share)
    call: float  # predicted wall time of the calls (launches or replay + kernels)
    calls: float

    @property
    def launch_share(self) -> float:
        """Share of the calls' predicted time the device did not compute: what capture could save at most."""
        return max(0.0, 1.0 - self.busy / self.call) if self.call > 0 else float("nan")


class DeviceTimeline:
    """Binned device activity; thread-safe; memory grows by 32 bytes per bin (about 12 MB per hour)."""

    def __init__(self, bin_s: float = 0.01):
        if bin_s <= 0:
            raise ValueError(f"bin_s={bin_s!r} must be > 0 seconds")
        self.bin_s = bin_s
        self.origin: float | None = None
        self._data = np.zeros((len(FIELDS) + 1, 256))  # busy, call, calls, memory peak
        self._used = 0
        self._lock = threading.Lock()

    def _grow(self, n: int) -> None:
        if n > self._data.shape[1]:
            bigger = np.zeros((self._data.shape[0], max(n, 2 * self._data.shape[1])))
            bigger[:, :self._used] = self._data[:, :self._used]
            self._data = bigger
        self._used = max(self._used, n)

    def add(self, t0: float, t1: float, busy_s: float, call_s: float, memory_bytes: float) -> None:
        """One call that ran over the wall span [t0, t1]."""
        with self._lock:
            if self.origin is None:
                self.origin = t0
            a, b = (t0 - self.origin) / self.bin_s, (t1 - self.origin) / self.bin_s
            first, last = max(int(np.floor(a)), 0), max(int(np.floor(b)), 0)
            self._grow(last + 1)
            width = max(b - a, 1e-12)
            for i in range(first, last + 1):
                share = (min(b, i + 1) - max(a, i)) / width if last > first else 1.0
                self._data[0, i] += busy_s * share
                self._data[1, i] += call_s * share
                self._data[2, i] += share
                self._data[3, i] = max(self._data[3, i], memory_bytes)

    def _weights(self, t0: float, t1: float) -> np.ndarray:
        edges = self.origin + self.bin_s * np.arange(self._used + 1)
        overlap = np.clip(np.minimum(edges[1:], t1) - np.maximum(edges[:-1], t0), 0.0, None)
        return overlap / self.bin_s

    def totals(self, t0: float, t1: float) -> Totals:
        """Device compute, predicted call time and calls inside [t0, t1]."""
        with self._lock:
            if self.origin is None or t1 <= t0:
                return Totals(0.0, 0.0, 0.0)
            w = self._weights(t0, t1)
            sums = self._data[:3, :self._used] @ w
        return Totals(*map(float, sums))

    def memory_peak(self, t0: float, t1: float) -> float:
        with self._lock:
            if self.origin is None:
                return 0.0
            w = self._weights(t0, t1)
            values = self._data[3, :self._used][w > 0]
        return float(values.max()) if len(values) else 0.0

    def copy(self) -> "DeviceTimeline":
        """A frozen copy (a result keeps its own, unaffected by later calls)."""
        out = DeviceTimeline(self.bin_s)
        with self._lock:
            out.origin, out._used = self.origin, self._used
            out._data = self._data[:, :max(self._used, 1)].copy()
        return out

    def active_share(self, t0: float, t1: float) -> float:
        """NVML's util.gpu over [t0, t1] (0-1): the share of its sample periods (the bins) in which any kernel ran,
        a period counted whole however little of it a kernel took (edge bins by their overlap); NaN for an empty
        window."""
        if not t1 > t0:
            return float("nan")
        with self._lock:
            if self.origin is None:
                return 0.0
            w = self._weights(t0, t1)
            active = self._data[0, :self._used] > 0
            periods = float(w[active].sum())
        return min(periods * self.bin_s / (t1 - t0), 1.0)

    def busy_share(self, t0: float, t1: float) -> float:
        """Device busy over [t0, t1]: the share the device computed (the kernel sum over the wall time)."""
        return min(self.totals(t0, t1).busy / (t1 - t0), 1.0) if t1 > t0 else float("nan")
