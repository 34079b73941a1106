"""Monte-Carlo of the ladder's keep rule through its public seam (SIMULATED: a stub queue, no timing).

``run_ladder(..., measure=stub)`` with ``tests.verdict_stubs.QueueStub``: an M/D/1 queue whose service rate
carries 5% run-to-run noise, 400 outcomes a window, past its knee a queue that grows at rate - mu, p99 target
800 ms. Three cases per settings (quick, as
``investigate --quick`` runs, and full):

- **no-op**: no knob changes anything; the share of ladders that ship any knob, and false keeps per decision;
- **+10%, +20%, +30%, +50%**: every step's knob raises the capacity by that much; the share of decided steps
  kept;
- **thin**: the no-op and +20% cases with 80 outcomes a window (a slow machine's short windows: too few for any
  count to pass after quick mode's 3 pairs).

    python bench/keep_rule.py [--runs 100] [--quick]

Writes ``bench/results/keep_rule.json`` (``--quick``: 10 runs, temporary folder). The unit tests bound the
same rule with fewer runs (``tests/test_verdict.py``); this gives the figures README quotes.
"""

from __future__ import annotations

import argparse
import time

from common import write

from tests.verdict_stubs import QueueStub
from tuning.experiments.ladder import LadderSettings, run_ladder

TARGET_P99_MS = 800.0
NOISE = 0.05
FACTORS = (1.10, 1.20, 1.30, 1.50)
THIN = 80  # outcomes a window in the thin cases
# past the knee the stub's queue grows at rate - mu, so the race's latency gate sees each arm's capacity (the
# stub's default gives every overloaded run the same latencies: the gate would never fire)
OVERLOAD = "queue"  # every step's knob raises the capacity by this much
STEPS = ("workers", "batch", "tokenizer", "buckets", "precision", "batching", "joint", "again")
EFFECT_STEPS = ("workers", "tokenizer", "precision")  # one knob each, no knee or plan involved
KNOBS = [lambda k: k.num_workers > 2, lambda k: k.batch_size > 1, lambda k: k.tokenizer == "fast",
         lambda k: k.padding == "bucket", lambda k: k.dtype == "bf16"]


class _Sweep:
    knee = 8


def _ladder(measure, settings: LadderSettings, steps=STEPS):
    return run_ladder(device="cpu", measure=measure, progress=False, settings=settings, steps=steps,
                      sweep=lambda knobs: _Sweep(), accuracy=lambda dtypes: {"bf16": 0.99999},
                      lengths=[12, 20, 31, 40, 64, 90], target_p99_ms=TARGET_P99_MS)


def kept_by(step) -> str:
    """Which rule kept ``step``: the race's count (``race pass``), the race's latency gate (``latency gate``),
    the target met where the reference missed it (``target met``, judged before the pairs' interval), the
    light-load pairs' interval (``light-load pairs``), or ``other``. Read from the step's reason and figures."""
    race = step.figures.get("race_verdict")
    if race == "candidate":
        return "race pass"
    if race == "candidate faster":
        return "latency gate"
    if "meets the target" in step.reason and "where the reference did not" in step.reason:
        return "target met"  # judged before the pairs' interval, whatever that said
    return "light-load pairs" if step.figures.get("verdict") == "better" else "other"


def no_op(settings: LadderSettings, runs: int, window: int = 400) -> dict:
    shipped = decisions = kept = gated = 0
    by: dict[str, int] = {}
    for seed in range(runs):
        ladder = _ladder(QueueStub(base_rate=40.0, noise=NOISE, seed=seed, overload=OVERLOAD, window=window), settings)
        decided = [s for s in ladder.steps if s.status in ("kept", "not kept")]
        decisions += len(decided)
        kept += sum(s.status == "kept" for s in decided)
        shipped += bool(ladder.changes())
        gated += sum(s.status == "kept" and s.figures.get("race_verdict") == "candidate faster" for s in decided)
        for s in decided:
            if s.status == "kept":
                rule = kept_by(s)
                by[rule] = by.get(rule, 0) + 1
    return {"runs": runs, "window": window, "runs_shipping_a_knob": shipped, "false_keeps_by_the_latency_gate": gated,
            "false_keeps_by_rule": dict(sorted(by.items())),
            "share_of_runs": shipped / runs, "decisions": decisions,
            "false_keeps": kept, "false_keeps_per_decision": kept / decisions if decisions else None}


def effect(settings: LadderSettings, runs: int, factor: float, window: int = 400) -> dict:
    kept = decided = gated = 0
    for seed in range(runs):
        stub = QueueStub([(test, factor) for test in KNOBS], base_rate=40.0, noise=NOISE, seed=seed,
                         overload=OVERLOAD, window=window)
        steps = [s for s in _ladder(stub, settings, EFFECT_STEPS).steps if s.status in ("kept", "not kept")]
        decided += len(steps)
        kept += sum(s.status == "kept" for s in steps)
        gated += sum(s.status == "kept" and s.figures.get("race_verdict") == "candidate faster" for s in steps)
    return {"runs": runs, "window": window, "factor": factor, "steps_decided": decided, "steps_kept": kept,
            "kept_by_the_latency_gate": gated,
            "share_kept": kept / decided if decided else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="ladders per case")
    parser.add_argument("--quick", action="store_true", help="check the script: 10 runs, temporary output")
    args = parser.parse_args()
    runs = 10 if args.quick else args.runs
    out = {"what": "SIMULATED: the keep rule's false keeps and power through run_ladder(measure=stub); an M/D/1 "
                   f"stub with {100 * NOISE:.0f}% run-to-run noise on its service rate, p99 target "
                   f"{TARGET_P99_MS:.0f} ms; no timing", "simulated": True, "settings": {}}
    # the stubs model the keep rule, not this host: the workers step is judged whatever the cores (quick mode
    # skips it on fewer than 3, LadderSettings.workers_min_cores)
    for name, settings in (("quick", LadderSettings.quick(workers_min_cores=0)), ("full", LadderSettings.full())):
        t0 = time.perf_counter()
        res = {"no_op": no_op(settings, runs),
               **{f"plus_{round(100 * (f - 1))}": effect(settings, runs, f) for f in FACTORS}}
        # thin races: 80 outcomes a window, under the 299 a count needs after quick mode's 3 pairs (the thin
        # race's extension; at 400 a window no race is thin)
        res["no_op_thin"], res["plus_20_thin"] = no_op(settings, runs, THIN), effect(settings, runs, 1.20, THIN)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        out["settings"][name] = res
        n = res["no_op"]
        kept = "; ".join(f"+{round(100 * (f - 1))}%: {res[f'plus_{round(100 * (f - 1))}']['steps_kept']} of "
                         f"{res[f'plus_{round(100 * (f - 1))}']['steps_decided']}" for f in FACTORS)
        print(f"{name}: no-op: {n['runs_shipping_a_knob']} of {runs} runs shipped a knob "
              f"({n['false_keeps']} false keeps in {n['decisions']} decisions, by rule {n['false_keeps_by_rule']}); "
              f"steps kept: {kept}; thin ({THIN} a window): no-op {res['no_op_thin']['runs_shipping_a_knob']} of {runs} "
              f"runs shipped a knob, +20% {res['plus_20_thin']['steps_kept']} of {res['plus_20_thin']['steps_decided']} "
              f"kept ({res['seconds']:.0f} s)", flush=True)
    write("keep_rule", out, quick=args.quick)


if __name__ == "__main__":
    main()
