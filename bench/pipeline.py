"""baseline vs tuned offline pipeline vs the bare model forward, in one run on the shipped records.

The bare forward replays exactly the tuned run's batches (same batch sizes and padded
shapes, tensors prepared in advance), so ``tuned_over_bare`` is the pipeline efficiency:
the share of the model's own speed that the whole pipeline keeps.

    python bench/pipeline.py [--limit N]

Target on the 2-core CPU: tuned/baseline >= 3, tuned/bare >= 0.85.
"""

from __future__ import annotations

import argparse
import time

from common import write

import torch

from tuning.knobs import preset
from tuning.pipeline import Pipeline
from tuning.report import table


def bare_throughput(pipeline: Pipeline, limit: int | None) -> tuple[float, int]:
    from tuning.pipeline import LineDataset

    batches = [b for b in pipeline.loader(LineDataset(limit=limit)) if b.input_ids is not None]
    engine = pipeline.engine
    n = sum(len(b.ok_items) for b in batches)
    with torch.inference_mode():
        engine.runner(batches[0].input_ids, batches[0].attention_mask)
        t0 = time.perf_counter()
        for b in batches:
            engine.runner(b.input_ids.to(engine.device), b.attention_mask.to(engine.device))
        engine._sync()
    return n / (time.perf_counter() - t0), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N records only (default: all)")
    args = parser.parse_args()

    rows, results = [], {}
    for name in ("baseline", "tuned"):
        pipeline = Pipeline(preset(name))
        result = pipeline.run(limit=args.limit, keep_embeddings=False)
        results[name] = result
        rows.append({"run": name, "texts_per_s": result.throughput_rps, "model_busy": result.model_busy,
                     "padding_waste": result.padding_waste, "requests": len(result.requests), "errors": result.errors})
        print(f"{name}: {result.throughput_rps:.1f} texts/s", flush=True)
    bare, n = bare_throughput(Pipeline(preset("tuned")), args.limit)
    rows.append({"run": "bare forward (tuned shapes)", "texts_per_s": bare, "requests": n})
    tuned, baseline = results["tuned"].throughput_rps, results["baseline"].throughput_rps
    ratios = {"tuned_over_baseline": tuned / baseline, "tuned_over_bare": tuned / bare}
    print(table(rows, ["run", "texts_per_s", "model_busy", "padding_waste", "requests", "errors"]))
    print("  ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    write("pipeline", {
        "records": len(results["tuned"].requests),
        "throughput_rps": {"baseline": baseline, "tuned": tuned, "bare_forward": bare},
        **ratios,
        "targets": {"tuned_over_baseline": 3.0, "tuned_over_bare": 0.85},
        "ledgers": {name: r.summary()["stages"] for name, r in results.items()},
        "knobs": {name: r.knobs.as_dict() for name, r in results.items()},
    })


if __name__ == "__main__":
    main()
