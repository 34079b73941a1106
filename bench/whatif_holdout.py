"""The what-if fitted on some H200 cards and judged on the others (issue 52), and fitted on small shapes and judged on
the larger ones (issue 59; ``docs/what-if-validation.md``).

    python bench/whatif_holdout.py                    # judge, write bench/results/whatif_holdout.json
    python bench/whatif_holdout.py --write-profile    # and write the refit chip fit, tuning/sim/devices/chips/gh100.json
    python bench/whatif_holdout.py --predict          # the next plan's points predicted, bench/results/whatif_predictions.json

The committed ``bench/results/gpu_check_h200*`` runs are grouped by the card each recorded (NVML UUID); the split
(the card with the most runs fits, the others judge) is printed before anything is fitted. On the fit side
(``tuning.sim.holdout.fit``): the attention backend's extra kernels (the profiler's count less the model's), the
eager and in-graph per-kernel floors (the profiler's kernel sums) and the bf16 GEMM efficiency (bounded least
squares of the replayed forwards). Both sides are then predicted with the shipped profile before the refit and
with the refit one: predicted/measured per shape, median and range per mode.

Not held out: the host's cost per launch. The profile's ``launch_s`` was set from the runs whose hosts measured
their own miniature (``host_cost``), which are the judge side's; the fit side's runs measured none, so their host
part is the geometric mean of the hosts that did. Eager times at small shapes are mostly host time, so the eager
figures here judge the host part in-sample; ``bench/gpu_check.py`` records ``host_cost`` on every run now, so
the next GPU run on a new card holds it out.

Beside the card split, a split by shape: fitted on every run's shapes of batch x length <= 2,048, judged on the
larger ones (``shape_split`` in the result): the model at shapes it has not seen.

Measured figures are the runs' (real H200 cards); every predicted figure is SIMULATED.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS, write

from tuning.sim import holdout, load_profile
from tuning.sim.profiles import DeviceProfile

ROOT = Path(__file__).resolve().parents[1]
DONE_GRAPH_MEDIAN = (0.85, 1.15)  # issue 52's done-when, graph mode on the held-out cards
DONE_GRAPH_BAND = (0.67, 1.5)


def sides(profile: DeviceProfile, split: holdout.Split, dispatch_s: float) -> tuple[dict, list[dict]]:
    summary, rows = {}, []
    for side, runs in (("fit", split.fit), ("judge", split.judge)):
        judged = holdout.judge(profile, runs, dispatch_s=dispatch_s)
        rows += [{"side": side, **r} for r in judged]
        summary[side] = {mode: holdout.summarize([r for r in judged if r["mode"] == mode])
                         for mode in ("eager", "cuda_graph")}
    return summary, rows


def shape_split(runs: list[holdout.Run], before: DeviceProfile, dispatch: float) -> dict:
    """Fit on every run's shapes with batch x length at most :data:`tuning.sim.holdout.SHAPE_LIMIT`, judge the
    larger ones (every run, each on its own card's profile): the model at shapes it has not seen."""
    small = holdout.in_shape_fit

    def large(p: dict) -> bool:
        return not holdout.in_shape_fit(p)

    fitted = holdout.fit(runs, base=before, dispatch_s=dispatch, keep=small)
    profile = holdout.refit_profile(before, fitted)
    rows = holdout.judge(profile, runs, dispatch_s=dispatch, keep=large)
    fit_rows = holdout.judge(profile, runs, dispatch_s=dispatch, keep=small)
    judged = {mode: holdout.summarize([r for r in rows if r["mode"] == mode]) for mode in ("eager", "cuda_graph")}
    graph = judged["cuda_graph"]
    met = bool(graph["n"]) and (DONE_GRAPH_MEDIAN[0] <= graph["median"] <= DONE_GRAPH_MEDIAN[1]
                                and DONE_GRAPH_BAND[0] <= graph["low"] and graph["high"] <= DONE_GRAPH_BAND[1])
    return {"rule": f"fit on batch x length <= {holdout.SHAPE_LIMIT} (every run), judge the larger shapes; the floors "
                    "and kernels come from the profiler at batch 1, on the fit side",
            "fitted": fitted,
            "fit": {mode: holdout.summarize([r for r in fit_rows if r["mode"] == mode])
                    for mode in ("eager", "cuda_graph")},
            "judge": judged,
            "done_when": {"graph_median": DONE_GRAPH_MEDIAN, "graph_band": DONE_GRAPH_BAND, "met": met},
            "eager_note": "eager forwards are host-bound at every committed shape (2-4 ms whatever the batch, the "
                          "engine sweeps above the bare forward): they judge the host part, which is not held out",
            "rows": rows}


PLAN = ROOT / "bench" / "plans" / "whatif-next.json"
PREDICTED_CARDS = ("h200-sxm-estimate", "h100-sxm-estimate")


def model_commit() -> str:
    """The commit of the cost model and profiles that make a prediction; refused where they differ from it (a
    prediction must name the model that made it)."""
    import subprocess

    dirty = subprocess.run(["git", "status", "--porcelain", "--", "tuning/sim", "tuning/assets"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        raise SystemExit(f"tuning/sim or tuning/assets differ from the last commit:\n{dirty}\ncommit the model first: "
                         "the predictions name the commit that made them")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def predict_plan(runs: list[holdout.Run]) -> dict:
    """The cost model's predictions (SIMULATED) for every point of the plan on each of :data:`PREDICTED_CARDS`,
    with the host's miniature of the committed runs (their geometric mean: the next run's host is not known)."""
    import time

    from tuning.sim import embedded_model_profile, predict

    plan = json.loads(PLAN.read_text())
    dispatch = holdout.default_dispatch_s(runs)
    minilm = embedded_model_profile()

    def cost(profile: DeviceProfile, p: dict) -> dict:
        c = predict(minilm, profile, p["batch"], p["length"], p["dtype"], p["mode"], host_dispatch_s=dispatch)
        return {"call_ms": round(c.call_s * 1e3, 4), "device_ms": round(c.device_s * 1e3, 4),
                "host_ms": round(c.host_s * 1e3, 4), "kernels": c.kernels}
    profiles = [load_profile(name) for name in PREDICTED_CARDS]
    return {
        "what": "the cost model's predictions (SIMULATED) of bench/plans/whatif-next.json's points, made before any "
                "GPU run of the plan, so that its run judges them out of sample; call_ms is one synchronised call",
        "simulated": True, "model_commit": model_commit(), "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan": str(PLAN.relative_to(ROOT)), "host_dispatch_us": round(dispatch * 1e6, 3),
        "host_dispatch_source": "geometric mean of the committed runs' host_cost miniature (" +
                                ", ".join(r.name for r in runs if r.host_dispatch_s) + "); the next run's host "
                                "measures its own: predictions of its eager points move with it",
        "profiles": {p.name: p.description for p in profiles},
        "points": [{**{k: p[k] for k in ("mode", "batch", "length", "dtype")},
                    **{prof.name: cost(prof, p) for prof in profiles}} for p in plan["points"]],
        "kernel_sum": [{**{k: p[k] for k in ("mode", "batch", "length", "dtype")},
                        **{prof.name: cost(prof, p) for prof in profiles}} for p in plan.get("kernel_sum", [])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-profile", action="store_true",
                        help="write the refit chip fit (tuning/sim/devices/chips/<chip>.json) every card of it shares")
    parser.add_argument("--before", default=None, help="the profile judged as 'before' (default: the shipped one "
                        "as committed before the refit, from git, else the current file)")
    parser.add_argument("--predict", action="store_true",
                        help="write bench/results/whatif_predictions.json: the plan's points predicted on the H200 and "
                             "H100 by the committed model (before any GPU run of the plan), and stop")
    args = parser.parse_args()
    if args.predict:
        data = predict_plan(holdout.load_runs(RESULTS))
        write("whatif_predictions", data)
        print(f"{len(data['points'])} points predicted, model {data['model_commit']}")
        return

    runs = holdout.load_runs(RESULTS)
    split = holdout.split_by_card(runs)
    print("split (stated before fitting):")
    print(split.describe(), flush=True)
    dispatch = holdout.default_dispatch_s(runs)
    print(f"host miniature for runs that measured none: {dispatch * 1e6:.2f} us (geometric mean of "
          f"{', '.join(r.name for r in runs if r.host_dispatch_s)}): the host part is not held out", flush=True)

    before = load_profile(args.before) if args.before else _before_profile()
    fitted = holdout.fit(split.fit, base=before, dispatch_s=dispatch)
    after = holdout.refit_profile(before, fitted)
    print(f"fitted on {', '.join(fitted['fit_runs'])}: attention_extra_kernels {fitted['attention_extra_kernels']}, "
          f"min_kernel {fitted['min_kernel_s'] * 1e6:.3f} us, graph_min_kernel {fitted['graph_min_kernel_s'] * 1e6:.3f} "
          f"us, bf16 GEMM efficiency {fitted['gemm_efficiency_bf16']:.3f}", flush=True)

    summary_before, rows_before = sides(before, split, dispatch)
    summary_after, rows_after = sides(after, split, dispatch)
    summary = {side: {mode: {"before": summary_before[side][mode], "after": summary_after[side][mode]}
                      for mode in ("eager", "cuda_graph")} for side in ("fit", "judge")}
    for r, b in zip(rows_after, rows_before):
        r["predicted_before_ms"], r["ratio_before"] = b["predicted_ms"], b["ratio"]
    shape = shape_split(runs, before, dispatch)
    graph = summary["judge"]["cuda_graph"]["after"]
    done = (DONE_GRAPH_MEDIAN[0] <= graph["median"] <= DONE_GRAPH_MEDIAN[1]
            and DONE_GRAPH_BAND[0] <= graph["low"] and graph["high"] <= DONE_GRAPH_BAND[1])
    print(f"{'side':6s} {'mode':11s} {'n':>3s} {'before: median (range)':>26s} {'after: median (range)':>26s}")
    for side in ("fit", "judge"):
        for mode in ("eager", "cuda_graph"):
            b, a = summary[side][mode]["before"], summary[side][mode]["after"]
            print(f"{side:6s} {mode:11s} {a['n']:3d} {b['median']:8.3f} ({b['low']:.3f}-{b['high']:.3f})      "
                  f"{a['median']:8.3f} ({a['low']:.3f}-{a['high']:.3f})")
    print(f"held-out graph mode within the done-when (median {DONE_GRAPH_MEDIAN}, all in {DONE_GRAPH_BAND}): {done}")
    print(f"shape split (fit on batch x length <= {holdout.SHAPE_LIMIT} on every run, judge the larger): bf16 GEMM "
          f"efficiency {shape['fitted']['gemm_efficiency_bf16']:.3f}")
    for mode in ("eager", "cuda_graph"):
        a = shape["judge"][mode]
        print(f"  judge {mode:11s} {a['n']:3d} {a['median']:8.3f} ({a['low']:.3f}-{a['high']:.3f})")
    print(f"held-out larger shapes, graph mode, within the done-when: {shape['done_when']['met']}")

    payload = {
        "what": "predicted (SIMULATED) / measured per shape on real H200 cards: fitted on one card's runs, judged on "
                "the other cards' runs; 'before' is the shipped profile before the refit, 'after' the refit one",
        "simulated": True,
        "split": split.as_dict(),
        "fitted": fitted,
        "profile_before": before.name, "profile_after": after.name,
        "summary": summary,
        "done_when": {"graph_median": DONE_GRAPH_MEDIAN, "graph_band": DONE_GRAPH_BAND, "met": done},
        "shape_split": shape,
        "not_held_out": {
            "host": ("the host's cost per launch: launch_s was set from the runs whose hosts measured their "
                     "miniature (host_cost: " + ", ".join(r.name for r in runs if r.host_dispatch_s) + "), the judge "
                     "side; the fit side's runs recorded no host measurement, so their host part is the geometric "
                     f"mean of those hosts ({dispatch * 1e6:.2f} us). bench/gpu_check.py records host_cost on "
                     "every run: the next run on a new card holds it out"),
            "fp32_tf32": "no fp32 or TF32 forward was replayed in a graph; fp32 is judged on eager shapes only",
            "sandbox": "runs 3 and 4 ran under gVisor (README); runs 1 and 2 do not record it",
        },
        "rows": rows_after,
    }
    write("whatif_holdout", payload)
    if args.write_profile:
        from tuning.sim.profiles import chip_path

        chip = load_profile("h200-sxm-estimate").chip  # the card fitted on; every card of its chip shares the fit
        path = chip_path(chip)
        path.write_text(json.dumps(holdout.chip_fit(after, chip), indent=2) + "\n")
        print(f"wrote {path}")


def _before_profile() -> DeviceProfile:
    """The shipped profile as committed before the refit (git's copy of the file at the commit before the one
    that first wrote the refit), else the current file: 'before' stays the profile the issue judged."""
    import subprocess
    import tempfile

    try:
        text = subprocess.run(["git", "show", f"{BEFORE_COMMIT}:tuning/sim/devices/h200-sxm-estimate.json"],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return load_profile("h200-sxm-estimate")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
    return load_profile(f.name)


BEFORE_COMMIT = "4a228b7"  # the last commit with the datasheet-only H200 profile (issue 52's 'shipped')


if __name__ == "__main__":
    main()
