"""Thread naming, so that per-thread CPU tables show recognisable names (like ``top -H``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

_PR_SET_NAME = 15
_libc = None


def name_this_thread(name: str) -> None:
    """Name the current thread for Python (``threading``) and for the OS (``/proc/.../comm``, 15 chars)."""
    global _libc
    threading.current_thread().name = name
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the Python name is still set
        pass


def python_thread_names() -> dict[int, str]:
    """native thread id -> Python thread name, for this process."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def thread_start(tid: int, pid: int | None = None) -> int | None:
    """A thread's start time in clock ticks since boot (``/proc/PID/task/TID/stat`` field 22), which
    with its id names it uniquely; None where there is no /proc or the thread has ended."""
    try:
        with open(f"/proc/{pid or os.getpid()}/task/{tid}/stat") as fh:
            raw = fh.read()
        return int(raw[raw.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def python_thread_keys() -> dict[tuple[int, int], str]:
    """(native thread id, start ticks) -> Python thread name, for this process's live threads."""
    keys = {}
    for tid, name in python_thread_names().items():
        start = thread_start(tid)
        keys[(tid, start if start is not None else 0)] = name
    return keys
