"""The whole investigation with its report: what ``python -m tuning investigate`` and :func:`tuning.investigate` run."""

from __future__ import annotations

import functools
from typing import Any

from tuning.experiments.investigate import Investigation, run_investigation
from tuning.present.html import render_report


@functools.wraps(run_investigation, assigned=("__doc__", "__annotations__"))
def investigate(*args: Any, **kwargs: Any) -> Investigation:
    kwargs.setdefault("render", render_report)
    return run_investigation(*args, **kwargs)
