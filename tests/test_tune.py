"""``tune``: a service started from a command line per configuration, measured by its capacity at the target,
stopped with its whole process group; a configuration that fails is its own error and the rest go on."""

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from tuning import cli
from tuning.experiments.tune import fill, parse_space

APP = Path(__file__).parent / "apps" / "queue_service.py"


def test_space_and_placeholders_are_checked():
    assert parse_space(["batch=1,4", "timeout=0.01"]) == {"batch": ["1", "4"], "timeout": ["0.01"]}
    with pytest.raises(ValueError, match="name=v1,v2"):
        parse_space(["batch"])
    with pytest.raises(ValueError, match="port"):
        parse_space(["port=1,2"])
    assert fill("serve --port {port} --b {batch}", {"batch": "8"}, 9000) == "serve --port 9000 --b 8"


def _run(*argv):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.mark.slow
def test_tune_finds_the_faster_configuration_and_reports_a_crash(tmp_path):
    code, out, err = _run("tune", "--cmd", f"{sys.executable} {APP} --port {{port}} --service-ms {{ms}} --crash {{crash}}",
                          "--space", "ms=4,16", "--space", "crash=no,yes", "--url", "http://127.0.0.1:{port}/predict",
                          "--body", '{"input": "{text}"}', "--target-p99-ms", "200", "--quick", "--limit", "20",
                          "--startup-timeout", "60", "--out", str(tmp_path), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["search"] == "exhaustive" and s["configurations"] == 4
    rows = {(r["ms"], r["crash"]): r for r in s["rows"]}
    assert rows[("4", "yes")]["error"] and "configuration refused" in rows[("4", "yes")]["error"]
    fast, slow = rows[("4", "no")], rows[("16", "no")]
    assert fast["capacity"] > 1.5 * slow["capacity"]  # 4 ms against 16 ms of service: about 4x
    assert s["best"]["ms"] == "4" and "--service-ms 4" in s["best"]["command"]
    c = s["confirmation"]  # raced against the runner-up, each server restarted as the pairs went
    assert c["runner_up"] == {"ms": "16", "crash": "no"} and c["confirmed"], c
    assert json.loads((tmp_path / "tune.json").read_text())["configurations"] == 4


def _searched(stub, configs, target=100.0):
    from tuning.experiments.capacity import CapacitySettings, capacity_at_target
    from tuning.experiments.tune import TuneResult, TuneRow

    rows = []
    for values in configs:
        closed = stub(values)
        cap = capacity_at_target(stub, values, target, saturation=closed.qps, settings=CapacitySettings.quick())
        rows.append(TuneRow(values, f"serve --ms {values['ms']}", cap))
    return TuneResult({"ms": [c["ms"] for c in configs]}, rows, "exhaustive", target)


def test_the_best_is_confirmed_against_the_runner_up_in_interleaved_pairs():
    """Two capacities searched one after the other are unpaired: the best must hold where the runner-up failed,
    in the same pairs. A 2x faster configuration does; two identical ones are tied, whichever came out ahead."""
    from tests.verdict_stubs import QueueStub
    from tuning.experiments.tune import TuneSettings, confirm_best

    settings = TuneSettings.quick()
    fast = QueueStub([(lambda v: v["ms"] == "4", 2.0)], base_rate=50.0, noise=0.03, seed=1)
    result = _searched(fast, [{"ms": "8"}, {"ms": "4"}])
    c = confirm_best(result, fast, settings)
    assert c.best == {"ms": "4"} and c.runner_up == {"ms": "8"} and c.confirmed, c
    assert c.rate == pytest.approx(1.2 * result.rows[0].capacity.high) and 2 <= c.pairs <= settings.confirm_pairs
    assert c.sentence(100.0).startswith("confirmed against the runner-up ms=8")
    result.confirmation = c
    assert result.summary()["confirmation"]["confirmed"] is True

    for seed in range(4):
        same = QueueStub([], base_rate=50.0, noise=0.05, seed=seed)
        tied = _searched(same, [{"ms": "8"}, {"ms": "4"}])
        c = confirm_best(tied, same, settings)
        assert not c.confirmed, (seed, c)
        assert "NOT DISTINGUISHABLE" in c.sentence(100.0)


def test_one_configuration_that_met_the_target_has_nothing_to_confirm():
    from tests.verdict_stubs import QueueStub
    from tuning.experiments.tune import TuneSettings, confirm_best

    stub = QueueStub([], base_rate=50.0, noise=0.0)
    assert confirm_best(_searched(stub, [{"ms": "8"}]), stub, TuneSettings.quick()) is None


# --- charts and the page ----------------------------------------------------------------------------

def _three_configurations():
    """ms=4 twice as fast as ms=8; ms=16's server failed (an error row, no capacity)."""
    from tests.verdict_stubs import QueueStub
    from tuning.experiments.tune import TuneRow

    stub = QueueStub([(lambda v: v["ms"] == "4", 2.0)], base_rate=50.0, noise=0.0, seed=1)
    result = _searched(stub, [{"ms": "8"}, {"ms": "4"}])
    result.space = {"ms": ["8", "4", "16"]}
    result.rows.append(TuneRow({"ms": "16"}, "serve --ms 16", None, "the server exited with 2 before it answered; "
                                                                   "its output ends:\nconfiguration refused"))
    return result


def test_tune_charts_draw_each_configuration_from_the_result_and_from_tune_json():
    from tuning import viz

    result = _three_configurations()
    assert result.best.values == {"ms": "4"}
    loaded = json.loads(json.dumps(result.summary(), default=str))  # tune.json, as read back
    for source in (result, loaded):
        fig = viz.tune_probes_chart(source)
        assert [t.name for t in fig.data] == ["ms=8", "ms=4 (best)"]  # one trace per probed configuration
        assert all(t.mode == "lines+markers" and len(t.x) == len(t.y) >= 2 for t in fig.data)
        probes = result.rows[1].capacity.probes
        assert sorted(fig.data[1].x) == pytest.approx(sorted(p.rate for p in probes), rel=1e-4)
        assert [s.y0 for s in fig.layout.shapes] == [100.0]  # the target, horizontal
        assert fig.layout.shapes[0].y0 == fig.layout.shapes[0].y1
        assert fig.layout.xaxis.title.text == "offered Poisson rate (req/s)"
        assert "(ms)" in fig.layout.yaxis.title.text
        assert "1 configuration without probes (errors)" in fig.layout.title.text

        cap = viz.tune_capacity_chart(source)
        traces = {t.name: t for t in cap.data}
        assert set(traces) == {"best", "met the target", "error"}
        assert list(traces["best"].x) == ["ms=4"]
        assert traces["best"].y[0] == pytest.approx(result.rows[1].capacity.capacity, rel=1e-3)
        up = traces["best"].error_y.array[0]  # the bracket: up to the lowest failing rate
        assert up == pytest.approx(result.rows[1].capacity.high - result.rows[1].capacity.capacity, rel=1e-2)
        assert list(traces["error"].x) == ["ms=16"] and "configuration refused" not in traces["error"].hovertext[0]
        assert "the server exited with 2" in traces["error"].hovertext[0]
        assert [a.text for a in cap.layout.annotations] == ["best"]
        assert cap.layout.xaxis.title.text == "configuration (ms)"
        assert cap.layout.yaxis.title.text == "capacity at p99 ≤ 100 ms (req/s)"
        assert "best ms=4" in cap.layout.title.text and "1 error" in cap.layout.title.text
    with pytest.raises(TypeError, match="tune result"):
        viz.tune_capacity_chart(42)


def test_tune_charts_of_nothing_measured_say_so():
    from tuning import viz
    from tuning.experiments.tune import TuneResult

    empty = TuneResult({"ms": ["4"]}, [], "exhaustive", 100.0)
    assert not viz.tune_probes_chart(empty).data
    assert "no configuration met the target" in viz.tune_capacity_chart(empty).layout.title.text


def test_tune_html_has_the_table_and_both_charts():
    from tuning.present.html import render_tune

    result = _three_configurations()
    page = render_tune(result.summary())
    assert page.startswith("<!DOCTYPE html>") and "<script src" not in page and "chart unavailable" not in page
    assert 'id="chart-0"' in page and 'id="chart-1"' in page and "<table>" in page
    assert "serve --ms 4" in page and "configuration refused" in page and "TARGET NOT MET" not in page
    result.interrupted = True
    assert "--resume out/here" in render_tune(result, resume_dir="out/here")


# --- Ctrl-C and --resume ------------------------------------------------------------------------------

class _FakeConfigs:
    """Stands in for ``measure_config``: a configuration's capacity from a queue stub (ms=4 twice as fast),
    counting what was measured; ``stop_at``: the configuration at which Ctrl-C comes."""

    def __init__(self, stop_at=None, fail=None):
        from tests.verdict_stubs import QueueStub

        self.stub = QueueStub([(lambda v: v["ms"] == "4", 2.0)], base_rate=50.0, noise=0.0, seed=1)
        self.measured, self.stop_at, self.fail = [], stop_at, fail  # fail: the configuration whose server dies

    def __call__(self, cmd, values, url, bodies, api, target_p99_ms, settings, ready_url, say):
        from tuning.experiments.capacity import CapacitySettings, capacity_at_target
        from tuning.experiments.tune import TuneRow, fill

        if values == self.stop_at:
            raise KeyboardInterrupt
        self.measured.append(dict(values))
        if values == self.fail:
            return TuneRow(dict(values), fill(cmd, values, 9000), None, "the server exited with 1 before it answered; "
                           "its output ends:\nout of memory")
        closed = self.stub(values)
        cap = capacity_at_target(self.stub, values, target_p99_ms, saturation=closed.qps, settings=CapacitySettings.quick())
        return TuneRow(dict(values), fill(cmd, values, 9000), cap, peak_memory_mb=100.0, load_tests=len(cap.probes) + 1)


TUNE_ARGS = ("tune", "--cmd", "serve --port {port} --ms {ms}", "--space", "ms=8,4,2", "--url",
             "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}', "--target-p99-ms", "100", "--quick",
             "--limit", "5", "--confirm-pairs", "0")


def test_ctrl_c_keeps_what_was_measured_and_resume_measures_only_the_rest(tmp_path, monkeypatch):
    from tuning.cli.guard import EXIT_INTERRUPTED
    from tuning.experiments import tune

    cut = _FakeConfigs(stop_at={"ms": "2"})
    monkeypatch.setattr(tune, "measure_config", cut)
    code, out, err = _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    assert code == EXIT_INTERRUPTED, err
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["interrupted"] and [r["ms"] for r in saved["rows"]] == ["8", "4"] and cut.measured == [{"ms": "8"}, {"ms": "4"}]
    assert saved["cmd"] == "serve --port {port} --ms {ms}" and saved["api"]["name"] == "custom"
    assert "INTERRUPTED" in (tmp_path / "tune.html").read_text()

    rest = _FakeConfigs()
    monkeypatch.setattr(tune, "measure_config", rest)
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 0, err
    assert rest.measured == [{"ms": "2"}]  # only the missing configuration
    assert "(resumed) ms=8" in err and "(resumed) ms=4" in err
    assert "3 configurations" in out and "2 from the earlier run" in out and "earlier run" in out
    final = json.loads((tmp_path / "tune.json").read_text())  # --resume without --out goes on writing there
    assert not final["interrupted"] and final["configurations"] == 3 and final["resumed"] == 2
    assert [(r["ms"], r["resumed"]) for r in final["rows"]] == [("8", True), ("4", True), ("2", False)]
    for before, after in zip(saved["rows"], final["rows"]):
        assert {k: v for k, v in before.items() if k != "resumed"} == {k: v for k, v in after.items() if k != "resumed"}
    assert final["capacities"]["ms=4"]["probes"] == saved["capacities"]["ms=4"]["probes"]
    assert final["best"]["ms"] == "4"
    page = (tmp_path / "tune.html").read_text()
    assert "INTERRUPTED" not in page and 'id="chart-1"' in page

    again = _FakeConfigs()  # everything measured: nothing runs again
    monkeypatch.setattr(tune, "measure_config", again)
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path), "--out", str(tmp_path / "copy"), "--json")
    assert code == 0 and again.measured == [], err
    assert json.loads(out)["configurations"] == 3 and (tmp_path / "copy" / "tune.json").is_file()


@pytest.mark.parametrize("change, named", [
    (("--cmd", "serve --port {port} --ms {ms} --fast"), "--cmd: that run had 'serve --port {port} --ms {ms}'"),
    (("--space", "ms=8,4"), "--space: that run had --space ms=8,4,2, this one --space ms=8,4"),
    (("--target-p99-ms", "50"), "--target-p99-ms: that run had 100.0, this one 50.0"),
    (("--url", "http://127.0.0.1:{port}/other"), "--url"),
    (("--body", '{"text": "{text}"}'), "the API"),
    (("--limit", "4"), "the requests (--data, --limit, the text field): that run sent 5"),  # other texts
])
def test_resume_refuses_a_run_with_other_settings_and_names_the_difference(tmp_path, monkeypatch, change, named):
    from tuning.experiments import tune

    monkeypatch.setattr(tune, "measure_config", _FakeConfigs(stop_at={"ms": "4"}))
    _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    fresh = _FakeConfigs()
    monkeypatch.setattr(tune, "measure_config", fresh)
    args = list(TUNE_ARGS)
    i = args.index(change[0])
    args[i + 1] = change[1]
    code, out, err = _run(*args, "--resume", str(tmp_path))
    assert code == 2 and fresh.measured == [], err
    assert "cannot resume" in err and named in err, err


@pytest.mark.parametrize("then, now", [(True, False), (False, True)])
def test_resume_refuses_a_run_with_the_other_quick_setting(tmp_path, monkeypatch, then, now):
    """--quick changes the load windows: capacities measured with and without it are not comparable."""
    from tuning.experiments import tune

    without_quick = [a for a in TUNE_ARGS if a != "--quick"]
    monkeypatch.setattr(tune, "measure_config", _FakeConfigs(stop_at={"ms": "4"}))
    _run(*(TUNE_ARGS if then else without_quick), "--out", str(tmp_path), "--json")
    fresh = _FakeConfigs()
    monkeypatch.setattr(tune, "measure_config", fresh)
    code, out, err = _run(*(TUNE_ARGS if now else without_quick), "--resume", str(tmp_path))
    assert code == 2 and fresh.measured == [], err
    had, has = ("--quick", "no --quick") if then else ("no --quick", "--quick")
    assert f"--quick: that run had {had}, this one {has}" in err, err
    assert ("add --quick" if then else "drop --quick") in err and "run without --resume" in err, err


def test_resume_refuses_a_tune_json_that_does_not_record_quick(tmp_path, monkeypatch):
    from tuning.experiments import tune

    monkeypatch.setattr(tune, "measure_config", _FakeConfigs(stop_at={"ms": "4"}))
    _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    saved = json.loads((tmp_path / "tune.json").read_text())
    del saved["quick"], saved["windows"]  # as written before tune.json recorded them
    (tmp_path / "tune.json").write_text(json.dumps(saved))
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 2 and "does not record whether --quick was given" in err, err


def test_resume_measures_again_the_configurations_that_errored(tmp_path, monkeypatch):
    """A server that never came up (or crashed) in the earlier run is retried, not kept as an error."""
    from tuning.experiments import tune

    first = _FakeConfigs(stop_at={"ms": "2"}, fail={"ms": "8"})
    monkeypatch.setattr(tune, "measure_config", first)
    _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert [(r["ms"], bool(r["error"])) for r in saved["rows"]] == [("8", True), ("4", False)]

    rest = _FakeConfigs()
    monkeypatch.setattr(tune, "measure_config", rest)
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 0, err
    assert rest.measured == [{"ms": "8"}, {"ms": "2"}]  # the error again, then the missing one
    assert "(resumed) ms=4" in err and "(resumed) ms=8" not in err
    assert "ms=8: an error in the earlier run (the server exited with 1 before it answered), measured again" in err, err
    assert "1 from the earlier run" in out and "2 measured now (1 of them again: an error in the earlier run)" in out
    final = json.loads((tmp_path / "tune.json").read_text())
    assert final["resumed"] == 1 and final["retried"] == 1 and final["configurations"] == 3
    assert {r["ms"]: (r["resumed"], r["error"]) for r in final["rows"]} == {"4": (True, None), "8": (False, None),
                                                                            "2": (False, None)}


def test_a_configuration_that_crashed_while_measured_is_not_the_best():
    """Its capacity was measured on a dying server: the row is an error, never the one to ship or race."""
    from tests.verdict_stubs import QueueStub
    from tuning.experiments.tune import TuneSettings, confirm_best

    stub = QueueStub([(lambda v: v["ms"] == "4", 2.0)], base_rate=50.0, noise=0.0, seed=1)
    result = _searched(stub, [{"ms": "8"}, {"ms": "4"}])
    result.rows[1].error = "the server exited with -9 while measured; its output ends: Killed"
    assert result.rows[1].capacity.met and result.best is result.rows[0]
    assert result.summary()["best"]["ms"] == "8"
    assert confirm_best(result, stub, TuneSettings.quick()) is None  # one configuration left that met the target
    from tuning import viz
    from tuning.present.html import tune_capacity_sentence

    traces = {t.name: list(t.x) for t in viz.tune_capacity_chart(result).data}
    assert traces == {"best": ["ms=8"], "error": ["ms=4"]}, traces
    assert tune_capacity_sentence(result.summary()).startswith("1 of 2 configurations met p99 ≤ 100 ms, 1 failed")


def test_resume_needs_an_earlier_tune_json(tmp_path):
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 2 and "no tune.json there" in err


@pytest.mark.slow
def test_a_partial_tune_json_is_resumed_against_a_real_service(tmp_path):
    """The queue service over ms=4,16: tune.json as it stood after the first configuration (what Ctrl-C
    leaves), resumed: only ms=16's server is started, and the table holds both."""
    argv = ("tune", "--cmd", f"{sys.executable} {APP} --port {{port}} --service-ms {{ms}}", "--space", "ms=4,16",
            "--url", "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}', "--target-p99-ms", "200",
            "--quick", "--limit", "20", "--startup-timeout", "60", "--confirm-pairs", "0")
    code, out, err = _run(*argv, "--out", str(tmp_path), "--json")
    assert code == 0, err
    full = json.loads((tmp_path / "tune.json").read_text())
    partial = {**full, "rows": full["rows"][:1], "capacities": {"ms=4": full["capacities"]["ms=4"]},
               "configurations": 1, "interrupted": True, "best": None}
    (tmp_path / "tune.json").write_text(json.dumps(partial))
    code, out, err = _run(*argv, "--resume", str(tmp_path))
    assert code == 0, err
    started = [line for line in err.splitlines() if line.startswith("starting: ")]
    assert len(started) == 1 and "--service-ms 16" in started[0], err
    assert "1 from the earlier run" in out
    s = json.loads((tmp_path / "tune.json").read_text())
    assert s["configurations"] == 2 and s["resumed"] == 1 and s["rows"][0] == {**full["rows"][0], "resumed": True}
    assert s["rows"][1]["ms"] == "16" and s["rows"][1]["capacity"] and s["best"]["ms"] == "4"
    assert 'id="chart-1"' in (tmp_path / "tune.html").read_text()
