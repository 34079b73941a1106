"""`python -m tuning investigate` and the ladder it shares with notebook 06.

The ladder's rules are driven with a stub measurement (no timing); one end-to-end run in quick
mode on a tiny slice (with malformed lines) checks the files, their agreement and the report.
"""

import csv
import dataclasses
import json
import math
import re

import pytest

from tests.investigation_run import MALFORMED
from tests.verdict_stubs import SmoothStub
from tuning.experiments.ladder import MIN_COSINE, LadderSettings, run_ladder


class Sweep:
    knee = 8


def _stub(rules, floor=None):
    """Capacity 100 req/s times each matching rule's factor, 2% figure noise (tests.verdict_stubs.SmoothStub);
    ``floor(knobs)`` ms are added to every latency."""
    stub = SmoothStub(rules, noise=0.02, seed=1)
    if floor is None:
        return stub

    def measure(knobs, *, rate=None, record=False):
        t = stub(knobs, rate=rate)
        if t.latencies_ms is not None:
            t.latencies_ms = t.latencies_ms + floor(knobs)
            t.p99_ms += floor(knobs)
        return t
    return measure


# quick mode with the light-load pairs before the race (LadderSettings.light_load): what those pairs print and decide
_LIGHT = LadderSettings.quick(light_load=True, race_pairs=None, workers_min_cores=0)


def _ladder(measure, steps, **kw):
    settings = kw.pop("settings", LadderSettings.quick(workers_min_cores=0))  # the step on any host
    kw.setdefault("target_p99_ms", 200.0)
    return run_ladder(device=kw.pop("device", "cpu"), measure=measure, progress=False, settings=settings, steps=steps,
                      sweep=lambda knobs: Sweep(), accuracy=kw.pop("accuracy", lambda dtypes: {"bf16": 0.99999}),
                      lengths=[12, 20, 31, 40, 64, 90], **kw)


def test_a_step_that_does_not_help_is_not_kept():
    measure = _stub([(lambda k: k.num_workers > 2, 0.8), (lambda k: k.tokenizer == "fast", 1.5)])
    ladder = _ladder(measure, ("workers", "tokenizer"), settings=_LIGHT)
    frame = ladder.to_frame().set_index("step")
    assert frame.loc["workers", "status"] == "not kept" and frame.loc["workers", "high"] < 1.05
    assert frame.loc["tokenizer", "status"] == "kept" and frame.loc["tokenizer", "low"] > 1.05
    assert ladder.recommended.num_workers == 2 and ladder.recommended.tokenizer == "fast"
    assert "--set tokenizer=fast" in ladder.set_line() and "num_workers" not in ladder.set_line()
    assert ladder.python_call() == "tuning.preset(\"baseline\", tokenizer='fast')"
    assert ladder.capacity.capacity > 1.3 * ladder.baseline_capacity.capacity


def test_what_is_printed_is_what_was_judged():
    measure = _stub([(lambda k: k.tokenizer == "fast", 1.5)])
    lines = []
    ladder = run_ladder(device="cpu", measure=measure, progress=lines.append, settings=_LIGHT,
                        steps=("tokenizer",), lengths=[10], accuracy=lambda d: {}, sweep=lambda k: Sweep(),
                        target_p99_ms=200.0)
    step = ladder.step("tokenizer")
    f = step.figures
    line = next(x for x in lines if x.startswith("tokenizer"))
    assert f"{f['ratio']:.2f} [{f['low']:.2f}-{f['high']:.2f}] after {f['pairs']} pairs" in line
    assert f["pairs"] >= 3 and f["order"].startswith("AB BA BA")


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
    stub = _stub([(lambda k: k.dtype == "bf16", 2.0)])

    def measure(knobs, *, rate=None, record=False):
        calls.append(knobs)
        return stub(knobs, rate=rate)
    ladder = _ladder(measure, ("precision",), accuracy=lambda dtypes: {"bf16": MIN_COSINE - 0.01})
    step = ladder.step("precision")
    assert step.status == "refused" and "not recommended" in step.reason
    assert ladder.recommended.dtype == "fp32" and all(k.dtype == "fp32" for k in calls)


def test_max_wait_steps_are_judged_one_by_one_at_the_target():
    # 5 ms: +40% capacity (at +20% its capacity, 144 req/s at 200 ms, sits on the race's rate, 1.2 x the
    # reference's failing 120.8: undecided there, rightly)
    measure = _stub([(lambda k: k.batch_size > 1, 1.5), (lambda k: k.max_wait_ms == 5.0, 1.4)],
                    floor=lambda k: 400.0 if k.max_wait_ms == 20.0 else 0.0)
    ladder = _ladder(measure, ("batch", "batching"), settings=dataclasses.replace(_LIGHT, waits_ms=(5.0, 20.0)))
    waits = ladder.waits.set_index("max_wait_ms")
    assert waits.loc[5.0, "status"] == "kept" and waits.loc[20.0, "status"] == "not kept"
    assert "misses the 200 ms target" in ladder.steps[-1].reason
    assert ladder.recommended.max_wait_ms == 5.0


def test_on_cuda_the_ladder_pins_memory_prefers_bf16_and_captures_graphs_even_without_buckets(monkeypatch):
    import torch

    from tuning.sim import DeviceChoice

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the stub never touches a device
    measure = _stub([(lambda k: k.batch_size > 1, 1.5), (lambda k: k.dtype != "fp32", 1.3),
                     (lambda k: k.graph == "cuda_graph", 1.3)])
    gpu = DeviceChoice("cuda", False, "cuda (stub)", "stub GPU")
    ladder = _ladder(measure, ("workers", "batch", "buckets", "precision", "graph"), device=gpu,
                     accuracy=lambda dtypes: {"fp16": MIN_COSINE - 0.001, "bf16": 0.9999})
    assert "pin_memory=true" in ladder.step("workers").change
    assert ladder.step("buckets").status == "not kept"  # buckets alone do nothing here
    precision = ladder.step("precision")
    assert precision.status == "kept" and precision.change == "dtype=bf16" and "fp16: min cosine" in precision.reason
    graph = ladder.step("graph")
    assert graph.status == "kept" and "graph=cuda_graph" in graph.change and "padding=bucket" in graph.change
    assert ladder.recommended.graph == "cuda_graph" and ladder.recommended.padding == "bucket"
    assert ladder.summary()["device"]["kind"] == "cuda"


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="unknown ladder step"):
        _ladder(_stub([]), ("warp_drive",))
    with pytest.raises(ValueError, match="target_p99_ms=0"):
        _ladder(_stub([]), ("workers",), target_p99_ms=0)
    with pytest.raises(ValueError, match="objective='fast'"):
        LadderSettings(objective="fast")


# --- end to end ---------------------------------------------------------------------------------

@pytest.fixture
def run(quick_investigation):
    """One quick investigate on 16 short records plus 4 malformed lines, once per test run (tests/conftest.py)."""
    return quick_investigation


@pytest.mark.slow
def test_quick_run_writes_every_file_and_prints_only_json(run):
    code, stdout, out = run
    summary = json.loads(stdout)  # nothing but the JSON on stdout
    assert code == (0 if summary["target_met"] else 3)
    assert summary["partial"] is False and summary["headline"]
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


@pytest.mark.slow
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
        for eid in step["experiments"]:
            assert by_id[eid]["step"] == step["step"]
        cand = [by_id[i] for i in step["experiments"] if by_id[i]["role"] == "candidate"]
        if cand:  # a step's figures are its candidate's pooled runs
            assert step["p99_ms"] == pytest.approx(cand[0]["p99_ms"]) and step["pairs"] == cand[0]["runs"]


@pytest.mark.slow
def test_malformed_lines_go_through_as_errors(run):
    _, stdout, _ = run
    summary = json.loads(stdout)
    assert summary["data"]["lines"] == 20 and summary["data"]["invalid"] == len(MALFORMED)
    baseline = summary["experiments"][0]
    assert baseline["errors"] > 0 and baseline["ok"] > 0  # bad lines are error outcomes, the rest goes on
    assert summary["before"]["errors"] > 0


@pytest.mark.slow
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
    cores = summary["what_if"]["host_cores"]["baseline"]  # the cores needed, in the JSON and on the page
    assert cores["simulated"] and cores["cores"] > 0 and cores["processes"] >= 1
    assert "Host cores needed" in sections["what-if"] and "would keep it 70% busy" in sections["what-if"]


def test_the_headline_names_what_changed_under_the_ladder_by_its_kind():
    """Quick investigate on this CPU: the bf16 reference passed at 200.4 req/s past the 167.0 its search had failed
    (no steal either time), and the headline said 'then the machine slowed'. It says what happened."""
    from tuning.experiments.investigate import drift_clause

    passed = {"step": "batching", "kind": "passed past its capacity", "capacity_before": 153.18,
              "capacity_after": 200.45, "baseline_searched_again": False}
    text = drift_clause(passed)
    assert "slowed" not in text and "passed past the capacity its search had found" in text
    assert "153.2" in text and "200.4" in text and "batching" in text
    assert "slowed" in drift_clause({**passed, "kind": "slowed"})
    assert "recovered" in drift_clause({**passed, "kind": "recovered"})
    other = drift_clause({**passed, "kind": "something new"})
    assert "passed past" not in other and "slowed" not in other and "something new" in other
