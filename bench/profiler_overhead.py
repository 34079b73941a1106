"""Throughput with and without the full recorder (GPU + host/thread samplers, default intervals).

Runs are interleaved in one process (without, with, without, with, ...) on a warmed
pipeline so drift hits both sides alike. ``overhead`` = 1 - median(with) / median(without):
0.03 is 3%. Target: <= 3%.

    python bench/profiler_overhead.py [--preset tuned] [--limit 800] [--pairs 6]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

from common import write

from tuning.knobs import preset
from tuning.pipeline import Pipeline
from tuning.profile import Recorder
from tuning.report import table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tuned")
    parser.add_argument("--limit", type=int, default=800)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()

    pipeline = Pipeline(preset(args.preset))
    pipeline.warmup()
    pipeline.run(limit=64, keep_embeddings=False)
    runs: dict[str, list[float]] = {"without": [], "with": []}
    for i in range(args.pairs):
        for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
            if mode == "with":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # no GPU here: said once below
                    with Recorder() as rec:
                        result = pipeline.run(limit=args.limit, keep_embeddings=False)
                    gpu_reason = rec.join(result).gpu.reason
            else:
                result = pipeline.run(limit=args.limit, keep_embeddings=False)
            runs[mode].append(result.throughput_rps)
            print(f"pair {i} {mode:>7}: {result.throughput_rps:.1f} req/s", flush=True)
    without, with_ = statistics.median(runs["without"]), statistics.median(runs["with"])
    overhead = 1 - with_ / without
    print(table([{"mode": k, "median_rps": statistics.median(v), "runs": ", ".join(f"{x:.1f}" for x in v)}
                 for k, v in runs.items()], ["mode", "median_rps", "runs"]))
    print(f"overhead {overhead:+.3f} (target <= 0.03); GPU sampler: {gpu_reason or 'on'}")
    write("profiler_overhead", {"preset": args.preset, "records_per_run": args.limit, "runs_rps": runs,
                                "median_rps": {"without": without, "with": with_}, "overhead": overhead,
                                "target": 0.03, "gpu_sampler": gpu_reason or "on"})


if __name__ == "__main__":
    main()
