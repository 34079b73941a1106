"""The engine checked against an exhaustive grid: does it ship (close to) the best configuration?

On the simulated device, every cell of a grid (``batch_size`` x ``max_wait_ms`` x length buckets on/off, from
the engine's likely end state: fast tokenizer, bf16, eager) gets its capacity at a p99 target the way the
engine checks one (``docs/deciding.md``, stage 3): its sustained throughput (a closed-loop window), then
target windows at descending fractions of it on a warm server; the capacity is the highest rate that passed.
Then the engine (:func:`tuning.experiments.ladder.run_ladder`) decides from ``baseline`` on the same device.
The grid's best is the highest of many single checks and so biased up (the winner's curse): after the grid
the best cell and the shipped configuration are checked again alternately (ABBA then BAAB, ``--head-to-head
N`` each), and ``engine_over_grid_best`` is the ratio of the means of those checks. Everything shares one
:class:`~tuning.experiments.measure.LoadMeasure` (the same requests, the load from a separate process).

**The device profile.** ``l4-estimate`` slowed 10x (``--slowdown 10``: FLOP/s and memory bandwidth divided
by 10, host costs kept), so that the device, not this 2-core host, limits the cells and the grid has device
choices to tell apart; the synthetic profile is written to a temporary file and recorded in the result.

Figures (``bench/results/tuner.json``): each cell's throughput, capacity and windows; the grid's best over
its worst (at least 1.5: a grid that discriminates); ``engine_over_grid_best`` (target >= 0.95) with each
pair's ratio; the windows the grid used and the engine's. Every figure is SIMULATED: the host side measured
here, the device time predicted by the cost model.

    python bench/tuner.py             # 4 x 3 x 2 = 24 cells, the full engine, 4 head-to-head checks each
    python bench/tuner.py --quick     # 2 x 2 x 2 = 8 cells, the quick engine, 2 each
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import write

from tuning.base.assets import device_profile_path
from tuning.base.format import rounded
from tuning.experiments.capacity import check_target
from tuning.experiments.engine import EngineSettings, Runner
from tuning.experiments.ladder import LadderSettings, measure_for, run_ladder
from tuning.experiments.result import change_text, changes_of
from tuning.experiments.workload import input_texts, load_inputs, plan_for, token_lengths
from tuning.knobs import Knobs, preset

TARGET_P99_MS = 200.0
MIN_DISCRIMINATION = 1.5  # the grid's best over its worst: below this the grid does not tell configurations apart
TARGET_RATIO = 0.95  # the engine's shipped configuration over the grid's best
GRIDS = {  # (batch sizes, max waits in ms); buckets on and off for each
    "full": ((8, 16, 32, 64), (2.0, 5.0, 20.0)),
    "quick": ((8, 32), (2.0, 20.0)),
}


def slowed_profile(name: str, slowdown: float, folder: Path) -> tuple[str, dict[str, Any]]:
    """``name``'s profile with its device rates (FLOP/s, memory bandwidth) divided by ``slowdown`` and its host
    costs kept, written to ``folder``; returns the ``sim_profile`` knob (a name or that file) and the profile."""
    raw = json.loads(device_profile_path(name).read_text())
    if slowdown == 1:
        return name, raw
    raw = {**raw, "name": f"{raw['name']}-slowed-{slowdown:g}x",
           "peak_flops": {k: v / slowdown for k, v in raw["peak_flops"].items()},
           "mem_bandwidth": raw["mem_bandwidth"] / slowdown,
           "description": (f"SYNTHETIC: {raw['name']} with its FLOP/s and memory bandwidth divided by {slowdown:g} "
                           f"(host costs kept) so that the device, not the host, limits some configurations; from: "
                           f"{raw['description']}")}
    raw["sources"] = {**raw.get("sources", {}), "slowdown": f"bench/tuner.py --slowdown {slowdown:g}: not a datasheet"}
    path = folder / f"{raw['name']}.json"
    path.write_text(json.dumps(raw, indent=2))
    return str(path), raw


def grid_cells(base: Knobs, sizes: tuple[int, ...], waits: tuple[float, ...], buckets: tuple[int, ...]) -> list[dict]:
    """Every (batch size, max wait, padding) of the grid as validated Knobs and the changes from ``base``."""
    cells = []
    for padding in ("bucket", "dynamic"):
        for size in sizes:
            for wait in waits:
                changes: dict[str, Any] = {"batch_size": size, "max_wait_ms": float(wait), "padding": padding}
                if padding == "bucket":
                    changes["buckets"] = buckets
                cells.append({"changes": changes, "knobs": base.replace(**changes)})  # replace validates
    return cells


def capacity(runner: Runner, knobs: Knobs, seed: int) -> dict[str, Any]:
    """The engine's target check of one configuration: its throughput, then the descending windows."""
    t0 = time.time()
    w = runner.run("grid", knobs, None, seed)
    cap = check_target(lambda rate, s, arrivals: runner.run("target", knobs, rate, s, arrivals), w.qps,
                       runner.target_ms, runner.settings.fractions, runner.settings.error_budget, seed,
                       longest=runner.settings.longest_arrivals)
    return {"throughput": rounded(w.qps), "capacity": rounded(cap.capacity), "windows": 1 + len(cap.probes),
            "device_busy": rounded(w.device_busy), "check": cap.summary(), "seconds": rounded(time.time() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", default="l4-estimate")
    ap.add_argument("--slowdown", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=TARGET_P99_MS)
    ap.add_argument("--head-to-head", type=int, default=None, help="checks of each of the two, alternately")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    mode = "quick" if args.quick else "full"
    settings = LadderSettings.quick() if args.quick else LadderSettings.full()
    engine: EngineSettings = settings.engine
    folder = Path(tempfile.mkdtemp(prefix="tuner-"))
    sim_profile, profile = slowed_profile(args.profile, args.slowdown, folder)
    inputs = load_inputs(None, 400 if args.quick else 1000)
    texts, _ = input_texts(inputs)
    plan = plan_for(token_lengths(texts))
    base = preset("baseline", device="sim", sim_profile=sim_profile, tokenizer="fast", dtype="bf16")
    cells = grid_cells(base, *GRIDS[mode], tuple(plan["buckets"]))
    random.Random(args.seed).shuffle(cells)
    measure = measure_for(inputs, settings)
    runner = Runner(measure, lambda k: changes_of(k), engine, args.target)
    try:
        for i, cell in enumerate(cells):
            cell.update(capacity(runner, cell["knobs"], args.seed + 100 * i))
            print(f"{change_text(cell['changes']):60s} {cell['throughput']} req/s, capacity {cell['capacity']}",
                  flush=True)
        grid_windows = len(runner.windows)
        result = run_ladder(inputs, device="sim", sim_profile=sim_profile, settings=settings, measure=measure,
                            target_p99_ms=args.target, progress=True)
        met = [c for c in cells if c["capacity"]]
        best = max(met, key=lambda c: c["capacity"]) if met else None
        worst = min(met, key=lambda c: c["capacity"]) if met else None
        pairs = []
        for i in range(args.head_to_head or (2 if args.quick else 4)):  # ABBA then BAAB: a drift falls on neither
            order = ("grid", "engine") if i % 4 in (0, 3) else ("engine", "grid")
            got = {name: capacity(runner, best["knobs"] if name == "grid" else result.recommended, 10_000 + i)
                   for name in order} if best is not None else {}
            if got:
                pairs.append({k: v["capacity"] for k, v in got.items()})
    finally:
        measure.close()
    done = [p for p in pairs if p.get("grid") and p.get("engine") is not None]
    ratio = (float(np.mean([p["engine"] or 0.0 for p in done])) / float(np.mean([p["grid"] for p in done]))
             if done else None)
    out = {"what": "SIMULATED: the engine against an exhaustive grid on a slowed simulated device; host side "
                   "measured, device time predicted", "simulated": True, "mode": mode, "profile": profile,
           "slowdown": args.slowdown, "target_p99_ms": args.target,
           "cells": [{k: v for k, v in c.items() if k != "knobs"} for c in cells],
           "grid_best": best and change_text(best["changes"]), "grid_best_capacity": best and best["capacity"],
           "grid_best_over_worst": rounded(best["capacity"] / worst["capacity"]) if best and worst else None,
           "discriminates": bool(best and worst and best["capacity"] / worst["capacity"] >= MIN_DISCRIMINATION),
           "engine_shipped": result.set_line(), "engine_summary": {k: result.summary()[k] for k in
                                                                   ("steps", "confirmations", "target_checks")},
           "head_to_head": pairs, "engine_over_grid_best": rounded(ratio),
           "engine_meets_target_ratio": None if ratio is None else ratio >= TARGET_RATIO,
           "grid_windows": grid_windows, "engine_windows": len(result.windows), "seconds": round(time.time() - t0, 1)}
    print(f"grid best {out['grid_best']} at {out['grid_best_capacity']} req/s (best/worst "
          f"{out['grid_best_over_worst']}); engine shipped {out['engine_shipped']}; engine/grid best "
          f"{out['engine_over_grid_best']} over {len(done)} head-to-head pairs; windows {grid_windows} vs "
          f"{out['engine_windows']}")
    write("tuner", {**out, "profile": {k: v for k, v in profile.items() if k != "description"}}, quick=args.quick)


if __name__ == "__main__":
    main()
