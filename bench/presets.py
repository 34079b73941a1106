"""The sweeps behind the ``tuned`` preset: each offline knob moved away from ``tuned`` one at a time.

Every variant is the ``tuned`` preset with one change (loader workers, tokenizer, batch size,
length grouping and padding, bucket lengths, grouping window, dtype; ``--compile`` adds
graph='compile'). All variants run once per round, interleaved ABBA, on the same records;
each variant's throughput is compared with ``tuned`` in the same round (paired) and reported
as the median with its spread. A variant that beats ``tuned`` by more than its spread says the
preset should change. ``max_wait_ms`` is a serving knob: ``python -m tuning sweep wait`` measures it.

    python bench/presets.py [--limit 800] [--rounds 5] [--compile] [--quick]

Writes bench/results/presets.json (the record that knobs.py's presets cite).
"""

from __future__ import annotations

import argparse
from typing import Any

from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.knobs import preset
from tuning.offline.pipeline import Pipeline
from tuning.present.tables import table

_OTHER_DTYPE = "fp32" if preset("tuned").dtype == "bf16" else "bf16"

# (factor, label, changes to ``tuned``)
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("tuned", "tuned", {}),
    ("num_workers", "num_workers=1", {"num_workers": 1}),
    ("num_workers", "num_workers=2", {"num_workers": 2}),
    ("tokenizer", "tokenizer=naive", {"tokenizer": "naive"}),
    ("batch_size", "batch_size=8", {"batch_size": 8}),
    ("batch_size", "batch_size=32", {"batch_size": 32}),
    ("grouping", "bucket, group_by=bytes", {"group_by": "bytes"}),
    ("grouping", "dynamic, grouped by tokens", {"padding": "dynamic"}),
    ("grouping", "dynamic, arrival order", {"padding": "dynamic", "group_by": "bytes"}),
    ("buckets", "buckets=32,64,128,256", {"buckets": (32, 64, 128, 256)}),
    ("bucket_window", "bucket_window=256", {"bucket_window": 256}),
    # the other precision than tuned's on this machine (tuned is bf16 with native bf16, fp32 without)
    ("dtype", f"dtype={_OTHER_DTYPE}", {"dtype": _OTHER_DTYPE}),
]
COMPILE = ("graph", "graph=compile", {"graph": "compile"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=800, help="records per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved ABBA rounds (at least 5 for a spread)")
    parser.add_argument("--compile", action="store_true", help="also graph='compile' (one compilation per bucket)")
    parser.add_argument("--quick", action="store_true", help="check the script: 16 records, 1 round, temp output")
    args = parser.parse_args()
    if args.quick:
        args.limit, args.rounds = 16, 1
    check_rounds(args.rounds, args.quick)

    variants = VARIANTS + ([COMPILE] if args.compile else [])
    pipelines = {}
    for _, label, changes in variants:
        pipelines[label] = Pipeline(preset("tuned", **changes))
        pipelines[label].warmup()  # compile / capture here, outside every window
    arms = {label: (lambda p=p: p.run(limit=args.limit, keep_embeddings=False)) for label, p in pipelines.items()}
    samples = interleave(arms, args.rounds, lambda r, label, res: print(
        f"round {r} {label:>28}: {res.qps:.1f} req/s", flush=True))
    rps = {label: [r.qps for r in results] for label, results in samples.items()}
    rows, points = [], []
    for factor, label, changes in variants:
        ratio = paired_ratio(rps[label], rps["tuned"])
        last = samples[label][-1]
        point = {"factor": factor, "variant": label, "changes": {k: list(v) if isinstance(v, tuple) else v
                                                                 for k, v in changes.items()},
                 "qps": spread(rps[label]), "over_tuned": ratio,
                 "padding_waste": last.padding_waste, "model_busy": spread([r.model_busy for r in samples[label]])}
        points.append(point)
        rows.append({"factor": factor, "variant": label, "req_per_s": fmt_spread(point["qps"], 1),
                     "over_tuned": fmt_spread(ratio), "padding_waste": last.padding_waste})
    # a variant beats tuned only if even its worst round did (its whole range of paired ratios is above 1)
    better = [p["variant"] for p in points if p["factor"] != "tuned" and p["over_tuned"]["min"] > 1.0]
    print(table(rows, ["factor", "variant", "req_per_s", "over_tuned", "padding_waste"]))
    print("tuned is not beaten by any single change" if not better else f"beat tuned in every round: {better}")
    write("presets", {"preset": "tuned", "knobs": preset("tuned").as_dict(), "records_per_run": args.limit,
                      "rounds": args.rounds, "order": "ABBA over all variants", "points": points,
                      "beat_tuned_every_round": better}, quick=args.quick)


if __name__ == "__main__":
    main()
