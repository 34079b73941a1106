"""The one clock every span and sampler uses, so all signals share a timeline.

``time.perf_counter`` is CLOCK_MONOTONIC on Linux: system-wide, so spans measured in
DataLoader worker processes line up with the main process. Tests inject fake clocks
where a function takes a ``clock`` argument.
"""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]
now: Clock = time.perf_counter


class FakeClock:
    """A manual clock for tests: ``advance(seconds)`` moves it; calling it reads it."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
