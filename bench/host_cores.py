"""Check the cores-needed prediction (:mod:`tuning.profile.hostcores`): one simulated configuration served
under load pinned to 1 core and to 2 cores (``taskset -c 0`` vs ``taskset -c 0,1``), each run in a subprocess,
interleaved ABAB; per pair the 2-core prediction from the 1-core run (and the 1-core one from the 2-core run)
against the measured throughput ratio. Target: the median measured ratio within 20% of the predicted one.

The load generator is a child of the server process, so ``taskset`` pins it to the same cores. Its measured CPU
is a fixed share of a core whatever the rate (0.27-0.31 cores at 130-1400 req/s in the first runs here: it
polls), so the prediction takes that share off the cores; its threads are capped at one core each.

Every device figure is SIMULATED (``device=sim``, the h200-sxm-estimate profile: the cost model's device
time); throughput, CPU per thread and steal are measured on this host. Writes ``bench/results/host_cores.json``.

    flock /tmp/bench.lock python bench/host_cores.py            # about 5 minutes (264-305 s here)
    python bench/host_cores.py --quick                           # one pair, short windows
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import fmt_spread, spread, write

ARMS = {"1core": "0", "2core": "0,1"}
TOLERANCE = 0.20


def knobs(name: str, profile: str):
    """``tuned``: the Rust fast tokenizer in 2 preprocessing threads, batches of 16 (core-bound: should scale);
    ``baseline``: pure-Python tokenizing in 2 threads, batch 1 (GIL-bound: one process cannot use a second core)."""
    from tuning import preset

    return preset(name, device="sim", sim_profile=profile).replace(num_workers=2)


def worker(args: argparse.Namespace) -> None:
    """One pinned run: a recorded closed-loop load test; prints one JSON line."""
    from tuning.base.machine import steal_share, steal_ticks, usable_cores
    from tuning.experiments.ladder import load_inputs
    from tuning.experiments.measure import LoadMeasure
    from tuning.profile.hostcores import host_cores

    k = knobs(args.preset, args.profile)
    measure = LoadMeasure(load_inputs(None, args.limit), args.concurrency, args.duration, args.warmup)
    s0 = steal_ticks()
    try:
        trial = measure(k, record=True)
        load_pid = measure._process.process.pid if measure._process is not None else None  # noqa: SLF001
    finally:
        measure.close()
    steal = steal_share(s0, steal_ticks())
    hc = host_cores(trial)  # the server ran in this process; the load process is left out
    rows = trial.profile.top_threads(64)
    client = sum(r["cpu_mean"] for r in rows if load_pid is not None and r.get("pid") == load_pid) / 100
    out = {"cores": usable_cores(), "affinity": sorted(os.sched_getaffinity(0)), "qps": trial.qps,
           "p99_ms": trial.p99_ms, "device_busy": trial.device_busy, "mean_batch": trial.mean_batch,
           "steal_share": steal, "steal_share_window": trial.steal_share,
           "client_cpu_share": client, "rejected": trial.rejected, "errors": trial.errors,
           "client_cpu_ms_per_request": 1e3 * client / trial.qps, "model_busy": trial.model_busy,
           "host_cores": hc.to_dict(), "threads_raw": rows}
    print("RESULT " + json.dumps(out, default=str), flush=True)


def run_arm(name: str, preset: str, args: argparse.Namespace) -> dict:
    cmd = ["taskset", "-c", ARMS[name], sys.executable, __file__, "--worker", "--profile", args.profile, "--preset", preset,
           "--duration", str(args.duration), "--warmup", str(args.warmup), "--concurrency", str(args.concurrency),
           "--limit", str(args.limit)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{name} run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def predicted_rate(run: dict, cores: int) -> float:
    """The rate ``cores`` cores would serve, from one run's host CPU per request: the library's prediction
    (:meth:`tuning.profile.hostcores.HostCores.rate_on`) with the pinned client's fixed share of a core taken off."""
    from tuning.profile.hostcores import HostCores

    return HostCores.from_dict(run["host_cores"]).rate_on(cores, other_cores=run["client_cpu_share"])


def summarize(runs: dict[str, list[dict]], name: str, args: argparse.Namespace) -> dict:
    pairs = []
    for one, two in zip(runs["1core"], runs["2core"]):
        measured = two["qps"] / one["qps"]
        from_one = predicted_rate(one, 2) / one["qps"]  # the 2-core rate predicted from the 1-core run
        from_two = two["qps"] / predicted_rate(two, 1)  # the 1-core rate predicted from the 2-core run
        pairs.append({"measured_ratio": measured, "predicted_ratio_from_1core": from_one,
                      "predicted_ratio_from_2core": from_two})
    measured = spread([p["measured_ratio"] for p in pairs])
    pred1 = spread([p["predicted_ratio_from_1core"] for p in pairs])
    pred2 = spread([p["predicted_ratio_from_2core"] for p in pairs])
    err1 = pred1["median"] / measured["median"] - 1
    err2 = pred2["median"] / measured["median"] - 1
    out = {"knobs": str(knobs(name, args.profile)),
           "qps_1core_measured": spread([r["qps"] for r in runs["1core"]]),
           "qps_2core_measured": spread([r["qps"] for r in runs["2core"]]),
           "device_busy_1core_simulated": spread([r["device_busy"] for r in runs["1core"]]),
           "device_busy_2core_simulated": spread([r["device_busy"] for r in runs["2core"]]),
           "ratio_measured": measured, "ratio_predicted_from_1core": pred1, "ratio_predicted_from_2core": pred2,
           "error_from_1core": err1, "error_from_2core": err2,
           "within_target": abs(err1) <= TOLERANCE,  # the prediction from the 1-core run, for 2 cores
           "cores_needed_from_2core": statistics.median(r["host_cores"]["cores"] for r in runs["2core"]),
           "processes_from_2core": max(r["host_cores"]["processes"] for r in runs["2core"]),
           "sentence_2core": runs["2core"][-1]["host_cores"]["sentence"], "per_pair": pairs, "runs": runs}
    print(f"{name}: QPS 1 core {fmt_spread(out['qps_1core_measured'], 1)}; 2 cores "
          f"{fmt_spread(out['qps_2core_measured'], 1)} (measured)")
    print(f"{name}: ratio measured {fmt_spread(measured)}; predicted from 1 core {fmt_spread(pred1)} ({err1:+.0%}); "
          f"from 2 cores {fmt_spread(pred2)} ({err2:+.0%})")
    print(f"{name}: {out['sentence_2core']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="h200-sxm-estimate")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--preset", default="tuned", help=argparse.SUPPRESS)
    ap.add_argument("--presets", default="tuned,baseline", help="configurations checked, comma-separated")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=256, help="closed-loop concurrency: high, so the host "
                    "cores (not the loop's latency) bound the throughput")
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--name", default="host_cores", help="results file name (a second run beside the first)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.pairs, args.duration, args.warmup = 1, 4.0, 1.0
    t0 = time.time()
    names = args.presets.split(",")
    runs: dict[str, dict[str, list[dict]]] = {n: {arm: [] for arm in ARMS} for n in names}
    for p in range(args.pairs):
        for n in names:
            for arm in ARMS:  # ABAB: 1 core, 2 cores, every pair
                r = run_arm(arm, n, args)
                runs[n][arm].append(r)
                print(f"pair {p} {n} {arm}: cores {r['cores']} QPS {r['qps']:.1f} (measured) device busy "
                      f"{r['device_busy']:.1%} (SIMULATED) host CPU {r['host_cores']['cpu_ms_per_request']:.2f} ms/req "
                      f"(GIL {r['host_cores']['gil_ms_per_request']:.2f}) + client {r['client_cpu_ms_per_request']:.2f} "
                      f"ms/req, batch {r['mean_batch']:.1f}, steal {r['steal_share']:.1%}", flush=True)
    configs = {n: summarize(runs[n], n, args) for n in names}
    payload = {
        "what": ("cores-needed check: the same configuration pinned to 1 and 2 cores; device busy and capacity "
                 "SIMULATED (cost model), throughput, host CPU per thread and steal MEASURED on this host"),
        "profile": args.profile, "order": "ABAB (1core, 2core per pair, per configuration)", "pairs": args.pairs,
        "duration_s": args.duration, "warmup_s": args.warmup, "concurrency": args.concurrency,
        "tolerance": TOLERANCE, "configs": configs,
        "within_target": all(c["within_target"] for c in configs.values()),
        "steal_share_measured": spread([r["steal_share"] for n in names for a in ARMS for r in runs[n][a]]),
        "seconds": time.time() - t0,
    }
    write(args.name, payload, quick=args.quick)


if __name__ == "__main__":
    main()
