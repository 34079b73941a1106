"""``tune``: the engine over a service's own knobs, each configuration started from a command line, kept warm
while measured and stopped with its whole process group; a configuration that fails is its own error and the
rest go on. The fast tests replace the servers with a simulated world (tests/worlds.py)."""

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import short_tune_windows
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
def test_tune_finds_the_faster_configuration_and_reports_a_crash(tmp_path, monkeypatch):
    short_tune_windows(monkeypatch)
    code, out, err = _run("tune", "--cmd", f"{sys.executable} {APP} --port {{port}} --service-ms {{ms}} --crash {{crash}}",
                          "--space", "ms=16,4", "--space", "crash=no,yes", "--url", "http://127.0.0.1:{port}/predict",
                          "--body", '{"input": "{text}"}', "--target-p99-ms", "200", "--quick", "--limit", "20",
                          "--startup-timeout", "60", "--out", str(tmp_path), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["search"] == "grid" and s["configurations"] == 4
    rows = {(r["ms"], r["crash"]): r for r in s["rows"]}
    assert rows[("4", "yes")]["error"] and "configuration refused" in rows[("4", "yes")]["error"]
    fast, slow = rows[("4", "no")], rows[("16", "no")]
    assert fast["qps"] > 1.5 * slow["qps"]  # 4 ms against 16 ms of service: about 4x
    assert s["best"]["ms"] == "4" and "--service-ms 4" in s["best"]["command"]
    assert s["confirmations"][0]["verdict"] == "better"  # against the baseline, ms=16, each server restarted
    assert fast["capacity"] > slow["capacity"] and fast["checked"] and slow["checked"]
    assert json.loads((tmp_path / "tune.json").read_text())["configurations"] == 4


# --- the engine over a space, the servers replaced by a simulated world ----------------------------------

class FakeServers:
    """Stands in for tune's servers (``SwitchingMeasure``): each configuration a simulated M/D/1 server
    (ms=4 twice as fast as ms=8, ms=2 as ms=4), counting starts and windows; ``stop_after``: Ctrl-C after that
    many windows; ``fail``: a configuration whose server does not come up."""

    def __init__(self, rules=None, stop_after=None, fail=None, noise=0.02, seed=1):
        from tests.worlds import World

        rules = [(lambda v: v["ms"] in ("4", "2"), 2.0)] if rules is None else rules
        self.world = World(rules=rules, base_rate=50.0, noise=noise, seed=seed, dip_share=0.0)
        self.windows, self.starts, self.stop_after, self.fail = [], [], stop_after, fail

    def install(self, monkeypatch):
        from tuning.experiments import tune

        fake = self

        class Switching(tune.SwitchingMeasure):
            values = None  # the configuration whose stand-in server runs (one at a time here)

            def _start(self, values):
                self.close()
                row = self.row(values)
                row.command = tune.fill(self.cmd, values, 9000)
                row.starts += 1
                fake.starts.append(dict(values))
                if values == fake.fail:
                    row.error = "the server exited with 1 before it answered; its output ends:\nout of memory"
                    raise tune.ConfigError(row.error)
                self.values = dict(values)

            def __call__(self, values, *, rate=None, record=False, seed=None, window_s=None, warmup_s=None):
                if values != self.values:
                    self._start(values)
                if fake.stop_after is not None and len(fake.windows) >= fake.stop_after:
                    raise KeyboardInterrupt
                fake.windows.append((dict(values), rate))
                return fake.world(values, rate=rate, seed=seed, window_s=window_s, warmup_s=warmup_s)

            def close(self):
                self.values = None
        monkeypatch.setattr(tune, "SwitchingMeasure", Switching)
        return self


TUNE_ARGS = ("tune", "--cmd", "serve --port {port} --ms {ms}", "--space", "ms=8,4,2", "--url",
             "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}', "--target-p99-ms", "300", "--quick",
             "--limit", "5")


def test_tune_ships_a_confirmed_faster_configuration_that_meets_the_target(tmp_path, monkeypatch):
    fake = FakeServers().install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["best"]["ms"] in ("4", "2") and s["best"]["command"].startswith("serve --port 9000 --ms")
    assert s["indeterminate"] and "ms=4" in s["indeterminate"] and "ms=2" in s["indeterminate"]  # equally fast
    confirmed = sum(c["verdict"] == "better" for c in s["confirmations"])
    assert s["confirmations"][0]["verdict"] == "better" and len(s["target_checks"]) == 1 + confirmed  # each one
    by = {r["ms"]: r for r in s["rows"]}
    assert by["8"]["throughput_ratio"] == 1.0 and by["4"]["throughput_ratio"] > 1.7
    assert by["8"]["capacity"] and by[s["best"]["ms"]]["capacity"] > 1.7 * by["8"]["capacity"]
    assert len(fake.starts) < len(fake.windows)  # a server is kept across its configuration's windows
    held = s["verified"]  # the claim held for --quick's 60 s on the shipped configuration before it ships
    assert held["seconds"] == 60 and held["claim"] == s["best"]["capacity"] and s["capacity"] == held["held"]
    values, rate = fake.windows[-1]
    assert values == {"ms": s["best"]["ms"]} and rate == pytest.approx(held["holds"][-1]["rate"], rel=1e-3)
    page = (tmp_path / "tune.html").read_text()
    assert 'id="chart-0"' in page and 'id="chart-1"' in page and "TARGET NOT MET" not in page
    assert f"held {held['held']:.1f} req/s for 60 s" in page


def test_tune_charts_draw_each_configuration_from_the_result_and_from_tune_json(tmp_path, monkeypatch):
    from tuning import viz

    FakeServers(fail={"ms": "2"}).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    assert code == 0, err
    loaded = json.loads((tmp_path / "tune.json").read_text())
    fig = viz.tune_chart(loaded)
    traces = {t.name: list(t.x) for t in fig.data}
    assert traces["shipped"] == ["ms=4"] and traces["explored"] == ["ms=8"] and traces["error"] == ["ms=2"]
    assert "shipped: ms=4" in fig.layout.title.text
    target = viz.target_check_chart(loaded)
    assert any(s.y0 == 300.0 and s.y0 == s.y1 for s in target.layout.shapes)  # the p99 target line
    assert "TARGET NOT MET" not in (tmp_path / "tune.html").read_text()


def test_ctrl_c_keeps_what_was_measured_and_resume_replays_it(tmp_path, monkeypatch):
    from tuning.cli.guard import EXIT_INTERRUPTED

    cut = FakeServers(stop_after=3).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    assert code == EXIT_INTERRUPTED, err
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["interrupted"] and len(saved["state"]["log"]) == 3 and len(cut.windows) == 3
    assert saved["cmd"] == "serve --port {port} --ms {ms}" and saved["api"]["name"] == "custom"
    assert "INTERRUPTED" in (tmp_path / "tune.html").read_text()

    rest = FakeServers().install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 0, err
    final = json.loads((tmp_path / "tune.json").read_text())  # --resume without --out goes on writing there
    assert not final["interrupted"] and final["resumed"] == 3 and final["state"]["log"][:3] == saved["state"]["log"]
    holds = len(final["verified"]["holds"])  # the claim's holds come after the engine's windows, never logged
    assert len(rest.windows) == len(final["state"]["log"]) - 3 + holds  # the logged windows not measured again
    assert "3 windows from the earlier run" in out


@pytest.mark.parametrize("change, named", [
    (("--cmd", "serve --port {port} --ms {ms} --fast"), "--cmd: that run had 'serve --port {port} --ms {ms}'"),
    (("--space", "ms=8,4"), "--space: that run had --space ms=8,4,2, this one --space ms=8,4"),
    (("--target-p99-ms", "50"), "--target-p99-ms: that run had 300.0, this one 50.0"),
    (("--url", "http://127.0.0.1:{port}/other"), "--url"),
    (("--body", '{"text": "{text}"}'), "the API"),
    (("--limit", "4"), "the requests (--data, --limit, the text field): that run sent 5"),  # other texts
])
def test_resume_refuses_a_run_with_other_settings_and_names_the_difference(tmp_path, monkeypatch, change, named):
    FakeServers(stop_after=2).install(monkeypatch)
    _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    fresh = FakeServers().install(monkeypatch)
    args = list(TUNE_ARGS)
    i = args.index(change[0])
    args[i + 1] = change[1]
    code, out, err = _run(*args, "--resume", str(tmp_path))
    assert code == 2 and fresh.windows == [], err
    assert "cannot resume" in err and named in err, err


@pytest.mark.parametrize("then, now", [(True, False), (False, True)])
def test_resume_refuses_a_run_with_the_other_quick_setting(tmp_path, monkeypatch, then, now):
    """--quick changes the load windows: windows measured with and without it are not comparable."""
    without_quick = [a for a in TUNE_ARGS if a != "--quick"]
    FakeServers(stop_after=2).install(monkeypatch)
    _run(*(TUNE_ARGS if then else without_quick), "--out", str(tmp_path), "--json")
    fresh = FakeServers().install(monkeypatch)
    code, out, err = _run(*(TUNE_ARGS if now else without_quick), "--resume", str(tmp_path))
    assert code == 2 and fresh.windows == [], err
    had, has = ("--quick", "no --quick") if then else ("no --quick", "--quick")
    assert f"--quick: that run had {had}, this one {has}" in err, err
    assert ("add --quick" if then else "drop --quick") in err and "run without --resume" in err, err


def test_resume_refuses_a_tune_json_that_does_not_record_quick(tmp_path, monkeypatch):
    FakeServers(stop_after=2).install(monkeypatch)
    _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    saved = json.loads((tmp_path / "tune.json").read_text())
    del saved["quick"], saved["windows"]  # as written before tune.json recorded them
    (tmp_path / "tune.json").write_text(json.dumps(saved))
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 2 and "does not record whether --quick was given" in err, err


def test_a_configuration_whose_server_fails_is_its_error_and_the_rest_go_on(tmp_path, monkeypatch):
    FakeServers(fail={"ms": "4"}).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--json")
    assert code == 0, err
    s = json.loads(out)
    by = {r["ms"]: r for r in s["rows"]}
    assert "out of memory" in by["4"]["error"] and by["4"]["windows"] == 0
    assert s["best"]["ms"] == "2" and s["errors"] == {"ms=4": by["4"]["error"]}


def test_a_baseline_that_never_comes_up_cannot_be_decided(monkeypatch):
    from tuning.cli.guard import EXIT_NOTHING

    FakeServers(fail={"ms": "8"}).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS)
    assert code == EXIT_NOTHING and "NOT DECIDED" in out and "baseline (ms=8) could not be measured" in out, out


def test_two_runs_ship_the_same_best_or_say_which_two_are_indeterminate(monkeypatch):
    """On the simulated world: ms=2 is 40% faster than ms=4, ms=4 twice ms=8; two runs at 10% run-to-run noise
    and a 20% drift ship ms=2 both times, each capacity under the steady state's own at its fastest pace, and
    within 25% of each other (each claim stands on a fresh window, whose pace the noise moves)."""
    rules = [(lambda v: v["ms"] in ("4", "2"), 2.0), (lambda v: v["ms"] == "2", 1.4)]
    shipped = []
    for seed in (1, 2):
        FakeServers(rules=rules, noise=0.10, seed=seed).install(monkeypatch)
        code, out, err = _run(*TUNE_ARGS, "--json")
        s = json.loads(out)
        assert code == 0 and not s["indeterminate"], err
        shipped.append((s["best"]["ms"], s["best"]["capacity"]))
    from tests.worlds import steady_capacity

    assert [b for b, _ in shipped] == ["2", "2"]
    assert max(c for _, c in shipped) <= steady_capacity(1.1 * 50.0 * 2.0 * 1.4, 300.0)
    assert max(c for _, c in shipped) / min(c for _, c in shipped) <= 1.25


def test_resume_needs_an_earlier_tune_json(tmp_path):
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 2 and "no tune.json there" in err


@pytest.mark.slow
def test_a_partial_tune_json_is_resumed_against_a_real_service(tmp_path, monkeypatch):
    """The queue service over ms=16,4: tune.json cut after its first windows (what Ctrl-C leaves), resumed:
    the logged windows are replayed, the rest measured, and the table holds both."""
    short_tune_windows(monkeypatch)
    argv = ("tune", "--cmd", f"{sys.executable} {APP} --port {{port}} --service-ms {{ms}}", "--space", "ms=16,4",
            "--url", "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}', "--target-p99-ms", "200",
            "--quick", "--limit", "20", "--startup-timeout", "60")
    code, out, err = _run(*argv, "--out", str(tmp_path), "--json")
    assert code == 0, err
    full = json.loads((tmp_path / "tune.json").read_text())
    partial = {**full, "state": {"log": full["state"]["log"][:2]}, "interrupted": True, "best": None}
    (tmp_path / "tune.json").write_text(json.dumps(partial))
    code, out, err = _run(*argv, "--resume", str(tmp_path))
    assert code == 0, err
    assert "2 windows from the earlier run" in out
    s = json.loads((tmp_path / "tune.json").read_text())
    assert s["state"]["log"][:2] == full["state"]["log"][:2] and s["resumed"] == 2
    assert s["best"]["ms"] == "4" and {r["ms"] for r in s["rows"]} == {"16", "4"}
    assert 'id="chart-1"' in (tmp_path / "tune.html").read_text()


def test_a_failed_configuration_is_logged_and_a_resume_meets_it_again(tmp_path, monkeypatch):
    """Review: a configuration whose server failed left no window in the log, so a resume took the next
    configuration's windows for it and stopped on a mismatch. The failure is logged and replayed."""
    from tuning.cli.guard import EXIT_INTERRUPTED

    FakeServers(fail={"ms": "4"}, stop_after=5).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--out", str(tmp_path), "--json")
    assert code == EXIT_INTERRUPTED, err
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert any(w["error"] and "out of memory" in w["error"] for w in saved["state"]["log"])
    again = FakeServers(fail={"ms": "4"}).install(monkeypatch)
    code, out, err = _run(*TUNE_ARGS, "--resume", str(tmp_path))
    assert code == 0, err
    assert {"ms": "4"} not in again.starts  # its failure was replayed, not measured again


@pytest.mark.parametrize("answers, error", [
    (["HTTP 404: Request for unknown model: 'minilm' is not found", "HTTP 503: loading", "ok"], None),
    (["connection failed: refused", "ok"], None),
    (["HTTP 400: the body has no 'inputs'"], "the server answers, but not ok: HTTP 400"),
])
def test_tune_waits_while_a_server_loads_its_model_and_names_a_wrong_request_at_once(monkeypatch, answers, error):
    """#50: Triton opens HTTP before its model is loaded and answers 404 for it; tune gave up on that first
    answer although its help says it waits until a first request is ok."""
    from types import SimpleNamespace

    import tuning.load.generator as generator
    from tuning.experiments import tune
    from tuning.online.response import Response

    queue = list(answers)

    class Send:
        def __call__(self, body):
            got = queue.pop(0)
            return Response(0, "ok") if got == "ok" else Response(0, "error", got)

        def close(self):
            pass
    monkeypatch.setattr(generator, "http_target", lambda *a, **k: Send())
    group = SimpleNamespace(alive=lambda: True, tail=lambda: "")
    measure = SimpleNamespace(url="http://127.0.0.1:1/predict", api=None, bodies=[b"{}"])
    got = tune._wait_ready(group, measure, None, timeout_s=30.0, poll_s=0.0)
    assert (got is None) if error is None else got.startswith(error), got
    assert queue == [] or error is not None


def test_the_hold_line_holds_the_claimed_rate_at_the_run_s_url_and_api():
    """The printed `loadtest --target-p99-ms` line runs as printed: the --cmd run's throwaway port becomes
    {port}, the API flags and body template come along (quoted for the shell), and a capacity in texts/s is
    held in requests/s."""
    import shlex

    from tuning.present.tables import HOLD_S, hold_command

    s = {"url": "http://127.0.0.1:43117/predict", "cmd": "python svc.py {port}",
         "api": {"name": "custom", "template": {"input": "{text}"}, "client_batch": 1}, "best": {}}
    line = hold_command(s, 512.34, 50.0)
    assert line == ("python -m tuning loadtest --url http://127.0.0.1:{port}/predict --api custom "
                    f"""--body '{{"input": "{{text}}"}}' --rate 512.3 --duration {HOLD_S} --target-p99-ms 50""")
    assert shlex.split(line)[shlex.split(line).index("--body") + 1] == '{"input": "{text}"}'
    texts = {"url": "http://10.0.0.5:8000/embed", "api": {"name": "tuning", "client_batch": 1},
             "best": {"client_batch": 16}}
    assert hold_command(texts, 640.0, 50.0, "texts/s") == ("python -m tuning loadtest --url http://10.0.0.5:8000/embed "
                                                          "--client-batch 16 --rate 40.0 --duration 180 "
                                                          "--target-p99-ms 50")


def test_every_reason_a_target_window_cannot_tell_has_words_for_the_user():
    """Issue 58, finding 8: "indeterminate by client lag" was the engine's name for it. Each way a window can be
    indeterminate is said in words: the client's lag as the client's, a share still holding 1%, and errors over
    the budget not yet beyond chance (which the review found said as a share too close to 1%)."""
    from tuning.present.tables import UNDECIDED_BECAUSE, undecided_because

    assert "the client's figure, not the server's" in undecided_because({"by": "client lag", "share_high": 0.5})
    assert undecided_because({"by": "batches", "share_high": 0.02}) == UNDECIDED_BECAUSE["share"]
    assert undecided_because({"by": "blocks", "share_high": 0.004}) == UNDECIDED_BECAUSE["errors"]
