"""Plain-text rendering of results for the terminal (charts live in ``tuning.charts``)."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A fixed-width text table."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def format_run(result) -> str:
    """The offline run as a readable block: headline figures, stage ledger, waits, errors."""
    s = result.summary()
    k = result.knobs
    lines = [
        f"knobs: batch_size={k.batch_size} num_workers={k.num_workers} tokenizer={k.tokenizer} padding={k.padding} "
        f"dtype={k.dtype} graph={k.graph} device={k.device}",
        f"requests {s['requests']}  ok {s['ok']}  errors {s['errors']}  truncated {s['truncated']}  batches {s['batches']}",
        f"throughput {s['throughput_rps']:.1f} req/s   model busy {100 * s['model_busy']:.0f}%   "
        f"padding waste {_fmt(s['padding_waste'])}   (window {s['window_s']:.1f} s, warm-up {s['warmup_s']:.1f} s)",
        "",
        "stage ledger (per request, ms; share of the p50 / p99 sums)",
        table([{"stage": st, **v} for st, v in s["stages"].items()], ["stage", "p50_ms", "p99_ms", "share", "share_p99"]),
        "",
        "waits per batch: model waited for input (starvation) vs ready batch waited for the model (back-pressure)",
        table([{"wait": w, **v} for w, v in s["waits"].items()], ["wait", "p50_ms", "p99_ms", "share_of_window"]),
    ]
    if s["error_reasons"]:
        lines += ["", "errors", table(s["error_reasons"], ["count", "reason", "first_lines"])]
    return "\n".join(lines)
