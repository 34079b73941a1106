"""The tuned offline pipeline against ``SentenceTransformer.encode`` (what a user would pick instead).

Same device, same dtype, on the shipped records, in one run: fp32 then bf16. Ours reads
and validates every line from disk; theirs gets the formatted texts in memory and sorts
them by length before batching (batch size 32, as asked).

    python bench/peers.py [--limit N]

Writes bench/results/peers.json with ``ratio_fp32`` and ``ratio_bf16`` (ours / theirs). Target >= 1.0.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import write

import torch

from tuning.data import load_texts
from tuning.knobs import preset
from tuning.model import embedded_model_dir
from tuning.pipeline import Pipeline
from tuning.report import table


def ours_rps(dtype_name: str, device: str, limit: int | None) -> float:
    pipeline = Pipeline(preset("tuned", dtype=dtype_name, device=device))
    pipeline.warmup()
    result = pipeline.run(limit=limit, keep_embeddings=False)
    return len(result.requests) / (result.t_end - result.t_start)  # whole run, warm-up batches included


def theirs_rps(st, texts: list[str]) -> float:
    st.encode(texts[:64], batch_size=32)  # warm-up
    t0 = time.perf_counter()
    st.encode(texts, batch_size=32)
    return len(texts) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per dtype; medians are compared")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = load_texts(limit=args.limit)
    rows, ratios = [], {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        st = SentenceTransformer(str(embedded_model_dir()), device=device).to(dtype)
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(ours_rps(dtype_name, device, args.limit))
            theirs.append(theirs_rps(st, texts))
        ratios[f"ratio_{dtype_name}"] = statistics.median(ours) / statistics.median(theirs)
        rows += [{"dtype": dtype_name, "runner": "tuning tuned pipeline", "texts_per_s": statistics.median(ours),
                  "rounds": ", ".join(f"{x:.1f}" for x in ours)},
                 {"dtype": dtype_name, "runner": "SentenceTransformer.encode(batch_size=32)",
                  "texts_per_s": statistics.median(theirs), "rounds": ", ".join(f"{x:.1f}" for x in theirs)}]
        print(f"{dtype_name}: ours {ours}, theirs {theirs}, ratio of medians {ratios[f'ratio_{dtype_name}']:.2f}",
              flush=True)
    print(table(rows, ["dtype", "runner", "texts_per_s", "rounds"]))
    write("peers", {"device": device, "texts": len(texts), "rounds": args.rounds, **ratios, "target": 1.0,
                    "runs": rows})


if __name__ == "__main__":
    main()
