"""The machine a result was made on."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
