"""What a newcomer meets (issue 58): a report and a terminal headline that follow the run's real state, ship
lines runnable as printed, every table column with its data, a dead endpoint said in one line, ``--cmd``'s
rules, a help that imports no heavy library, output that fits a terminal."""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import investigate_on

TARGET_MS = 200.0


def _investigate(monkeypatch, tmp_path, measure, *extra):
    """``python -m tuning investigate --quick`` on a simulated world (tests.worlds), through ``cli.main``."""
    return investigate_on(monkeypatch, tmp_path, measure, *extra, target_ms=TARGET_MS)


def _world(**kw):
    from tests.worlds import World

    return World(noise=0.02, seed=1, rules=[(lambda k: k.tokenizer == "fast", 1.6), (lambda k: k.dtype == "bf16", 1.6)],
                 **kw)


def _last_said(stdout: str) -> str:
    """The last thing printed: the last line with the continuation lines it was wrapped onto."""
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line and not line[0].isspace())
    return " ".join(line.strip() for line in lines[start:])


def _page_head(page: str) -> str:
    """The report's head: what a reader sees before the first section."""
    return page.split("</h1>", 1)[1].split("<section", 1)[0]


# --- 1. a finished report opens with its decision ------------------------------------------------------

def test_a_finished_report_opens_with_the_decision_not_in_progress(monkeypatch, tmp_path):
    code, stdout, _, out = _investigate(monkeypatch, tmp_path, _world())
    assert code == 0, stdout[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is False and "IN PROGRESS" not in summary["headline"]
    head = _page_head((out / "report.html").read_text())
    assert "IN PROGRESS" not in head and "nothing decided" not in head
    assert "Capacity at p99" in head and "Ship:" in head
    assert _last_said(stdout).startswith("capacity at p99")


# --- 2. an interrupted run claims no verdict --------------------------------------------------------------

def test_ctrl_c_before_any_target_check_says_interrupted_before_a_verdict(monkeypatch, tmp_path):
    world = _world()

    def measure(knobs, **kw):
        if world.calls >= 6:
            raise KeyboardInterrupt
        return world(knobs, **kw)
    code, stdout, _, out = _investigate(monkeypatch, tmp_path, measure)
    assert code == 130
    assert "TARGET NOT MET" not in stdout and "ship:" not in stdout and "keep the baseline" not in stdout
    assert "interrupted before a verdict" in _last_said(stdout).lower()
    summary = json.loads((out / "summary.json").read_text())
    assert "interrupted before a verdict" in summary["headline"].lower()
    page = (out / "report.html").read_text()
    assert "TARGET NOT MET" not in page and "keep the baseline" not in page
    assert "interrupted before a verdict" in _page_head(page).lower()


def test_a_missed_target_after_its_check_still_says_target_not_met(monkeypatch, tmp_path):
    from tests.worlds import World

    world = World(noise=0.02, seed=0, floor_ms=lambda k: 2 * TARGET_MS)
    code, stdout, _, out = _investigate(monkeypatch, tmp_path, world)
    assert code == 3
    assert _last_said(stdout).startswith("TARGET NOT MET")
    assert "TARGET NOT MET" in _page_head((out / "report.html").read_text())


def test_investigate_url_interrupted_before_a_verdict_says_so_and_claims_nothing(tmp_path):
    from tuning.present.tables import format_service

    service, calls = _Service(), []

    def measure(values, **kw):
        calls.append(values)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return service.measure(values, **kw)
    inv = _service_run(tmp_path, measure=measure)
    text = format_service(inv)
    assert inv.interrupted and "interrupted before a verdict" in text.lower()
    assert "TARGET NOT MET" not in text and "ship:" not in text
    page = (tmp_path / "report.html").read_text()
    assert "before a verdict" in page and "TARGET NOT MET" not in page


# --- 3. ship lines runnable as printed ----------------------------------------------------------------------

class _Service:
    """A running service whose throughput grows with texts per request (SIMULATED: tests.worlds)."""

    def __init__(self):
        from tests.worlds import World

        self.world = World(rules=[(lambda v: v.get("client_batch") == "4", 3.0),
                                  (lambda v: v.get("client_batch") == "16", 3.15)],
                           base_rate=80.0, noise=0.02, seed=3, dip_share=0.0)

    def measure(self, values, *, rate=None, record=False, seed=None, window_s=None):
        return self.world(values, rate=rate, seed=seed, window_s=window_s)

    def watch(self, pid, url, bodies, *, concurrency, duration_s, api, metrics_url):
        diagnosis = {"kind": "blocked", "reasons": ["idle"], "next_step": "raise load", "cannot_see": ["threads"]}
        threads = [{"name": "uvicorn-worker", "cpu_mean": 87.5, "cpu_max": 99.0}]
        return SimpleNamespace(load=None, server_metrics=None,
                               summary=lambda: {"diagnosis": diagnosis, "threads": threads})


def _service_run(tmp_path, api=None, measure=None, say=None, space=None, cmd=None):
    from tuning.experiments.service import investigate_service
    from tuning.experiments.tune import TuneSettings
    from tuning.load.apis import Api
    from tuning.present.service import write_service_files

    service = _Service()
    return investigate_service("http://127.0.0.1:9/embed", lambda a: [b"{}"] * 4, api or Api("tei"), 300.0,
                               TuneSettings.quick(), out=tmp_path, measure=measure or service.measure,
                               watch_fn=service.watch, on_save=write_service_files, diagnose_s=1.0, say=say,
                               space=space, cmd=cmd)


def test_investigate_url_ships_the_client_setting_to_use_not_an_empty_command(tmp_path):
    from tuning.present.tables import format_service

    inv = _service_run(tmp_path)
    best = inv.tune.best.values["client_batch"]
    page = (tmp_path / "report.html").read_text()
    assert "<pre></pre>" not in page and "<pre>None</pre>" not in page
    ship = page.split('data-section="ship"', 1)[1].split("</section>", 1)[0]
    assert f"{best} texts per request" in ship
    assert f"{best} texts per request" in format_service(inv)


def test_investigate_cmd_ships_the_user_s_port_placeholder_never_the_run_s_port(tmp_path):
    from tuning.present.tables import format_service

    cmd = "python mysvc.py --port {port} --max-batch {max_batch}"
    service = _Service()

    def measure(values, **kw):
        return service.measure({"client_batch": {"1": "1", "8": "4", "32": "16"}[values["max_batch"]]}, **kw)
    inv = _service_run(tmp_path, measure=measure, space={"max_batch": ["1", "8", "32"]}, cmd=cmd)
    best = inv.tune.best
    best.command = cmd.replace("{port}", "44743").replace("{max_batch}", best.values["max_batch"])  # as it ran
    shipped = f"python mysvc.py --port {{port}} --max-batch {best.values['max_batch']}"
    text = format_service(inv)
    assert "44743" not in text and shipped in text
    from tuning.present.service import write_service_files

    write_service_files(inv)
    page = (tmp_path / "report.html").read_text()
    ship = page.split('data-section="ship"', 1)[1].split("</section>", 1)[0]
    assert "44743" not in ship and shipped in ship
    assert json.loads((tmp_path / "summary.json").read_text())["ship"] == shipped


# --- 4. every column has its data ------------------------------------------------------------------------------

def test_the_diagnosis_table_s_cpu_column_holds_the_threads_cpu(tmp_path):
    _service_run(tmp_path)
    page = (tmp_path / "report.html").read_text()
    diagnosis = page.split('data-section="diagnosis"', 1)[1]
    assert "<th>CPU %</th>" in diagnosis
    assert '<td class="num">87.5</td>' in diagnosis


# --- 5. a dead endpoint ------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_investigate_url_on_a_dead_port_says_nothing_listens_there_and_writes_nothing(tmp_path):
    from tuning import cli

    url = f"http://127.0.0.1:{_free_port()}/embed"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["investigate", "--url", url, "--quick", "--limit", "5", "--out", str(tmp_path / "out")])
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, stderr.getvalue()
    assert "nothing listens there" in lines[0] and url in lines[0]
    assert not (tmp_path / "out" / "report.html").exists()


def test_a_service_that_cannot_be_measured_is_named_not_left_blank(tmp_path):
    from tuning.experiments.engine import ConfigError
    from tuning.load.apis import Api
    from tuning.present.tables import format_service

    said = []

    def never(values, **kw):
        raise ConfigError("no ok answer (first reason: connection failed)")
    inv = _service_run(tmp_path, api=Api("custom", template={"input": "{text}"}), measure=never, say=said.append)
    text = "\n".join([*said, format_service(inv)])
    assert "()" not in text and "error in :" not in text and not any(line.startswith(":") for line in said)
    assert "1 configurations" not in text
    assert "the service as it runs" in text


# --- 6. --cmd is not a shell ---------------------------------------------------------------------------------------

def _usage(*argv):
    from tuning import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return code, stderr.getvalue()


@pytest.mark.parametrize("cmd, named", [
    ("MAX_BATCH={max_batch} python mysvc.py --port {port}", "MAX_BATCH={max_batch}"),
    ("python mysvc.py --port {port} --b {max_batch} > log.txt", "'>' needs a shell"),
])
def test_cmd_says_it_is_not_a_shell_with_the_env_form(tmp_path, cmd, named):
    code, err = _usage("investigate", "--cmd", cmd, "--space", "max_batch=1,8", "--url",
                       "http://127.0.0.1:{port}/embed", "--quick", "--limit", "5", "--out", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert named in err and "not a shell" in err and "env " in err


def test_cmd_help_says_it_is_not_a_shell():
    from tuning.cli.commands import build_parser

    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "tune" in a.choices)
    for name in ("investigate", "tune"):
        text = " ".join(sub.choices[name].format_help().split())
        assert "not a shell" in text and "env VAR=" in text


# --- 7. help, version and usage errors import no heavy library ----------------------------------------------------

HEAVY = ("torch", "scipy", "pandas")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["investigate", "--help"], ["investigate", "--limt", "3"],
                                  ["tune", "--quick", "--targte-p99-ms", "3"]])
def test_help_version_and_usage_errors_import_no_heavy_library(argv):
    probe = ("import sys, contextlib, io\n"
             "from tuning.cli.commands import build_parser, main\n"
             "build_parser()\n"
             f"heavy = {HEAVY!r}\n"
             "assert not [m for m in heavy if m in sys.modules], 'after the parser'\n"
             "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
             "    try:\n"
             f"        code = main({argv!r})\n"
             "    except SystemExit as exc:\n"
             "        code = exc.code\n"
             "print(code, [m for m in heavy if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    code, loaded = done.stdout.split(" ", 1)
    assert loaded.strip() == "[]", (argv, loaded)
    assert int(code) in (0, 2)


def test_version_prints_the_package_version():
    import tuning

    done = subprocess.run([sys.executable, "-m", "tuning", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and tuning.__version__ in done.stdout


def test_the_cli_s_defaults_are_the_engine_s():
    from tuning.experiments import engine, ladder
    from tuning.experiments.defaults import DEFAULT_TARGET_P99_MS, OBJECTIVES

    assert OBJECTIVES == engine.OBJECTIVES and DEFAULT_TARGET_P99_MS == ladder.DEFAULT_TARGET_P99_MS


# --- 8. terminal output fits 100 columns, says each thing once, names capacity and throughput -----------------

WIDTH = 100


def _wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > WIDTH]


def test_the_investigate_output_fits_100_columns_and_says_each_thing_once(monkeypatch, tmp_path):
    code, stdout, _, _ = _investigate(monkeypatch, tmp_path, _world())
    assert code == 0
    assert _wide(stdout) == []
    said = [line.strip() for line in stdout.splitlines() if len(line.strip()) > 30]
    assert len(said) == len(set(said)), [line for line in said if said.count(line) > 1]
    assert sum(line.startswith("capacity at p99") for line in stdout.splitlines()) == 1  # the headline, once
    flat = " ".join(stdout.split())
    assert "capacity = the highest offered rate" in flat and "throughput = ok answers/s" in flat
    effects = re.findall(r"main effect x[\d.]+ \[[\d.]+-[\d.]+\]", flat)  # each step's reason, said once
    assert effects and len(effects) == len(set(effects)), effects
    recorded = next(line for line in stdout.splitlines() if line.startswith("recommended, under the recorder"))
    assert "offered" in recorded and "throughput" in recorded and "QPS" not in recorded


def test_the_service_output_fits_100_columns(tmp_path):
    from tuning.present.tables import format_service

    said = []
    inv = _service_run(tmp_path, say=said.append)
    assert _wide(format_service(inv)) == [] and _wide("\n".join(said)) == []


def test_a_table_wraps_its_words_to_the_width_and_keeps_every_word():
    from tuning.present.tables import table

    why = "met: 80.0 req/s at p99 <= 200 ms (p99 there 158 ms; next rate up 84.8: indeterminate, p99 218 ms)"
    rows = [{"step": "target", "change": "tokenizer=fast, dtype=bf16", "ratio": 1.57, "why": why}]
    text = table(rows, ["step", "change", "ratio", "why"], width=80)
    assert _wide(text.replace("\n", "\n")) == [] and max(len(line) for line in text.splitlines()) <= 80
    assert " ".join(text.split()).count("indeterminate,") == 1 and "218 ms)" in text


# --- 10. the docs a newcomer needs ---------------------------------------------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_the_readme_s_first_screen_says_the_default_target_and_links_the_glossary():
    from tuning.experiments.defaults import DEFAULT_TARGET_P99_MS

    front = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert f"p99 ≤ {DEFAULT_TARGET_P99_MS:.0f} ms" in front
    assert "(docs/cli.md#python--m-tuning)" in front
    cli = (ROOT / "docs" / "cli.md").read_text()
    assert "## python -m tuning\n" in cli and "terms:" in cli.split("## investigate", 1)[0]


def _own_server_section() -> str:
    doc = (ROOT / "docs" / "your-service.md").read_text()
    return doc.split("\n## Your own server\n", 1)[1].split("\n## ", 1)[0]


def test_your_own_server_section_has_the_custom_format_and_cmd_s_rules():
    section = " ".join(_own_server_section().split())
    for said in ('"{text}"', '"{texts}"', "one embedding per text", "--no-validate", "not by a shell", "env ",
                 "{port}"):
        assert said in section, said


def test_the_example_command_parses_and_its_cmd_is_not_refused():
    import shlex

    from tuning.cli.commands import _check_not_shell, build_parser

    section = _own_server_section()
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    argv = shlex.split(block)
    assert argv[:3] == ["python", "-m", "tuning"]
    args = build_parser().parse_args(argv[3:])
    _check_not_shell("investigate", args.cmd)
    assert "{max_batch}" in args.cmd and "{port}" in args.cmd and args.space == ["max_batch=1,8,32"]


def test_the_example_service_batches_and_answers_what_custom_expects(tmp_path):
    import os
    import time
    import urllib.request

    from tuning.load.apis import Api

    code = _own_server_section().split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.splitlines()) <= 45
    (tmp_path / "mysvc.py").write_text(code)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "mysvc.py"), str(port)], cwd=tmp_path,
                            env={**os.environ, "MAX_BATCH": "4"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        api = Api("custom", template={"input": "{text}"})
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=api.body(["hello world"]),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    status, data = resp.status, resp.read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
                time.sleep(0.2)
        outcome, reason, _ = api.check(status, data, 1)
        assert outcome == "ok", reason
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_docs_request_no_web_font_and_code_blocks_scroll():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"].get("font") is False
    css = "".join((ROOT / "docs" / p).read_text() for p in config.get("extra_css", []))
    assert "overflow-x: auto" in css and "pre > code" in css


@pytest.mark.slow
def test_a_newcomer_tunes_the_docs_example_service_and_gets_a_runnable_line(tmp_path):
    """The newcomer's path end to end: the example of docs/your-service.md under ``investigate --cmd``."""
    import os

    code = _own_server_section().split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mysvc.py").write_text(code)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tuning", "investigate", "--cmd",
                           "env MAX_BATCH={max_batch} " + sys.executable + " mysvc.py {port}", "--space",
                           "max_batch=1,8", "--url", "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}',
                           "--quick", "--limit", "40", "--verify", "10", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode in (0, 3), done.stderr[-3000:]
    assert _wide(done.stdout) == []
    run_it = " ".join(done.stdout.split("run it: ", 1)[1].split("\n")[0].split()) if done.returncode == 0 else None
    if run_it is not None:
        assert run_it.endswith("mysvc.py {port}") and run_it.startswith("env MAX_BATCH=")
        assert "held " in done.stdout.split("run it: ", 1)[0]  # the claim held 10 s before it shipped
        hold = " ".join(done.stdout.split("hold it longer: ", 1)[1].split("\n\n")[0].split())
        assert hold.startswith("python -m tuning loadtest --url http://127.0.0.1:{port}/predict --api custom")
        assert """--body '{"input": "{text}"}'""" in hold
        seconds = int(hold.split(" --duration ", 1)[1].split()[0])  # 3 minutes, or what its windows say it needs
        assert seconds >= 180, hold
    page = (out / "report.html").read_text()
    first = page.index('data-section="')
    assert page[first:].startswith('data-section="ship"')
