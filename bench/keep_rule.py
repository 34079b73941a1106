"""The engine's error rates through its public seam (SIMULATED: ``tests.worlds``, computed queues, no timing).

``run_ladder(..., measure=world)`` on every world of ``tests/worlds.py`` (each configuration an M/D/1 server
kept warm across its windows, lognormal run-to-run noise, a 20% slow drift, 5% of windows in a deep dip, a
client that lags in 10% of windows) at 5, 10 and 15% noise, in quick and full settings. Per case:

- **no knob matters**: the share of runs that ship any change (should be at most 5%);
- **two knobs matter, with an interaction** (batch x1.4, bf16 x1.2, buckets x1.1 with batches): the share
  whose shipped configuration's service rate is within 10% of the best's;
- **one knob worth +10%**: the share that ship it;
- **a knob gains throughput but breaks the target**: the share that ship it (should be 0);
- **unreachable target**: the share that say the target was not met (should be all).

Every rate with its 95% Wilson interval, and the windows and simulated seconds a run took.

``--verify``: each claim then held as a service's run holds it (stage 5, ``tuning.experiments.verify.hold_claim``:
60 s in quick settings, 180 s in full, on the world's open loop), and the capacity is the rate held (none held:
the claim withdrawn: a run not counted in ``met``).

    python bench/keep_rule.py [--runs 200] [--quick] [--verify]

Writes ``bench/results/keep_rule.json`` and ``docs/deciding-results.md`` (``--quick``: 20 runs, a temporary
folder, no docs page; another verdict or ``--verify``: ``keep_rule_<verdict>[_held].json``, no docs page).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import numpy as np
from common import write

from tests.worlds import TARGET_MS, WORLDS, World, best_rate, seam_kwargs, steady_capacity
from tests.worlds_hard import BF16_TAIL_HEAVY, HARD_WORLDS, BatchingWorld, target_for
from tuning.experiments.defaults import VERIFY_S_FULL, VERIFY_S_QUICK
from tuning.experiments.engine import VERDICTS, EngineSettings
from tuning.experiments.judge import wilson
from tuning.experiments.ladder import LadderSettings, run_ladder
from tuning.experiments.verify import hold_claim
from tuning.knobs import preset

NOISES = (0.05, 0.10, 0.15)
LAG_SHARE = 0.10
DOCS = Path(__file__).resolve().parents[1] / "docs" / "deciding-results.md"


def outcome(world_name: str, world: World, result) -> bool:
    """Whether this run did the right thing in its world."""
    shipped = result.changes()
    if world_name == "no knob matters":
        return not shipped
    if world_name == "two knobs matter, with an interaction":
        return world.service_rate(result.recommended) >= 0.9 * best_rate(world)
    if world_name == "one knob worth +10%":
        return shipped.get("tokenizer") == "fast"
    if world_name == "a knob gains throughput but breaks the target":
        return shipped.get("tokenizer") != "fast"
    if world_name == "unreachable target":
        return not result.target_met
    raise KeyError(world_name)


def shipped_capacity(world, result, target_ms: float, verify_s: float) -> float | None:
    """The capacity a run ships: the target check's claim, or with ``verify_s`` the rate its holds held (stage
    5 on the world's open loop, arrivals and service from the world's own generator; None: not held)."""
    cap = result.capacity
    if cap is None or not cap.met:
        return None
    if not verify_s:
        return cap.capacity

    def hold(rate: float, settle_s: float, judged_s: float):
        return world(result.recommended, rate=rate, window_s=judged_s, warmup_s=settle_s)
    return hold_claim(hold, cap.capacity, verify_s, target_ms).held


def capacity_ratio(world: World, result, verify_s: float = 0.0) -> float | None:
    """The capacity shipped over the steady-state capacity of the configuration shipped, at its nominal pace
    (the world's drift moves the pace by up to 10% either way while it runs)."""
    shipped = shipped_capacity(world, result, TARGET_MS, verify_s)
    if shipped is None:
        return None
    knobs = result.recommended
    truth = steady_capacity(world.service_rate(knobs), TARGET_MS, world.floor_ms(knobs))
    return shipped / truth if truth > 0 else None


def accuracy_case(noise: float, runs: int, settings: LadderSettings, verify_s: float = 0.0) -> dict:
    """The capacity shipped against the steady-state truth on a world without drift or dips (the main cases'
    truth is at the nominal pace, which their drift moves by up to 10% while a run measures)."""
    ratios = []
    for seed in range(runs):
        world = World(noise=noise, seed=seed, drift=0.0, dip_share=0.0, lag_share=LAG_SHARE,
                      **WORLDS["two knobs matter, with an interaction"])
        result = run_ladder(device="cpu", measure=world, progress=False, settings=settings, target_p99_ms=TARGET_MS,
                            **seam_kwargs())
        ratio = capacity_ratio(world, result, verify_s)
        if ratio is not None:
            ratios.append(ratio)
    over = sum(r > 1.05 for r in ratios)
    low, high = wilson(over, len(ratios))
    return {"noise": noise, "runs": runs, "met": len(ratios), "median": round(float(np.median(ratios)), 4),
            "p10_p90": [round(float(x), 4) for x in np.percentile(ratios, [10, 90])], "over_5pct": over,
            "over_low": round(low, 4), "over_high": round(high, 4)}


def run_case(world_name: str, noise: float, runs: int, settings: LadderSettings, verify_s: float = 0.0) -> dict:
    good, windows, sim_s, shipped, ratios = 0, [], [], {}, []
    for seed in range(runs):
        world = World(noise=noise, seed=seed, lag_share=LAG_SHARE, **WORLDS[world_name])
        result = run_ladder(device="cpu", measure=world, progress=False, settings=settings, target_p99_ms=TARGET_MS,
                            **seam_kwargs())
        good += outcome(world_name, world, result)
        windows.append(len(result.windows))
        sim_s.append(world.clock)
        line = result.set_line()
        shipped[line] = shipped.get(line, 0) + 1
        ratio = capacity_ratio(world, result, verify_s)
        if ratio is not None:
            ratios.append(ratio)
    low, high = wilson(good, runs)
    over = sum(r > 1.05 for r in ratios)
    over_low, over_high = wilson(over, len(ratios)) if ratios else (None, None)
    return {"world": world_name, "noise": noise, "runs": runs, "right": good, "rate": round(good / runs, 4),
            "low": round(low, 4), "high": round(high, 4), "windows_median": float(np.median(windows)),
            "simulated_s_median": round(float(np.median(sim_s)), 1),
            "shipped_most": sorted(shipped.items(), key=lambda kv: -kv[1])[:3],
            # the capacity shipped against the steady-state truth: its median, and how often it is over by > 5%
            "capacity_over_truth_median": round(float(np.median(ratios)), 4) if ratios else None,
            "capacity_over_truth_p10_p90": [round(float(x), 4) for x in np.percentile(ratios, [10, 90])] if ratios
            else None, "capacity_overstated_5pct": over, "capacity_overstated_low": over_low and round(over_low, 4),
            "capacity_overstated_high": over_high and round(over_high, 4), "capacities_met": len(ratios)}


HARD_LOADS = (0.6, 0.8, 0.9)  # the truth placed at these shares of the saturation rate (tests.worlds_hard.target_for)
HARD_NOISE = 0.10
QUEUE_WORLDS = [name for name in HARD_WORLDS if "batcher" not in name]
# the screen's reach on the batching world: batch 1 or the knee (16), naive or fast tokenizer, dynamic or bucket
# padding, fp32 or bf16 (seam_kwargs' knee and lengths)
LADDER_SPACE = {"batch_size": (1, 16), "tokenizer": ("naive", "fast"), "padding": ("dynamic", "bucket"),
                "dtype": ("fp32", "bf16")}


def _summary(ratios: list[float], runs: int) -> dict:
    over = sum(r > 1.05 for r in ratios)
    low, high = wilson(over, len(ratios)) if ratios else (None, None)
    return {"runs": runs, "met": len(ratios), "median": round(float(np.median(ratios)), 4) if ratios else None,
            "p10_p90": [round(float(x), 4) for x in np.percentile(ratios, [10, 90])] if ratios else None,
            "over_5pct": over, "over_low": low and round(low, 4), "over_high": high and round(high, 4)}


def hard_capacity_case(name: str, load: float, runs: int, settings: LadderSettings, verify_s: float = 0.0) -> dict:
    """A world of tests.worlds_hard where no knob matters, the target placed so that the truth is ``load`` of
    saturation: the capacity claimed against the truth, and how often a change was shipped."""
    base = preset("baseline")
    ratios, changed = [], 0
    for seed in range(runs):
        world = HARD_WORLDS[name](noise=HARD_NOISE, seed=seed)
        target = target_for(world, base, load)
        result = run_ladder(device="cpu", measure=world, progress=False, settings=settings, target_p99_ms=target,
                            **seam_kwargs())
        changed += bool(result.changes())
        shipped = shipped_capacity(world, result, target, verify_s)
        if shipped is not None:
            ratios.append(shipped / world.truth(result.recommended, target))
    return {"world": name, "load": load, "noise": HARD_NOISE, "changed": changed,
            **_summary(ratios, runs)}


def batching_case(load: float, runs: int, settings: LadderSettings, verify_s: float = 0.0) -> dict:
    """The dynamic batcher whose bf16 is cheaper a call with 2% of calls 8x slow (it raises closed-loop
    throughput and lowers capacity at the target): the shipped configuration's truth over the best's among
    the screen's reach, the capacity claimed over the shipped one's truth, and how often bf16 shipped."""
    base = preset("baseline")
    configs = [base.replace(**dict(zip(LADDER_SPACE, v))) for v in itertools.product(*LADDER_SPACE.values())]
    shipped_best, ratios, bf16 = [], [], 0
    for seed in range(runs):
        world = BatchingWorld(costs=BF16_TAIL_HEAVY, seed=seed)
        target = target_for(world, base.replace(batch_size=16, tokenizer="fast", padding="bucket"), load)
        best = max(world.truth(k, target) for k in configs)
        result = run_ladder(device="cpu", measure=world, progress=False, settings=settings, target_p99_ms=target,
                            **seam_kwargs())
        truth = world.truth(result.recommended, target)
        shipped_best.append(truth / best)
        bf16 += result.recommended.dtype == "bf16"
        shipped = shipped_capacity(world, result, target, verify_s)
        if shipped is not None and truth > 0:
            ratios.append(shipped / truth)
    within = sum(r >= 0.9 for r in shipped_best)
    low, high = wilson(within, runs)
    b_low, b_high = wilson(bf16, runs)
    return {"world": "dynamic batcher, bf16 slow path 8x", "load": load, "runs": runs,
            "shipped_over_best_median": round(float(np.median(shipped_best)), 4),
            "shipped_over_best_min": round(float(np.min(shipped_best)), 4), "within_10pct": within,
            "within_low": round(low, 4), "within_high": round(high, 4), "bf16_shipped": bf16,
            "bf16_low": round(b_low, 4), "bf16_high": round(b_high, 4), "claimed_over_truth": _summary(ratios, runs)}


WHAT_RIGHT_MEANS = {
    "no knob matters": "ships no change",
    "two knobs matter, with an interaction": "ships within 10% of the best",
    "one knob worth +10%": "ships the +10% knob",
    "a knob gains throughput but breaks the target": "does not ship the knob",
    "unreachable target": "says the target was not met",
}


def docs_page(out: dict) -> str:
    lines = ["# The engine's error rates (SIMULATED)", "",
             "Generated by `bench/keep_rule.py` from `bench/results/keep_rule.json`: the engine through its seam",
             "(`run_ladder(measure=world)`) on the simulated worlds of `tests/worlds.py`, "
             f"{out['runs']} runs a case, with 95% Wilson intervals. Nothing here is a measurement of a machine.", ""]
    for mode, cases in out["cases"].items():
        lines += [f"## {mode} settings", "", "| world | right means | noise | right | 95% interval | windows | simulated s "
                  "| capacity / steady-state truth: median [p10-p90] | over by > 5% |", "|---|---|---|---|---|---|---|---|---|"]
        for c in cases:
            truth = (f"{c['capacity_over_truth_median']:.3f} [{c['capacity_over_truth_p10_p90'][0]:.3f}-"
                     f"{c['capacity_over_truth_p10_p90'][1]:.3f}]" if c["capacities_met"] else "-")
            over = (f"{c['capacity_overstated_5pct']} of {c['capacities_met']} [{100 * c['capacity_overstated_low']:.1f}-"
                    f"{100 * c['capacity_overstated_high']:.1f}%]" if c["capacities_met"] else "-")
            lines.append(f"| {c['world']} | {WHAT_RIGHT_MEANS[c['world']]} | {100 * c['noise']:.0f}% | "
                         f"{100 * c['rate']:.1f}% | {100 * c['low']:.1f}-{100 * c['high']:.1f}% | "
                         f"{c['windows_median']:.0f} | {c['simulated_s_median']:.0f} | {truth} | {over} |")
        lines.append("")
        acc = out.get("capacity_accuracy", {}).get(mode) or []
        if acc:
            lines += [f"Capacity against the steady-state truth without drift or dips ({mode}; two knobs matter):", "",
                      "| noise | median | p10-p90 | over by > 5% [95%] |", "|---|---|---|---|"]
            lines += [f"| {100 * a['noise']:.0f}% | {a['median']:.3f} | {a['p10_p90'][0]:.3f}-{a['p10_p90'][1]:.3f} | "
                      f"{a['over_5pct']} of {a['met']} [{100 * a['over_low']:.1f}-{100 * a['over_high']:.1f}%] |"
                      for a in acc]
            lines.append("")
    hard = out.get("hard") or {}
    if hard:
        lines += ["## Worlds the engine was not built from (quick settings)", "",
                  "`tests/worlds_hard.py`: FIFO servers with deterministic, lognormal (sigma 1) and 97/3 short/long "
                  f"service, {100 * HARD_NOISE:.0f}% run-to-run pace noise, no drift or dips, no knob that matters; the "
                  "target placed so that the steady-state truth is the load's share of saturation.", "",
                  "| world | load | changes shipped | capacity / truth: median [p10-p90] | over by > 5% [95%] |",
                  "|---|---|---|---|---|"]
        for c in hard["capacity"]:
            med = f"{c['median']:.3f} [{c['p10_p90'][0]:.3f}-{c['p10_p90'][1]:.3f}]" if c["met"] else "-"
            over = (f"{c['over_5pct']} of {c['met']} [{100 * c['over_low']:.1f}-{100 * c['over_high']:.1f}%]"
                    if c["met"] else "-")
            lines.append(f"| {c['world']} | {c['load']} | {c['changed']} of {c['runs']} | {med} | "
                         f"{over} |")
        lines += ["", "The dynamic batcher (bf16 a call 30% cheaper, 2% of its calls 8x slow), in quick and full "
                  "settings:", "",
                  "| settings | load | shipped / best truth: median (min) | within 10% of the best [95%] | bf16 shipped "
                  "[95%] | claimed / truth of what shipped: median, over by > 5% |", "|---|---|---|---|---|---|"]
        for b in hard["batching"]:
            c = b["claimed_over_truth"]
            lines.append(f"| {b.get('mode', 'quick')} | {b['load']} | {b['shipped_over_best_median']:.3f} "
                         f"({b['shipped_over_best_min']:.3f}) | "
                         f"{b['within_10pct']} of {b['runs']} [{100 * b['within_low']:.1f}-{100 * b['within_high']:.1f}%] | "
                         f"{b['bf16_shipped']} of {b['runs']} [{100 * b['bf16_low']:.1f}-{100 * b['bf16_high']:.1f}%] | "
                         f"{c['median']}, {c['over_5pct']} of {c['met']} |")
        lines.append("")
    return "\n".join(lines)


def with_verdict(settings: LadderSettings, verdict: str) -> LadderSettings:
    return dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, verdict=verdict))


def hold_seconds(mode: str, verify: bool) -> float:
    """A service's hold in these settings (``defaults.VERIFY_S_QUICK`` / ``VERIFY_S_FULL``), or none."""
    return (VERIFY_S_QUICK if mode == "quick" else VERIFY_S_FULL) if verify else 0.0


def hard_cases(runs: int, verdict: str, verify: bool = False) -> dict:
    settings = with_verdict(LadderSettings.quick(), verdict)
    out: dict = {"capacity": [], "batching": []}
    for name in QUEUE_WORLDS:
        for load in HARD_LOADS:
            c = hard_capacity_case(name, load, runs, settings, hold_seconds("quick", verify))
            out["capacity"].append(c)
            print(f"hard  {name:<34} load {load}: capacity/truth {c['median']} {c['p10_p90']}, "
                  f"over by >5% {c['over_5pct']} of {c['met']}, changes shipped {c['changed']} of {runs}",
                  flush=True)
    for mode, ladder in (("quick", settings), ("full", with_verdict(LadderSettings.full(), verdict))):
        for load in HARD_LOADS:
            b = {"mode": mode, **batching_case(load, runs, ladder, hold_seconds(mode, verify))}
            out["batching"].append(b)
            print(f"hard  batcher {mode} load {load}: shipped/best median {b['shipped_over_best_median']} "
                  f"(min {b['shipped_over_best_min']}), within 10% {b['within_10pct']} of {runs}, bf16 shipped "
                  f"{b['bf16_shipped']} of {runs}, claimed/truth {b['claimed_over_truth']['median']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="20 runs a case, a temporary folder")
    ap.add_argument("--modes", default="quick,full", help="settings to run: quick, full or both")
    ap.add_argument("--verdict", default="blocks", choices=VERDICTS,
                    help="the target verdict (EngineSettings.verdict); another than the default writes "
                         "keep_rule_<verdict>.json and no docs page")
    ap.add_argument("--hard-runs", type=int, default=40, help="runs a case on the worlds of tests/worlds_hard.py")
    ap.add_argument("--verify", action="store_true", help="hold each claim as a service's run does (stage 5) and "
                    "count the rate held")
    args = ap.parse_args()
    runs = 20 if args.quick else args.runs
    t0 = time.perf_counter()
    out: dict = {"what": "SIMULATED: the engine's error rates through run_ladder(measure=world) on tests/worlds.py "
                         "(M/D/1 servers kept warm, lognormal noise, 20% drift, 5% dips, a client lagging in "
                         f"{100 * LAG_SHARE:.0f}% of windows), target p99 {TARGET_MS:.0f} ms",
                 "simulated": True, "runs": runs, "target_p99_ms": TARGET_MS, "verdict": args.verdict,
                 "held_s": {m: hold_seconds(m, args.verify) for m in ("quick", "full")} if args.verify else None,
                 "cases": {}}
    for mode in args.modes.split(","):
        settings = with_verdict(LadderSettings.quick() if mode == "quick" else LadderSettings.full(), args.verdict)
        cases = []
        for name in WORLDS:
            for noise in NOISES:
                case = run_case(name, noise, runs, settings, hold_seconds(mode, args.verify))
                cases.append(case)
                print(f"{mode:<5} {name:<48} noise {100 * noise:>3.0f}%: {100 * case['rate']:5.1f}% right "
                      f"[{100 * case['low']:.1f}-{100 * case['high']:.1f}], {case['windows_median']:.0f} windows; "
                      f"capacity/truth {case['capacity_over_truth_median']}, over by >5%: "
                      f"{case['capacity_overstated_5pct']} of {case['capacities_met']}", flush=True)
        out["cases"][mode] = cases
        out.setdefault("capacity_accuracy", {})[mode] = [accuracy_case(noise, runs, settings,
                                                                       hold_seconds(mode, args.verify))
                                                         for noise in NOISES]
        for a in out["capacity_accuracy"][mode]:
            print(f"{mode:<5} capacity / steady-state truth, no drift, noise {100 * a['noise']:.0f}%: median "
                  f"{a['median']}, p10-p90 {a['p10_p90']}, over by >5% {a['over_5pct']} of {a['met']}", flush=True)
    out["hard"] = hard_cases(5 if args.quick else args.hard_runs, args.verdict, args.verify)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    default_verdict = args.verdict == EngineSettings().verdict
    write("keep_rule" + ("" if default_verdict else f"_{args.verdict}") + ("_held" if args.verify else ""), out,
          quick=args.quick)
    if not args.quick and default_verdict and not args.verify:
        DOCS.write_text(docs_page(out) + "\n")
        print(f"wrote {DOCS}")


if __name__ == "__main__":
    main()
