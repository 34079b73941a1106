"""Serving at fixed concurrency: the ``baseline`` server (batch 1, no waiting) against the
``tuned`` one (dynamic batching by length bucket), in one run, on the shipped records.

    python bench/serving.py [--concurrency 32] [--requests 600]

Writes bench/results/serving.json with ``qps_ratio`` and ``p99_ratio`` (tuned / baseline).
Target on the 2-core CPU: qps_ratio >= 3 and p99_ratio <= 0.5.
"""

from __future__ import annotations

import argparse

from common import write

from tuning.data import read_lines
from tuning.knobs import preset
from tuning.loadgen import run_load
from tuning.report import table
from tuning.serve import Server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=64)
    args = parser.parse_args()

    inputs = [raw for _, raw in read_lines()]
    summaries = {}
    for name in ("baseline", "tuned"):
        with Server(preset(name)) as server:
            result = run_load(server, inputs, concurrency=args.concurrency, requests=args.requests,
                              warmup_requests=args.warmup)
        summaries[name] = result.summary()
        s = summaries[name]
        print(f"{name}: {s['qps']:.1f} QPS, p99 {s['p99_ms']:.0f} ms, mean batch {s['mean_batch']:.1f}", flush=True)
    base, tuned = summaries["baseline"], summaries["tuned"]
    ratios = {"qps_ratio": tuned["qps"] / base["qps"], "p99_ratio": tuned["p99_ms"] / base["p99_ms"]}
    print(table([{"server": k, **v} for k, v in summaries.items()],
                ["server", "qps", "p50_ms", "p95_ms", "p99_ms", "ok", "errors", "model_busy", "mean_batch"]))
    print(f"qps_ratio {ratios['qps_ratio']:.2f} (target >= 3)   p99_ratio {ratios['p99_ratio']:.2f} (target <= 0.5)")
    write("serving", {"concurrency": args.concurrency, "requests": args.requests, **ratios,
                      "targets": {"qps_ratio": 3.0, "p99_ratio": 0.5}, "runs": summaries})


if __name__ == "__main__":
    main()
