"""Against a real third-party server: a LitServe app (tests/apps/litserve_minilm.py, sentence-transformers
with the shipped MiniLM weights), plain ``/predict {"input": ...}`` and LitServe's OpenAI embedding spec,
through ``loadtest`` (both engines) and ``watch`` with the documented flags. Skipped without litserve."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import installed_by_test_extra, short_tune_windows
from tuning.base.net import free_port

installed_by_test_extra("litserve")
pytestmark = [pytest.mark.slow, pytest.mark.thirdparty]

APP = Path(__file__).parent / "apps" / "litserve_minilm.py"


@contextlib.contextmanager
def _litserve(*flags, path="/predict", body=None):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(APP), "--port", str(port), *flags], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # its own group: LitServe forks workers
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    try:
        while True:
            try:
                req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"LitServe did not come up: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(1)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        for _ in range(100):  # the workers LitServe forked go with their group, a moment after the parent
            if _group_gone(proc.pid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _run(*argv):
    from tuning import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_plain_litserve_with_a_body_template():
    with _litserve(path="/predict", body={"input": "hello"}) as (url, proc):
        code, out, err = _run("loadtest", "--url", url + "/predict", "--body", '{"input": "{text}"}', "--requests", "30",
                              "--concurrency", "4", "--limit", "30", "--json")
        assert code == 0, err
        s = json.loads(out)
        assert s["ok"] == 30 and s["errors"] == 0
        code, _, err = _run("loadtest", "--url", url + "/predict", "--requests", "5", "--limit", "5")
        assert code == 1 and "HTTP 500" in err  # this package's {"text": ...} is not what the app reads
        code, out, err = _run("watch", "--pid", str(proc.pid), "--url", url, "--route", "/predict", "--body",
                              '{"input": "{text}"}', "--duration", "1", "--limit", "30", "--json")
        assert code == 0, err
        code, out, err = _run("loadtest", "--engine", "locust", "--url", url, "--route", "/predict", "--body",
                              '{"input": "{text}"}', "--duration", "1.5", "--concurrency", "2", "--limit", "20",
                              "--warmup-s", "0.5", "--json")
        assert code == 0, err
        assert json.loads(out)["errors"] == 0
    assert _group_gone(proc.pid)  # no LitServe worker left behind


def test_litserve_openai_embedding_spec():
    with _litserve("--openai", path="/v1/embeddings", body={"input": ["hello"], "model": "minilm"}) as (url, proc):
        code, out, err = _run("loadtest", "--url", url, "--api", "openai", "--model-name", "minilm", "--client-batch",
                              "4", "--requests", "20", "--concurrency", "2", "--limit", "40", "--json")
        assert code == 0, err
        s = json.loads(out)
        assert s["ok"] == 20 and s["errors"] == 0 and s["texts_per_s"] == pytest.approx(4 * s["qps"])
    assert _group_gone(proc.pid)


def test_tune_over_litserves_batching_knobs_leaves_no_process(monkeypatch):
    """``tune`` over 2 x 2 of LitServe's batching knobs in quick mode: the structure of the result, the stages the
    engine ran, and that no LitServe process is left, not which configuration wins (bench/tune_repeat.py runs it
    twice and compares)."""
    import psutil

    def litserve_pids() -> set[int]:
        return {p.pid for p in psutil.process_iter(["cmdline"]) if str(APP) in " ".join(p.info["cmdline"] or [])}
    before = litserve_pids()
    short_tune_windows(monkeypatch)
    code, out, err = _run("tune", "--cmd", f"{sys.executable} {APP} --port {{port}} --max-batch-size {{batch}} "
                          "--batch-timeout {timeout}", "--space", "batch=1,8", "--space", "timeout=0.002,0.02",
                          "--url", "http://127.0.0.1:{port}/predict", "--body", '{"input": "{text}"}',
                          "--target-p99-ms", "1000", "--quick", "--limit", "40", "--startup-timeout", "240", "--json")
    assert code in (0, 3), err  # 3: no configuration met the target (a busy machine), still a full table
    s = json.loads(out)
    assert s["search"] == "grid" and s["configurations"] == 4 and s["stage"] == "done"
    assert {(r["batch"], r["timeout"]) for r in s["rows"]} == {("1", "0.002"), ("1", "0.02"), ("8", "0.002"),
                                                               ("8", "0.02")}
    for r in s["rows"]:
        assert r["error"] is None, r["error"]
        assert r["qps"] > 0 and r["windows"] >= 2
        assert r["peak_memory_mb"] > 50  # the group's memory: the parent and its forked workers
    baseline = next(r for r in s["rows"] if (r["batch"], r["timeout"]) == ("1", "0.002"))
    assert baseline["checked"]  # the baseline's target is always checked
    if s["best"] is not None:
        assert f"--max-batch-size {s['best']['batch']}" in s["best"]["command"]
    for c in s["confirmations"]:
        assert c["verdict"] in ("better", "not better") and c["pairs"] >= 4
    assert litserve_pids() <= before  # every configuration's group stopped
