"""A background sampling thread shared by the GPU and host samplers.

Start on ``__enter__``, stop and join on ``__exit__``; the thread sleeps with
``Event.wait(interval)`` so stopping is immediate.
"""

from __future__ import annotations

import threading
from typing import Any

from tuning.base import clock as _clock
from tuning.base.threads import name_this_thread

MIN_INTERVAL_S = 0.1


class PeriodicSampler:
    """Calls ``self.sample(t)`` every ``interval`` seconds on a named thread."""

    thread_name = "sampler"

    def __init__(self, interval: float = 0.5, clock: _clock.Clock | None = None):
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < MIN_INTERVAL_S:
            raise ValueError(f"interval={interval!r} must be a number >= {MIN_INTERVAL_S} seconds")
        self.interval = float(interval)
        self.clock = clock or _clock.now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # subclasses
    def start(self) -> bool:
        """Prepare; return False to run without a thread (nothing to sample)."""
        return True

    def sample(self, t: float) -> bool:
        """Take one sample at ``t``; return False to stop sampling."""
        raise NotImplementedError

    def finish(self) -> None:
        """Release resources after the thread stopped."""

    def _loop(self) -> None:
        name_this_thread(self.thread_name)
        while True:
            if not self.sample(self.clock()):
                return
            if self._stop.wait(self.interval):
                self.sample(self.clock())  # one last reading at the end of the window
                return

    def __enter__(self) -> "PeriodicSampler":
        self._stop.clear()
        if self.start():
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.finish()
