"""The investigation's story on the simulated H200: the engine from ``baseline`` to what to ship.

Everything on the host is real (reading, tokenizing, loader workers, batcher, copies); the model call is the
simulated accelerator's stand-in (``device=sim``, profile ``h200-sxm-estimate``, a datasheet estimate). The
decision is the package's own (:func:`tuning.experiments.ladder.run_ladder`, shared with ``investigate`` and
notebook 06; ``docs/deciding.md``). For the baseline and the configuration shipped this script adds a run
under the recorder (its diagnosis) and an offline replay of the knobs (throughput, model busy, device busy,
offline diagnosis).

Writes ``bench/results/sim_ladder.json`` (``--quick``: ``sim_ladder_quick.json`` in a temporary folder): the
decision's table, its capacities, ``tuned_over_baseline`` (the capacity ratio at the target) and the offline
ratio beside it. Every figure is SIMULATED: the host side measured here, the device time predicted.

    python bench/sim_ladder.py             # the full settings
    python bench/sim_ladder.py --quick     # the quick ones
"""

from __future__ import annotations

import argparse
import time

from common import write

from tuning.experiments.ladder import LadderSettings, run_ladder
from tuning.experiments.profiled import profile_pipeline


def replay(knobs, limit: int) -> dict:
    offline = profile_pipeline(knobs, limit=limit, with_ops=False)
    work = offline.workload
    return {"qps": work.qps, "model_busy": work.model_busy, "device_busy": work.device_busy,
            "diagnosis": offline.diagnosis.kind, "reasons": offline.diagnosis.reasons}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", default="h200-sxm-estimate", help="simulated device profile")
    parser.add_argument("--target", type=float, default=200.0, help="p99 target, ms")
    args = parser.parse_args()
    t0 = time.time()
    settings = LadderSettings.quick() if args.quick else LadderSettings.full()
    result = run_ladder(None, device="sim", sim_profile=args.profile, settings=settings, target_p99_ms=args.target,
                        progress=True)
    summary = result.summary()
    limit = 400 if args.quick else 1200
    ends = {"baseline": replay(result.baseline, limit), "recommended": replay(result.recommended, limit)}
    for name, row in ends.items():
        print(f"{name:11s} offline {row['qps']:7.1f} req/s, device busy {row['device_busy']:5.0%}, {row['diagnosis']}")
    payload = {
        "what": "SIMULATED: the engine on a simulated accelerator; host side measured, device time predicted",
        "simulated": True, "device": summary["device"], "steps": summary["steps"],
        "confirmations": summary["confirmations"], "target_checks": summary["target_checks"],
        "tuned_over_baseline": summary["result"]["ratio"], "ratio_of": summary["result"]["ratio_of"],
        "target_p99_ms": summary["target_p99_ms"], "target_met": summary["target_met"], "offline": ends,
        "offline_tuned_over_baseline": ends["recommended"]["qps"] / ends["baseline"]["qps"],
        "recommended": summary["recommended"], "batch_sweep": summary["batch_sweep"],
        "windows": len(result.windows), "seconds": round(time.time() - t0, 1),
    }
    print(f"tuned_over_baseline (online {payload['ratio_of']}) {payload['tuned_over_baseline']}; offline "
          f"{payload['offline_tuned_over_baseline']:.2f}; recommended: {summary['recommended']['set_line']}")
    write("sim_ladder_quick" if args.quick else "sim_ladder", payload, quick=args.quick)


if __name__ == "__main__":
    main()
