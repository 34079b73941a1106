"""One set of number formatters for every renderer: rounding for JSON, percentages and numbers for text."""

from __future__ import annotations

import math
import textwrap
from typing import Any


def rounded(x: Any, digits: int = 6) -> Any:
    """A figure for JSON and CSV: rounded to ``digits`` places, None where unknown or not finite."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), digits)


def number(value: Any, digits: int = 2) -> str:
    """A table cell: ``-`` for None, a float to ``digits`` places, anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fixed(x: Any, spec: str = ".1f", missing: str = "n/a", scale: float = 1.0, suffix: str = "") -> str:
    """A figure as text in ``spec`` (times ``scale``, then ``suffix``); ``missing`` when unknown: None, not a
    number, or not finite."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return missing
    return f"{x * scale:{spec}}{suffix}"


def pct(x: Any, digits: int = 0) -> str:
    """A share (0.42) as a percentage (``42%``); ``n/a`` when unknown (None, NaN) or not finite."""
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{100 * float(x):.{digits}f}%"


TERMINAL_WIDTH = 100  # every line printed for a reader fits this many columns


def fit(text: str, width: int = TERMINAL_WIDTH, indent: str = "    ") -> str:
    """``text`` with each line longer than ``width`` wrapped at word boundaries, its continuation lines
    indented (a single word longer than the width, a long path, stays whole)."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        out.append(textwrap.fill(line, width, initial_indent="", subsequent_indent=lead + indent,
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


def command_lines(command: str, width: int = TERMINAL_WIDTH, lead: str = "") -> str:
    """A shell command wrapped at word boundaries with `` \\`` line continuations, so that it still runs as
    printed when pasted whole; ``lead`` (e.g. ``ship: ``) opens its first line."""
    room = width - 2  # each line but the last ends with " \"
    lines = textwrap.wrap(command, room, initial_indent=lead, subsequent_indent=" " * len(lead) + "    ",
                          break_long_words=False, break_on_hyphens=False)
    return " \\\n".join(lines)
