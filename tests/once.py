"""Expensive work done once per test run, whichever process asks first.

Under pytest-xdist each worker is its own session, so a session fixture alone would execute a notebook or a
quick investigation once per worker. Here the first worker that asks does the work under a file lock in a
folder the workers share; the others wait on that lock and read what it saved. The saved value carries the
run's id, so a later run never reads an earlier one's.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock


def run_id(config) -> str:
    """The id every worker of this run shares (xdist's ``testrunuid``), or one made for a run without xdist."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        return worker["testrunuid"]
    if not hasattr(config, "_tuning_run_id"):
        config._tuning_run_id = uuid.uuid4().hex
    return config._tuning_run_id


def shared_folder(tmp_path_factory) -> Path:
    """A folder every worker of this run sees: the parent of the workers' own base temp folders."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def once(key: str, run: str, folder: Path, make: Callable[[], Any]) -> Any:
    """``make()`` once for ``key`` in run ``run``; its value (JSON) is saved in ``folder`` for the others. ``make``
    reports a failure in its value rather than raising: a raise saves nothing, and the next asker tries again."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / f"{key}.json"
    with FileLock(str(folder / f"{key}.lock")):
        done = _read(saved)
        if done.get("run") == run:
            return done["value"]
        value = make()
        partial = saved.with_suffix(".json.tmp")
        partial.write_text(json.dumps({"run": run, "value": value}))
        os.replace(partial, saved)  # whole or not at all: a worker killed mid-write leaves no half a file
        return value


def _read(saved: Path) -> dict:
    try:
        return json.loads(saved.read_text())
    except (OSError, ValueError):
        return {}
