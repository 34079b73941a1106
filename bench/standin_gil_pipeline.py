"""The simulated H200 offline pipeline with the stand-in's host part before and after ``SEGMENT_S`` (issue 25).

``flock /tmp/bench.lock python bench/standin_gil_pipeline.py`` writes ``bench/results/standin_gil_pipeline.json``.

``spin``: the host part before torch's GIL pattern (a GIL-holding spin); ``per_launch``: the host part as it
was (one real tiny op per launch, the GIL released after every launch);
``segment``: as it is (one GIL-free segment per ``SEGMENT_S`` of host time). ``baseline`` and ``tuned`` presets on
``device='sim'`` (the H200 profile), offline, interleaved rounds; medians of throughput and model-busy share.
Every figure is SIMULATED: the device is the cost model, the host (tokenizer, batcher, threads) is this one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tuning  # noqa: E402
import tuning.sim.standin as standin  # noqa: E402
from tuning.sim.dispatch import SEGMENT_S, HostPart  # noqa: E402

OUT = ROOT / "bench" / "results" / "standin_gil_pipeline.json"
NEW = standin.host_part


class Spin:
    """The host part before torch's GIL pattern: a GIL-holding spin of the predicted host time."""

    def __init__(self, cost):
        self.seconds = cost.host_s

    def run(self) -> None:
        standin.spin_cpu(self.seconds)


def per_launch(cost):
    plan = NEW(cost)
    return HostPart(plan.ops, plan.released_s, segment_s=0.0, real_ops="launch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    runs: dict[str, dict[str, list[dict]]] = {}
    for round_ in range(args.rounds):
        for name in ("baseline", "tuned"):
            for mode, factory in (("spin", Spin), ("per_launch", per_launch), ("segment", NEW))[::1 if round_ % 2 == 0 else -1]:
                standin.host_part = factory
                try:
                    result = tuning.Pipeline(tuning.preset(name, device="sim")).run(limit=args.limit,
                                                                                  keep_embeddings=False)
                finally:
                    standin.host_part = NEW
                row = {"qps": result.qps, "model_busy": result.model_busy}
                runs.setdefault(name, {}).setdefault(mode, []).append(row)
                print(f"round {round_ + 1} {name} {mode}: {row['qps']:.0f} req/s (simulated), "
                      f"model busy {row['model_busy']:.2f}", flush=True)
    summary = {"what": "SIMULATED offline throughput on the h200-sxm-estimate profile, the stand-in's host part "
                       "as a GIL-holding spin, before (per_launch) and after (segment) SEGMENT_S; medians over "
                       "interleaved rounds",
               "segment_s": SEGMENT_S, "limit": args.limit, "rounds": args.rounds, "presets": {}}
    for name, modes in runs.items():
        med = {mode: {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]} for mode, rows in modes.items()}
        med["segment_over_per_launch_qps"] = round(med["segment"]["qps"] / med["per_launch"]["qps"], 3)
        med["segment_over_spin_qps"] = round(med["segment"]["qps"] / med["spin"]["qps"], 3)
        med["runs"] = modes
        summary["presets"][name] = med
        print(f"{name}: spin {med['spin']['qps']:.0f}, per_launch {med['per_launch']['qps']:.0f} "
              f"-> segment {med['segment']['qps']:.0f} req/s "
              f"(x{med['segment_over_per_launch_qps']:.2f}, simulated)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
