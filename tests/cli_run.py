"""The command line run in this process: ``tuning.cli.main(argv)`` with its exit code and what it wrote.

An error exit through ``python -m tuning`` costs seconds (importing torch) and tests nothing the parser and
the commands do not show here; the few things only a process shows (Ctrl-C, the exit code through
``python -m``, a server process left behind) keep their subprocess tests.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tuning import cli


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*argv: str, capfd=None, cwd: Path | None = None) -> CliRun:
    """``python -m tuning ARGV`` in this process, started in ``cwd`` if given. Pass pytest's ``capfd`` to see
    what is written to the file descriptors too (native libraries, the quiet filter's pass-through), not only
    through ``sys.stdout``."""
    with _started_in(cwd):
        if capfd is not None:
            capfd.readouterr()  # drop what the test wrote before
            code = _main(list(argv))
            seen = capfd.readouterr()
            return CliRun(code, seen.out, seen.err)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = _main(list(argv))
        return CliRun(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _started_in(cwd: Path | None):
    """As a process started in ``cwd``: a ``--model module:factory`` imports from there (the CLI puts the
    working folder on ``sys.path``, as ``python -m`` does); afterwards the working folder and ``sys.path`` are
    as they were and the modules this call imported from ``cwd`` are forgotten."""
    saved_path, saved_modules, saved_cwd = list(sys.path), set(sys.modules), os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        if cwd is not None:
            for name in set(sys.modules) - saved_modules:
                if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(cwd)):
                    del sys.modules[name]


def _main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse: --help (0) and unknown arguments (2)
        return exc.code if isinstance(exc.code, int) else 1
