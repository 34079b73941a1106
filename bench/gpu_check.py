"""GPU check: one script, under 5 minutes on a CUDA machine.

    PYTHONPATH=. python bench/gpu_check.py [--out PATH] [--budget-s 240]

1. NVML sampler readings during the run (SM util, power, memory, clocks);
2. op and launch statistics of eager at batch 1: the launch-overhead budget, i.e. the most
   CUDA-graph capture could save, predicted before capturing;
3. eager vs compile vs cuda_graph at batch 1, 8 and 16 for two bucket lengths, with
   compile/capture time apart from steady-state time, and correctness against eager;
4. a table, and JSON at --out.

Runs from the working tree with nothing the GPU image lacks (no plotly, no widgets). When
the embedded weights are not installed, MiniLM is built from the config.json kept in the
repo with random weights (timing and equality checks only), and the output says so. On a
machine without CUDA it still runs (eager and compile on the CPU) and records cuda_graph
as refused, so its CPU-side logic is tested.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tuning.graphs import CudaGraphRunner  # noqa: E402
from tuning.model import check_dtype, load_minilm, random_minilm  # noqa: E402
from tuning.profile.gpu import GpuSampler  # noqa: E402
from tuning.profile.ops import op_stats  # noqa: E402
from tuning.report import table  # noqa: E402

MODES = ("eager", "compile", "cuda_graph")


def load_model() -> tuple[torch.nn.Module, str]:
    try:
        return load_minilm(), "all-MiniLM-L6-v2 weights (installed package)"
    except (ImportError, FileNotFoundError) as exc:
        return random_minilm(), f"RANDOM weights from tuning/assets/minilm_config.json ({exc}); timings and equality only"


def time_runner(runner, ids, mask, repeats: int, device: torch.device) -> tuple[float, float, torch.Tensor]:
    """(first-call seconds: compile or capture included, steady median ms, output)."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        out = runner(ids, mask)
        sync()
        first_s = time.perf_counter() - t0
        for _ in range(3):
            runner(ids, mask)
        times = []
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            out = runner(ids, mask)
            sync()
            times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return first_s, times[len(times) // 2], out.float().clone()


def make_runner(mode: str, model, device: torch.device, compiled: dict):
    if mode == "eager":
        return model
    if mode == "compile":
        if "fn" not in compiled:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
            compiled["fn"] = torch.compile(model, dynamic=False)
        return compiled["fn"]
    return CudaGraphRunner(model, device)  # raises without CUDA, naming the knob to use instead


def run_check(batches=(1, 8, 16), lengths=(64, 128), modes=MODES, repeats=20, budget_s=240.0,
              dtype_name: str | None = None, device_name: str | None = None) -> dict:
    t_begin = time.perf_counter()
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = dtype_name or ("fp16" if device.type == "cuda" else "bf16")
    model, weights = load_model()
    model = model.to(device=device, dtype=check_dtype(dtype_name, device)).eval()
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'}),"
          f" dtype {dtype_name}, torch {torch.__version__}; model: {weights}", flush=True)
    rows, compiled = [], {}
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as caught, GpuSampler(0.2) as sampler:
        warnings.simplefilter("always", RuntimeWarning)
        ids1 = torch.randint(1000, 20000, (1, lengths[0]), generator=gen).to(device)
        ops = op_stats(model, ids1, torch.ones_like(ids1), batches=3).summary()
        print(f"eager at (1, {lengths[0]}): {ops['ops_per_batch']:.0f} ops, {ops['kernels_per_batch']:.0f} kernels per batch, "
              f"launch cost {ops['launch_cost_us']:.1f} us -> predicted capture gain <= {100 * ops['launch_share']:.0f}%",
              flush=True)
        for length in lengths:
            for batch in batches:
                ids = torch.randint(1000, 20000, (batch, length), generator=gen)
                mask = torch.ones_like(ids)
                mask[batch // 2:, length * 3 // 4:] = 0  # some padded rows, as bucketed batches have
                ids, mask = ids.to(device), mask.to(device)
                reference = None
                for mode in modes:
                    row = {"mode": mode, "batch": batch, "length": length}
                    if time.perf_counter() - t_begin > budget_s:
                        rows.append({**row, "status": "skipped: time budget"})
                        continue
                    try:
                        runner = make_runner(mode, model, device, compiled)
                        first_s, median_ms, out = time_runner(runner, ids, mask, repeats, device)
                    except Exception as exc:
                        rows.append({**row, "status": f"refused: {exc}" if isinstance(exc, ValueError)
                                     else f"failed: {type(exc).__name__}: {str(exc)[:160]}"})
                        continue
                    if mode == "eager":
                        reference = out
                    ok_ref = reference is not None
                    cosine = float(torch.nn.functional.cosine_similarity(out, reference).min()) if ok_ref else math.nan
                    max_abs = float((out - reference).abs().max()) if ok_ref else math.nan
                    rows.append({**row, "status": "ok", "first_call_s": first_s, "median_ms": median_ms,
                                 "per_sample_ms": median_ms / batch, "min_cosine_vs_eager": cosine,
                                 "max_abs_diff": max_abs})
                    print(f"  {mode:>10} b={batch:<2} L={length}: {median_ms:.3f} ms (first call {first_s:.2f} s), "
                          f"cos vs eager {cosine:.5f}", flush=True)
    eager = {(r["batch"], r["length"]): r["median_ms"] for r in rows if r["mode"] == "eager" and r["status"] == "ok"}
    for r in rows:
        if r.get("status") == "ok" and (r["batch"], r["length"]) in eager:
            r["speedup_vs_eager"] = eager[(r["batch"], r["length"])] / r["median_ms"]
    gpu = sampler.series.summary()
    return {"device": device.type, "dtype": dtype_name, "torch": torch.__version__, "weights": weights,
            "elapsed_s": time.perf_counter() - t_begin, "ops_eager_batch1": ops, "nvml": gpu,
            "nvml_samples": sampler.series.to_frame().tail(5).to_dict("records"),
            "warnings": [str(w.message) for w in caught], "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    parser.add_argument("--budget-s", type=float, default=240.0, help="skip remaining points after this")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--lengths", default="64,128")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    result = run_check(tuple(int(x) for x in args.batches.split(",")), tuple(int(x) for x in args.lengths.split(",")),
                       tuple(args.modes.split(",")), args.repeats, args.budget_s, device_name=args.device)
    print(table(result["rows"], ["mode", "batch", "length", "status", "median_ms", "per_sample_ms", "first_call_s",
                                 "speedup_vs_eager", "min_cosine_vs_eager"]))
    g = result["nvml"]
    print(f"NVML: {'on, ' + str(g['samples']) + ' samples, SM util mean ' + str(g.get('sm_util_mean')) + '%, power mean ' + str(g.get('power_w_mean')) + ' W' if g['available'] else 'off: ' + str(g['reason'])}")
    print(f"model: {result['weights']}; elapsed {result['elapsed_s']:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
