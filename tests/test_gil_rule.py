"""The simulated dispatch's GIL rule, measured on the running interpreter: hashlib updates of
``dispatch.HELD_BYTES`` keep the GIL and updates of ``dispatch.GIL_FREE_BYTES`` release it, as a spinning
Python thread's progress during them shows (not the module's constants checked against each other)."""

import hashlib
import sys
import threading
import time
from contextlib import contextmanager

from tuning.sim import dispatch

SWITCH_S = 0.5  # the switch interval while measuring: far longer than the held updates below take


@contextmanager
def _spinner():
    """A Python thread counting while it holds the GIL; with a long switch interval it gets the GIL from this
    thread only when this thread releases it (or after SWITCH_S of holding it)."""
    count, stop = [0], [False]

    def spin() -> None:
        while not stop[0]:
            count[0] += 1
    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    thread = threading.Thread(target=spin, daemon=True)
    try:
        thread.start()
        while count[0] == 0:  # running (this thread got the GIL back after SWITCH_S)
            time.sleep(0.001)
        yield count
    finally:
        stop[0] = True
        thread.join()
        sys.setswitchinterval(old)


def test_updates_of_held_bytes_keep_the_gil():
    data = bytes(dispatch.HELD_BYTES)
    update = hashlib.sha256().update
    with _spinner() as count:
        before = count[0]
        for _ in range(200):
            update(data)
        assert count[0] == before


def test_updates_of_gil_free_bytes_release_it():
    data = bytes(dispatch.GIL_FREE_BYTES)
    update = hashlib.sha256().update
    with _spinner() as count:
        before = count[0]
        deadline = time.monotonic() + 30  # the spinner needs a core to take a released GIL: wait for it
        while count[0] == before and time.monotonic() < deadline:
            update(data)
        assert count[0] > before
