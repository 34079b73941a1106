"""One result contract (tuning.base.contract): every --json output carries ``schema_version``, and every
measured result names its figures the same way (``qps``, ``p50_ms``, ``p99_ms``, ``model_busy``, ``device_busy``)
with ``device`` as one object (kind, name, profile, source). The commands run in this process (fast)."""

import contextlib
import io
import json

import pytest

from tuning.base.contract import DEVICE_KEYS, DEVICE_KINDS, FIGURE_KEYS, SCHEMA_VERSION, as_device, device_object, with_schema
from tuning.cli import main

FAST = ["--set", "max_length=32"]
COMMANDS = {  # command -> (argv, where its figures are: "top" or "points")
    "run": (["run", "--limit", "16", *FAST, "--json"], "top"),
    "profile": (["profile", "--limit", "16", *FAST, "--json"], "top"),
    "loadtest": (["loadtest", "--requests", "16", "--warmup", "2", "--concurrency", "4", *FAST, "--json"], "top"),
    "sweep concurrency": (["sweep", "concurrency", "--values", "1,2", "--requests", "8", *FAST, "--json"], "points"),
    "sweep batch": (["sweep", "batch", "--sizes", "1,2", "--length", "16", "--repeats", "1", "--json"], "device"),
    "precision": (["precision", "--limit", "8", "--json"], "device"),
    "plan": (["plan", "--limit", "50", "--json"], "none"),
}


def _json_of(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def _check_device(device):
    assert isinstance(device, dict) and set(DEVICE_KEYS) <= set(device), device
    assert device["kind"] in DEVICE_KINDS


@pytest.mark.parametrize("name", COMMANDS)
def test_every_json_output_carries_the_contract(name):
    argv, where = COMMANDS[name]
    out = _json_of(argv)
    assert out["schema_version"] == SCHEMA_VERSION and next(iter(out)) == "schema_version"
    if where == "top":
        assert set(FIGURE_KEYS) <= set(out), set(FIGURE_KEYS) - set(out)
        _check_device(out["device"])
    elif where == "points":
        _check_device(out["device"])
        for point in out["points"]:
            assert {"qps", "p50_ms", "p99_ms", "model_busy"} <= set(point)
    elif where == "device":
        _check_device(out["device"])
    for key in ("throughput", "qps_rps"):  # other names for the contract's figure stay out of the top level
        assert key not in out


def test_offline_qps_counts_ok_answers_and_the_deprecated_alias_counts_every_outcome(messy_file):
    out = _json_of(["run", "--data", str(messy_file), *FAST, "--json"])
    assert out["errors"] > 0 and out["ok"] > 0
    assert out["qps"] == pytest.approx(out["ok"] / out["window_s"], rel=1e-3)
    assert out["throughput_rps"] == pytest.approx(out["requests"] / out["window_s"], rel=1e-3)
    assert out["qps"] < out["throughput_rps"]


def test_device_object_and_schema_helpers():
    assert device_object("cpu", "x") == {"kind": "cpu", "name": "x", "profile": None, "source": None}
    with pytest.raises(ValueError, match="kind='gpu'.*cpu \\| cuda \\| simulated"):
        device_object("gpu")
    assert as_device({"kind": "simulated", "profile": "p"}) == {"kind": "simulated", "name": None, "profile": "p",
                                                              "source": None}
    assert as_device({"no": "kind"}) is None and as_device(None) is None
    assert with_schema({"a": 1}) == {"schema_version": SCHEMA_VERSION, "a": 1}
    assert with_schema([1]) == {"schema_version": SCHEMA_VERSION, "rows": [1]}


def test_a_device_choice_gives_the_same_object():
    import tuning

    for choice in ("cpu", "sim"):
        block = as_device(tuning.device_for(choice))
        _check_device(block)
    assert as_device(tuning.device_for("sim"))["profile"] == "h200-sxm-estimate"
