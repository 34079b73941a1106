"""baseline vs tuned offline pipeline vs the bare model forward, interleaved, on the shipped records.

Three arms run once per round in ABBA order (baseline, tuned, bare; then bare, tuned,
baseline; ...), at least 5 rounds; ratios are taken per round (paired) and reported as the
median with its spread. Throughput is the pipeline's own definition: requests / measured window
(warm-up batches of an evenly spaced sample run first and are discarded).

* ``tuned_over_bare``: tuned throughput / the bare forward's, where the bare forward replays
  exactly the tuned run's batches (same sizes and padded shapes, tensors prepared in advance).
* ``efficiency_in_run``: inside one tuned run, its throughput / its own forward throughput
  (ok requests / seconds inside the model), i.e. the share of the window the model computed.
  It needs no second run, so no drift between runs enters it; tuned/bare can only exceed it
  when the model runs faster inside the pipeline than alone (it should not).
* ``forward_in_run_over_bare``: the model's speed inside the pipeline / alone (below 1: the
  input side competes with the model for the cores).

    python bench/pipeline.py [--limit N] [--rounds 5] [--quick]

Target on the 2-core CPU: tuned/baseline >= 3, tuned/bare >= 0.85.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.knobs import preset
from tuning.offline.pipeline import LineDataset, Pipeline, PipelineResult
from tuning.present.tables import table


def forward_rps_in_run(result: PipelineResult) -> float:
    """Ok requests of the measured batches / seconds they spent inside the model, in this run."""
    measured = [b for b in result.batches if not b.warmup]
    seconds = sum(b.inference_ms for b in measured) / 1000
    return sum(b.ok for b in measured) / seconds if seconds else float("nan")


class BareForward:
    """The tuned run's batches, prepared once, replayed through the model alone."""

    def __init__(self, pipeline: Pipeline, limit: int | None):
        dataset = LineDataset(limit=limit)
        self.engine = pipeline.engine
        self.batches = [b for b in pipeline.loader(dataset) if b.input_ids is not None]
        dataset.close()
        self.requests = sum(len(b.ok_items) for b in self.batches)

    def __call__(self) -> float:
        engine = self.engine
        engine.use_threads()  # the tuned run's thread count (torch's is process-wide)
        with torch.inference_mode():
            engine.runner(self.batches[0].input_ids, self.batches[0].attention_mask)  # warm
            engine._sync()
            t0 = time.perf_counter()
            for b in self.batches:
                engine.runner(b.input_ids.to(engine.device), b.attention_mask.to(engine.device))
            engine._sync()
        return self.requests / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N records only (default: all)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved ABBA rounds (at least 5 for a spread)")
    parser.add_argument("--quick", action="store_true", help="check the script: 32 records, 2 rounds, temp output")
    args = parser.parse_args()
    if args.quick:
        args.limit, args.rounds = min(args.limit or 32, 32), min(args.rounds, 2)
    check_rounds(args.rounds, args.quick)

    pipelines = {name: Pipeline(preset(name)) for name in ("baseline", "tuned")}
    for p in pipelines.values():
        p.warmup()
    bare = BareForward(pipelines["tuned"], args.limit)
    arms = {"baseline": lambda: pipelines["baseline"].run(limit=args.limit, keep_embeddings=False),
            "tuned": lambda: pipelines["tuned"].run(limit=args.limit, keep_embeddings=False),
            "bare": bare}

    def report(r, name, value):
        rps = value if isinstance(value, float) else value.qps
        print(f"round {r} {name:>8}: {rps:.1f} texts/s", flush=True)

    samples = interleave(arms, args.rounds, report)
    rps = {"baseline": [r.qps for r in samples["baseline"]],
           "tuned": [r.qps for r in samples["tuned"]], "bare_forward": samples["bare"]}
    in_run_forward = [forward_rps_in_run(r) for r in samples["tuned"]]
    figures = {
        "tuned_over_baseline": paired_ratio(rps["tuned"], rps["baseline"]),
        "tuned_over_bare": paired_ratio(rps["tuned"], rps["bare_forward"]),
        "efficiency_in_run": paired_ratio(rps["tuned"], in_run_forward),
        "forward_in_run_over_bare": paired_ratio(in_run_forward, rps["bare_forward"]),
    }
    last = {name: samples[name][-1] for name in ("baseline", "tuned")}
    rows = [{"run": name, "texts_per_s": fmt_spread(spread(values), 1)} for name, values in rps.items()]
    print(table(rows, ["run", "texts_per_s"]))
    for name, s in figures.items():
        print(f"{name}: {fmt_spread(s)}")
    write("pipeline", {
        "records": len(last["tuned"].requests),
        "rounds": args.rounds,
        "order": "ABBA: baseline, tuned, bare; then bare, tuned, baseline",
        "throughput_definition": "requests / measured window (warm-up: an evenly spaced sample, run first and discarded)",
        "qps": {name: spread(values) for name, values in rps.items()},
        **{name: s["median"] for name, s in figures.items()},
        "spreads": figures,
        "model_busy": {name: spread([r.model_busy for r in samples[name]]) for name in ("baseline", "tuned")},
        "padding_waste": {name: r.padding_waste for name, r in last.items()},
        "targets": {"tuned_over_baseline": 3.0, "tuned_over_bare": 0.85},
        "ledgers": {name: r.summary()["stages"] for name, r in last.items()},
        "knobs": {name: r.knobs.as_dict() for name, r in last.items()},
    }, quick=args.quick)


if __name__ == "__main__":
    main()
