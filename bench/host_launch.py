"""The what-if's eager host cost per launch, checked against the lent H200's measurements (issue 25, deliver 2).

    python bench/host_launch.py

The simulator charges an eager launch as this host's cost per launched kernel of the model's own code (its
miniature, ``tuning.sim.dispatch.model_dispatch_s``) plus the profile's ``launch_s`` (the CUDA path's part).
Every ``bench/results/gpu_check_h200*/gpu_check.json`` whose run measured the miniature on its own host (the
``host_cost`` step) is predicted here with the shipped ``h200-sxm-estimate`` profile and that host's miniature,
beside what the run measured on the card: the eager forward at batch 1 (``host_cost``) and, where the run has
them, the published table's shapes (``published_shapes``). The rule before (one tiny op's dispatch plus a raw
2.65 us launch) is predicted beside it. Also printed: this host's miniature, and the whole per-launch host cost
``bench/sim_published.py`` fitted to the A100 publications' hosts. Writes ``bench/results/host_launch.json``.
Measured figures are the runs'; every predicted figure is simulated.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuning.runtime.engine import sim_host_dispatch  # noqa: E402
from tuning.sim import embedded_model_profile, load_profile, predict  # noqa: E402
from tuning.sim.dispatch import host_dispatch_s  # noqa: E402

RESULTS = ROOT / "bench" / "results"
OLD_LAUNCH_S = 2.65e-6  # the shipped launch_s before 2026-12-04 (a raw no-op launch)
BAND = (0.67, 1.5)  # issue 25's per-row band


def predicted_ms(minilm, profile, batch: int, length: int, dtype: str, dispatch_s: float) -> float:
    return predict(minilm, profile, batch, length, dtype, "eager", host_dispatch_s=dispatch_s).call_s * 1e3


def rows_of(run: Path, minilm, profile) -> list[dict]:
    data = json.loads((run / "gpu_check.json").read_text())
    steps = data.get("steps", {})
    host = steps.get("host_cost", {})
    if host.get("status") != "ok":
        return []
    mini_s = host["rows"][0]["miniature_us"] * 1e-6
    tiny_s = host["rows"][0]["tiny_op_us"] * 1e-6
    old = replace(profile, launch_s=OLD_LAUNCH_S)
    measured = [("host_cost", r["batch"], r["length"], r["dtype"], r["measured_ms"]) for r in host["rows"]]
    measured += [("published_shapes", r["batch"], r["seq_len"], r["dtype"], r["measured_ms"])
                 for r in steps.get("published_shapes", {}).get("rows", [])]
    rows = []
    for step, batch, length, dtype, ms in measured:
        new = predicted_ms(minilm, profile, batch, length, dtype, mini_s)
        before = predicted_ms(minilm, old, batch, length, dtype, tiny_s)
        rows.append({"run": run.name, "step": step, "batch": batch, "length": length, "dtype": dtype,
                     "measured_ms": round(ms, 4), "predicted_ms": round(new, 4), "ratio": round(new / ms, 3),
                     "predicted_before_ms": round(before, 4), "ratio_before": round(before / ms, 3),
                     "host_miniature_us": round(mini_s * 1e6, 2), "host_tiny_op_us": round(tiny_s * 1e6, 2)})
    return rows


def main() -> None:
    minilm = embedded_model_profile()
    profile = load_profile("h200-sxm-estimate")
    runs = sorted(p.parent for p in RESULTS.glob("gpu_check_h200*/gpu_check.json"))
    rows = [row for run in runs for row in rows_of(run, minilm, profile)]
    skipped = [run.name for run in runs if not any(r["run"] == run.name for r in rows)]
    ratios = [r["ratio"] for r in rows]
    before = [r["ratio_before"] for r in rows]
    host_rows = [r for r in rows if r["batch"] == 1]
    published = json.loads((RESULTS / "sim_published.json").read_text())["summary"]["fitted_on_calibration_rows"]
    from tuning.runtime.model import random_minilm

    here_s, here_source = sim_host_dispatch(random_minilm())
    summary = {
        "what": "predicted (SIMULATED, h200-sxm-estimate, each run's own host's miniature) over measured (lent H200 runs)",
        "launch_s_us": profile.launch_s * 1e6, "launch_s_source": profile.sources["launch_s"],
        "runs": [r.name for r in runs], "runs_without_a_host_measurement": skipped, "rows": len(rows),
        "median_ratio": statistics.median(ratios) if ratios else None,
        "within_band": sum(BAND[0] <= x <= BAND[1] for x in ratios), "band": BAND,
        "median_ratio_batch_1": statistics.median(r["ratio"] for r in host_rows) if host_rows else None,
        "median_ratio_before": statistics.median(before) if before else None,
        "median_ratio_before_batch_1": statistics.median(r["ratio_before"] for r in host_rows) if host_rows else None,
        "this_host": {"miniature_us_per_launch": here_s * 1e6, "source": here_source,
                      "tiny_op_us": host_dispatch_s() * 1e6,
                      "eager_host_us_per_launch_predicted": here_s * 1e6 + profile.launch_s * 1e6},
        "a100_publication_hosts_whole_us_per_launch": {k: v * 1e6 for k, v in published["launch_s_per_host"].items()},
    }
    out = RESULTS / "host_launch.json"
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"{'run':26s} {'step':16s} {'b':>4s} {'L':>4s} {'dtype':5s} {'meas ms':>8s} {'pred ms':>8s} {'ratio':>6s} "
          f"{'before':>6s}")
    for r in rows:
        print(f"{r['run']:26s} {r['step']:16s} {r['batch']:4d} {r['length']:4d} {r['dtype']:5s} {r['measured_ms']:8.3f} "
              f"{r['predicted_ms']:8.3f} {r['ratio']:6.2f} {r['ratio_before']:6.2f}")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
