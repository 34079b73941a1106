"""Throughput with and without the full recorder (GPU + host/thread samplers, default intervals).

Runs are paired and interleaved in one process on a warmed pipeline (without, with; then
with, without; ...) so drift hits both sides alike. Per pair, ``overhead = 1 - with / without``
(0.03 is 3%). The number of pairs is sized to the target: a pilot of ``--pilot`` pairs gives
the standard deviation ``sd`` of the paired overheads, and the run goes on until the 95%
confidence interval of their mean has a half-width of at most ``--half-width`` (default: half
the target), i.e. ``ceil((1.96 * sd / half_width) ** 2)`` pairs, capped by ``--max-pairs``.
The verdict says whether the interval lies below the target, above it, or still straddles it.

    python bench/profiler_overhead.py [--preset tuned] [--limit 800] [--target 0.03] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import warnings

from common import fmt_spread, pairs_needed, spread, write

from tuning.knobs import preset
from tuning.offline.pipeline import Pipeline
from tuning.present.tables import table
from tuning.profile import Recorder

Z95 = 1.96


def interval(overheads: list[float]) -> tuple[float, float, float]:
    """Mean paired overhead and its 95% confidence interval (normal approximation)."""
    mean = statistics.fmean(overheads)
    half = Z95 * statistics.stdev(overheads) / math.sqrt(len(overheads)) if len(overheads) > 1 else math.inf
    return mean, mean - half, mean + half


def verdict(low: float, high: float, target: float) -> str:
    if high <= target:
        return "within target"
    if low > target:
        return "over target"
    return "unresolved: the interval straddles the target"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tuned")
    parser.add_argument("--limit", type=int, default=800, help="records per run")
    parser.add_argument("--target", type=float, default=0.03, help="largest acceptable overhead (0.03: 3%%)")
    parser.add_argument("--half-width", type=float, default=None, help="95%% CI half-width to reach (default target/2)")
    parser.add_argument("--pilot", type=int, default=6, help="pairs before sizing the run")
    parser.add_argument("--max-pairs", type=int, default=80, help="stop here even if not resolved")
    parser.add_argument("--quick", action="store_true", help="check the script: 32 records, 2+1 pairs, temp output")
    args = parser.parse_args()
    if args.quick:
        args.limit, args.pilot, args.max_pairs = 32, 2, 3
    half_width = args.half_width or args.target / 2

    pipeline = Pipeline(preset(args.preset))
    pipeline.warmup()
    pipeline.run(limit=64, keep_embeddings=False)
    runs: dict[str, list[float]] = {"without": [], "with": []}
    gpu_reason = None

    def one(mode: str) -> float:
        nonlocal gpu_reason
        if mode == "with":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # no GPU here: said once below
                with Recorder() as rec:
                    result = pipeline.run(limit=args.limit, keep_embeddings=False)
                gpu_reason = rec.join(result).gpu.reason
        else:
            result = pipeline.run(limit=args.limit, keep_embeddings=False)
        return result.qps

    def pair(i: int) -> None:
        for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
            runs[mode].append(one(mode))
        print(f"pair {i}: without {runs['without'][-1]:.1f}, with {runs['with'][-1]:.1f} req/s, "
              f"overhead {1 - runs['with'][-1] / runs['without'][-1]:+.3f}", flush=True)

    for i in range(args.pilot):
        pair(i)
    overheads = [1 - w / wo for w, wo in zip(runs["with"], runs["without"])]
    pilot_sd = statistics.stdev(overheads) if len(overheads) > 1 else math.nan
    needed = pairs_needed(pilot_sd, half_width, Z95, minimum=args.pilot) if math.isfinite(pilot_sd) else args.max_pairs
    planned = min(needed, args.max_pairs)
    print(f"pilot: sd of paired overheads {pilot_sd:.4f} -> {needed} pairs for a 95% half-width of {half_width:.3f}"
          + (f" (capped at {args.max_pairs})" if needed > args.max_pairs else ""), flush=True)
    for i in range(args.pilot, planned):
        pair(i)
    overheads = [1 - w / wo for w, wo in zip(runs["with"], runs["without"])]
    mean, low, high = interval(overheads)
    said = verdict(low, high, args.target)
    print(table([{"mode": k, "req_per_s": fmt_spread(spread(v), 1)} for k, v in runs.items()], ["mode", "req_per_s"]))
    print(f"overhead {mean:+.4f}, 95% CI [{low:+.4f}, {high:+.4f}] over {len(overheads)} pairs (target <= {args.target}): "
          f"{said}; GPU sampler: {gpu_reason or 'on'}")
    write("profiler_overhead", {
        "preset": args.preset, "records_per_run": args.limit, "target": args.target, "half_width": half_width,
        "pilot_pairs": args.pilot, "pilot_sd": pilot_sd, "pairs_needed": needed, "pairs": len(overheads),
        "overhead": mean, "overhead_ci95": [low, high], "verdict": said,
        "overheads": spread(overheads), "runs_rps": runs,
        "median_rps": {k: statistics.median(v) for k, v in runs.items()},
        "gpu_sampler": gpu_reason or "on",
    }, quick=args.quick)


if __name__ == "__main__":
    main()
