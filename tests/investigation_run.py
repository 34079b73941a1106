"""One quick ``investigate`` on 16 short records plus 4 malformed lines, through the CLI with ``--json``, on tiny
ladder settings: the end-to-end run the investigate tests and the browser's report test read (run once per test
run by the ``quick_investigation`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tuning.experiments.engine import EngineSettings
from tuning.experiments.ladder import LadderSettings

TINY = LadderSettings(engine=EngineSettings.quick(window_s=0.4, max_pairs=4, target_outcomes=60, target_max_s=0.8,
                                                  target_min_outcomes=60,
                                                  fractions=(0.9, 0.5)),
                      concurrency=4, warmup_s=0.1, sweep_sizes=(1, 2), sweep_repeats=1, sweep_rounds=1,
                      precision_texts=6, compile_on_cpu=False)
MALFORMED = [b'{"id": "bad-json", "title": ', b'{"id": "no-body", "title": "t", "category": "c"}',
             b'{"id": "empty", "title": "", "category": "", "attributes": {}, "body": "   "}', b"\xff\xfe not utf-8"]


def quick_investigation(folder: Path) -> tuple[int, str, str]:
    """Runs it in ``folder``; returns the exit code, stdout and the output folder."""
    data = folder / "mine.jsonl"
    lines = [json.dumps({"id": f"r{i}", "title": f"Widget {i}", "category": "gadget", "attributes": {"color": "red"},
                         "body": f"Short review number {i}: works fine, cheap."}).encode() for i in range(16)]
    lines[3:3] = MALFORMED[:2]
    lines[9:9] = MALFORMED[2:]
    data.write_bytes(b"\n".join(lines) + b"\n")
    out = folder / "out"
    mp = pytest.MonkeyPatch()
    mp.setattr(LadderSettings, "quick", classmethod(lambda cls, **kw: TINY))
    try:
        done = run_cli("investigate", "--quick", "--data", str(data), "--device", "cpu", "--out", str(out),
                       "--target-p99-ms", "5000", "--json")
    finally:
        mp.undo()
    return done.returncode, done.stdout, str(out)
