"""How far can the simulated accelerator be trusted? Simulate this CPU and compare with the real CPU.

1. Calibrate a device profile for this CPU from a batch sweep of the real model (fp32 and bf16,
   several lengths), and measure the fit's error on shapes left out of the calibration grid.
2. Run ``baseline`` and ``tuned`` offline and under fixed-concurrency serving, on the real CPU and
   on ``device=sim`` with that fitted profile, interleaved (real, sim, sim, real per round).
3. Write ``bench/results/sim_fidelity.json``: sim/real throughput ratios ``offline_baseline``,
   ``offline_tuned``, ``serving_baseline``, ``serving_tuned`` (medians over rounds, with every
   round's figures) and ``holdout_error``. Target: ratios within 0.85-1.15, holdout error < 0.15.

    python bench/sim_fidelity.py            # about 5 minutes on 2 cores
    python bench/sim_fidelity.py --quick    # a smoke run (~1 minute): small sizes, one round
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import QUICK_RESULTS, RESULTS, write

from tuning import preset
from tuning.experiments.sweeps import run_batch_sweep
from tuning.inputs.readers import read_lines
from tuning.load.generator import run_load
from tuning.offline.pipeline import Pipeline
from tuning.online.serve import Server
from tuning.sim import embedded_model_profile
from tuning.sim.calibrate import Point, calibrate, describe, prediction_error
from tuning.sim.costmodel import ModelProfile, predict
from tuning.sim.profiles import DeviceProfile
from tuning.sim.standin import IntraOpBurner

TARGET = (0.85, 1.15)


def sweep_points(sizes, lengths, dtypes, repeats, rounds) -> list[Point]:
    points = []
    for dtype in dtypes:
        for length in lengths:
            result = run_batch_sweep(preset("baseline", device="cpu", dtype=dtype), sizes, length, repeats, rounds=rounds)
            points += [Point(int(r["batch_size"]), length, dtype, "eager", float(r["per_batch_ms"]))
                       for r in result.rows if r.get("status") == "ok"]
            print(f"  swept {dtype} length {length}: " + ", ".join(f"{p.batch}:{p.ms:.1f}ms" for p in points[-len(sizes):]))
    return points


def offline(knobs, limit: int, model: ModelProfile, fitted: DeviceProfile) -> tuple[float, float]:
    """Throughput, and the median over model calls of the call's measured time over the fitted
    profile's prediction for its shape: the device-time term checked in place (real masks, real
    neighbours on the cores), where the sweep measured it in isolation."""
    pipe = Pipeline(knobs)
    pipe.warmup()
    result = pipe.run(limit=limit, keep_embeddings=False)
    dtype = "tf32" if knobs.tf32 and knobs.dtype == "fp32" else knobs.dtype
    over = [(b.t_infer_end - b.t_infer_start) / predict(model, fitted, b.ok, b.padded_length, dtype, knobs.graph).call_s
            for b in result.batches if b.ok > 0 and b.t_infer_end > b.t_infer_start]  # the rows the model ran
    return result.qps, statistics.median(over)


def serving(knobs, inputs, seconds: float, concurrency: int) -> dict:
    with Server(knobs.replace(concurrency=concurrency)) as server:
        result = run_load(server, inputs, concurrency=concurrency, duration_s=seconds, warmup_s=min(2.0, seconds / 3))
    s = result.summary()
    return {"qps": s["qps"], "p99_ms": s["p99_ms"], "model_busy": s["model_busy"], "device_busy": s["device_busy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    q = args.quick
    sizes = (1, 2, 4, 8) if q else (1, 2, 4, 8, 16)
    lengths = (16, 64) if q else (16, 64, 160)
    holdout_shapes = ((3, 32), (12, 96)) if not q else ((3, 32),)
    rounds = 1 if q else 2
    t_start = time.time()
    model = embedded_model_profile()

    print("1. calibrating a device profile for this CPU from a batch sweep of the real model")
    points = sweep_points(sizes, lengths, ("fp32", "bf16"), repeats=2 if q else 3, rounds=1 if q else 2)
    fitted, fit_error = calibrate(points, model, "cpu", "this-cpu-fitted")
    folder = QUICK_RESULTS if q else RESULTS
    profile_path = folder / "this-cpu-fitted.json"
    folder.mkdir(parents=True, exist_ok=True)
    fitted.to_json(profile_path)
    holdout = []
    for dtype in ("fp32", "bf16"):
        for batch, length in holdout_shapes:
            r = run_batch_sweep(preset("baseline", device="cpu", dtype=dtype), [batch], length, 3, rounds=1)
            holdout += [Point(batch, length, dtype, "eager", float(row["per_batch_ms"]))
                        for row in r.rows if row.get("status") == "ok"]
    holdout_error = prediction_error(model, fitted, holdout)
    print(f"   fitted {describe(fitted)}; fit error {fit_error:.1%}, holdout error {holdout_error:.1%}")

    print("2. baseline and tuned, real CPU vs simulated CPU, interleaved")
    # the stand-in's unit of work, measured once here on the quiet machine (not during a pipeline's warm-up)
    units = IntraOpBurner().measure_all()
    print("   stand-in work units (rows: idle us): " + ", ".join(f"{r}: {s * 1e6:.0f}" for r, s in units.items()))
    inputs = [raw for _, raw in read_lines(limit=600)]
    sim = {"device": "sim", "sim_profile": str(profile_path)}
    configs = {"baseline": preset("baseline", device="cpu"), "tuned": preset("tuned", device="cpu")}
    limits = {"baseline": 120 if q else 400, "tuned": 400 if q else 1200}
    rows: dict[str, dict[str, list]] = {}
    calls: dict[str, dict[str, list[float]]] = {}
    for round_ in range(rounds):
        for name, knobs in configs.items():
            for mode in (("real", "sim", "sim", "real") if not q else ("real", "sim")):
                k = knobs if mode == "real" else knobs.replace(**sim)
                rps, over = offline(k, limits[name], model, fitted)
                rows.setdefault(f"offline_{name}", {}).setdefault(mode, []).append(rps)
                calls.setdefault(name, {}).setdefault(mode, []).append(over)
                rows.setdefault(f"serving_{name}", {}).setdefault(mode, []).append(
                    serving(k, inputs, 4.0 if q else 8.0, 16))
                print(f"   round {round_ + 1} {name} {mode}: offline {rows[f'offline_{name}'][mode][-1]:.1f} req/s, "
                      f"serving {rows[f'serving_{name}'][mode][-1]['qps']:.1f} QPS; model call / predicted "
                      f"{calls[name][mode][-1]:.2f}")
    ratios, detail = {}, {}
    for key, modes in rows.items():
        real = [v if isinstance(v, float) else v["qps"] for v in modes["real"]]
        simv = [v if isinstance(v, float) else v["qps"] for v in modes["sim"]]
        ratios[key] = statistics.median(simv) / statistics.median(real)
        detail[key] = {"real": modes["real"], "sim": modes["sim"], "real_median": statistics.median(real),
                       "sim_median": statistics.median(simv)}
    within = {k: TARGET[0] <= v <= TARGET[1] for k, v in ratios.items()}
    # the device-time term in place: a real call over its prediction, the stand-in's over the same prediction;
    # their quotient is how far the stand-in's calls run ahead of (<1: behind) the real ones in the pipeline
    call_terms = {name: {"real_call_over_predicted": statistics.median(m["real"]),
                         "sim_call_over_predicted": statistics.median(m["sim"]),
                         "sim_call_over_real_call": statistics.median(m["sim"]) / statistics.median(m["real"])}
                  for name, m in calls.items()}
    payload = {
        "what": "sim/real throughput on this CPU: the stand-in with a profile fitted to this CPU vs the real model",
        "ratios": ratios, "holdout_error": holdout_error, "fit_error": fit_error, "model_call_terms": call_terms,
        "target": {"ratio": TARGET, "holdout_error": 0.15}, "within_target": within,
        "fitted_profile": describe(fitted), "profile_path": str(profile_path),
        "calibration_points": [p.__dict__ for p in points], "holdout_points": [p.__dict__ for p in holdout],
        "runs": detail, "seconds": time.time() - t_start,
    }
    for key, value in ratios.items():
        print(f"{key:18s} sim/real {value:.3f} {'ok' if within[key] else 'OUTSIDE 0.85-1.15'}")
    print(f"holdout_error      {holdout_error:.3f} {'ok' if holdout_error < 0.15 else 'OVER 0.15'}")
    for name, terms in call_terms.items():
        print(f"{name} model call / predicted: real {terms['real_call_over_predicted']:.2f}, "
              f"sim {terms['sim_call_over_predicted']:.2f} (sim/real call {terms['sim_call_over_real_call']:.2f})")
    write("sim_fidelity", payload, quick=q)


if __name__ == "__main__":
    main()
