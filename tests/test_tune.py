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
