"""How far can the simulated accelerator be trusted? Simulate this CPU and compare with the real CPU.

1. Calibrate a device profile for this CPU from a batch sweep of the real model (fp32 and bf16,
   several lengths), and measure the fit's error on shapes left out of the calibration grid; every
   shape, held-out ones too, is timed in ``--sweep-passes`` interleaved passes and takes their median.
2. Run ``baseline`` and ``tuned`` offline and under fixed-concurrency serving, on the real CPU and
   on ``device=sim`` with that fitted profile, in interleaved pairs: per round, each of the four
   measures runs one real and one simulated arm (ABBA across rounds, the measures' order reversed
   on odd rounds), and its ratio sim/real is that pair's figure. Right before every pair the device term
   is calibrated in place: the real call and a stand-in's, at a few shapes outside any pipeline, and the
   arm's stand-in is slowed (or sped up) to take what the real call takes (the median over the checks
   so far); the one-time fit gives the shape of the device time, the checks its level over the run.
   Rounds go on until every measure's 95% interval is within +-5% (at least 6 rounds), or the budget ends.
3. Write ``bench/results/sim_fidelity.json``: per measure (``offline_baseline``, ``offline_tuned``,
   ``serving_baseline``, ``serving_tuned``) the median of the paired ratios with a t interval of
   the mean log ratio and the median's own order-statistic interval, every pair's figures, and
   ``holdout_error``. Target: medians within 0.85-1.15, holdout error < 0.15.

Why pairs: on this VM a real offline ``baseline`` run varied 42-59 req/s between runs minutes apart
(another tenant, steal), so medians of separate arms moved about 10% run to run; a ratio of two
runs seconds apart carries much less of that drift.

    python bench/sim_fidelity.py              # at most 24 minutes on 2 cores (--minutes)
    python bench/sim_fidelity.py --quick      # a smoke run (a few minutes): small sizes, two rounds
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from common import QUICK_RESULTS, RESULTS, write

from tuning import preset
from tuning.base.decide import Paired, quantile_interval
from tuning.experiments.sweeps import run_batch_sweep
from tuning.inputs.readers import read_lines
from tuning.load.generator import run_load
from tuning.offline.pipeline import Pipeline
from tuning.online.serve import Server
from tuning.runtime.engine import Engine
from tuning.sim import embedded_model_profile
from tuning.sim.calibrate import Point, calibrate, describe, prediction_error
from tuning.sim.costmodel import ModelProfile, predict
from tuning.sim.profiles import DeviceProfile
from tuning.sim.standin import IntraOpBurner, SimulatedDevice

TARGET = (0.85, 1.15)
MEASURES = ("offline_baseline", "serving_baseline", "offline_tuned", "serving_tuned")
LEVEL = 0.95  # the intervals' two-sided coverage
HALF_WIDTH = 0.05  # stop once every measure's interval is within +-5% of its ratio
# (length: batch sizes) the device term is checked at right before every pair, outside the pipeline: batch 1 (the
# baseline's calls) to 16 (the tuned one's), within the calibration grid
CHECK_SHAPES = {16: (1, 4), 64: (1, 16), 160: (2, 8)}


def ratio_summary(d: list[float]) -> dict:
    """Paired log ratios ``d`` -> the median ratio (the figure judged), the geometric mean with its t interval
    (``low``, ``high``; its relative half-width decides when to stop) and the median's distribution-free interval
    (``median_low``, ``median_high``; None below 6 pairs, which cannot bound a median at 95%)."""
    ratios = [math.exp(x) for x in d]
    p = Paired(level=LEVEL)
    p.d = list(d)
    geo_mean, low, high = p.interval()
    ok = len(d) >= 2
    m_low, m_high = quantile_interval(ratios, q=0.5, level=LEVEL)
    return {"median": statistics.median(ratios), "geo_mean": geo_mean, "low": low if ok else None,
            "high": high if ok else None, "half_width": max(high / geo_mean - 1, 1 - low / geo_mean) if ok else None,
            "median_low": m_low, "median_high": m_high, "pairs": len(d)}


def sweep_points(engines: dict[str, Engine], shapes: dict[tuple[str, int], tuple[int, ...]], repeats: int,
                 rounds: int) -> list[Point]:
    """Per (dtype, length) the batch sizes to time: ``rounds`` passes over all of them, interleaved (the
    shapes' order reversed on odd passes), each point the median of its passes. A single pass per shape, as
    before, moved 20-40% between runs on this VM (bf16 8x64: 72.9 then 44.1 ms), and the fit with it."""
    times: dict[tuple[str, int, int], list[float]] = {}
    order = list(shapes)
    for r in range(rounds):
        for dtype, length in (order if r % 2 == 0 else order[::-1]):
            result = run_batch_sweep(engines[dtype].knobs, shapes[(dtype, length)], length, repeats,
                                     engine=engines[dtype], rounds=1)
            for row in result.rows:
                if row.get("status") == "ok":
                    times.setdefault((dtype, length, int(row["batch_size"])), []).append(float(row["per_batch_ms"]))
    points = [Point(batch, length, dtype, "eager", statistics.median(ms)) for (dtype, length, batch), ms in times.items()]
    for dtype, length in order:
        print(f"  swept {dtype} length {length} ({rounds} passes): " + ", ".join(
            f"{p.batch}:{p.ms:.1f}ms" for p in points if p.dtype == dtype and p.length == length))
    return points


def call_dtype(knobs) -> str:
    """The dtype the cost model prices a configuration's calls at."""
    return "tf32" if knobs.tf32 and knobs.dtype == "fp32" else knobs.dtype


def slowed_to(fitted: DeviceProfile, model: ModelProfile, dtype: str, want: float) -> tuple[DeviceProfile, float]:
    """``fitted`` slowed so that its predictions at :data:`CHECK_SHAPES` are ``want`` times the fitted ones (median;
    the host's dispatch per op is not scaled by :meth:`DeviceProfile.slowed`, so the factor is found in a few
    fixed-point steps); returns the profile and the factor given to ``slowed``."""
    shapes = [(b, length) for length, sizes in CHECK_SHAPES.items() for b in sizes]
    base = [predict(model, fitted, b, length, dtype).call_s for b, length in shapes]
    factor = want
    for _ in range(4):
        profile = fitted.slowed(factor)
        got = statistics.median(predict(model, profile, b, length, dtype).call_s / t for (b, length), t in zip(shapes, base))
        factor *= want / got
    return fitted.slowed(factor), factor


def isolated_over_predicted(engine: Engine, standin: SimulatedDevice, model: ModelProfile, fitted: DeviceProfile,
                            dtype: str, repeats: int = 3) -> tuple[float, float]:
    """The device term now, outside any pipeline: (the real model call over the fitted profile's prediction,
    the stand-in's call over its own target), each the median over :data:`CHECK_SHAPES` of the median of
    ``repeats`` calls. Their quotient is how much slower the stand-in must be told to be, right now, for its
    isolated call to take what the real one takes."""
    real, sim = [], []
    for length, sizes in CHECK_SHAPES.items():
        rows = run_batch_sweep(engine.knobs, sizes, length, repeats, engine=engine, rounds=1).rows
        for row in rows:
            if row.get("status") == "ok":
                batch = int(row["batch_size"])
                real.append(float(row["per_batch_ms"]) / 1e3 / predict(model, fitted, batch, length, dtype).call_s)
        for batch in sizes:
            standin.run(batch, length, dtype, "eager")  # warm: its plan and the burner's operands
            took = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                cost = standin.run(batch, length, dtype, "eager")
                took.append(time.perf_counter() - t0)
            sim.append(statistics.median(took) / cost.call_s)
    return statistics.median(real), statistics.median(sim)


def offline(pipe: Pipeline, limit: int, model: ModelProfile, fitted: DeviceProfile) -> tuple[float, float]:
    """Throughput, and the median over model calls of the call's measured time over the fitted
    profile's prediction for its shape: the device-time term checked in place (real masks, real
    neighbours on the cores), where the sweep measured it in isolation."""
    knobs = pipe.knobs
    result = pipe.run(limit=limit, keep_embeddings=False)
    dtype = call_dtype(knobs)
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
    parser.add_argument("--minutes", type=float, default=24.0, help="the run's time budget (default 24)")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of each serving run (default 8)")
    parser.add_argument("--sweep-passes", type=int, default=5,
                        help="interleaved passes of the calibration sweep, each point their median (default 5)")
    args = parser.parse_args()
    q = args.quick
    min_rounds = 2 if q else 6
    sizes = (1, 2, 4, 8) if q else (1, 2, 4, 8, 16)
    lengths = (16, 64) if q else (16, 64, 160)
    holdout_shapes = ((3, 32), (12, 96)) if not q else ((3, 32),)
    t_start = time.time()
    model = embedded_model_profile()

    print("1. calibrating a device profile for this CPU from a batch sweep of the real model")
    passes = 1 if q else args.sweep_passes
    if passes < 1:
        raise SystemExit(f"--sweep-passes {passes}: give at least 1")
    configs = {"baseline": preset("baseline", device="cpu"), "tuned": preset("tuned", device="cpu")}
    # the dtypes the two presets run on this CPU (tuned is bf16 only where the CPU has native bf16): a dtype
    # neither runs would cost the sweep minutes (bf16 16x160 takes seconds per call without it) and judge nothing
    dtypes = sorted({call_dtype(k) for k in configs.values()})
    print(f"   dtypes the presets run here: {', '.join(dtypes)}")
    grid = {(dtype, length): tuple(sizes) for dtype in dtypes for length in lengths}
    held_keys = {(dtype, length, batch) for dtype in dtypes for batch, length in holdout_shapes}
    assert not {length for _, length, _ in held_keys} & set(lengths), "a held-out shape at a calibration length"
    shapes = dict(grid)
    for dtype, length, batch in sorted(held_keys):
        shapes[(dtype, length)] = (*shapes.get((dtype, length), ()), batch)
    engines = {dtype: Engine(preset("baseline", device="cpu", dtype=dtype)) for dtype in dtypes}
    measured = sweep_points(engines, shapes, repeats=2 if q else 3, rounds=passes)
    points = [p for p in measured if (p.dtype, p.length, p.batch) not in held_keys]
    holdout = [p for p in measured if (p.dtype, p.length, p.batch) in held_keys]
    fitted, fit_error = calibrate(points, model, "cpu", "this-cpu-fitted")
    folder = QUICK_RESULTS if q else RESULTS
    profile_path = folder / "this-cpu-fitted.json"
    folder.mkdir(parents=True, exist_ok=True)
    fitted.to_json(profile_path)
    holdout_error = prediction_error(model, fitted, holdout)
    print(f"   fitted {describe(fitted)}; fit error {fit_error:.1%}, holdout error {holdout_error:.1%}")

    print("2. baseline and tuned, real CPU vs simulated CPU, in interleaved pairs")
    # the stand-in's unit of work, measured once here on the quiet machine (not during a pipeline's warm-up)
    units = IntraOpBurner().measure_all()
    print("   stand-in work units (rows: idle us): " + ", ".join(f"{r}: {s * 1e6:.0f}" for r, s in units.items()))
    inputs = [raw for _, raw in read_lines(limit=600)]
    sim = {"device": "sim", "sim_profile": str(profile_path)}
    limits = {"baseline": 120 if q else 400, "tuned": 400 if q else 1200}
    arms = {(name, mode): knobs if mode == "real" else knobs.replace(**sim)
            for name, knobs in configs.items() for mode in ("real", "sim")}
    pipelines = {key: Pipeline(k) for key, k in arms.items()}  # built and warmed once, replayed every round
    for pipe in pipelines.values():
        pipe.warmup()
    seconds = 4.0 if q else args.window
    # calibration in place: right before every pair the device term is checked outside the pipeline (the real
    # call and the stand-in's, same shapes) and the arm's stand-in is told to be as slow as the real call is
    # (the median of the checks so far); the one-time fit gives the shape of the device time, the checks its
    # level over the run, not at the calibration's one moment. Run to run the one-time fit alone had left the
    # real call at 1.18 then 1.32 times its prediction (baseline), the stand-in at 1.21 then 1.13: a ratio that
    # moved with the calibration's moment, not with the simulation.
    standin = SimulatedDevice(fitted, model)  # the check's own stand-in, apart from the arms' timelines
    applied = {name: fitted for name in configs}  # the profile each sim arm runs with now
    wants: dict[str, list[float]] = {name: [] for name in configs}  # every check's figure, per configuration
    scaled_dir = Path(tempfile.mkdtemp(prefix="sim_fidelity_"))

    def recalibrate(name: str) -> dict:
        dtype = call_dtype(configs[name])
        standin.use_profile(applied[name])
        real_over, sim_over = isolated_over_predicted(engines[dtype], standin, model, fitted, dtype,
                                                      repeats=2 if q else 5)
        # the stand-in's slowdown over the fitted prediction for its call to take the real one's; applied: the
        # median of every check so far, so one check caught in a burst of steal does not set a whole pair
        wants[name].append(real_over / sim_over)
        want = statistics.median(wants[name])
        profile, factor = slowed_to(fitted, model, dtype, want)
        applied[name] = profile
        pipelines[(name, "sim")].engine.sim.use_profile(profile)
        path = scaled_dir / f"{name}.json"
        profile.replace(name=f"this-cpu-fitted-now-{name}").to_json(path)
        arms[(name, "sim")] = arms[(name, "sim")].replace(sim_profile=str(path))
        return {"real_isolated_over_fitted": real_over, "sim_isolated_over_target": sim_over,
                "this_check_slowdown": wants[name][-1], "sim_slowdown_over_fitted": want, "slowed_factor": factor}

    def measure(measure_name: str, mode: str) -> tuple[float, dict]:
        kind, name = measure_name.split("_", 1)
        if kind == "offline":
            rps, over = offline(pipelines[(name, mode)], limits[name], model, fitted)
            return rps, {"qps": rps, "model_call_over_predicted": over}
        s = serving(arms[(name, mode)], inputs, seconds, 16)
        return float(s["qps"] or 0.0), s

    pairs = {m: Paired(level=LEVEL) for m in MEASURES}
    runs: dict[str, list[dict]] = {m: [] for m in MEASURES}
    budget_s = args.minutes * 60
    round_s: list[float] = []
    stop = "round cap"
    for round_ in range(10_000):
        t_round = time.time()
        for m in (MEASURES if round_ % 2 == 0 else MEASURES[::-1]):
            check = recalibrate(m.split("_", 1)[1])
            got: dict[str, tuple[float, dict]] = {}
            for arm in Paired.order(len(pairs[m].d)):  # A (real) and B (sim) in ABBA order across rounds
                mode = "real" if arm == "A" else "sim"
                got[mode] = measure(m, mode)
            pairs[m].add(got["real"][0], got["sim"][0])
            # the ratio as Paired floored it: a real arm with no answer (0 QPS, or None) must not end the run
            runs[m].append({"real": got["real"][1], "sim": got["sim"][1], "ratio": math.exp(pairs[m].d[-1]),
                           "check": check})
        round_s.append(time.time() - t_round)
        summary = {m: ratio_summary(pairs[m].d) for m in MEASURES}
        print(f"   round {round_ + 1} ({round_s[-1]:.0f} s): " + "; ".join(
            f"{m} {r['median']:.3f} (geometric mean's t {r['low']:.3f}-{r['high']:.3f})" if r["low"] is not None
            else f"{m} {r['median']:.3f}" for m, r in summary.items()), flush=True)
        rounds_done = round_ + 1
        precise = rounds_done >= min_rounds and all(
            r["half_width"] is not None and r["half_width"] <= HALF_WIDTH for r in summary.values())
        if precise or (q and rounds_done >= min_rounds):
            stop = "every interval within the half-width" if precise else "quick"
            break
        if time.time() - t_start + max(round_s) > budget_s:  # another round would overrun the budget
            stop = f"budget of {args.minutes:g} minutes"
            if rounds_done < min_rounds:
                stop += f", before the {min_rounds} rounds the intervals want (give more --minutes)"
            break
    ratios = {m: r["median"] for m, r in summary.items()}
    within = {m: TARGET[0] <= r["median"] <= TARGET[1] for m, r in summary.items()}
    interval_within = {m: r["low"] is not None and TARGET[0] <= r["low"] and r["high"] <= TARGET[1]
                       for m, r in summary.items()}

    # the device-time term in place: a real call over its prediction, the stand-in's over the same prediction;
    # their quotient is how far the stand-in's calls run ahead of (<1: behind) the real ones in the pipeline
    def call_term(name: str, mode: str) -> float:
        return statistics.median(r[mode]["model_call_over_predicted"] for r in runs[f"offline_{name}"])
    call_terms = {name: {"real_call_over_predicted": call_term(name, "real"),
                         "sim_call_over_predicted": call_term(name, "sim"),
                         "sim_call_over_real_call": call_term(name, "sim") / call_term(name, "real")}
                  for name in configs}
    # the slowdown last applied is the median of every check (each pair applies the median so far)
    device_checks = {name: {"checks": len(w), "applied_slowdown_last": statistics.median(w), "median": statistics.median(w),
                            "min": min(w), "max": max(w), "check_shapes": {str(k): v for k, v in CHECK_SHAPES.items()}}
                     for name, w in wants.items() if w}
    payload = {
        "what": "sim/real throughput on this CPU: the stand-in with a profile fitted to this CPU vs the real model",
        "method": (f"interleaved pairs (real, sim in ABBA order across rounds; the measures' order reversed on odd "
                   f"rounds); per pair the ratio sim/real; the figure is the median of the paired ratios, the interval "
                   f"a {LEVEL:.0%} t interval of the mean log ratio (its half-width decides when to stop: at most "
                   f"{HALF_WIDTH:.0%} on every measure after at least {min_rounds} rounds, or the time budget) and "
                   f"the median's own distribution-free {LEVEL:.0%} interval from order statistics; before every "
                   f"pair the stand-in is slowed to the median of the device checks so far (the real call over the "
                   f"fit's prediction, over the stand-in's call over its target, at check_shapes, outside any pipeline)"),
        "ratios": ratios, "ratio_intervals": summary, "rounds": rounds_done, "stopped_by": stop,
        "holdout_error": holdout_error, "fit_error": fit_error, "model_call_terms": call_terms,
        "device_checks": device_checks,
        "target": {"ratio": TARGET, "holdout_error": 0.15, "half_width": HALF_WIDTH},
        "within_target": within, "geo_mean_interval_within_target": interval_within,
        "fitted_profile": describe(fitted), "profile_path": str(profile_path),
        "calibration_points": [p.__dict__ for p in points], "holdout_points": [p.__dict__ for p in holdout],
        "runs": runs, "round_seconds": round_s, "seconds": time.time() - t_start,
    }
    for m, r in summary.items():
        t = (f"geometric mean {r['geo_mean']:.3f}, t {r['low']:.3f}-{r['high']:.3f}, +-{r['half_width']:.1%}"
             if r["low"] is not None else "no interval")
        own = (f"{r['median_low']:.3f}-{r['median_high']:.3f}" if r["median_low"] is not None
               and r["median_high"] is not None else "none (fewer than 6 pairs)")
        print(f"{m:18s} sim/real median {r['median']:.3f} ({t}; the median's own {own}) "
              f"{'ok' if within[m] else 'OUTSIDE 0.85-1.15'}")
    print(f"holdout_error      {holdout_error:.3f} {'ok' if holdout_error < 0.15 else 'OVER 0.15'}")
    print(f"{rounds_done} rounds, stopped by {stop}, {time.time() - t_start:.0f} s")
    for name, terms in call_terms.items():
        print(f"{name} model call / predicted: real {terms['real_call_over_predicted']:.2f}, "
              f"sim {terms['sim_call_over_predicted']:.2f} (sim/real call {terms['sim_call_over_real_call']:.2f})")
    for name, c in device_checks.items():
        print(f"{name} stand-in slowdown over the fit from {c['checks']} checks: median {c['median']:.2f} "
              f"(range {c['min']:.2f}-{c['max']:.2f})")
    write("sim_fidelity", payload, quick=q)


if __name__ == "__main__":
    main()
