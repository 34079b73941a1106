"""The hypervisor's steal over a window inside a run: :class:`StealWatch`."""

from __future__ import annotations

import math
import time
from typing import Callable

from tuning.base.machine import steal_share, steal_ticks
from tuning.profile.sampler import PeriodicSampler


class StealWatch(PeriodicSampler):
    """Steal readings every ``interval`` seconds from a daemon thread while it is open, so the steal share of a
    window inside the run (a load test's measured window, without its warm-up and server start and stop) can
    be read afterwards: ``with StealWatch() as w: ...; w.share(t0, t1)`` on the ``time.perf_counter`` clock.

    One reading is a read of ``/proc/stat`` (microseconds); no thread runs where that file has no steal column."""

    thread_name = "steal-watch"

    def __init__(self, interval: float = 0.25, clock: Callable[[], float] = time.perf_counter,
                 ticks: Callable[[], tuple[int, int] | None] = steal_ticks):
        super().__init__(interval, clock)
        self.ticks = ticks
        self.readings: list[tuple[float, int, int]] = []

    def _read(self) -> None:
        got = self.ticks()
        if got is not None:
            self.readings.append((self.clock(), *got))

    def start(self) -> bool:
        self._read()
        return bool(self.readings)

    def sample(self, t: float) -> bool:
        self._read()
        return True

    def share(self, t0: float | None = None, t1: float | None = None) -> float:
        """The steal share between the last reading at or before ``t0`` and the first at or after ``t1`` (the
        smallest span of readings that covers the window; the whole watch without bounds). NaN without two."""
        r = self.readings
        if len(r) < 2:
            return math.nan
        before = [x for x in r if t0 is not None and x[0] <= t0]
        after = [x for x in r if t1 is not None and x[0] >= t1]
        start = before[-1] if before else r[0]
        end = after[0] if after else r[-1]
        return steal_share(start[1:], end[1:])
