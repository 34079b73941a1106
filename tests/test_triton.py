"""Against a real Triton Inference Server: ``examples/pytriton_server.py`` (PyTriton 0.7, Triton 2.51, the
shipped MiniLM on the CPU behind the dynamic batcher) under the interpreter of PyTriton's own environment
(``tests/triton_env.py``: it pins numpy<2), driven through ``loadtest`` and ``watch`` with the documented
KServe flags, and stopped the way a user or a tuner stops it (SIGTERM).

Run just these: ``python -m pytest -q -n 0 tests/test_triton.py``. The first run builds the environment
(tens of seconds with a network, cached afterwards); without one they skip here and fail in CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.cli_run import run_cli
from tests.triton_env import pytriton_python  # noqa: F401  (the session fixture, used by name below)
from tuning.base.net import free_port

# One worker for the module: the module's server is started once, and two Triton servers on two cores would
# starve each other's batches.
pytestmark = [pytest.mark.slow, pytest.mark.thirdparty, pytest.mark.xdist_group("triton")]

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "pytriton_server.py"
READY_TIMEOUT_S = 180  # importing torch and loading Triton's Python backend on a busy 2-core machine
STOP_TIMEOUT_S = 60  # Triton unloads the model, then PyTriton removes its workspace
MAX_BATCH = 8
KSERVE = ("--api", "kserve", "--model-name", "minilm", "--output-name", "embedding")


@dataclass
class Triton:
    proc: subprocess.Popen
    url: str
    metrics_url: str
    home: Path  # $PYTRITON_HOME: the server's workspace is made in here
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def triton_server(python: Path, folder: Path, *flags: str):
    """The example server on free ports, in its own process group, yielded once its model answers ready."""
    port, metrics_port = free_port(), free_port()
    home, log = Path(tempfile.mkdtemp(prefix="pyt-")), folder / "server.log"  # short: PyTriton's sockets go in it
    env = {**os.environ, "PYTRITON_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(python), str(SERVER), "--port", str(port), "--metrics-port", str(metrics_port),
                                 *flags], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Triton(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", home, log)
    try:
        _wait_ready(server)
        yield server
    finally:
        stop(server)
        _kill_group(proc.pid)
        shutil.rmtree(home, ignore_errors=True)


def _wait_ready(server: Triton) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers(server.url + "/v2/models/minilm/ready"):
        if server.proc.poll() is not None:
            raise AssertionError(f"the server exited ({server.proc.returncode}) before ready:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready in {READY_TIMEOUT_S} s:\n{server.log_tail()}")
        time.sleep(0.5)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def stop(server: Triton) -> bool:
    """SIGTERM to the server's own process (as ``kill PID`` does), then wait for its whole group to be gone;
    whether it went within the time."""
    with contextlib.suppress(ProcessLookupError):
        server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while group_members(server.proc.pid):  # the parent counts until it exits, then its children
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    server.proc.wait(STOP_TIMEOUT_S)  # reap it: exited, it is a zombie until then (its exit code is read here)
    return True


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group (zombies are dead: they only wait to be reaped)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _kill_group(pgid: int) -> None:
    """Whatever a failed stop left: killed, so that a failing test leaves no server behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture(scope="module")
def triton(pytriton_python, tmp_path_factory):  # noqa: F811  (the imported fixture, by name)
    """One server for the load tests: batches of up to 8, each request held up to 5 ms for others to join."""
    with triton_server(pytriton_python, tmp_path_factory.mktemp("triton"), "--max-batch-size", str(MAX_BATCH),
                       "--max-queue-delay-us", "5000") as server:
        yield server


def _cli_json(*argv: str) -> dict:
    done = run_cli(*argv, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_loadtest_checks_answers_and_joins_tritons_own_timings(triton):
    s = _cli_json("loadtest", "--url", triton.url, *KSERVE, "--metrics-url", triton.metrics_url,
                  "--concurrency", "8", "--duration", "3")
    assert s["errors"] == 0 and s["ok"] > 0 and s["error_reasons"] == []
    assert s["api"]["api"] == "kserve" and s["api"]["validate"]  # each answer checked: one embedding per text
    metrics = s["server_metrics"]
    assert metrics["exporter"] == "triton" and metrics["reason"] is None, metrics
    values = metrics["values"]
    assert values["queue_ms"] >= 0 and values["inference_ms"] > 0
    # 8 in flight and a 5 ms queue delay: the dynamic batcher groups requests, never past its largest batch
    assert 1 < values["mean_batch"] <= MAX_BATCH


def test_watch_diagnoses_with_tritons_metrics(triton):
    w = _cli_json("watch", "--pid", str(triton.proc.pid), "--url", triton.url, *KSERVE, "--metrics-url",
                  triton.metrics_url, "--duration", "3")
    assert w["pid"] == triton.proc.pid and "pytriton_server.py" in w["command"]
    assert w["load"]["errors"] == 0 and w["load"]["ok"] > 0
    assert w["server_metrics"]["exporter"] == "triton" and w["server_metrics"]["values"]["mean_batch"] > 0
    diagnosis = w["diagnosis"]
    assert diagnosis["kind"] and diagnosis["next_step"]
    assert diagnosis["evidence"]["metrics_exporter"] == "triton"
    assert any("triton" in reason for reason in diagnosis["reasons"]), diagnosis["reasons"]


def test_sigterm_leaves_no_process_and_no_workspace(pytriton_python, tmp_path):  # noqa: F811
    """Two model instances (two Python-backend stubs under Triton): a plain SIGTERM to the script stops them all
    and removes PyTriton's workspace and shared memory."""
    with triton_server(pytriton_python, tmp_path, "--instances", "2", "--max-batch-size", "4") as server:
        answer = _infer(server.url, ["hello", "a second text"])
        assert answer["shape"] == [2, 384] and len(answer["data"]) == 2 * 384
        programs = [Path(p.cmdline()[0]).name for p in group_members(server.proc.pid)]
        assert programs.count("tritonserver") == 1 and programs.count("triton_python_backend_stub") == 2, programs
        workspaces = [p.name for p in server.home.iterdir()]
        assert len(workspaces) == 1 and workspaces[0].startswith("workspace_"), workspaces
        stopped = stop(server)
        assert stopped, f"left running: {[p.cmdline()[:2] for p in group_members(server.proc.pid)]}"
        assert server.proc.returncode == 0, server.log_tail()
        assert list(server.home.iterdir()) == []  # PyTriton's workspace (the Triton binaries it copied) is gone
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pytrtion{server.proc.pid}-")]


def _infer(url: str, texts: list[str]) -> dict:
    body = {"inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}]}
    req = urllib.request.Request(url + "/v2/models/minilm/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return next(o for o in json.loads(resp.read())["outputs"] if o["name"] == "embedding")
