"""`python -m tuning investigate` on the engine it shares with notebook 06.

Factor declarations and the command's exit codes, files and resume are driven through the seam with a
simulated world (no timing); one end-to-end run in quick mode on a tiny slice (with malformed lines) checks
the files, their agreement and the report.
"""

import csv
import json
import math
import re

import pytest

from tests.helpers import investigate_on
from tests.investigation_run import MALFORMED
from tests.worlds import TARGET_MS, World, seam_kwargs
from tuning.experiments.engine import EngineSettings
from tuning.experiments.factors import MIN_COSINE
from tuning.experiments.ladder import LadderSettings, run_ladder
from tuning.experiments.trial import Trial


def test_on_cuda_the_screen_pins_memory_prefers_bf16_and_captures_graphs_over_buckets(monkeypatch):
    import torch

    from tuning.sim import DeviceChoice

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the world never touches a device
    world = World(noise=0.03, seed=2, rules=[(lambda k: k.batch_size > 1, 1.5), (lambda k: k.dtype != "fp32", 1.3),
                                              (lambda k: k.graph == "cuda_graph", 1.4)])
    gpu = DeviceChoice("cuda", False, "cuda (stub)", "stub GPU")
    kw = {**seam_kwargs(), "accuracy": lambda dtypes: {"fp16": MIN_COSINE - 0.001, "bf16": 0.9999}}
    result = run_ladder(device=gpu, measure=world, progress=False, settings=LadderSettings.quick(workers_min_cores=0),
                        target_p99_ms=TARGET_MS, **kw)
    assert result.screened["workers"] == {"num_workers": LadderSettings().workers, "pin_memory": True}
    assert result.screened["precision"] == {"dtype": "bf16"}
    assert result.screened["graph"]["graph"] == "cuda_graph" and result.screened["graph"]["padding"] == "bucket"
    rec = result.recommended
    assert rec.graph == "cuda_graph" and rec.padding == "bucket" and rec.dtype == "bf16" and rec.batch_size > 1
    assert result.summary()["device"]["kind"] == "cuda"


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="unknown factor"):
        run_ladder(device="cpu", measure=World(), progress=False, factors=("warp_drive",), **seam_kwargs())
    with pytest.raises(ValueError, match="target_p99_ms=0"):
        run_ladder(device="cpu", measure=World(), progress=False, target_p99_ms=0, **seam_kwargs())
    with pytest.raises(ValueError, match="objective='fast'"):
        EngineSettings(objective="fast")
    with pytest.raises(ValueError, match="fractions"):
        EngineSettings(fractions=(0.5, 0.9))


# --- the command: exit codes, files and resume ----------------------------------------------------------

def _cli(monkeypatch, tmp_path, measure, *extra):
    return investigate_on(monkeypatch, tmp_path, measure, *extra, target_ms=TARGET_MS)


def test_exit_3_when_no_configuration_meets_the_target(monkeypatch, tmp_path):
    world = World(noise=0.02, seed=0, floor_ms=lambda k: 2 * TARGET_MS)
    code, stdout, _, out = _cli(monkeypatch, tmp_path, world)
    assert code == 3, stdout[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target_met"] is False and summary["partial"] is False
    assert "TARGET NOT MET" in summary["headline"] and "TARGET NOT MET" in stdout.strip().splitlines()[-1]


def test_exit_1_naming_the_first_error_when_the_baseline_gets_no_answer(monkeypatch, tmp_path):
    def dead(knobs, *, rate=None, record=False, seed=None, window_s=None):
        return Trial(qps=0.0, p99_ms=math.nan, ok=0, errors=20, submitted=20, first_error="error: connection refused")
    code, _, stderr, _ = _cli(monkeypatch, tmp_path, dead)
    assert code == 1 and "connection refused" in stderr


def test_ctrl_c_writes_the_partial_report_and_resume_finishes_it(monkeypatch, tmp_path):
    world = World(noise=0.02, seed=1, rules=[(lambda k: k.tokenizer == "fast", 1.6), (lambda k: k.dtype == "bf16", 1.6)])
    armed = {"at": 8}

    def measure(knobs, **kw):
        if armed["at"] is not None and world.calls >= armed["at"]:
            raise KeyboardInterrupt
        return world(knobs, **kw)
    code, _, _, out = _cli(monkeypatch, tmp_path, measure)
    assert code == 130
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["partial"] is True and "--resume" in summary["headline"]
    page = (out / "report.html").read_text()
    head = page.split("</h1>", 1)[1].split("<section", 1)[0]
    assert "Ship:" not in head and "TARGET NOT MET" not in head  # nothing decided: nothing to ship, nothing missed
    logged = summary["state"]["log"]
    assert len(logged) == 7  # the baseline under the recorder, then seven windows
    assert (out / "experiments.csv").read_text().count("\n") == len(logged) + 1
    armed["at"] = None
    code, _, _, out2 = _cli(monkeypatch, tmp_path, measure, "--resume", str(out))
    done = json.loads((out2 / "summary.json").read_text())
    assert code == 0 and done["partial"] is False and done["stage"] == "done"
    assert done["state"]["log"][:7] == logged
    assert "tokenizer=fast" in done["recommended"]["set_line"] and "dtype=bf16" in done["recommended"]["set_line"]


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
    assert {"batch", "tokenizer", "precision", "target"} <= {s["step"] for s in summary["steps"]}
    assert summary["recommended"]["set_line"].startswith("--preset baseline")


@pytest.mark.slow
def test_summary_agrees_with_experiments_csv(run):
    _, stdout, out = run
    summary = json.loads(stdout)
    with open(out / "experiments.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    log = summary["state"]["log"]
    assert len(rows) == len(log) >= 10
    for row, w in zip(rows, log):
        assert row["stage"] == w["stage"] and row["kind"] == w["kind"]
        assert float(row["qps"]) == pytest.approx(w["qps"], rel=1e-9)
        assert int(row["n"]) == w["n"] and int(row["errors"]) == w["errors"]
    stages = [w["stage"] for w in log]
    assert stages[0] == "screen" and ("confirm" in stages or "target" in stages)


@pytest.mark.slow
def test_malformed_lines_go_through_as_errors(run):
    _, stdout, _ = run
    summary = json.loads(stdout)
    assert summary["data"]["lines"] == 20 and summary["data"]["invalid"] == len(MALFORMED)
    # What one short window holds depends on the machine's pace; what the whole run went through does not: it
    # passes over the 20 lines many times, so its bad lines are among its outcomes, as errors, beside good ones.
    windows = summary["state"]["log"]
    outcomes = sum(w["n"] for w in windows) + summary["before"]["submitted"]
    errors = sum(w["errors"] for w in windows) + summary["before"]["errors"]
    assert outcomes >= 2 * summary["data"]["lines"], outcomes
    assert 0 < errors < outcomes  # bad lines are error outcomes, the rest goes on


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
    assert list(sections)[:2] == ["ship", "decision"]  # top-down: what to ship, then why
    for key in ("trends", "ledger", "decision", "sweep", "what-if"):
        assert key in sections, key
        charts = sections[key].count('<figure class="chart">')
        assert charts >= 1 and sections[key].count("<figcaption>") == charts, key
    assert "--preset baseline" in sections["ship"] and "tuning.preset(" in sections["ship"]
    assert "simulated" in sections["what-if"].lower()
    summary = json.loads(stdout)
    # issue 58, finding 9: the ledger compared a closed loop before with an open loop after; like for like now
    if summary["recommended"]["changes"]:
        assert "Both in a closed loop" in sections["ledger"] and summary["after_same_load"]["qps"] > 0
    else:
        assert "no change was shipped" in sections["ledger"] and summary["after_same_load"] is None
    assert math.isfinite(summary["what_if"]["runs"]["baseline"]["device_busy"])
    cores = summary["what_if"]["host_cores"]["baseline"]  # the cores needed, in the JSON and on the page
    assert cores["simulated"] and cores["cores"] > 0 and cores["processes"] >= 1
    assert "Host cores needed" in sections["what-if"] and "would keep it 70% busy" in sections["what-if"]


def test_the_environment_table_says_each_fact_once_and_has_no_empty_rows():
    """Issue 58, finding 9: the table had empty rows (cuda_version, gpu on a CPU machine) and repeated the
    simulated profile's source (in its source and again in its label) and the device's banner."""
    from tuning.present.html import environment_rows

    source = "datasheet estimate (NVIDIA H200 SXM 141 GB: datasheet peaks)"
    env = {"schema_version": 1, "python": "3.11.7", "cuda_available": False, "cuda_version": None, "gpu": None,
           "device": {"kind": "cpu", "label": "cpu (measured)", "banner": "Running on the CPU: every figure ..."},
           "contended": "another process keeps the cores busy", "machine": {"cpu": {"model": "x"}},
           "sim_profile": {"name": "h200-sxm-estimate", "source": source, "label": f"simulated h200 ({source})",
                           "used_for": "the what-if section"}, "load_average_at_start": []}
    rows = {r["what"]: str(r["value"]) for r in environment_rows(env)}
    assert set(rows) == {"python", "cuda_available", "device", "sim_profile"}
    assert rows["device"] == "cpu (measured)" and rows["sim_profile"].count(source) == 1
    assert all(v not in ("", "None") for v in rows.values())


def test_a_run_whose_answer_may_change_says_so_in_one_line_at_the_top():
    """Issue 58, finding 11: three runs under contention shipped two different lines and nothing said the
    answer was not stable. A run on a busy machine, or one whose two best candidates could not be told apart,
    says so first in the terminal and at the top of the report."""
    from types import SimpleNamespace

    from tuning.experiments.investigate import not_stable

    decision = SimpleNamespace(stage="done", indeterminate=None)
    inv = SimpleNamespace(ladder=SimpleNamespace(decision=decision), environment={})
    assert not_stable(inv) is None
    inv.environment["contended"] = "another process keeps the cores busy"
    assert not_stable(inv).startswith("ANSWER NOT STABLE: the machine was busy with other work;")
    decision.indeterminate = "a and b are within 2% of each other"
    line = not_stable(inv)
    assert "busy with other work and two candidates could not be told apart" in line and "\n" not in line
    decision.stage = "target"  # not decided yet: nothing to call unstable
    assert not_stable(inv) is None


def test_compile_on_a_cpu_is_asked_for_with_a_flag_the_message_names():
    """Issue 58, finding 8: the reason torch.compile was not screened named a Python setting
    (LadderSettings(compile_on_cpu=True)) to a command-line user; it names the flag, and the flag sets it."""
    from tuning.experiments.factors import Context, screened
    from tuning.experiments.investigate import _settings

    _, why = screened(Context(device="cpu", cores=2), ("graph",))
    assert "investigate --compile-on-cpu" in why["graph"] and "LadderSettings" not in why["graph"]
    assert _settings(None, True, compile_on_cpu=True).compile_on_cpu is True
    assert _settings(None, True, compile_on_cpu=None).compile_on_cpu is False
    on, _ = screened(Context(device="cpu", cores=2, compile_on_cpu=True), ("graph",))
    assert on["graph"] == {"graph": "compile"}
