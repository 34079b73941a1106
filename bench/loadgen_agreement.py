"""Our load client against locust on the same server at the same concurrency (issue 11 item 4).

The server (``python -m tuning serve --preset tuned``, the real model) runs in its own process for the
whole bench. Each round runs our client (asyncio, keep-alive, in this process) and locust (headless,
a master and ``--workers`` worker processes, FastHttpUser keep-alive) as closed loops at the same
concurrency with the same warm-up and window, interleaved ABBA. Per round: ``qps_ratio`` = ours /
locust and ``p99_ratio`` = ours / locust (both over every outcome of the measured window); the
figures are the medians of the per-round ratios with their spread. Target: both within 0.9-1.1.
Each arm's client CPU is reported beside it (a client short of CPU reads a worse tail than the server
gives).

    python bench/loadgen_agreement.py            # writes bench/results/loadgen_agreement.json
    python bench/loadgen_agreement.py --quick    # a short smoke run; writes to a temporary folder
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.base.net import free_port

TARGET = (0.9, 1.1)
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (results not comparable)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each runs both clients)")
    parser.add_argument("--concurrency", type=int, default=32, help="clients (locust users) in the closed loop")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per run")
    parser.add_argument("--workers", type=int, default=1, help="locust worker processes")
    parser.add_argument("--preset", default="tuned", help="the server's preset")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="a server knob (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N records")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 4.0, 1.0
    check_rounds(args.rounds, args.quick)

    from tuning.inputs.readers import read_lines
    from tuning.load.generator import run_load
    from tuning.load.locust_engine import run_locust

    port = free_port()
    sets = [flag for knob in args.set for flag in ("--set", knob)]
    server = subprocess.Popen([sys.executable, "-m", "tuning", "serve", "--preset", args.preset, *sets,
                               "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    line = server.stdout.readline()
    if f":{port}" not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line}{server.stderr.read()[-2000:]}")
    url = f"http://127.0.0.1:{port}/embed"
    inputs = [raw for _, raw in read_lines(limit=args.limit)]
    t_start = time.perf_counter()

    def figures(result) -> dict:
        s = result.summary()
        return {key: s[key] for key in ("qps", "p50_ms", "p95_ms", "p99_ms", "submitted", "ok", "errors", "timeouts",
                                        "rejected", "client_cpu", "error_rate")}

    arms = {
        "ours": lambda: figures(run_load(url, inputs, concurrency=args.concurrency, duration_s=args.duration,
                                         warmup_s=args.warmup)),
        "locust": lambda: figures(run_locust(url, inputs, args.concurrency, args.duration, workers=args.workers,
                                             warmup_s=args.warmup)),
    }
    try:
        runs = interleave(arms, args.rounds, lambda r, name, v: print(
            f"round {r} {name}: {v['qps']:.1f} QPS, p50 {v['p50_ms']:.0f} ms, p99 {v['p99_ms']:.0f} ms, "
            f"{v['submitted']} requests ({v['errors']} errors), client CPU {v['client_cpu']:.2f}", flush=True))
    finally:
        server.terminate()
        server.wait(timeout=60)
    qps_ratio = paired_ratio([r["qps"] for r in runs["ours"]], [r["qps"] for r in runs["locust"]])
    p99_ratio = paired_ratio([r["p99_ms"] for r in runs["ours"]], [r["p99_ms"] for r in runs["locust"]])
    inside = all(TARGET[0] <= x["median"] <= TARGET[1] for x in (qps_ratio, p99_ratio))
    print(f"qps_ratio (ours/locust) {fmt_spread(qps_ratio)}   p99_ratio {fmt_spread(p99_ratio)}   "
          f"target {TARGET[0]}-{TARGET[1]}: {'met' if inside else 'NOT met'}   at concurrency {args.concurrency}, "
          f"{time.perf_counter() - t_start:.0f} s")
    write("loadgen_agreement", {
        "method": "the same server (own process) driven in turn by our asyncio keep-alive client and by locust "
                  "(headless master + workers, FastHttpUser) as closed loops at one concurrency, same warm-up and "
                  "window; ABBA rounds; medians of per-round ratios ours/locust",
        "preset": args.preset, "set": args.set, "concurrency": args.concurrency, "duration_s": args.duration,
        "warmup_s": args.warmup, "rounds": args.rounds, "locust_workers": args.workers,
        "qps_ratio": qps_ratio["median"], "p99_ratio": p99_ratio["median"],
        "qps_ratio_spread": qps_ratio, "p99_ratio_spread": p99_ratio, "target": list(TARGET), "met": inside,
        "qps": {name: spread([r["qps"] for r in rs]) for name, rs in runs.items()},
        "p99_ms": {name: spread([r["p99_ms"] for r in rs]) for name, rs in runs.items()},
        "runs": runs,
    }, quick=args.quick)


if __name__ == "__main__":
    main()
