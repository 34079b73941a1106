"""Serving: the ``baseline`` server (batch 1, no waiting) against the ``tuned`` one (dynamic batching
by length bucket), on the shipped records. Two figures, each measured the way it means something:

- ``qps_ratio`` (capacity): closed loop at fixed concurrency (32 clients), tuned QPS / baseline QPS,
  medians over the runs. A closed loop's latency is concurrency / QPS (Little's law): its p99 repeats
  the QPS ratio, so it is not used for the tail.
- ``p99_ratio`` (the tail at equal load): open loop at one fixed Poisson rate below both servers'
  capacity (``--load`` x the lower closed-loop QPS, or ``--rate``); latency from each request's
  scheduled arrival, over every outcome; tuned p99 / baseline p99 over all the runs' samples pooled,
  with a bootstrap 95% interval, the per-run p99s and the sample counts.

Where the load comes from: a separate process. A generator process (multiprocessing, spawn) runs
``run_load`` against a :class:`~tuning.load.generator.PipeTarget`; this process runs the server behind
:func:`~tuning.load.generator.serve_pipe` (one reader and one writer thread, no client threads). The client
threads and their GIL stay out of the server's process; the two processes still share this machine's
cores, as any client on the same host would. Latency is timed in the generator process on
``perf_counter`` (CLOCK_MONOTONIC, system wide) and includes the pipe's round trip (tens of
microseconds). The server's busy total is read over the same pipe at the window's edges.

Runs are interleaved ABBA (baseline, tuned, tuned, baseline, ...) so drift on a shared machine falls
on both; each engine (model) is built once, each run starts a fresh server with its own warm-up.

    python bench/serving.py            # about 4 minutes; writes bench/results/serving.json
    python bench/serving.py --quick    # a 1-minute smoke run; writes to a temporary folder, not results/

Other before/after pairs on the same method (``--compare``; ``--device sim`` runs both arms against
the simulated accelerator, labelled simulated; results in ``serving_<compare>[_sim].json``):

- ``fairness``: the tuned server with the batcher's old order (full batches before overdue ones)
  against earliest-deadline-first (issue 11 item 7);
- ``critical-path``: the executor answering each batch before it takes the next, copies synchronous,
  against the completer thread and staged (pinned) copies (issue 11 item 8);
- ``token-budget``: request-count batching (``batch_size`` 16) against a padded-token budget
  (``max_batch_tokens`` 2048 = 16 x 128, ``batch_size`` 64), text-embeddings-inference's rule
  (issue 11 item 5).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import warnings

import numpy as np
from common import write

NAMES = ("baseline", "tuned")
TARGETS = {"qps_ratio": 3.0, "p99_ratio": 0.5}
# --compare: (before, after) arms, each (preset, knob changes, Server keyword arguments, batcher attributes)
COMPARES = {
    "presets": {"baseline": ("baseline", {}, {}, {}), "tuned": ("tuned", {}, {}, {})},
    "fairness": {"full-first": ("tuned", {}, {}, {"overdue_first": False}),
                 "edf": ("tuned", {}, {}, {"overdue_first": True})},
    "critical-path": {"inline": ("tuned", {"pin_memory": False}, {"completion": "inline"}, {}),
                      "completer": ("tuned", {"pin_memory": True}, {"completion": "thread"}, {})},
    "token-budget": {"count": ("tuned", {}, {}, {}),
                     "tokens": ("tuned", {"batch_size": 64, "max_batch_tokens": 2048}, {}, {})},
    "a-a": {"first": ("tuned", {}, {}, {}), "second": ("tuned", {}, {}, {})},  # the bench's own noise
}


def _generator(ctrl, data, limit) -> None:
    """The load generator's process: one ``run_load`` per job received on ``ctrl``, over ``data``."""
    from tuning.inputs.readers import read_lines
    from tuning.load.generator import PipeTarget, run_load

    inputs = [raw for _, raw in read_lines(limit=limit)]
    while (job := ctrl.recv()) is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with PipeTarget(data) as target:
                result = run_load(target, inputs, busy_probe=target.busy, **job)
        ctrl.send({"summary": result.summary(), "latencies_ms": result.latencies_ms(),
                   "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]})


def _abba(rounds: int, names: tuple[str, str] = NAMES) -> list[str]:
    """A, B, B, A, ... (baseline, tuned, tuned, baseline for the presets) with ``rounds`` runs of each."""
    return [names[(i + i // 2) % 2] for i in range(2 * rounds)]


def _p99(values) -> float:
    return float(np.percentile(values, 99))


def _bootstrap_ratio(a: np.ndarray, b: np.ndarray, n: int = 1000, seed: int = 0) -> list[float]:
    """95% interval of p99(b) / p99(a), resampling each pool with replacement."""
    rng = np.random.default_rng(seed)
    ratios = [np.percentile(rng.choice(b, b.size), 99) / np.percentile(rng.choice(a, a.size), 99) for _ in range(n)]
    return [float(x) for x in np.percentile(ratios, [2.5, 97.5])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (results not comparable)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--requests", type=int, default=300, help="measured requests per closed-loop run")
    parser.add_argument("--closed-rounds", type=int, default=2, help="closed-loop runs per server")
    parser.add_argument("--rounds", type=int, default=4, help="open-loop runs per server")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per open-loop run")
    parser.add_argument("--load", type=float, default=0.6, help="open-loop rate as a share of the lower capacity")
    parser.add_argument("--rate", type=float, default=None, help="open-loop rate in req/s (instead of --load)")
    parser.add_argument("--clients", type=int, default=256, help="open-loop client pool (requests in flight)")
    parser.add_argument("--limit", type=int, default=None, help="read only the first N records")
    parser.add_argument("--compare", choices=sorted(COMPARES), default="presets",
                        help="the pair of servers: the presets (baseline, tuned) or a before/after of one change")
    parser.add_argument("--device", choices=["auto", "cpu", "sim"], default="auto",
                        help="sim: the real host pipeline against the simulated accelerator (h200-sxm-estimate); "
                             "auto: CUDA when present, else the CPU")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.closed_rounds, args.rounds, args.duration = 60, 1, 1, 4.0
    warmup_requests, warmup_s = (16, 1.0) if args.quick else (64, 2.0)

    from tuning.knobs import preset
    from tuning.runtime.engine import Engine

    arms = COMPARES[args.compare]
    names = tuple(arms)
    import torch

    device = {"auto": {}, "cpu": {"device": "cpu"}, "sim": {"device": "sim"}}[args.device]
    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    knobs = {name: preset(arm[0], **{**{k: v for k, v in arm[1].items() if not (on_cpu and k == "pin_memory")},
                                    **device})
             for name, arm in arms.items()}  # pinned copies need CUDA or the simulated device
    from tuning.load.generator import serve_pipe
    from tuning.online.serve import Server
    from tuning.present.tables import table

    ctx = mp.get_context("spawn")
    ctrl, ctrl_child = ctx.Pipe()
    data, data_child = ctx.Pipe()
    generator = ctx.Process(target=_generator, args=(ctrl_child, data_child, args.limit), name="load-generator",
                            daemon=True)
    generator.start()
    engines = {name: Engine(knobs[name], reserved_cores=1) for name in names}  # the load generator's core
    t_start = time.perf_counter()

    def make_server(name: str) -> Server:
        server = Server(knobs[name], engine=engines[name], **arms[name][2])
        for attribute, value in arms[name][3].items():
            setattr(server.former, attribute, value)
        return server

    def run(name: str, job: dict) -> dict:
        with make_server(name) as server:
            ctrl.send(job)
            done = serve_pipe(server, data)
            reply = ctrl.recv()
            done()
        for message in reply["warnings"]:
            print(f"  warning ({name}): {message}", flush=True)
        return reply

    # capacity: closed loop, interleaved
    closed: dict[str, list[dict]] = {name: [] for name in names}
    for name in _abba(args.closed_rounds, names):
        s = run(name, dict(concurrency=args.concurrency, requests=args.requests,
                           warmup_requests=warmup_requests))["summary"]
        closed[name].append(s)
        print(f"closed {name}: {s['qps']:.1f} QPS ({s['ok']} ok, window {s['window_s']:.1f} s)", flush=True)
    qps = {name: float(np.median([s["qps"] for s in runs])) for name, runs in closed.items()}
    rate = args.rate or round(args.load * min(qps.values()), 1)
    print(f"open-loop rate {rate} req/s ({'given' if args.rate else f'{args.load} x the lower capacity'})", flush=True)

    # the tail at one fixed rate: open loop, interleaved
    opened: dict[str, list[dict]] = {name: [] for name in names}
    pooled: dict[str, list[float]] = {name: [] for name in names}
    for i, name in enumerate(_abba(args.rounds, names)):
        reply = run(name, dict(concurrency=args.clients, rate=rate, duration_s=args.duration, warmup_s=warmup_s,
                               seed=i // 2))  # both arms of a round get the same arrival schedule (paired)
        s = reply["summary"]
        opened[name].append(s)
        pooled[name] += reply["latencies_ms"]
        print(f"open {name}: p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms over {s['submitted']} requests, "
              f"offered {s['offered_rate']:.1f} achieved {s['achieved_rate']:.1f} req/s, "
              f"error rate {s['error_rate']:.3f}, model busy {s['model_busy']:.2f}", flush=True)
    ctrl.send(None)
    generator.join(timeout=30)

    before, after = names
    base, tuned = (np.asarray(pooled[name]) for name in names)
    p99 = {name: _p99(pooled[name]) for name in names}
    closed_p99 = {name: float(np.median([s["p99_ms"] for s in runs])) for name, runs in closed.items()}
    figures = {
        "qps_ratio": qps[after] / qps[before],
        "p99_ratio": p99[after] / p99[before],
        "p99_ratio_ci95": _bootstrap_ratio(base, tuned),
        "p99_ratio_per_round": [t["p99_ms"] / b["p99_ms"] for b, t in zip(opened[before], opened[after])],
        "closed_p99_ms": closed_p99, "closed_p99_ratio": closed_p99[after] / closed_p99[before],
        "samples": {name: len(pooled[name]) for name in names},
    }
    rows = []
    for name in names:
        o = opened[name]
        rows.append({"server": name, "closed_qps": qps[name], "closed_p99_ms": closed_p99[name],
                     "open_p50_ms": float(np.median(pooled[name])),
                     "open_p99_ms": p99[name], "samples": len(pooled[name]),
                     "error_rate": float(np.mean([s["error_rate"] for s in o])),
                     "model_busy": float(np.mean([s["model_busy"] for s in o if s["model_busy"] is not None]))})
    print(table(rows, ["server", "closed_qps", "closed_p99_ms", "open_p50_ms", "open_p99_ms", "samples", "error_rate",
                       "model_busy"]))
    lo, hi = figures["p99_ratio_ci95"]
    targets = TARGETS if args.compare == "presets" else {}
    device = engines[after].device_info
    print(f"{after} over {before} on {device.get('kind')} {device.get('name') or device.get('profile', '')}: "
          f"qps_ratio {figures['qps_ratio']:.2f} (closed loop{', target >= 3.0' if targets else ''}), closed-loop "
          f"p99 ratio {figures['closed_p99_ratio']:.2f} at concurrency {args.concurrency}   "
          f"p99_ratio {figures['p99_ratio']:.2f} [{lo:.2f}, {hi:.2f}] at {rate} req/s "
          f"(open loop{', target <= 0.5' if targets else ''})   samples {figures['samples']}   "
          f"{time.perf_counter() - t_start:.0f} s")
    name = "serving" if args.compare == "presets" else f"serving_{args.compare.replace('-', '_')}"
    write(name + ("_sim" if args.device == "sim" else ""), {
        "compare": args.compare, "arms": {n: {"preset": a[0], "knobs": a[1], "server": a[2], "batcher": a[3]}
                                          for n, a in arms.items()},
        "device": device, "simulated": args.device == "sim",
        "method": "qps_ratio: closed loop, median QPS over ABBA runs; p99_ratio: open loop at one fixed rate, "
                  "latency from the scheduled arrival over every outcome, samples pooled over ABBA runs; "
                  "load from a separate process over a pipe",
        "concurrency": args.concurrency, "requests": args.requests,
        "closed_rounds": args.closed_rounds, "rounds": args.rounds, "duration_s": args.duration, "rate": rate,
        **figures, "targets": targets,
        "p99_ms": p99, "p99_ms_per_run": {name: [s["p99_ms"] for s in opened[name]] for name in names},
        "qps_per_run": {name: [s["qps"] for s in closed[name]] for name in names},
        "closed": closed, "open": opened,
    }, quick=args.quick)


if __name__ == "__main__":
    main()
