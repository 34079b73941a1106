"""Helpers shared by the bench scripts: machine facts, interleaved rounds, spreads and writing results.

Every bench that compares two or more setups runs them interleaved in ABBA order (``a b c``,
then ``c b a``, ...) so that a drift of the machine (another process, thermal state, page
cache) falls on every arm alike, reports the median with its spread (IQR, min, max and the raw
values), and computes a ratio per round (paired) before taking its median. ``--quick`` runs
check that a script works; their results go to a temporary folder, never to bench/results.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_RESULTS = Path(tempfile.gettempdir()) / "tuning-bench-quick"
MIN_ROUNDS = 5  # fewer interleaved rounds cannot show a spread worth the name
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def machine() -> dict[str, Any]:
    """The machine block of tuning's results (CPU model and flags, native bf16, cores, torch threads, load,
    steal, GPU), plus the versions a bench depends on."""
    import torch

    from tuning.base.machine import machine_info

    return {**machine_info(), "torch": torch.__version__}


def replaced_note(differs: str | None) -> str | None:
    """``same_machine(previous, this)``'s sentence said of the result a write replaces: each pair it names is the
    replaced result's machine first, this run's second."""
    if not differs:
        return None
    return (f"the result this replaces ran on another machine ({differs}; in each pair the replaced result's "
            "first, this run's second)")


def write(name: str, payload: dict[str, Any], quick: bool = False) -> Path:
    """Write ``payload`` (with the machine's facts) as JSON: bench/results/NAME.json, or for a
    ``--quick`` check a temporary folder, so that a check never replaces a measured result."""
    folder = QUICK_RESULTS if quick else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    from tuning.base.machine import same_machine

    this = machine()
    try:
        previous = json.loads(path.read_text()).get("machine") if path.is_file() else None
    except (OSError, ValueError):  # an unreadable old file must not lose the run just measured
        previous = None
    differs = replaced_note(same_machine(previous, this)) if previous is not None else None
    if differs:  # the committed result it replaces came from another machine: a reader comparing them is told
        print(f"note: {differs}", flush=True)
    path.write_text(json.dumps({"machine": this, "quick": quick,
                                **({"previous_result_machine": differs} if differs else {}), **payload},
                               indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path


def check_rounds(rounds: int, quick: bool) -> None:
    if rounds < 1:
        raise SystemExit(f"--rounds {rounds}: give at least 1")
    if rounds < MIN_ROUNDS and not quick:
        print(f"warning: {rounds} rounds; the spread needs at least {MIN_ROUNDS} to mean anything", flush=True)


def interleave(arms: Mapping[str, Callable[[], Any]], rounds: int,
               report: Callable[[int, str, Any], None] | None = None) -> dict[str, list[Any]]:
    """Run every arm once per round, in the given order on even rounds and reversed on odd ones
    (ABBA); returns each arm's raw samples (whatever its callable returns), in round order."""
    names = list(arms)
    samples: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            value = arms[name]()
            samples[name].append(value)
            if report is not None:
                report(r, name, value)
    return samples


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median with its spread: IQR, min, max, the count and the raw values."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "iqr": None, "min": None, "max": None, "n": 0, "values": []}
    ordered = sorted(vals)
    if len(vals) > 1:
        q = statistics.quantiles(vals, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return {"median": statistics.median(vals), "iqr": iqr, "min": ordered[0], "max": ordered[-1], "n": len(vals),
            "values": vals}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """The ratio of two arms per round (paired, so a round's drift cancels), as a :func:`spread`."""
    return spread([a / b for a, b in zip(numerator, denominator)])


def pairs_needed(sd: float, half_width: float, z: float = 1.96, minimum: int = 2) -> int:
    """Pairs for a ``z`` confidence interval of half-width ``half_width`` on the mean of paired
    differences whose standard deviation is ``sd``: ``ceil((z * sd / half_width) ** 2)``."""
    if half_width <= 0:
        raise ValueError(f"half_width={half_width!r} must be > 0")
    return max(minimum, math.ceil((z * sd / half_width) ** 2))


def fmt_spread(s: Mapping[str, Any], digits: int = 2) -> str:
    """``median [min-max] (IQR x, n=N)`` for a printed line."""
    if not s["n"]:
        return "n/a"
    return (f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}] "
            f"(IQR {s['iqr']:.{digits}f}, n={s['n']})")
