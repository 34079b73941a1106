"""The command line as a newcomer meets it (issue 18): bad input gives one line and the right exit code,
runs that achieve nothing fail loudly, Ctrl-C keeps what was measured, output stays quiet.

Subprocess tests: every one has a timeout, and servers bind loopback only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Through ``python -m tuning``: for what only a process shows (tests/cli_run.py runs the rest here)."""
    return subprocess.run([sys.executable, "-m", "tuning", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.jsonl").write_text("")
    (d / "notjson.jsonl").write_text("hello\nnot json either\n")
    (d / "blank.txt").write_text("\n  \n")
    return {"empty": str(d / "empty.jsonl"), "notjson": str(d / "notjson.jsonl"), "blank": str(d / "blank.txt"),
            "dir": str(d), "missing": str(d / "nope.jsonl")}


def _busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/embed"


USAGE, NOTHING = 2, 1

# (argv with {placeholders}, exit code, a piece of the one line on stderr)
BAD_INPUTS = [
    ("serve --port -1", USAGE, "0-65535"),
    ("serve --port 70000", USAGE, "0-65535"),
    ("serve --port {busy}", NOTHING, "is in use; pass --port 0"),
    ("sweep batch --length 513", USAGE, "3-512"),
    ("sweep batch --values 1,2", USAGE, "--values does not apply"),
    ("sweep concurrency --values 1.5", USAGE, "whole number"),
    ("sweep wait --sizes 1,2", USAGE, "--sizes does not apply"),
    ("loadtest --warmup -3 --requests 2", USAGE, "--warmup"),
    ("loadtest --concurrency 1.5 --requests 2", USAGE, "not an integer"),
    ("loadtest --url {dead} --set batch_size=4 --requests 2", USAGE, "--set does not apply"),
    ("loadtest --url {dead} --requests 2 --warmup 0", NOTHING, "no answer from"),
    ("loadtest --target-p99-ms 100 --requests 2", USAGE, "give --rate R"),
    ("loadtest --url {dead} --metrics-map queue --requests 2", USAGE, "KEY=NAME"),
    ("loadtest --target-p99-ms 100 --rate 5 --duration 2 --engine locust", USAGE, "scheduled arrival"),
    ("profile --interval 0.01", USAGE, ">= 0.1"),
    ("run --data {dir}", USAGE, "is a directory"),
    ("run --data {missing}", USAGE, "no such file"),
    ("run --data {empty}", NOTHING, "no requests"),
    ("run --data {notjson}", NOTHING, "none of its 2 lines is a valid request"),
    ("profile --data {notjson}", NOTHING, "none of its 2 lines"),
    ("loadtest --data {empty} --requests 2", NOTHING, "no requests"),
    ("sweep wait --data {notjson}", NOTHING, "accepted: record JSONL"),
    ("plan --data {empty}", NOTHING, "no requests"),
    ("precision --data {empty}", NOTHING, "no requests"),
    ("precision --data {blank}", NOTHING, "empty"),
    ("investigate --data {empty} --quick", NOTHING, "no requests"),
    ("watch --pid 1 --url {dead} --data {empty}", NOTHING, "no requests"),
    ("calibrate --from {missing} -o x.json", USAGE, "no such file"),
    ("run --set graph=cuda", USAGE, "allowed"),
    ("run --set nonsense=1", USAGE, "nonsense"),
    ("frobnicate", USAGE, "invalid choice"),
    ("", USAGE, "choose a command"),
]


@pytest.mark.parametrize("argv, code, expected", BAD_INPUTS, ids=[a or "(none)" for a, _, _ in BAD_INPUTS])
def test_bad_input_gives_one_line_and_the_right_exit_code(files, argv, code, expected, capfd):
    busy = _busy_port()
    try:
        args = argv.format(busy=busy.getsockname()[1], dead=_dead_url(), **files).split()
        r = run_cli(*args, capfd=capfd)
    finally:
        busy.close()
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "diagnosis" not in r.stdout


def test_the_exit_code_and_the_one_line_reach_the_shell_through_python_m():
    """The table above runs in this process; one case through ``python -m tuning`` shows the process's side."""
    r = cli("run", "--set", "nonsense=1")
    assert r.returncode == USAGE and r.stderr.strip().startswith("error: ") and "nonsense" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _wait_for(pred, timeout: float = 150.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError("the command never reached the state the test waits for")


def _cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _wait_for_cpu(pid: int, seconds: float) -> None:
    """Until the process has used ``seconds`` more of CPU time: its own progress, not the wall clock's."""
    start = _cpu_s(pid)
    _wait_for(lambda: _cpu_s(pid) - start >= seconds)


def _children(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _thread_names(pid: int) -> set[str]:
    names = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:
            continue
    return names


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _interruptible(argv: list[str]) -> subprocess.Popen:
    """The command as a user's terminal starts it: SIGINT at its default. A suite started in the background by
    a non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt: the child would run on past the test's timeout."""
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
def test_ctrl_c_during_run_keeps_the_ledger_and_ends_loader_workers():
    proc = _interruptible([sys.executable, "-m", "tuning", "run", "--limit", "2000", "--set", "num_workers=2"])
    try:
        _wait_for(lambda: len(_children(proc.pid)) >= 2)  # the loader workers: the measured loop is running
        workers = _children(proc.pid)
        _wait_for_cpu(proc.pid, 1.0)  # batches went through the model (however slowly a loaded machine runs it)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted after ")
    assert "stage ledger" in out and "verdict:" in out
    _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10)


@pytest.mark.slow
def test_ctrl_c_during_loadtest_prints_valid_json_with_what_was_measured():
    proc = _interruptible([sys.executable, "-m", "tuning", "loadtest", "--duration", "600", "--concurrency", "2",
                           "--limit", "50", "--json"])
    try:
        _wait_for(lambda: "batcher" in _thread_names(proc.pid))  # the server is up; load starts next
        _wait_for_cpu(proc.pid, 1.0)  # requests were answered
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert f"interrupted after {summary['submitted']} requests" in err


def test_knobs_lists_every_knob_with_help_and_default():
    from tuning.knobs import Knobs, knob_names

    r = run_cli("knobs", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["knob"]: row for row in json.loads(r.stdout)}
    assert list(rows) == knob_names()
    assert all(row["help"] and row["default"] == Knobs().as_dict()[name] for name, row in rows.items())


def test_help_shows_defaults_and_defines_the_terms():
    r = run_cli("loadtest", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "(default: 8)" in text  # --concurrency
    assert "terms and exit codes: python -m tuning --help" in text  # said once, on the top-level help
    top = " ".join(run_cli("--help").stdout.split())
    for term in ("truncated", "wait_for_input", "wait_for_model", "padding waste", "mean batch"):
        assert term in top


def test_quiet_filter_drops_native_profiler_lines_and_keeps_the_rest():
    code = ("import os, sys\nfrom tuning.cli.guard import filter_native_stderr\n"
            "with filter_native_stderr():\n"
            "    os.write(2, b'USDT:2026 x SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
            "    os.write(2, b'kept line\\n')\n"
            "    print('python line', file=sys.stderr)\n"
            "print('after', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "USDT" not in r.stderr
    assert r.stderr.splitlines() == ["kept line", "python line", "after"]


def test_a_knob_fallback_is_one_note_line_and_third_party_deprecations_are_hidden():
    import warnings

    from tuning.cli.guard import warning_policy

    lines = []
    with warning_policy(verbose=False):
        import sys as _sys
        saved, _sys.stderr = _sys.stderr, type("W", (), {"write": lambda s, t: lines.append(t), "flush": lambda s: None})()
        try:
            warnings.warn("pin_memory=True has no effect without CUDA; running with pin_memory=False", UserWarning, stacklevel=1)
            warnings.warn("pin_memory=True has no effect without CUDA; running with pin_memory=False", UserWarning, stacklevel=1)
            warnings.warn("torch.foo is deprecated", DeprecationWarning, stacklevel=1)
        finally:
            _sys.stderr = saved
    text = "".join(lines)
    assert text == "note: pin_memory=True has no effect without CUDA; running with pin_memory=False\n"


def test_verdicts_are_computed_from_the_numbers():
    from tuning.present.verdicts import batch_sweep_verdict, load_sweep_verdict, precision_verdict

    rows = [{"dtype": "bf16", "min_cosine": 0.9995, "status": "ok"}, {"dtype": "fp16", "min_cosine": 0.9999,
                                                                       "status": "ok"}]
    assert "dtype=bf16" in precision_verdict(rows)
    assert "keep dtype=fp32" in precision_verdict([{"dtype": "bf16", "min_cosine": 0.98, "status": "ok"}])
    points = [{"batch_size": 1, "status": "ok", "per_sample_ms": 10.0}, {"batch_size": 8, "status": "ok",
                                                                         "per_sample_ms": 2.0}]
    assert "knee is batch 8" in batch_sweep_verdict({"points": points, "knee": 8})
    sweep = [{"concurrency": 1, "qps": 10.0, "p99_ms": 50}, {"concurrency": 8, "qps": 40.0, "p99_ms": 90},
             {"concurrency": 32, "qps": 41.0, "p99_ms": 400}]
    assert "concurrency=8" in load_sweep_verdict("concurrency", sweep)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_serve_json_prints_one_summary_at_shutdown():
    r = cli("serve", "--port", "0", "--duration", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert set(summary["outcomes"]) >= {"ok", "error"} and summary["requests"] == 0


def test_a_run_whose_records_mostly_failed_says_so_in_its_verdict():
    """3 of 4 records malformed: the verdict leads with it, instead of a throughput over the one that worked."""
    from tuning.present.verdicts import run_verdict

    s = {"ok": 1, "requests": 4, "errors": 3, "qps": 41.8, "model_busy": 0.44, "knobs": {"batch_size": 8}}
    verdict = run_verdict(s)
    assert verdict.startswith("verdict: 3 of 4 records failed (75%): see the errors above")
    assert "41.8 ok answers/s" in verdict
    assert "failed" not in run_verdict({**s, "errors": 0, "ok": 4})
