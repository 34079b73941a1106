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
    assert json.loads((tmp_path / "tune.json").read_text())["configurations"] == 4
