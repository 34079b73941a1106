"""No impossible numbers in the repository (issue 59, deliver 5): every committed device profile and result that
names a card holds no FLOP/s or bandwidth beyond that card's datasheet (its shipped profile's peaks and bandwidth).
Old fitted profiles held 37.4, 2,938.6 and 35.5 TB/s and fp32 at 196-232 TFLOP/s for an H200 (datasheet: 4.8 TB/s,
67 TFLOP/s fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuning.base.assets import DEVICE_PROFILES
from tuning.sim.profiles import load_profile, profile_for_card

ROOT = Path(__file__).resolve().parents[1]
SLACK = 1 + 1e-6  # rounding in a written figure


def committed_json() -> list[Path]:
    return sorted([*DEVICE_PROFILES.glob("*.json"), *(ROOT / "bench" / "results").rglob("*.json")])


def card_named(data) -> str | None:
    """The card a file is of: its env's name (a gpu_check run), a profile's device_names, else None (a CPU run)."""
    if not isinstance(data, dict):
        return None
    env = data.get("env") or {}
    if isinstance(env, dict) and env.get("device") == "cuda" and env.get("name"):
        return str(env["name"])
    names = data.get("device_names") or []
    return str(names[0]) if names else None


def figures(node, path: str = ""):
    """(where, dtype or 'bandwidth', value in FLOP/s or bytes/s) for every achieved rate a JSON tree states: a
    profile's peak_flops x flops_efficiency and mem_bandwidth x bandwidth_efficiency, a summary's tflops_<dtype>
    and bandwidth_gb_s."""
    if isinstance(node, dict):
        if isinstance(node.get("peak_flops"), dict) and "mem_bandwidth" in node:
            eff = float(node.get("flops_efficiency", 1.0))
            for d, v in node["peak_flops"].items():
                if v is not None:
                    yield f"{path}/peak_flops/{d}", d, float(v) * eff
            yield f"{path}/mem_bandwidth", "bandwidth", float(node["mem_bandwidth"]) * float(
                node.get("bandwidth_efficiency", 1.0))
        for key, value in node.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if key.startswith("tflops_"):
                    yield f"{path}/{key}", key.removeprefix("tflops_"), float(value) * 1e12
                elif key == "bandwidth_gb_s":
                    yield f"{path}/{key}", "bandwidth", float(value) * 1e9
            elif isinstance(value, (dict, list)):
                yield from figures(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from figures(value, f"{path}[{i}]")


def beyond_datasheet(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    card = card_named(data)
    sheet = profile_for_card(card)
    if sheet is None:
        return []
    out = []
    for where, what, value in figures(data):
        limit = sheet.mem_bandwidth if what == "bandwidth" else sheet.flops_for(what)
        if value > limit * SLACK:
            out.append(f"{path.relative_to(ROOT)}{where}: {value:.4g} > {sheet.name}'s datasheet {limit:.4g}")
    return out


def test_the_scan_finds_an_impossible_figure(tmp_path):
    bad = load_profile("h200-sxm-estimate").replace(name="bad", kind="measured", mem_bandwidth=37.4e12,
                                                    bandwidth_efficiency=1.0)
    path = ROOT / "bench" / "results" / "_scan_check.json"  # a path under the root, as the scan reports them
    try:
        bad.to_json(path)
        assert any("mem_bandwidth" in p for p in beyond_datasheet(path))
    finally:
        path.unlink(missing_ok=True)
    summary = ROOT / "bench" / "results" / "_scan_check2.json"
    try:
        summary.write_text(json.dumps({"env": {"device": "cuda", "name": "NVIDIA H200"},
                                       "fitted": {"tflops_fp32": 232.2, "bandwidth_gb_s": 3000.0}}))
        assert [p.split(":")[0].rsplit("/", 1)[-1] for p in beyond_datasheet(summary)] == ["tflops_fp32"]
    finally:
        summary.unlink(missing_ok=True)


@pytest.mark.parametrize("path", committed_json(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_committed_figure_is_beyond_its_cards_datasheet(path):
    assert beyond_datasheet(path) == []


def test_the_scan_covers_the_gpu_runs():
    scanned = [p for p in committed_json() if profile_for_card(card_named(json.loads(p.read_text())))]
    assert sum("gpu_check_h200" in str(p) for p in scanned) >= 4
