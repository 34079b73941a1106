"""The simulated dispatch's GIL rule, measured on the running interpreter: hashlib updates of
``dispatch.HELD_BYTES`` keep the GIL and updates of ``dispatch.GIL_FREE_BYTES`` release it, as a thread waiting
for the GIL shows by getting it, or not, while they run (not the module's constants checked against each other).

On CPython 3.11 a waiting thread takes a 2,048-byte update's release within a few thousand updates (a few ms);
20,000 updates of 2,047 bytes (tens of ms) give it none."""

import hashlib
import sys
import threading
import time
from contextlib import contextmanager

from tuning.sim import dispatch

SWITCH_S = 5.0  # the switch interval while measuring: far longer than the updates below, so only a release hands over


@contextmanager
def _waiting_thread():
    """A thread that, once let go, waits for the GIL and counts 1 when it gets it (then blocks without it)."""
    go, done, count = threading.Event(), threading.Event(), [0]

    def wait_for_the_gil() -> None:
        go.wait()
        count[0] += 1  # needs the GIL: runs only when this thread's updates let it go
        done.wait()
    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    thread = threading.Thread(target=wait_for_the_gil, daemon=True)
    try:
        thread.start()
        go.set()
        yield count
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(old)


def test_updates_of_held_bytes_keep_the_gil():
    data = bytes(dispatch.HELD_BYTES)
    update = hashlib.sha256().update  # a fresh object: one that has released the GIL once releases it always
    with _waiting_thread() as count:
        for _ in range(20_000):
            update(data)
        got = count[0]
    assert got == 0, f"a thread waiting for the GIL got it during updates of {dispatch.HELD_BYTES} bytes"


def test_updates_of_gil_free_bytes_release_it():
    data = bytes(dispatch.GIL_FREE_BYTES)
    update = hashlib.sha256().update
    deadline = time.monotonic() + 30  # the waiting thread needs a core to take a released GIL: wait for it
    with _waiting_thread() as count:
        while count[0] == 0 and time.monotonic() < deadline:
            update(data)
        got = count[0]
    assert got == 1, f"no thread waiting for the GIL got it during 30 s of updates of {dispatch.GIL_FREE_BYTES} bytes"
