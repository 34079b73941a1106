"""The investigation's story on the simulated H200: the ladder from ``baseline``, one variable at a time.

Everything on the host is real (reading, tokenizing, loader workers, batcher, copies); the model call
is the simulated accelerator's stand-in (``device=sim``, profile ``h200-sxm-estimate``, a datasheet
estimate). The ladder is the package's own (:func:`tuning.experiments.ladder.run_ladder`, shared with
``investigate`` and notebook 06): each rung load-tested under the same fixed-concurrency closed loop,
kept only if it beats the rung before by more than the run-to-run spread. Per rung this script
adds the recorder's diagnosis of that load test and an offline replay of the rung's knobs
(throughput, model busy, device busy, offline diagnosis).

Writes ``bench/results/sim_ladder.json``: the rungs and ``tuned_over_baseline`` (online QPS of the
recommended configuration over the baseline's; offline throughput ratio beside it). Every figure
is SIMULATED: the host side measured here, the device time predicted.

    python bench/sim_ladder.py             # about 6 minutes on 2 cores
    python bench/sim_ladder.py --quick     # about 2 minutes
"""

from __future__ import annotations

import argparse
import time

from common import write

from tuning.experiments.ladder import LadderSettings, load_inputs, run_ladder
from tuning.experiments.measure import LoadMeasure
from tuning.experiments.profiled import profile_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", default="h200-sxm-estimate", help="simulated device profile")
    args = parser.parse_args()
    t0 = time.time()
    settings = LadderSettings.quick() if args.quick else LadderSettings(
        concurrency=32, duration_s=8.0, warmup_s=2.0, sweep_sizes=(1, 2, 4, 8, 16, 32, 64),
        sweep_repeats=3, sweep_rounds=3, waits_ms=(2.0, 5.0, 10.0, 20.0), precision_texts=128)
    inputs = load_inputs(None, settings.limit)
    load = LoadMeasure(inputs, settings.concurrency, settings.duration_s, settings.warmup_s)
    ladder = run_ladder(None, device="sim", sim_profile=args.profile, settings=settings,
                        # every run under the recorder (its diagnosis per rung); the seed passed on, so that each pair and probe
                        # draws its own arrivals (a measure without ``seed`` replays one draw everywhere)
                        measure=lambda knobs, *, rate=None, record=False, seed=None: load(knobs, rate=rate, record=True,
                                                                                          seed=seed),
                        progress=True)

    rungs = []
    offline_limit = 400 if args.quick else 1200
    for step in ladder.steps:
        row = step.row()
        e = next((x for x in ladder.experiments if x.id in step.experiments and x.role in ("candidate", "baseline")),
                 None)
        if e is not None:
            f = e.figures()
            profiled = [t.profile for t in e.trials if t.profile is not None]
            row["online_diagnosis"] = profiled[-1].diagnosis.kind if profiled else None
            offline = profile_pipeline(e.knobs, limit=offline_limit, with_ops=False)
            work = offline.workload
            row["offline"] = {"qps": work.qps, "model_busy": work.model_busy,
                              "device_busy": work.device_busy, "diagnosis": offline.diagnosis.kind,
                              "reasons": offline.diagnosis.reasons}
            print(f"{step.name:10s} {step.status:9s} online {f['qps']:7.1f} QPS p99 {f['p99_ms']:7.1f} ms "
                  f"model {f['model_busy']:5.0%} device {f['device_busy']:5.0%} {row['online_diagnosis']:10s} | offline "
                  f"{work.qps:7.1f} req/s device {work.device_busy:5.0%} {offline.diagnosis.kind}")
        rungs.append(row)
    first = next(r for r in rungs if r.get("offline"))
    final = next(r for r in reversed(rungs) if r.get("offline") and r["kept"])
    summary = ladder.summary()
    payload = {
        "what": "SIMULATED: the ladder on a simulated accelerator; host side measured, device time predicted",
        "device": summary["device"], "rungs": rungs,
        "tuned_over_baseline": summary["result"]["ratio"], "ratio_of": summary["result"]["ratio_of"],
        "target_p99_ms": summary["target_p99_ms"], "target_met": summary["target_met"],
        "offline_tuned_over_baseline": final["offline"]["qps"] / first["offline"]["qps"],
        "recommended": summary["recommended"], "batch_sweep": summary["batch_sweep"], "waits": summary["waits"],
        "seconds": time.time() - t0,
    }
    print(f"tuned_over_baseline (online {payload['ratio_of']}) {payload['tuned_over_baseline']}; offline "
          f"{payload['offline_tuned_over_baseline']:.2f}; recommended: {summary['recommended']['set_line']}")
    write("sim_ladder", payload, quick=args.quick)


if __name__ == "__main__":
    main()
