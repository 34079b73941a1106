"""Thread oversubscription, before and after sizing torch's intra-op threads (issue: no oversubscription).

Part 1, the forward alone: MiniLM at 16x64 in fp32 and bf16 with 1 thread and with every core, on a quiet
machine and with one other busy process (a Python busy loop), the median of ``--reps`` calls; interleaved.

Part 2, the change: the offline pipeline with loader workers, torch's intra-op threads at every core (torch's
default: before) against the sized count (``torch_threads=None``: the cores less the loader workers, at least 1:
after), interleaved in ABBA rounds; ``sized_over_default`` is the paired ratio of req/s (ok answers per second).

    python bench/threads.py [--rounds 5] [--limit 300] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.base.machine import intra_op_threads, usable_cores
from tuning.knobs import preset
from tuning.offline.pipeline import Pipeline
from tuning.runtime.model import random_minilm


def forward_ms(model, dtype: torch.dtype, threads: int, reps: int) -> float:
    torch.set_num_threads(threads)
    ids = torch.full((16, 64), 1000, dtype=torch.long)
    mask = torch.ones_like(ids)
    m = model.to(dtype)
    with torch.inference_mode():
        m(ids, mask)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            m(ids, mask)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--workers", type=int, default=1, help="loader workers in part 2")
    ap.add_argument("--preset", default="tuned", help="part 2's preset (tuned: Rust tokenizer; baseline: pure Python)")
    ap.add_argument("--forward", action=argparse.BooleanOptionalAction, default=True, help="run part 1")
    ap.add_argument("--name", default="threads", help="results file name")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.reps, args.limit = 1, 2, 48
    check_rounds(args.rounds, args.quick)
    cores = usable_cores()
    model = random_minilm().eval()

    table = []
    for state in ("quiet", "one other busy process") if args.forward else ():
        other = busy_process() if state != "quiet" else None
        try:
            time.sleep(0.5 if other else 0)
            row = {"state": state}
            for threads in sorted({1, cores}):
                for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                    row[f"{name}_{threads}t_ms"] = round(forward_ms(model, dtype, threads, args.reps), 1)
            table.append(row)
            print(row, flush=True)
        finally:
            if other:
                other.kill()
                other.wait()

    knobs = preset(args.preset, num_workers=args.workers, dtype="fp32")
    sized = intra_op_threads(args.workers)
    pipes = {"default": Pipeline(knobs.replace(torch_threads=cores)), "sized": Pipeline(knobs)}
    for p in pipes.values():
        p.warmup()

    def arm(name: str):
        def run() -> float:
            torch.set_num_threads(pipes[name].engine.torch_threads)
            return pipes[name].run(limit=args.limit, keep_embeddings=False).qps
        return run

    samples = interleave({name: arm(name) for name in pipes}, args.rounds,
                         report=lambda r, name, v: print(f"round {r} {name}: {v:.1f} req/s", flush=True))
    ratio = paired_ratio(samples["sized"], samples["default"])
    payload = {
        "forward_16x64": table,
        "pipeline": {"preset": f"{args.preset} (fp32)", "num_workers": args.workers, "limit": args.limit,
                     "threads_default": cores, "threads_sized": sized,
                     "qps": {name: spread(v) for name, v in samples.items()}, "sized_over_default": ratio},
    }
    print(f"pipeline, {args.workers} loader worker(s): default {cores} threads {fmt_spread(spread(samples['default']))}"
          f" req/s; sized {sized} thread(s) {fmt_spread(spread(samples['sized']))} req/s; "
          f"sized/default {fmt_spread(ratio)}")
    write(args.name, payload, args.quick)


if __name__ == "__main__":
    main()
