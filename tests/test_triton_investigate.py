"""``investigate --cmd`` with the ``triton`` recipe against a real Triton (``examples/pytriton_server.py`` in
PyTriton's own environment, ``tests/triton_env.py``): 2 x 2 of its dynamic batcher's knobs, each
configuration started from its command line and waited for until its model is ready, short windows. The
structure and the cleanup are asserted, not the winner (two cores decide little between them)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers import running_with
from tests.triton_env import pytriton_python  # noqa: F401  (the session fixture, used by name below)
from tuning.experiments.engine import EngineSettings
from tuning.experiments.service import SUMMARY, investigate_service
from tuning.experiments.tune import TuneSettings
from tuning.load.apis import request_bodies
from tuning.load.servers import recipe
from tuning.present.service import write_service_files

pytestmark = [pytest.mark.slow, pytest.mark.thirdparty, pytest.mark.xdist_group("triton")]

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "pytriton_server.py"
SHORT = TuneSettings(engine=EngineSettings.quick(window_s=1.0, target_outcomes=400, target_max_s=3.0, max_pairs=4),
                     concurrency=8, warmup_s=0.3, startup_timeout_s=240.0, quick_mode=True)


def test_investigate_cmd_over_tritons_batcher_reports_and_leaves_nothing_running(pytriton_python, tmp_path,  # noqa: F811
                                                                                  monkeypatch):
    home = Path(tempfile.mkdtemp(prefix="pyt-"))  # short: PyTriton's sockets go in it (a path of 107 bytes at most)
    monkeypatch.setenv("PYTRITON_HOME", str(home))  # the servers' workspaces are made (and must be removed) here
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    triton = recipe("triton")
    space = {"max_batch_size": ["1", "8"], "max_queue_delay_us": ["0", "5000"]}
    api = triton.make_api()
    texts = [f"a request about item {i}" for i in range(40)]
    lines = []
    inv = investigate_service(triton.url, lambda a: request_bodies(a, texts), api, 800.0, SHORT,
                              cmd=triton.command_line(f"{pytriton_python} {SERVER}", list(space)), space=space,
                              ready_url=triton.ready_url, metrics_url=triton.metrics_url, out=tmp_path / "inv",
                              server="triton", say=lines.append, diagnose_s=2.0, on_save=write_service_files)
    s = json.loads((tmp_path / "inv" / SUMMARY).read_text())
    assert s["error"] is None and not s["interrupted"], (s["error"], lines[-5:])
    assert len(s["rows"]) == 4 and all(r["error"] is None for r in s["rows"]), [r["error"] for r in s["rows"]]
    assert all("--metrics-port" in r["command"] and "--max-queue-delay-us" in r["command"] for r in s["rows"])
    # Triton's own timings joined into every configuration measured
    assert all(r.get("server_compute_ms") and r["server_compute_ms"] > 0 for r in s["rows"]), s["rows"]
    assert s["target_checks"] and s["stage"] == "done"
    assert (s["best"] is not None) == inv.target_met and (s["best"] is None or "--port {port}" in s["ship"])
    baseline = s["diagnosis"]["baseline"]
    assert baseline["server_metrics"]["exporter"] == "triton" and baseline["stages"]["source"] == "metrics (triton)"
    # the process it started, whose Python runs the model: not tritonserver, the child listening on the port
    assert "pytriton_server.py" in baseline["command"], baseline["command"]
    assert (tmp_path / "inv" / "report.html").is_file()
    ports = [r["command"].split(" --port ")[1].split()[0] for r in s["rows"]]
    # every server stopped: one started with this run's ports, or a Triton whose workspace lies in its home
    assert running_with([str(home)] + [f"--port {p} " for p in ports]) == []
    assert list(home.iterdir()) == []  # every workspace removed
    assert os.environ["PYTRITON_HOME"] == str(home)
