"""The files of ``investigate --url`` / ``--cmd``: ``summary.json`` and ``report.html``, rewritten whole after
every window (Ctrl-C or a crash leaves the last complete pair)."""

from __future__ import annotations

import json
from typing import Any

from tuning.base.contract import with_schema
from tuning.experiments.service import REPORT, SUMMARY
from tuning.present.html import render_service


def write_service_files(inv: Any) -> None:
    """``summary.json`` and ``report.html`` of ``inv`` (a ServiceInvestigation) in ``inv.out``, each replaced
    whole (never half a file); nothing without an ``out``."""
    if inv.out is None:
        return
    inv.out.mkdir(parents=True, exist_ok=True)
    summary = inv.summary()
    for name, text in ((SUMMARY, json.dumps(with_schema(summary), indent=2, default=str)),
                       (REPORT, render_service(summary, resume_dir=inv.out))):
        tmp = inv.out / f"{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(inv.out / name)
