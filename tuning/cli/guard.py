"""What every command of the CLI shares for a newcomer: quiet output, one-line errors, Ctrl-C that keeps
what was measured. (The verdict sentences computed from each table's numbers are in :mod:`tuning.present.verdicts`.)

Kept apart from :mod:`tuning.cli.commands` (which declares the commands) so the policies live in one place.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import threading
import warnings
from typing import Any, Iterator


class Exit(enum.IntEnum):
    """Every exit status of the CLI, so that a script (or CI) can tell a miss from a mistake by the number alone."""

    OK = 0  # done
    NOTHING = 1  # nothing achieved: no valid input, no answer, nothing measured
    USAGE = 2  # a bad flag or value (one line names it and the fix)
    TARGET_MISSED = 3  # investigate/tune: no configuration met the p99 target, or its claim did not hold
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: what was measured so far is kept


EXIT_MEANINGS = {Exit.OK: "done", Exit.NOTHING: "nothing achieved (no valid input, no answer)",
                 Exit.USAGE: "usage error",
                 Exit.TARGET_MISSED: "investigate or tune: no configuration met the p99 target, or its claim "
                                     "could not be held (the report shows the closest)",
                 Exit.INTERRUPTED: "interrupted (Ctrl-C; what was measured is kept)"}

EXIT_NOTHING, EXIT_INTERRUPTED = Exit.NOTHING, Exit.INTERRUPTED  # the names tests/test_tune.py imports

DATA_FORMATS = ("accepted: record JSONL (one JSON object a line with id, title, category, attributes, body), "
                "JSONL with a text field ({\"text\": ...}, or --text-field NAME), CSV/TSV/Parquet with a text column "
                "(--text-column NAME), or plain text with one request per line (.txt, or --format text)")

GLOSSARY = {
    "truncated": "inputs longer than max_length tokens, cut to max_length (their tail is not embedded)",
    "wait_for_input": "a batch's wait for its inputs: the model idle, starved by reading/tokenizing",
    "wait_for_model": "a ready batch's wait for the model: the model is the bottleneck (back-pressure)",
    "queue_wait": "(server) time a request waits before a batch takes it",
    "padding waste": "share of the model's tokens that are padding: 1 - real tokens / padded tokens",
    "mean batch": "requests per model call; below batch_size when max_wait_ms expires before the batch fills "
                  "(too few requests in flight): raise concurrency or max_wait_ms",
    "model busy": "share of the measured window the model was running",
    "knee": "the smallest batch within 5% of the best per-sample cost",
    "stage ledger": "a request's time split by stage (read, preprocess, queue_wait, inference, ...), p50 and p99",
    "throughput": "ok answers per second under a closed loop (a fixed number of clients); QPS in tables",
    "capacity": "the highest Poisson arrival rate whose open-loop p99 (from the scheduled arrival, every "
                "outcome) is within the target with errors within the budget",
    "screen": "the engine's first stage: the knobs tried together in a factorial design, on throughput",
    "confirmation": "the second: a candidate against the baseline on fresh interleaved pairs, a group-sequential test that "
                    "stops once the answer is clear (docs/deciding.md)",
    "target check": "the confirmed candidates and the baseline offered descending rates, open loop: their "
                    "capacities",
}


def _glossary(width: int = 100, column: int = 21) -> str:
    """The terms as the top-level help prints them: each definition wrapped to ``width`` beside its term."""
    import textwrap

    lines = ["terms:"]
    for term, text in GLOSSARY.items():
        lines += textwrap.wrap(text, width, initial_indent=f"  {term:<{column - 2}}", subsequent_indent=" " * column)
    return "\n".join(lines)


TERMS = _glossary()

EXIT_CODES = "exit codes:\n" + "\n".join(f"  {int(code):<17d}  {text}" for code, text in EXIT_MEANINGS.items())


class NothingAchieved(Exception):
    """A run that measured nothing (no valid input, no answer from the URL): exit 1 with one line."""


# -- quiet by default ---------------------------------------------------------------------------------------

NATIVE_NOISE = ("USDT:",)  # torch's profiler (kineto) prints profiler_start/stop lines on fd 2


@contextlib.contextmanager
def filter_native_stderr(prefixes: tuple[str, ...] = NATIVE_NOISE) -> Iterator[None]:
    """Drop lines that native libraries write straight to file descriptor 2 and that start with one of
    ``prefixes``; every other line (Python's included) passes through unchanged."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:  # no real fd 2 (embedded use): nothing to filter
        yield
        return
    encoded = tuple(p.encode() for p in prefixes)

    def pump() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as src:
            pending = b""
            while chunk := src.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out = b"".join(line + b"\n" for line in lines if not line.startswith(encoded))
                if out:
                    os.write(saved, out)
            if pending and not pending.startswith(encoded):
                os.write(saved, pending)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer here closes; children that still hold it end it later
        thread.join(timeout=1.0)
        os.close(saved) if not thread.is_alive() else None


@contextlib.contextmanager
def warning_policy(verbose: bool) -> Iterator[None]:
    """Quiet (default): third-party deprecation warnings hidden, every other warning as one ``note:`` line
    (once per message). Verbose: Python's default filters and format, with file and line."""
    with warnings.catch_warnings():
        if verbose:
            warnings.simplefilter("default")
            yield
            return
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        seen: set[str] = set()

        def note(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            text = " ".join(str(message).split())
            if text not in seen:
                seen.add(text)
                print(f"note: {text}", file=sys.stderr, flush=True)

        warnings.showwarning = note
        yield


# -- verdicts -------------------------------------------------------------------------------------------------


