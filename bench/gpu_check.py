"""GPU check: one script that fits a borrowed GPU's window, cheap decisive parts first.

    PYTHONPATH=. timeout 420 python bench/gpu_check.py --out OUT_DIR --budget-s 300
    PYTHONPATH=. python bench/gpu_check.py --plan bench/plans/whatif-next.json --out OUT_DIR          # a plan's points
    PYTHONPATH=. python bench/gpu_check.py --plan bench/plans/whatif-next.json --device sim \
        --sim-profile h100-sxm-estimate --out OUT_DIR                     # its dry run: the budget, SIMULATED

A plan file (``--plan``) names the forwards to time, each (mode, batch, length, dtype; tf32 is fp32 with TF32 on,
set before a graph is captured), the shapes whose profiler kernel sum to record, and the host cost's lengths; it
replaces the fixed steps by ``plan_points``, ``plan_kernel_sum`` and ``host_cost``. ``--device sim`` runs the same
steps on the simulated device (every call takes its predicted time; kernel sums are the cost model's), so its
elapsed time is the plan's budget on that card before a card is borrowed; every figure it writes is SIMULATED.

Writes OUT_DIR/gpu_check.json after every point (a run cut short keeps what it measured),
checking the time budget inside long steps, not only between them. In order:

1. environment and NVML (the CUDA device mapped to NVML by UUID);
2. eager and cuda_graph at a few (batch, length) shapes, checked against an fp32 eager
   reference (TF32 off), with capture time apart from steady-state time;
3. the launch budget: host launch calls, kernel and wall time per batch at batch 1, eager
   and replayed, so the predicted capture gain can be read against the measured one;
4. TF32: fp32 with and without TF32 beside the half-precision dtype (its gain is overstated
   against strict fp32); then MiniLM eager at the shapes of ``bench/published.csv``'s A100 rows, fp32
   and half, beside the simulator's prediction on this card's shipped profile (``published_shapes``);
5. the real paths: ``Engine.run`` with pinned copies, the padded ``CudaGraphRunner`` at
   several batch sizes with ragged batches, and a short ``run_batch_sweep`` per graph mode;
6. the simulated accelerator: a device profile fitted from every forward timed so far
   (``device_profile.json`` beside the JSON, printed beside the shipped H200 estimate), then
   ``baseline`` and ``tuned`` offline on this device under the recorder (NVML series, model busy,
   device busy, diagnosis) and on ``device=sim`` with that profile: sim/real, the fidelity that
   matters most (the shipped records and tokenizer files travel with the repository);
7. torch.compile on two shapes (default mode, then mode='reduce-overhead'), skipped after
   its first failure, and the compile sweep last.

Random weights (``tuning.runtime.model.random_minilm``) and random token ids: the tokenizer and the
weights package are not on the GPU image, and timing and equality need neither. Without
CUDA it runs a reduced form on the CPU (small shapes; cuda_graph refused, the padded graph
runner exercised with a stand-in capture that re-runs the model: logic only, no timing).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tuning.experiments.sweeps import run_batch_sweep
from tuning.knobs import Knobs  # noqa: E402
from tuning.present.tables import table
from tuning.profile.gpu import GpuSampler  # noqa: E402
from tuning.profile.ops import op_stats  # noqa: E402
from tuning.runtime.engine import Engine, Item, PreparedBatch
from tuning.runtime.graphs import CompiledRunner, CudaGraphRunner
from tuning.runtime.model import DTYPES, check_dtype, random_minilm

FULL = {"batches": (1, 8, 32), "lengths": (64, 128), "repeats": 20, "sweep_sizes": (1, 4, 16, 64),
        "sweep_length": 128, "compile_shapes": ((1, 64), (8, 128)), "fidelity_limits": {"baseline": 600, "tuned": 2400}}
# reduced: the compile sweep's shapes are the compile step's, so its compiles hit the cache
REDUCED = {"batches": (1, 4), "lengths": (16, 32), "repeats": 5, "sweep_sizes": (1, 4), "sweep_length": 16,
           "compile_shapes": ((1, 16), (4, 16)), "fidelity_limits": {"baseline": 40, "tuned": 80}}


class OutOfTime(Exception):
    pass


class Report:
    """The JSON at ``out/gpu_check.json``, rewritten (atomically) after every point."""

    def __init__(self, out: Path, budget_s: float, sampler: GpuSampler | None = None):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.json"
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.sampler = sampler
        self.data: dict[str, Any] = {"complete": False, "budget_s": budget_s, "env": {}, "steps": {}, "rows": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def check(self, what: str) -> None:
        """Raise :class:`OutOfTime` once the budget is spent (called inside long steps too)."""
        if self.elapsed() > self.budget_s:
            raise OutOfTime(f"time budget {self.budget_s:.0f} s spent before {what}")

    def row(self, **row: Any) -> dict[str, Any]:
        self.data["rows"].append(row)
        self.write()
        return row

    def step(self, name: str, **info: Any) -> None:
        self.data["steps"].setdefault(name, {}).update(info)
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        if self.sampler is not None:
            self.data["nvml"] = self.sampler.series.summary()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=_jsonable) + "\n")
        os.replace(tmp, self.path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runner(runner: Callable, ids: torch.Tensor, mask: torch.Tensor, repeats: int, device: torch.device,
                report: Report) -> tuple[float, float, int, torch.Tensor]:
    """(first call s: compile or capture included, steady median ms, timed calls, output); the
    budget is checked between calls, so a slow shape stops early with what it has."""
    with torch.inference_mode():
        _sync(device)
        t0 = time.perf_counter()
        out = runner(ids, mask)
        _sync(device)
        first_s = time.perf_counter() - t0
        out = out.float().clone()
        for _ in range(3):
            runner(ids, mask)
        times = []
        for _ in range(repeats):
            if times and report.elapsed() > report.budget_s:
                break
            _sync(device)
            t = time.perf_counter()
            runner(ids, mask)
            _sync(device)
            times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return first_s, times[len(times) // 2], len(times), out


def stand_in_capture(fn, ids, mask):
    """CPU stand-in for CUDA capture: replay re-runs the model on the static buffers (logic only)."""
    out = fn(ids, mask)

    def replay():
        out.copy_(fn(ids, mask))
    return out, replay


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float(), b.float()).min())


@contextlib.contextmanager
def _tf32(enabled: bool):
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


class Check:
    def __init__(self, report: Report, device: torch.device, dtype_name: str, sizes: dict[str, Any],
                 sim: Any = None, plan: dict[str, Any] | None = None):
        self.report = report
        self.device = device
        self.cuda = device.type == "cuda"
        self.dtype_name = dtype_name
        self.sizes = sizes
        self.sim = sim  # a tuning.sim.SimulatedDevice for a dry run: every forward takes its predicted time
        self.plan = plan
        self.fp32 = random_minilm().to(device=device).eval()  # the reference: same seed, same weights, fp32
        if sim is not None:
            from tuning.sim import SimulatedModel

            self.model = SimulatedModel(sim, dtype_name, "eager")
        else:
            self.model = random_minilm().to(device=device, dtype=check_dtype(dtype_name, device)).eval()
        self.gen = torch.Generator().manual_seed(0)
        self.compile_failed: str | None = None
        self._models: dict[str, Any] = {}

    def batch(self, batch: int, length: int, ragged: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(1000, 20000, (batch, length), generator=self.gen)
        mask = torch.ones_like(ids)
        if ragged:
            mask[batch // 2:, length * 3 // 4:] = 0  # some padded rows, as bucketed batches have
        return ids.to(self.device), mask.to(self.device)

    def reference(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """fp32 eager output with TF32 off: what every mode and dtype is checked against."""
        with _tf32(False), torch.inference_mode():
            return self.fp32(ids, mask).float()

    def graph_runner(self, batch_sizes=None) -> CudaGraphRunner:
        capture = None if self.cuda else stand_in_capture
        return CudaGraphRunner(self.model, self.device, batch_sizes=batch_sizes, capture_fn=capture)

    # -- steps ---------------------------------------------------------------------------------------------------

    def points(self) -> None:
        """eager and cuda_graph per shape (cheap and decisive), checked against fp32."""
        modes = ("eager", "cuda_graph") if self.cuda else ("eager",)
        if not self.cuda:
            self.report.row(mode="cuda_graph", status="refused: no CUDA (logic: step graph_runner_padded)")
        for length in self.sizes["lengths"]:
            for batch in self.sizes["batches"]:
                ids, mask = self.batch(batch, length)
                ref = self.reference(ids, mask)
                eager_out = None
                for mode in modes:
                    self.report.check(f"{mode} b={batch} L={length}")
                    runner = self.model if mode == "eager" else self.graph_runner()
                    first_s, median_ms, n, out = time_runner(runner, ids, mask, self.sizes["repeats"], self.device,
                                                             self.report)
                    eager_out = out if mode == "eager" else eager_out
                    row = self.report.row(
                        mode=mode, batch=batch, length=length, dtype=self.dtype_name, status="ok",
                        first_call_s=round(first_s, 4), median_ms=median_ms, per_sample_ms=median_ms / batch,
                        timed_calls=n, min_cosine_vs_fp32=_cosine(out, ref),
                        min_cosine_vs_eager=_cosine(out, eager_out), max_abs_vs_eager=float((out - eager_out).abs().max()))
                    print(f"  {mode:>10} b={batch:<3} L={length}: {median_ms:8.3f} ms (first call {first_s:.2f} s), "
                          f"cos vs fp32 {row['min_cosine_vs_fp32']:.5f}", flush=True)
        eager = {(r["batch"], r["length"]): r["median_ms"] for r in self.report.data["rows"]
                 if r.get("mode") == "eager" and r.get("status") == "ok"}
        for r in self.report.data["rows"]:
            if r.get("status") == "ok" and (r.get("batch"), r.get("length")) in eager:
                r["speedup_vs_eager"] = eager[(r["batch"], r["length"])] / r["median_ms"]
        self.report.step("points", status="ok", rows=sum(r.get("status") == "ok" for r in self.report.data["rows"]))

    # -- a plan's forwards (--plan) ------------------------------------------------------------------------------

    def plan_model(self, dtype: str) -> Any:
        """The model a plan point runs in ``dtype`` on this device (tf32: the fp32 model, TF32 set around it)."""
        if dtype in ("fp32", "tf32"):
            return self.fp32
        if dtype == self.dtype_name:
            return self.model
        if dtype not in self._models:
            self._models[dtype] = random_minilm().to(device=self.device, dtype=check_dtype(dtype, self.device)).eval()
        return self._models[dtype]

    def plan_runner(self, mode: str, dtype: str) -> Any:
        """A fresh runner for one plan point: eager, or a graph runner that captures on its first call."""
        if self.sim is not None:
            from tuning.sim import SimulatedModel

            return SimulatedModel(self.sim, "fp32" if dtype == "tf32" else dtype, mode, tf32=dtype == "tf32")
        model = self.plan_model(dtype)
        return model if mode == "eager" else CudaGraphRunner(model, self.device)

    def plan_points(self) -> None:
        """Each plan point timed as one synchronised call at a time (the cost model's call), first call (capture or
        the shape's first run) apart; rows carry ``source: plan`` and, on the simulated device, ``simulated``."""
        done = 0
        for p in self.plan["points"]:
            mode, batch, length, dtype = p["mode"], p["batch"], p["length"], p["dtype"]
            self.report.check(f"plan {mode} {dtype} b={batch} L={length}")
            if mode == "cuda_graph" and not (self.cuda or self.sim is not None):
                self.report.row(mode=mode, batch=batch, length=length, dtype=dtype, source="plan",
                                status="refused: no CUDA")
                continue
            ids, mask = self.batch(batch, length, ragged=False)
            with _tf32(dtype == "tf32"):  # before a capture: cuBLAS picks its kernels then
                first_s, median_ms, n, _ = time_runner(self.plan_runner(mode, dtype), ids, mask,
                                                       self.sizes["repeats"], self.device, self.report)
            self.report.row(mode=mode, batch=batch, length=length, dtype=dtype, source="plan", status="ok",
                            first_call_s=round(first_s, 4), median_ms=median_ms, per_sample_ms=median_ms / batch,
                            timed_calls=n, simulated=self.sim is not None)
            done += 1
            print(f"  plan {mode:>10} {dtype:>4} b={batch:<3} L={length:<3}: {median_ms:8.3f} ms "
                  f"(first call {first_s:.2f} s){' SIMULATED' if self.sim is not None else ''}", flush=True)
        self.report.step("plan_points", status="ok", plan=self.plan["name"], points=done)

    def plan_kernel_sum(self) -> None:
        """The profiler's kernel count and summed kernel time per forward at the plan's shapes (on the simulated
        device: the cost model's, labelled)."""
        out = {}
        for p in self.plan.get("kernel_sum", []):
            mode, batch, length, dtype = p["mode"], p["batch"], p["length"], p["dtype"]
            self.report.check(f"kernel sum {mode} b={batch} L={length}")
            key = f"{mode} {dtype} {batch}x{length}"
            if self.sim is not None:
                cost = self.sim.cost(batch, length, dtype, mode)
                out[key] = {"mode": mode, "dtype": dtype, "batch_shape": [batch, length], "simulated": True,
                            "kernels_per_batch": cost.kernels, "busy_ms_per_batch": cost.device_s * 1e3,
                            "wall_ms_per_batch": cost.call_s * 1e3}
            elif mode == "cuda_graph" and not self.cuda:
                out[key] = {"status": "refused: no CUDA"}
                continue
            else:
                ids, mask = self.batch(batch, length, ragged=False)
                with _tf32(dtype == "tf32"):
                    summary = op_stats(self.plan_runner(mode, dtype), ids, mask, batches=5).summary()
                summary.pop("top_ops", None)
                out[key] = {"mode": mode, "dtype": dtype, **_clean(summary)}
            print(f"  kernel sum {key}: {out[key]['kernels_per_batch']:.0f} kernels, "
                  f"{out[key]['busy_ms_per_batch']:.3f} ms per forward", flush=True)
            self.report.step("plan_kernel_sum", status="partial", shapes=out)
        self.report.step("plan_kernel_sum", status="ok", shapes=out)

    def launch_budget(self) -> None:
        """Predicted capture gain (the wall time per batch no kernel covers: a bound, not a measured saving) at batch
        1, eager and replayed."""
        length = self.sizes["lengths"][0]
        ids, mask = self.batch(1, length, ragged=False)
        runners = {"eager": self.model}
        if self.cuda:
            runners["cuda_graph"] = self.graph_runner()
        for name, runner in runners.items():
            self.report.check(f"launch budget {name}")
            s = op_stats(runner, ids, mask, batches=5).summary()
            s.pop("top_ops", None)
            self.report.step("launch_budget", **{name: _clean(s)})
            what = "host launches" if self.cuda else "ops"
            print(f"  launch budget {name:>10} (1, {length}): {s['launches_per_batch']:.0f} {what}, "
                  f"{s['kernels_per_batch']:.0f} kernels, wall {s['wall_ms_per_batch']:.3f} ms, "
                  f"busy {s['busy_ms_per_batch']:.3f} ms, launch {s['launch_cost_us']:.1f} us -> predicted capture gain <= "
                  f"{100 * s['launch_share']:.0f}%", flush=True)

    def host_cost(self) -> None:
        """Issue 25's host launch cost checked on this host: the eager forward's host wall per launched kernel at batch
        1 against the model's own code at a miniature size on this host's CPU (what the what-if charges beside the
        profile's ``launch_s``, :func:`tuning.runtime.engine.sim_host_dispatch`), interleaved: 15 rounds, each 10
        miniature forwards then 10 device forwards (synchronised once; the device's 0.2 ms hides behind the host's
        launches), both timed on the wall clock, per launch. ``extra_us`` (the CUDA path's part: what ``launch_s``
        stands for) is the median of the rounds' differences, with their lower and upper quartiles; the tiny op's
        dispatch and the profiler's launch call (launch budget step) are beside it."""
        from tuning.runtime.model import miniature
        from tuning.sim import embedded_model_profile, load_profile
        from tuning.sim.costmodel import record_ops
        from tuning.sim.dispatch import MINIATURE_TOKENS, host_dispatch_s

        minilm = embedded_model_profile()
        small = miniature(self.fp32)
        small_launches = sum(op[1] for op in record_ops(small, 1, MINIATURE_TOKENS, 32))
        small_ids = torch.zeros(1, MINIATURE_TOKENS, dtype=torch.long)
        small_mask = torch.ones_like(small_ids)
        tiny = host_dispatch_s()
        budget = self.report.data["steps"].get("launch_budget", {}).get("eager", {})
        driver = budget.get("launch_cost_us") if self.cuda else None
        shipped = load_profile("h200-sxm-estimate").launch_s * 1e6
        rows = []
        for length in self.sizes["lengths"]:
            self.report.check(f"host cost L={length}")
            ids, mask = self.batch(1, length, ragged=False)
            launches = int(np.sum(minilm.per_op(1, length, self.dtype_name)[2]))
            mini, real = [], []
            threads = torch.get_num_threads()
            try:
                with torch.inference_mode():
                    for _ in range(5):
                        self.model(ids, mask)
                        small(small_ids, small_mask)
                    for _ in range(15):
                        torch.set_num_threads(1)
                        t0 = time.perf_counter()
                        for _ in range(10):
                            small(small_ids, small_mask)
                        mini.append((time.perf_counter() - t0) / 10 / small_launches * 1e6)
                        torch.set_num_threads(threads)
                        _sync(self.device)
                        t0 = time.perf_counter()
                        for _ in range(10):
                            self.model(ids, mask)
                        _sync(self.device)
                        real.append((time.perf_counter() - t0) / 10 / launches * 1e6)
            finally:
                torch.set_num_threads(threads)
            extra = sorted(r - m for r, m in zip(real, mini))
            q = lambda v, f: float(np.percentile(v, f))  # noqa: E731
            row = {"batch": 1, "length": length, "dtype": self.dtype_name, "rounds": len(real), "launches": launches,
                   "measured_us_per_launch": q(real, 50), "measured_us_per_launch_q1": q(real, 25),
                   "miniature_us": q(mini, 50), "miniature_us_q1": q(mini, 25), "miniature_launches": small_launches,
                   "extra_us": q(extra, 50), "extra_us_q1": q(extra, 25), "extra_us_q3": q(extra, 75),
                   "tiny_op_us": tiny * 1e6, "driver_us": driver, "measured_ms": q(real, 50) * launches / 1e3,
                   "predicted_shipped_ms": launches * (q(mini, 50) + shipped) / 1e3}
            row["predicted_over_measured"] = row["predicted_shipped_ms"] / row["measured_ms"]
            rows.append(row)
            self.report.step("host_cost", status="partial", rows=_clean(rows))
            print(f"  host cost b=1 L={length}: {row['measured_us_per_launch']:.1f} us per launch ({launches}) = "
                  f"miniature {row['miniature_us']:.1f} + extra {row['extra_us']:.1f} [{row['extra_us_q1']:.1f}-"
                  f"{row['extra_us_q3']:.1f}] us (15 interleaved rounds); tiny op {tiny * 1e6:.2f} us, profiler's "
                  f"launch {'-' if driver is None else f'{driver:.1f}'} us; shipped profile predicts "
                  f"{row['predicted_over_measured']:.2f} of it", flush=True)
        self.report.step("host_cost", status="ok", rows=_clean(rows),
                         note="measured on this device and host; predicted_shipped_ms is the cost model's host part "
                              "with the shipped h200-sxm-estimate launch_s and this host's miniature")

    def op_host_costs(self) -> None:
        """Host wall per op, unprofiled, for the op kinds of an eager BERT forward: on this device at the forward's
        shapes (batch 1, 64 tokens, width 384, the half dtype) and on this host's CPU at 2 tokens of width 2 in fp32
        (where they compute next to nothing), each the median of 5 loops of 200 calls after 50, synchronised at
        each loop's end; then the eager forward's own ops by host (self CPU) time under the profiler. What the CUDA
        path adds per op beyond the CPU's dispatch is the what-if's driver part."""
        import torch.nn.functional as F
        from torch.profiler import ProfilerActivity, profile

        def tensors(device: torch.device, dtype: torch.dtype, tokens: int, d: int) -> dict[str, torch.Tensor]:
            g = torch.Generator(device="cpu").manual_seed(0)

            def r(*shape: int) -> torch.Tensor:
                return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
            heads = 12 if d % 12 == 0 else 1  # the model's attention: 12 heads, a float mask
            return {"a": r(1, tokens, d), "b": r(1, tokens, d), "c": r(1, tokens, d), "w": r(d, d), "w_up": r(4 * d, d),
                    "bias": r(d), "g": r(d), "q": r(1, heads, tokens, d // heads), "k": r(1, heads, tokens, d // heads),
                    "v": r(1, heads, tokens, d // heads), "m": r(1, 1, 1, tokens) * 0, "h": r(1, tokens, 4 * d)}
        cases = {
            "add_out": lambda t: torch.add(t["a"], t["b"], out=t["c"]),
            "add": lambda t: t["a"] + t["b"],
            "linear": lambda t: F.linear(t["a"], t["w"], t["bias"]),
            "linear_up": lambda t: F.linear(t["a"], t["w_up"]),
            "layer_norm": lambda t: F.layer_norm(t["a"], (t["g"].shape[0],), t["g"], t["bias"]),
            "gelu": lambda t: F.gelu(t["h"]),
            "sdpa": lambda t: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=t["m"]),
            "view_transpose": lambda t: t["a"].view(1, t["a"].shape[1], t["q"].shape[1], -1).transpose(1, 2),
        }
        places = [("cpu", torch.device("cpu"), torch.float32, 2, 2)]
        if self.cuda:
            places.insert(0, ("device", self.device, DTYPES[self.dtype_name], 64, 384))
        rows = []
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                for place, device, dtype, tokens, width in places:
                    t = tensors(device, dtype, tokens, width)
                    for name, op in cases.items():
                        self.report.check(f"op host cost {place} {name}")
                        for _ in range(50):
                            op(t)
                        loops = []
                        for _ in range(5):
                            _sync(device)
                            t0 = time.perf_counter()
                            for _ in range(200):
                                op(t)
                            _sync(device)
                            loops.append((time.perf_counter() - t0) / 200 * 1e6)
                        rows.append({"place": place, "op": name, "tokens": tokens, "width": width,
                                     "us_per_op": sorted(loops)[2]})
        finally:
            torch.set_num_threads(threads)
        ids, mask = self.batch(1, 64, ragged=False)
        with torch.inference_mode():
            for _ in range(3):
                self.model(ids, mask)
            _sync(self.device)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    self.model(ids, mask)
                _sync(self.device)
        forward_ops = [{"name": e.key, "calls_per_forward": e.count / 5,
                        "self_cpu_us_per_call": e.self_cpu_time_total / max(e.count, 1),
                        "self_cpu_us_per_forward": e.self_cpu_time_total / 5}
                       for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]]
        self.report.step("op_host_costs", status="ok", rows=_clean(rows), forward_ops=_clean(forward_ops),
                         note="measured; device rows at batch 1 x 64 tokens in the half dtype, cpu rows at 2 tokens fp32")
        print(table(rows, ["place", "op", "tokens", "width", "us_per_op"]), flush=True)
        print(table(forward_ops[:12], ["name", "calls_per_forward", "self_cpu_us_per_call", "self_cpu_us_per_forward"]),
              flush=True)

    def published_shapes(self) -> None:
        """MiniLM eager at the (batch, length) shapes of bench/published.csv's A100 rows, fp32 (TF32 off) and the
        half dtype, each beside the simulator's prediction on this card's shipped profile (None without one): a
        measured MiniLM row for that table on a real card (its published rows are other models). On the CPU one
        shape, logic only."""
        from tuning.sim import embedded_model_profile, predict
        from tuning.sim.profiles import profile_for_card

        card = torch.cuda.get_device_name(self.device) if self.cuda else None
        profile = profile_for_card(card)
        shapes = PUBLISHED_SHAPES if self.cuda else PUBLISHED_SHAPES[:1]
        minilm, rows = embedded_model_profile(), []
        from tuning.runtime.engine import sim_host_dispatch

        dispatch, source = sim_host_dispatch(self.fp32)
        info = {"card": card, "profile": profile.name if profile else None, "host_dispatch_us": dispatch * 1e6,
                "host_dispatch_source": source,
                "note": "measured_ms is measured on this device; simulated_ms is the cost model's prediction with this "
                        "host's cost per launch of the model's own code; simulated_tiny_op_ms with a tiny op's"}
        for dtype, model in (("fp32", self.fp32), (self.dtype_name, self.model)):
            for batch, length in shapes:
                self.report.check(f"published shape {dtype} b={batch} L={length}")
                ids, mask = self.batch(batch, length, ragged=False)
                with _tf32(False):
                    _, median_ms, n, _ = time_runner(model, ids, mask, self.sizes["repeats"], self.device, self.report)
                sim_ms = (predict(minilm, profile, batch, length, dtype, host_dispatch_s=dispatch).call_s * 1e3
                          if profile else None)
                tiny_ms = predict(minilm, profile, batch, length, dtype).call_s * 1e3 if profile else None
                rows.append({"model": "all-MiniLM-L6-v2 (random weights)", "framework": "PyTorch eager",
                             "dtype": dtype, "batch": batch, "seq_len": length, "measured_ms": median_ms,
                             "timed_calls": n, "simulated_ms": sim_ms, "simulated_tiny_op_ms": tiny_ms,
                             "sim_over_measured_speed": median_ms / sim_ms if sim_ms else None})
                self.report.step("published_shapes", status="partial", rows=_clean(rows), **info)
                print(f"  published shape {dtype:>4} b={batch:<3} L={length:<3}: {median_ms:8.3f} ms measured, "
                      f"simulated {'-' if sim_ms is None else f'{sim_ms:.3f} ms'}", flush=True)
        self.report.step("published_shapes", status="ok", rows=_clean(rows), **info)

    def tf32(self) -> None:
        if not self.cuda:
            self.report.step("tf32", status="n/a: no CUDA device")
            return
        batch, length = self.sizes["batches"][-1], self.sizes["lengths"][-1]
        ids, mask = self.batch(batch, length)
        ref = self.reference(ids, mask)
        results = {}
        for name, model, tf32 in (("fp32", self.fp32, False), ("fp32+tf32", self.fp32, True),
                                  (self.dtype_name, self.model, False)):
            self.report.check(f"tf32 {name}")
            with _tf32(tf32):
                _, median_ms, n, out = time_runner(model, ids, mask, self.sizes["repeats"], self.device, self.report)
            results[name] = {"median_ms": median_ms, "min_cosine_vs_fp32": _cosine(out, ref), "timed_calls": n}
            self.report.step("tf32", shape=[batch, length], **{name: _clean(results[name])})
        gain = {k: results["fp32"]["median_ms"] / v["median_ms"] for k, v in results.items()}
        self.report.step("tf32", speedup_vs_strict_fp32=_clean(gain))
        print(f"  tf32 at ({batch}, {length}): " + ", ".join(f"{k} x{v:.2f}" for k, v in gain.items()), flush=True)

    def engine_run_pinned(self) -> None:
        """Engine.run on a pinned host batch: copy (non-blocking), forward, postprocess."""
        self.report.check("Engine.run")
        length = self.sizes["lengths"][0]
        knobs = Knobs(device=self.device.type, dtype=self.dtype_name, pin_memory=self.cuda, num_workers=0,
                      padding="bucket", buckets=(length,), max_length=max(self.sizes["lengths"]), batch_size=4)
        engine = Engine(knobs, self.model)
        engine.warmup()
        ids = torch.randint(1000, 20000, (4, length), generator=self.gen)
        mask = torch.ones_like(ids)
        mask[2:, length // 2:] = 0
        batch = PreparedBatch([Item(i) for i in range(4)], ids, mask, 0.0, 0.0, 0.0, padded_length=length)
        if self.cuda:
            batch.pin_memory()
        out = engine.run(batch)
        if out.error:
            raise RuntimeError(out.error)
        ref = self.reference(ids.to(self.device), mask.to(self.device)).cpu()
        info = {"status": "ok", "pinned": bool(batch.input_ids.is_pinned()) if self.cuda else False,
                "copy_ms": out.copy_s * 1000, "inference_ms": out.inference_s * 1000,
                "postprocess_ms": out.postprocess_s * 1000, "rows": int(out.embeddings.shape[0]),
                "min_cosine_vs_fp32": _cosine(torch.from_numpy(out.embeddings), ref)}
        self.report.step("engine_run_pinned", **_clean(info))
        print(f"  Engine.run pinned={info['pinned']}: copy {info['copy_ms']:.3f} ms, inference "
              f"{info['inference_ms']:.3f} ms, cos vs fp32 {info['min_cosine_vs_fp32']:.5f}", flush=True)

    def graph_runner_padded(self) -> None:
        """The padded CudaGraphRunner: captured sizes (2, 4, 8), ragged batches 1..8, vs eager; sealed refusal."""
        length = self.sizes["lengths"][0]
        runner = self.graph_runner(batch_sizes=(2, 4, 8))
        worst, checked = 1.0, []
        with torch.inference_mode():
            for rows in (1, 2, 3, 5, 8):
                self.report.check(f"graph runner rows={rows}")
                ids, mask = self.batch(rows, length)
                out = runner(ids, mask).float()
                eager = self.model(ids, mask).float()
                worst = min(worst, _cosine(out, eager))
                checked.append(rows)
                self.report.step("graph_runner_padded", rows_checked=checked, min_cosine_vs_eager=worst,
                                 captured=sorted(runner.graphs), capture="cuda" if self.cuda else "CPU stand-in (logic only)")
            runner.seal()
            try:
                runner(*self.batch(8, length + 8))
                refused = False
            except ValueError:
                refused = True
        self.report.step("graph_runner_padded", status="ok" if worst > 0.999 and refused else "MISMATCH",
                         late_capture_refused=refused, padded_rows_share=runner.padded_rows_share)
        print(f"  padded graph runner: captured {sorted(runner.graphs)}, min cos vs eager {worst:.5f}, "
              f"late capture refused: {refused}", flush=True)

    def sweep(self, graph: str) -> None:
        self.report.check(f"sweep {graph}")
        length = self.sizes["sweep_length"]
        try:
            knobs = Knobs(device=self.device.type, dtype=self.dtype_name, num_workers=0, padding="bucket",
                          buckets=(length,), max_length=max(length, 32), batch_size=self.sizes["sweep_sizes"][0],
                          graph=graph)
            engine = Engine(knobs, self.model)
        except ValueError as exc:
            self.report.step(f"sweep_{graph}", status=f"refused: {exc}")
            print(f"  sweep {graph}: refused ({exc})", flush=True)
            return
        t0 = time.perf_counter()
        result = run_batch_sweep(knobs, list(self.sizes["sweep_sizes"]), length=length, repeats=3, rounds=3,
                                 engine=engine)
        s = result.summary()
        points = [{k: p.get(k) for k in ("batch_size", "status", "per_batch_ms", "per_sample_ms", "iqr_ms",
                                         "memory_mb")} for p in s["points"]]
        self.report.step(f"sweep_{graph}", status="ok", seconds=time.perf_counter() - t0, knee=s["knee"],
                         memory=s["memory"], points=_clean(points))
        print(f"  sweep {graph}: knee {s['knee']}; per sample ms " +
              ", ".join(f"{p['batch_size']}: {p['per_sample_ms']:.3f}" if p["per_sample_ms"] else
                        f"{p['batch_size']}: {p['status']}" for p in points), flush=True)

    def compile(self, mode: str | None) -> None:
        name = f"compile_{mode or 'default'}"
        if self.compile_failed:
            self.report.step(name, status=f"skipped: compile failed before ({self.compile_failed})")
            return
        if mode == "reduce-overhead" and not self.cuda:
            self.report.step(name, status="n/a: no CUDA device")
            return
        import torch._dynamo

        torch._dynamo.reset()
        shapes = self.sizes["compile_shapes"]
        runner = CompiledRunner(self.model, batch_sizes=sorted({b for b, _ in shapes}), mode=mode,
                                expected_shapes=len(shapes))
        for batch, length in shapes:
            self.report.check(f"{name} {batch}x{length}")
            ids, mask = self.batch(batch, length)
            try:
                first_s, median_ms, n, out = time_runner(runner, ids, mask, self.sizes["repeats"], self.device,
                                                         self.report)
            except OutOfTime:
                raise
            except Exception as exc:
                self.compile_failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                self.report.row(mode=name, batch=batch, length=length, status=f"failed: {self.compile_failed}")
                print(f"  {name} b={batch} L={length}: FAILED {self.compile_failed}", flush=True)
                return
            ref = self.reference(ids, mask)
            with torch.inference_mode():
                eager = self.model(ids, mask).float()
            self.report.row(mode=name, batch=batch, length=length, dtype=self.dtype_name, status="ok",
                            first_call_s=round(first_s, 3), median_ms=median_ms, per_sample_ms=median_ms / batch,
                            timed_calls=n, min_cosine_vs_fp32=_cosine(out, ref), min_cosine_vs_eager=_cosine(out, eager))
            print(f"  {name:>10} b={batch:<3} L={length}: {median_ms:8.3f} ms (compile {first_s:.1f} s)", flush=True)
        self.report.step(name, status="ok", shapes=[list(s) for s in runner.shapes], recompiles=runner.recompiles)


    # -- the simulated accelerator's calibration and fidelity on this device --------------------------------------

    def calibration_points(self) -> list:
        """Every timed forward so far as a calibration point: the shape points and the sweeps."""
        from tuning.sim.calibrate import Point

        points = [Point(int(r["batch"]), int(r["length"]), r["dtype"], r["mode"], float(r["median_ms"]))
                  for r in self.report.data["rows"]
                  if r.get("status") == "ok" and r.get("mode") in ("eager", "cuda_graph") and r.get("median_ms")]
        for graph in ("eager", "cuda_graph"):
            step = self.report.data["steps"].get(f"sweep_{graph}", {})
            points += [Point(int(p["batch_size"]), self.sizes["sweep_length"], self.dtype_name, graph,
                             float(p["per_batch_ms"])) for p in step.get("points", [])
                       if p.get("status") == "ok" and p.get("per_batch_ms")]
        return points

    def device_profile(self) -> None:
        """Fit this device's profile from what was timed; print it beside the shipped H200 estimate."""
        from tuning.sim import embedded_model_profile, load_profile
        from tuning.sim.calibrate import calibrate, describe, profiler_floor, unidentified

        points = self.calibration_points()
        name = (torch.cuda.get_device_name(self.device) if self.cuda else "this-cpu").lower().replace(" ", "-")
        memory = torch.cuda.get_device_properties(self.device).total_memory if self.cuda else None
        card = torch.cuda.get_device_name(self.device) if self.cuda else None  # picks the shipped profile of this card
        from tuning.runtime.engine import sim_host_dispatch

        minilm = embedded_model_profile()
        dispatch, source = sim_host_dispatch(self.fp32)  # the fit keeps the driver's part: launch less this
        floor = profiler_floor(self.report.data["steps"].get("launch_budget", {})) if self.cuda else None
        profile, worst = calibrate(points, minilm, "cuda" if self.cuda else "cpu",
                                   f"{name}-measured", memory_bytes=memory, device_name=card, host_dispatch_s=dispatch,
                                   host_dispatch_kind="model" if "miniature" in source else "tiny op",
                                   kernel_floor_s=floor)
        path = self.report.path.parent / "device_profile.json"
        profile.to_json(path)
        shipped = describe(load_profile("h200-sxm-estimate"))
        self.report.step("device_profile", status="ok", path=str(path), points=len(points), worst_fit_error=worst,
                         fitted=describe(profile), shipped_estimate=shipped,
                         unidentified={k: profile.sources[k] for k in unidentified(profile)})
        print(f"  device profile from {len(points)} points (worst fit error {worst:.1%}), wrote {path}", flush=True)
        print(table([{"profile": "measured here", **describe(profile)}, {"profile": "h200-sxm-estimate", **shipped}],
                    ["profile", "tflops_fp32", "tflops_bf16", "bandwidth_gb_s", "launch_us", "min_kernel_us",
                     "graph_replay_us"]), flush=True)

    def sim_fidelity(self) -> None:
        """baseline and tuned offline on this device under the recorder, then on sim with this card's shipped
        profile (fitted on other runs: never the profile fitted on this run, which would judge the run by itself);
        each timed on its second pass over the records (the first, ``qps_first_pass``, meets each shape once)."""
        from tuning import preset
        from tuning.offline.pipeline import Pipeline
        from tuning.profile import Recorder

        card = torch.cuda.get_device_name(self.device) if self.cuda else None
        path = fidelity_profile(card)
        if path is None:
            self.report.step("sim_fidelity", status="skipped: no shipped profile of this card (the profile fitted on "
                             "this run is never used to judge this run)")
            return
        limits = self.sizes["fidelity_limits"]
        runs: dict[str, dict[str, Any]] = {}
        for name in ("baseline", "tuned"):
            for mode in ("real", "sim"):
                self.report.check(f"sim_fidelity {name} {mode}")
                if mode == "real":
                    knobs = preset(name, device=self.device.type)
                    pipe = Pipeline(knobs, model=random_minilm())
                else:
                    pipe = Pipeline(preset(name, device="sim", sim_profile=str(path)))
                pipe.warmup()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    # a first pass over the same records meets every shape once: on CUDA each new eager shape's
                    # first call cost 80-100 ms (bench/results/gpu_check_h200), which a short run cannot amortize
                    cold = pipe.run(limit=limits[name], keep_embeddings=False)
                    with Recorder(0.25, device=(self.device.index or 0) if self.cuda else None) as rec:
                        result = pipe.run(limit=limits[name], keep_embeddings=False)
                prof = rec.join(result)
                gpu = prof.summary()["gpu"]
                runs.setdefault(name, {})[mode] = row = {
                    "qps": result.qps, "qps_first_pass": cold.qps, "model_busy": result.model_busy,
                    "device_busy": prof.signals.device_busy, "diagnosis": prof.diagnosis.kind,
                    "sm_util_mean": gpu.get("sm_util_mean"), "gpu_series": gpu.get("devices"),
                    "device": result.summary()["device"]}
                print(f"  {name:8s} {mode:4s}: {row['qps']:8.1f} req/s, model busy {row['model_busy']:.0%}, "
                      f"device busy {row['device_busy']:.0%}, {row['diagnosis']}", flush=True)
                self.report.step("sim_fidelity", status="partial", runs=_clean(runs))
        ratios = {name: r["sim"]["qps"] / r["real"]["qps"] for name, r in runs.items()}
        self.report.step("sim_fidelity", status="ok", runs=_clean(runs), sim_over_real=ratios)
        print("  sim/real throughput: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()), flush=True)


def fidelity_profile(card: str | None) -> str | None:
    """The profile the simulated arm of ``sim_fidelity`` runs on: the shipped profile of ``card`` (fitted on other
    runs, judged here), None when no shipped profile is of it. Never this run's own ``device_profile.json``."""
    from tuning.sim.profiles import profile_for_card

    profile = profile_for_card(card)
    return profile.name if profile is not None else None


# the (batch, length) shapes of bench/published.csv's A100 PyTorch rows (P01-P09, P27-P31)
PUBLISHED_SHAPES = ((1, 16), (1, 128), (1, 256), (1, 512), (8, 256), (32, 128), (32, 256), (32, 384), (128, 256))
PLAN_STEPS = ("plan_points", "plan_kernel_sum", "host_cost")
PLAN_MODES, PLAN_DTYPES = ("eager", "cuda_graph"), ("bf16", "fp16", "fp32", "tf32")
STEPS = ("plan_points", "plan_kernel_sum", "points", "launch_budget", "host_cost", "op_host_costs", "tf32",
         "published_shapes", "engine_run_pinned", "graph_runner_padded", "sweep_eager", "sweep_cuda_graph",
         "device_profile", "sim_fidelity", "compile_default", "compile_reduce-overhead", "sweep_compile")


def load_plan(path: str | Path) -> dict[str, Any]:
    """A plan file (see the module docstring), checked: every point a known mode and dtype at a whole batch and
    length above 0; a clear error naming the value otherwise."""
    path = Path(path)
    try:
        plan = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--plan {str(path)!r}: cannot read it ({exc}); see bench/plans/whatif-next.json") from None
    if not isinstance(plan, dict) or not plan.get("points"):
        raise ValueError(f"--plan {str(path)!r}: no 'points'; see bench/plans/whatif-next.json")
    for p in [*plan["points"], *plan.get("kernel_sum", [])]:
        bad = (p.get("mode") not in PLAN_MODES or p.get("dtype") not in PLAN_DTYPES
               or not all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] > 0
                          for k in ("batch", "length")))
        if bad:
            raise ValueError(f"--plan {str(path)!r}: point {p}; each needs mode in {PLAN_MODES}, dtype in "
                             f"{PLAN_DTYPES}, and whole batch and length above 0")
    plan.setdefault("name", path.stem)
    return plan


def run_check(out: Path, budget_s: float, device_name: str | None = None, dtype_name: str | None = None,
              quick: bool | None = None, sizes: dict[str, Any] | None = None,
              steps: tuple[str, ...] = STEPS, plan: dict[str, Any] | None = None,
              sim_profile: str = "h200-sxm-estimate") -> dict[str, Any]:
    """Run ``steps`` (in the fixed order of :data:`STEPS`) and return the JSON's data. ``plan``: a plan
    (:func:`load_plan`): its steps (:data:`PLAN_STEPS`) with its repeats and host-cost lengths. ``device_name``
    ``"sim"``: the simulated device of ``sim_profile`` (a dry run, every figure SIMULATED)."""
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        raise ValueError(f"steps {unknown} unknown; choose from {', '.join(STEPS)}")
    if plan is None and set(steps) & {"plan_points", "plan_kernel_sum"}:
        steps = tuple(s for s in steps if s not in ("plan_points", "plan_kernel_sum"))
    sim = None
    if device_name == "sim":
        from tuning.runtime.engine import sim_host_dispatch
        from tuning.sim import SimulatedDevice, embedded_model_profile, load_profile

        dispatch, source = sim_host_dispatch(random_minilm())
        sim = SimulatedDevice(load_profile(sim_profile), embedded_model_profile(), host_dispatch_s=dispatch,
                              dispatch_source=source)
        device_name = "cpu"
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if plan is not None:
        sizes = {**(sizes or {}), "repeats": int(plan.get("repeats", 10)),
                 "lengths": tuple(plan.get("host_cost_lengths", (64, 128)))}
    if cuda:
        if device.index is None:  # set_device refuses a bare "cuda" on torch 2.11
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        torch.cuda.init()
    reduced = quick if quick is not None else not (cuda or sim is not None)
    sizes = {**(REDUCED if reduced else FULL), **(sizes or {})}
    dtype_name = dtype_name or ("bf16" if not cuda or torch.cuda.is_bf16_supported() else "fp16")
    with warnings.catch_warnings(record=True) as caught, GpuSampler(0.2, device=(device.index or 0) if cuda else None) \
            as sampler:
        warnings.simplefilter("always", RuntimeWarning)
        report = Report(out, budget_s, sampler)
        report.data["env"] = {
            "device": "simulated" if sim is not None else device.type,
            "name": (f"simulated {sim.profile.name}" if sim is not None
                     else torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"),
            "plan": plan, "simulated": sim is not None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": dtype_name,
            "form": "reduced" if reduced else "full",
            "tf32_matmul_default": torch.backends.cuda.matmul.allow_tf32, "weights": "random (random_minilm, seed 0)",
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "sizes": sizes}
        if sim is not None:
            report.data["simulated"] = True
            report.data["what"] = (f"a dry run of {plan['name'] if plan else 'the check'} on the simulated "
                                   f"{sim.profile.name} (SIMULATED): every forward took its predicted time, kernel "
                                   "sums are the cost model's; 'budget' estimates the real card's time")
        report.write()
        print(f"device {device} ({report.data['env']['name']}), dtype {dtype_name}, torch {torch.__version__}, "
              f"{report.data['env']['form']} form, budget {budget_s:.0f} s; writing {report.path}", flush=True)
        nvml = ('on: ' + ', '.join(sampler.series.devices) if sampler.series.available
                else 'off: ' + str(sampler.series.reason))
        print(f"NVML: {nvml}",
              flush=True)
        check = Check(report, device, dtype_name, sizes, sim=sim, plan=plan)
        order = [("plan_points", check.plan_points), ("plan_kernel_sum", check.plan_kernel_sum),
                 ("points", check.points), ("launch_budget", check.launch_budget), ("host_cost", check.host_cost),
                ("op_host_costs", check.op_host_costs),
                ("tf32", check.tf32),
                 ("published_shapes", check.published_shapes),
                 ("engine_run_pinned", check.engine_run_pinned), ("graph_runner_padded", check.graph_runner_padded),
                 ("sweep_eager", functools.partial(check.sweep, "eager")),
                 ("sweep_cuda_graph", functools.partial(check.sweep, "cuda_graph")),
                 ("device_profile", check.device_profile), ("sim_fidelity", check.sim_fidelity),
                 ("compile_default", functools.partial(check.compile, None)),
                 ("compile_reduce-overhead", functools.partial(check.compile, "reduce-overhead")),
                 ("sweep_compile", functools.partial(check.sweep, "compile"))]
        for name, step in order:
            if name not in steps:
                continue
            if name == "sweep_compile" and check.compile_failed:
                report.step(name, status=f"skipped: compile failed before ({check.compile_failed})")
                continue
            try:
                report.check(name)
                step()
            except OutOfTime as exc:
                report.step(name, status=f"skipped: {exc}")
                print(f"  {name}: skipped ({exc})", flush=True)
            except Exception as exc:
                report.step(name, status=f"failed: {type(exc).__name__}: {str(exc)[:300]}",
                            traceback=traceback.format_exc()[-2000:])
                print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        report.data["warnings"] = sorted({str(w.message)[:300] for w in caught})
    report.data["complete"] = True
    if sim is not None and plan is not None:
        report.data["budget"] = plan_budget(report.data)
    report.write()
    return report.data


PLAN_LIMIT_S = 300.0  # what a plan must fit on one borrowed card (issue 59)


def plan_budget(data: dict[str, Any], results: Path = ROOT / "bench" / "results") -> dict[str, Any]:
    """A dry run's budget for the real card: its simulated elapsed time (every forward at its predicted time, the
    host's real work) plus, per point, the slowest first call a committed real run measured in that mode beyond the
    simulated first call (cuBLAS and cuDNN set-up, CUDA-graph capture; the simulated device does not model them)."""
    first: dict[str, float] = {}
    for path in sorted(results.glob("gpu_check_*/gpu_check.json")):
        for r in json.loads(path.read_text()).get("rows", []):
            if r.get("status") == "ok" and r.get("first_call_s") is not None:
                first[r["mode"]] = max(first.get(r["mode"], 0.0), float(r["first_call_s"]))
    allowance = sum(max(first.get(r["mode"], 0.0) - float(r.get("first_call_s") or 0.0), 0.0)
                    for r in data["rows"] if r.get("source") == "plan" and r.get("status") == "ok")
    estimate = float(data.get("elapsed_s", 0.0)) + allowance
    return {"simulated_elapsed_s": data.get("elapsed_s"), "first_call_allowance_s": round(allowance, 2),
            "first_call_s_per_mode_from_committed_runs": first, "estimate_s": round(estimate, 2),
            "limit_s": PLAN_LIMIT_S, "within_limit": estimate <= PLAN_LIMIT_S,
            "not_counted": "process start, torch import and CUDA initialisation before the first step"}


def refit(folder: Path) -> dict[str, Any]:
    """Fit a committed run's ``device_profile.json`` again from the forwards it timed (its rows and sweeps), with
    this commit's :func:`tuning.sim.calibrate.calibrate` (bounded by the card's datasheet, each figure's
    identifiability checked, the floor from the run's profiler), and record in its ``gpu_check.json`` step which
    commit refitted it. The host's own cost per launch is the run's ``host_cost`` miniature, else the geometric
    mean of the committed runs that measured one (``tuning.sim.holdout.default_dispatch_s``)."""
    import subprocess

    from tuning.sim import embedded_model_profile, holdout, load_profile
    from tuning.sim.calibrate import calibrate, describe, profiler_floor, unidentified

    folder = folder.resolve()
    path = folder / "gpu_check.json"
    data = json.loads(path.read_text())
    run = next(r for r in holdout.load_runs(folder.parent) if r.name == folder.name)
    dispatch = run.host_dispatch_s or holdout.default_dispatch_s(holdout.load_runs(folder.parent))
    points = holdout.calibration_points(run)
    card = data["env"]["name"]
    old = folder / "device_profile.json"
    memory = json.loads(old.read_text()).get("mem_bytes") if old.is_file() else None
    profile, worst = calibrate(points, embedded_model_profile(), "cuda", f"{card.lower().replace(' ', '-')}-measured",
                               memory_bytes=memory, device_name=card, host_dispatch_s=dispatch,
                               host_dispatch_kind="model",
                               kernel_floor_s=profiler_floor(data["steps"].get("launch_budget", {})))
    profile.to_json(old)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    data["steps"]["device_profile"] = {
        "status": "ok", "path": str(old.relative_to(ROOT)), "points": len(points), "worst_fit_error": worst,
        "fitted": describe(profile), "shipped_estimate": describe(load_profile("h200-sxm-estimate")),
        "unidentified": {k: profile.sources[k] for k in unidentified(profile)},
        "refit": {"by": "python bench/gpu_check.py --refit", "commit": commit,
                  "host_dispatch_us": round(dispatch * 1e6, 3),
                  "host_dispatch_measured_by_run": bool(run.host_dispatch_s),
                  "why": "the fit written during the run was not bounded by the card's datasheet (its bandwidth and "
                         "fp32 rate exceeded the H200's); refitted from the same timed forwards (log.txt keeps "
                         "what the run printed)"}}
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return data["steps"]["device_profile"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json (written after every point)")
    parser.add_argument("--refit", type=Path, nargs="+", metavar="RUN_DIR",
                        help="fit the device profile of committed run folders again (no device needed), and stop")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="stop starting new points after this many seconds (checked inside long steps)")
    parser.add_argument("--device", default=None,
                        help="cuda, cuda:1, cpu or sim (a dry run on the simulated device; default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="half precision to compare with fp32 (default bf16, else fp16)")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--quick", action="store_true", default=None, help="the reduced form (default without CUDA)")
    form.add_argument("--full", dest="quick", action="store_false", help="the full form (default with CUDA)")
    parser.add_argument("--steps", default=None, help="comma-separated subset of: " + ", ".join(STEPS)
                        + " (default: all but the plan's; with --plan: " + ", ".join(PLAN_STEPS) + ")")
    parser.add_argument("--plan", type=Path, default=None,
                        help="a plan file of forwards to time (bench/plans/whatif-next.json); runs its steps only")
    parser.add_argument("--sim-profile", default="h200-sxm-estimate",
                        help="with --device sim: the simulated card (a shipped profile's name or a JSON path)")
    args = parser.parse_args(argv)
    if args.refit:
        for folder in args.refit:
            step = refit(folder)
            print(f"{folder}: {step['points']} points, worst fit error {step['worst_fit_error']:.1%}, "
                  f"fitted {step['fitted']}, unidentified {sorted(step['unidentified'])}")
        return
    if args.out is None:
        parser.error("--out is required (unless --refit)")
    plan = load_plan(args.plan) if args.plan else None
    default = PLAN_STEPS if plan else tuple(s for s in STEPS if s not in PLAN_STEPS[:2])
    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip()) if args.steps else default
    data = run_check(args.out, args.budget_s, args.device, args.dtype, args.quick, steps=steps, plan=plan,
                     sim_profile=args.sim_profile)
    rows = [r for r in data["rows"]]
    print(table(rows, ["mode", "batch", "length", "status", "median_ms", "per_sample_ms", "first_call_s",
                       "speedup_vs_eager", "min_cosine_vs_fp32"]))
    failed = [f"{k}: {v['status']}" for k, v in data["steps"].items()
              if not str(v.get("status", "ok")).startswith(("ok", "n/a", "refused"))]
    g = data.get("nvml", {})
    nvml = (f"on, {g.get('samples')} samples, SM util mean {g.get('sm_util_mean')}%" if g.get('available')
            else f"off: {g.get('reason')}")
    print(f"NVML: {nvml}")
    print("steps not ok: " + ("; ".join(failed) if failed else "none"))
    if "budget" in data:
        b = data["budget"]
        print(f"budget on the real card (SIMULATED dry run): {b['simulated_elapsed_s']:.0f} s simulated + "
              f"{b['first_call_allowance_s']:.0f} s first-call allowance = {b['estimate_s']:.0f} s "
              f"(limit {b['limit_s']:.0f} s)")
    print(f"elapsed {data['elapsed_s']:.0f} s; wrote {args.out / 'gpu_check.json'}")


if __name__ == "__main__":
    main()
