"""`python -m tuning investigate` and the ladder it shares with notebook 06.

The ladder's rules are driven with a stub measurement (no timing); one end-to-end run in quick
mode on a tiny slice (with malformed lines) checks the files, their agreement and the report.
"""

import csv
import json
import math
import re

import pytest

from tuning import cli
from tuning.experiments.ladder import MIN_COSINE, NOISE_FLOOR, LadderSettings, Trial, run_ladder


class Sweep:
    knee = 8


def _stub(rules, p99=None, calls=None):
    """A measurement: QPS 10 times each matching rule's factor; p99 from ``p99(knobs)`` or 1000/QPS s."""
    def measure(knobs):
        if calls is not None:
            calls.append(knobs)
        qps = 10.0
        for test, factor in rules:
            if test(knobs):
                qps *= factor
        return Trial(qps=qps, p99_ms=p99(knobs) if p99 else 10_000 / qps, model_busy=0.5)
    return measure


def _ladder(measure, steps, **kw):
    settings = kw.pop("settings", LadderSettings.quick())
    return run_ladder(device=kw.pop("device", "cpu"), measure=measure, progress=False, settings=settings, steps=steps,
                      sweep=lambda knobs: Sweep(), accuracy=kw.pop("accuracy", lambda dtypes: {"bf16": 0.99999}),
                      lengths=[12, 20, 31, 40, 64, 90], **kw)


def test_a_step_that_does_not_help_is_not_kept():
    measure = _stub([(lambda k: k.num_workers > 2, 0.8), (lambda k: k.tokenizer == "fast", 1.5)])
    ladder = _ladder(measure, ("workers", "tokenizer"))
    frame = ladder.to_frame().set_index("step")
    assert frame.loc["workers", "status"] == "not kept" and "slower" in frame.loc["workers", "reason"]
    assert frame.loc["tokenizer", "status"] == "kept"
    assert frame.loc["tokenizer", "gain"] == pytest.approx(0.5)
    assert ladder.recommended.num_workers == 2 and ladder.recommended.tokenizer == "fast"
    assert "--set tokenizer=fast" in ladder.set_line() and "num_workers" not in ladder.set_line()
    assert ladder.python_call() == "tuning.preset(\"baseline\", tokenizer='fast')"


def test_a_gain_within_the_spread_is_repeated_then_not_kept():
    calls = []
    measure = _stub([(lambda k: k.tokenizer == "fast", 1 + NOISE_FLOOR / 2)], calls=calls)
    settings = LadderSettings.quick()
    ladder = _ladder(measure, ("tokenizer",), settings=settings)
    step = ladder.step("tokenizer")
    assert step.status == "not kept" and "within the spread" in step.reason
    assert step.experiment.runs == 1 + settings.repeats  # repeated before it was judged
    assert step.reference.runs == 2 + settings.repeats  # baseline twice, then once per repeat, interleaved
    assert [k.tokenizer for k in calls] == ["naive", "naive", "fast", "naive", "fast"]
    assert ladder.recommended.tokenizer == "naive"


def test_bucket_step_brings_the_knee_batch_when_batching_lost_alone():
    measure = _stub([(lambda k: k.batch_size > 1 and k.padding == "dynamic", 0.7),
                     (lambda k: k.batch_size > 1 and k.padding == "bucket", 1.4)])
    ladder = _ladder(measure, ("batch", "buckets"))
    assert ladder.step("batch").status == "not kept"
    buckets = ladder.step("buckets")
    assert buckets.status == "kept" and "batch_size=8" in buckets.change and "two knobs" in buckets.reason
    assert ladder.recommended.batch_size == 8 and ladder.recommended.padding == "bucket"


def test_half_precision_under_the_cosine_threshold_is_not_recommended():
    calls = []
    measure = _stub([(lambda k: k.dtype == "bf16", 2.0)], calls=calls)
    ladder = _ladder(measure, ("precision",), accuracy=lambda dtypes: {"bf16": MIN_COSINE - 0.01})
    step = ladder.step("precision")
    assert step.status == "refused" and "not recommended" in step.reason
    assert ladder.recommended.dtype == "fp32" and all(k.dtype == "fp32" for k in calls)


def test_a_faster_step_that_breaks_the_p99_target_is_not_kept():
    measure = _stub([(lambda k: k.tokenizer == "fast", 2.0)], p99=lambda k: 900.0 if k.tokenizer == "fast" else 500.0)
    ladder = _ladder(measure, ("tokenizer",), target_p99_ms=800.0)
    step = ladder.step("tokenizer")
    assert step.status == "not kept" and "over the 800 ms target" in step.reason


def test_max_wait_is_the_best_qps_under_the_p99_target():
    measure = _stub([(lambda k: k.batch_size > 1, 1.5), (lambda k: k.max_wait_ms == 5.0, 1.2),
                     (lambda k: k.max_wait_ms == 20.0, 1.6)],
                    p99=lambda k: 2000.0 if k.max_wait_ms == 20.0 else 400.0)
    ladder = _ladder(measure, ("batch", "batching"))
    step = ladder.step("batching")
    assert step.status == "kept" and step.change == "max_wait_ms=5.0" and len(step.candidates) == 2
    assert ladder.recommended.max_wait_ms == 5.0
    assert list(ladder.waits.max_wait_ms) == [0.0, 5.0, 20.0]


def test_on_cuda_the_ladder_pins_memory_prefers_fp16_and_captures_graphs(monkeypatch):
    import torch

    from tuning.sim import DeviceChoice

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the stub never touches a device
    measure = _stub([(lambda k: k.batch_size > 1, 1.5), (lambda k: k.padding == "bucket", 1.2),
                     (lambda k: k.dtype != "fp32", 1.3), (lambda k: k.graph == "cuda_graph", 1.3)])
    gpu = DeviceChoice("cuda", False, "cuda (stub)", "stub GPU")
    ladder = _ladder(measure, ("workers", "batch", "buckets", "precision", "graph"), device=gpu,
                     accuracy=lambda dtypes: {"fp16": MIN_COSINE - 0.001, "bf16": 0.9999})
    assert "pin_memory=true" in ladder.step("workers").change
    precision = ladder.step("precision")
    assert precision.status == "kept" and precision.change == "dtype=bf16" and "fp16: min cosine" in precision.reason
    assert ladder.step("graph").change == "graph=cuda_graph" and ladder.step("graph").status == "kept"
    assert ladder.recommended.graph == "cuda_graph" and ladder.recommended.padding == "bucket"
    assert ladder.summary()["device"]["kind"] == "cuda"


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="unknown ladder step"):
        _ladder(_stub([]), ("warp_drive",))
    with pytest.raises(ValueError, match="target_p99_ms=0"):
        _ladder(_stub([]), ("workers",), target_p99_ms=0)


# --- end to end ---------------------------------------------------------------------------------

TINY = LadderSettings(concurrency=4, duration_s=0.4, warmup_s=0.1, repeats=0, sweep_sizes=(1, 2), sweep_repeats=1,
                      sweep_rounds=1, waits_ms=(5.0,), precision_texts=6, compile_on_cpu=False)
MALFORMED = [b'{"id": "bad-json", "title": ', b'{"id": "no-body", "title": "t", "category": "c"}',
             b'{"id": "empty", "title": "", "category": "", "attributes": {}, "body": "   "}', b"\xff\xfe not utf-8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One quick investigate on 16 short records plus 4 malformed lines, through the CLI with --json."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("investigate")
    data = tmp / "mine.jsonl"
    lines = [json.dumps({"id": f"r{i}", "title": f"Widget {i}", "category": "gadget", "attributes": {"color": "red"},
                         "body": f"Short review number {i}: works fine, cheap."}).encode() for i in range(16)]
    lines[3:3] = MALFORMED[:2]
    lines[9:9] = MALFORMED[2:]
    data.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp / "out"
    mp = pytest.MonkeyPatch()
    mp.setattr(LadderSettings, "quick", classmethod(lambda cls: TINY))
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            code = cli.main(["investigate", "--quick", "--data", str(data), "--device", "cpu", "--out", str(out),
                             "--json"])
    finally:
        mp.undo()
    return code, stdout.getvalue(), out


@pytest.mark.slow
def test_quick_run_writes_every_file_and_prints_only_json(run):
    code, stdout, out = run
    assert code == 0
    summary = json.loads(stdout)  # nothing but the JSON on stdout
    for name in ("report.html", "experiments.csv", "summary.json", "environment.json"):
        assert (out / name).stat().st_size > 0, name
    assert summary == json.loads((out / "summary.json").read_text())
    env = json.loads((out / "environment.json").read_text())
    assert {"torch", "cpu_model", "torch_threads", "device", "sim_profile"} <= set(env)
    assert summary["device"]["kind"] == "cpu" and summary["quick"] is True
    assert summary["schema_version"] == env["schema_version"] == 1  # the result contract, in the files too
    assert {"kind", "name", "profile", "source"} <= set(summary["device"])
    assert [s["step"] for s in summary["steps"]][:3] == ["baseline", "workers", "batch"]
    assert summary["recommended"]["set_line"].startswith("--preset baseline")


def test_summary_agrees_with_experiments_csv(run):
    _, stdout, out = run
    summary = json.loads(stdout)
    with open(out / "experiments.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(summary["experiments"]) >= 2
    for row, exp in zip(rows, summary["experiments"]):
        assert set(row) == set(exp)
        for key, value in exp.items():
            if value is None:
                assert row[key] == "", key
            elif isinstance(value, bool):
                assert row[key] == str(value), key
            elif isinstance(value, (int, float)):
                assert float(row[key]) == pytest.approx(value, rel=1e-9), key
            else:
                assert row[key] == str(value), key
        assert exp["submitted"] == exp["ok"] + exp["errors"] + exp["timeouts"] + exp["rejected"]
    by_id = {e["experiment"]: e for e in summary["experiments"]}
    for step in summary["steps"]:
        if step["experiment"] is not None:
            assert step["qps"] == by_id[step["experiment"]]["qps"]


def test_malformed_lines_go_through_as_errors(run):
    _, stdout, _ = run
    summary = json.loads(stdout)
    assert summary["data"]["lines"] == 20 and summary["data"]["invalid"] == len(MALFORMED)
    baseline = summary["experiments"][0]
    assert baseline["errors"] > 0 and baseline["ok"] > 0  # bad lines are error outcomes, the rest goes on
    assert summary["before"]["errors"] > 0


def test_report_is_offline_with_a_chart_per_section(run):
    _, stdout, out = run
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert not re.search(r"@import\s+url\(\s*[\"']?(https?:)?//", page, re.I)
    assert page.count("<script") >= 2 and "chart unavailable" not in page
    assert len(re.findall(r"Plotly\.newPlot", page)) >= 5
    sections = dict(re.findall(r'<section id="([\w-]+)" data-section="[\w-]+">(.*?)</section>', page, re.S))
    for key in ("trends", "ledger", "ladder", "sweep", "what-if"):
        assert key in sections, key
        charts = sections[key].count('<figure class="chart">')
        assert charts >= 1 and sections[key].count("<figcaption>") == charts, key
    assert "--preset baseline" in sections["ship"] and "tuning.preset(" in sections["ship"]
    assert "simulated" in sections["what-if"].lower()
    summary = json.loads(stdout)
    assert math.isfinite(summary["what_if"]["runs"]["baseline"]["device_busy"])
