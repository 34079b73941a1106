"""Thread naming, so that per-thread CPU tables show recognisable names (like ``top -H``)."""

from __future__ import annotations

import ctypes
import ctypes.util
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
