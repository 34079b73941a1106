"""The tuned offline pipeline against ``SentenceTransformer.encode`` (what a user would pick instead),
with the difference split into the model's part and the pipeline's part.

Same device, same dtype, on the shipped records; fp32 then bf16. Ours reads and validates every
line from disk; theirs gets the formatted texts in memory and sorts them by length before
batching (batch size 32, as asked). Four arms per round, interleaved ABBA, at least 5 rounds:

* ``ours``: the tuned pipeline; throughput = requests / measured window (warm-up batches of an
  evenly spaced sample run first and are discarded);
* ``theirs``: ``encode`` of all texts after a warm-up ``encode``: texts / that call's time;
* ``our_model`` and ``their_model``: each library's model alone (our MiniLM; their Transformer
  + Pooling + Normalize modules) on identical, prepared batches: the tuned run's own batches.

Per round: ``ratio = ours / theirs``; ``model_ratio = our_model / their_model`` (same inputs, so
only the model's implementation differs: the model's part); ``pipeline_ratio = ratio /
model_ratio`` (the rest: reading, tokenizing, batching and padding: the pipeline's part).
Medians of the per-round values with their spread.

    python bench/peers.py [--limit N] [--rounds 5] [--quick]

Writes bench/results/peers.json. Target: ratio >= 1.0.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.base.assets import embedded_model_dir
from tuning.inputs.readers import load_texts
from tuning.knobs import preset
from tuning.offline.pipeline import LineDataset, Pipeline
from tuning.present.tables import table

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def prepared_batches(pipeline: Pipeline, limit: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The tuned run's batches (sizes and padded shapes), tokenized once, as model inputs."""
    dataset = LineDataset(limit=limit)
    out = [(b.input_ids, b.attention_mask) for b in pipeline.loader(dataset) if b.input_ids is not None]
    dataset.close()
    return out


def replay_rps(forward, batches, device: torch.device) -> float:
    """Requests per second of ``forward(ids, mask)`` over ``batches`` (one warm-up call first)."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = sum(ids.shape[0] for ids, _ in batches)
    with torch.inference_mode():
        forward(*batches[0])
        sync()
        t0 = time.perf_counter()
        for ids, mask in batches:
            forward(ids.to(device), mask.to(device))
        sync()
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved ABBA rounds per dtype (at least 5)")
    parser.add_argument("--quick", action="store_true", help="check the script: 32 records, 2 rounds, temp output")
    args = parser.parse_args()
    if args.quick:
        args.limit, args.rounds = min(args.limit or 32, 32), min(args.rounds, 2)
    check_rounds(args.rounds, args.quick)
    from sentence_transformers import SentenceTransformer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    texts = load_texts(limit=args.limit)
    payload: dict = {"device": device.type, "texts": len(texts), "rounds": args.rounds, "target": 1.0,
                     "order": "ABBA: ours, theirs, our_model, their_model; then reversed",
                     "throughput_definition": "requests / measured window, after a warm-up outside it (both)"}
    rows = []
    for dtype_name, dtype in DTYPES.items():
        st = SentenceTransformer(str(embedded_model_dir()), device=device.type).to(dtype)
        pipeline = Pipeline(preset("tuned", dtype=dtype_name, device=device.type))
        pipeline.warmup()
        batches = prepared_batches(pipeline, args.limit)

        def theirs() -> float:
            st.encode(texts[:64], batch_size=32)  # warm-up, outside the window
            t0 = time.perf_counter()
            st.encode(texts, batch_size=32)
            return len(texts) / (time.perf_counter() - t0)

        arms = {
            "ours": lambda: pipeline.run(limit=args.limit, keep_embeddings=False).qps,
            "theirs": theirs,
            "our_model": lambda: replay_rps(pipeline.engine.runner, batches, device),
            "their_model": lambda: replay_rps(lambda ids, mask: st({"input_ids": ids, "attention_mask": mask}),
                                              batches, device),
        }
        samples = interleave(arms, args.rounds,
                             lambda r, name, v: print(f"{dtype_name} round {r} {name:>11}: {v:.1f} texts/s", flush=True))
        ratio = paired_ratio(samples["ours"], samples["theirs"])
        model_ratio = paired_ratio(samples["our_model"], samples["their_model"])
        pipeline_ratio = spread([o / t / (om / tm) for o, t, om, tm in
                                 zip(samples["ours"], samples["theirs"], samples["our_model"], samples["their_model"])])
        payload[f"ratio_{dtype_name}"] = ratio["median"]
        payload[f"model_ratio_{dtype_name}"] = model_ratio["median"]
        payload[f"pipeline_ratio_{dtype_name}"] = pipeline_ratio["median"]
        payload[dtype_name] = {"texts_per_s": {name: spread(v) for name, v in samples.items()}, "ratio": ratio,
                               "model_ratio": model_ratio, "pipeline_ratio": pipeline_ratio}
        for name, values in samples.items():
            rows.append({"dtype": dtype_name, "arm": name, "texts_per_s": fmt_spread(spread(values), 1)})
        print(f"{dtype_name}: ours/theirs {fmt_spread(ratio)}; model's part {fmt_spread(model_ratio)}; "
              f"pipeline's part {fmt_spread(pipeline_ratio)}", flush=True)
        del st, pipeline, batches
    print(table(rows, ["dtype", "arm", "texts_per_s"]))
    write("peers", payload, quick=args.quick)


if __name__ == "__main__":
    main()
