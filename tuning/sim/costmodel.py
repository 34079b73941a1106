"""The cost model of the simulated accelerator: model profile x device profile -> time per call.

A **model profile** is measured once for any ``torch.nn.Module`` on any machine (the CPU
included): every aten operator one forward dispatches, whether it launches a kernel (a view
or an op that returns its input's storage launches none), its FLOPs (``FlopCounterMode``) and
the bytes it reads and writes, at a small grid of (batch B, padded length T). Each operator's
FLOPs and bytes are fitted exactly as ``c0 + c1*B + c2*B*T + c3*B*T**2`` (linear layers and
norms grow with B*T, attention with B*T**2, pooling with B), so the profile predicts any shape.

A **device profile** (:mod:`tuning.sim.profiles`) gives peak FLOP/s per dtype, bandwidth,
their achievable fractions, the host cost of one eager launch and of one graph replay, the
minimum kernel time and copy bandwidths.

The formula, for one forward at (B, T) in dtype d::

    kernel_i   = max(min_kernel_s, flops_i / (peak_flops[d] * flops_efficiency),
                     bytes_i(d) / (mem_bandwidth * bandwidth_efficiency))
    device_s   = sum_i kernel_i                                   (what NVML's utilization sees)
    host_s     = launches * launch_s     (eager: every kernel; compile: fused kernels;
                 graph_replay_s          cuda_graph: one replay)
    call_s     = end of the last kernel, where kernel i starts at max(its launch, end of kernel i-1)
                 (an asynchronous device: about max(host_s, device_s) plus the start-up lag);
                 synchronous devices (a CPU) run launch then kernel in series: host_s + device_s
    copy_s     = copy_latency_s + input bytes / (h2d_pinned_bps or h2d_pageable_bps)

``compile`` (``compile_graph``: compile with mode='reduce-overhead', fused kernels replayed as one
graph) fuses each run of operators without FLOPs between two FLOP-heavy operators into
one kernel whose traffic is the largest of the run's (inductor's pointwise/reduction fusion;
matmuls and attention stay extern kernels). ``cuda_graph`` keeps the kernels and replaces
their launches by one replay. bytes_i(d) scales floating-point traffic by the dtype's size; ``tf32``
is fp32 storage with matmuls at the profile's TF32 rate (fp32's where the profile gives none).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from tuning.sim.profiles import DeviceProfile

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}  # tf32: fp32 storage, matmuls on TF32 tensor cores
FEATURES = ("1", "B", "B*T", "B*T^2")
CUDA_CONTEXT_BYTES = 0.5e9  # CUDA context, cuBLAS workspaces: typically 0.3-0.6 GB before the first tensor
DEFAULT_GRID = ((1, 8), (2, 8), (1, 16), (2, 16), (4, 32), (1, 64), (3, 48), (2, 64))


def features(batch: int | np.ndarray, length: int | np.ndarray) -> np.ndarray:
    b, t = np.asarray(batch, dtype=float), np.asarray(length, dtype=float)
    return np.stack([np.ones_like(b), b, b * t, b * t * t], axis=-1)


@dataclass
class ModelProfile:
    """Per operator of one forward: name, whether it launches a kernel, fitted FLOPs and bytes."""

    name: str
    ops: list[str]
    launches: list[bool]
    flops: list[list[float]]  # per op, coefficients over FEATURES
    float_bytes: list[list[float]]  # floating-point traffic at fp32, per op
    other_bytes: list[list[float]]  # integer/bool traffic (ids, masks), per op
    param_bytes_fp32: float
    output_dim: int
    grid: list[list[int]] = field(default_factory=list)
    fit_error: float = 0.0  # worst relative error of the fit on its own grid
    source: str = ""

    @property
    def kernels(self) -> int:
        """Kernels one eager forward launches."""
        return int(sum(self.launches))

    def per_op(self, batch: int, length: int, dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flops, bytes, launches) per operator at one shape and dtype."""
        x = features(batch, length)
        flops = np.maximum(np.asarray(self.flops) @ x, 0.0)
        scale = DTYPE_BYTES[dtype] / 4
        nbytes = np.maximum(np.asarray(self.float_bytes) @ x, 0.0) * scale + np.maximum(np.asarray(self.other_bytes) @ x, 0.0)
        return flops, nbytes, np.asarray(self.launches, dtype=bool)

    def totals(self, batch: int, length: int, dtype: str = "fp32") -> dict[str, float]:
        flops, nbytes, launches = self.per_op(batch, length, dtype)
        return {"flops": float(flops.sum()), "bytes": float(nbytes[launches].sum()), "kernels": int(launches.sum())}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(asdict(self), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelProfile":
        return cls(**json.loads(Path(path).read_text()))


class _OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool, float, float, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils.flop_counter import FlopCounterMode

        kwargs = kwargs or {}
        with FlopCounterMode(display=False) as counter:
            out = func(*args, **kwargs)
        flops = float(counter.get_total_flops())
        if "scaled_dot_product_attention" in str(func) and flops == 0:
            flops = sdpa_flops(args[0], args[1])  # the CPU flash kernel has no FlopCounterMode formula
        inputs = [t for t in _tensors((args, kwargs))]
        outputs = [t for t in _tensors(out)]
        in_storages = {_storage(t) for t in inputs}
        aliases = bool(outputs) and all(_storage(t) in in_storages for t in outputs)
        launches = not func.is_view and bool(outputs) and not aliases and "empty" not in str(func)
        if "embedding" in str(func):  # a gather reads only the rows it looks up, not the whole table
            inputs = [t for t in inputs if not t.is_floating_point()] + outputs
        fbytes = sum(_nbytes(t) for t in inputs + outputs if t.is_floating_point())
        obytes = sum(_nbytes(t) for t in inputs + outputs if not t.is_floating_point())
        self.ops.append((str(func), launches, flops, float(fbytes), float(obytes)))
        return out


def sdpa_flops(query: torch.Tensor, key: torch.Tensor) -> float:
    """Attention's matmuls: Q K^T and P V, each 2 * B * H * T * S * D (softmax's few ops per score left out)."""
    *lead, t, d = query.shape
    s = key.shape[-2]
    return 4.0 * float(np.prod(lead)) * t * s * d


def _tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def record_ops(model: torch.nn.Module, batch: int, length: int, vocab: int = 1000) -> list[tuple[str, bool, float, float, float]]:
    """Every aten op of one fp32 forward at (batch, length): (name, launches, flops, float bytes, other bytes)."""
    ids = torch.full((batch, length), min(1000, vocab - 1), dtype=torch.long)
    mask = torch.ones_like(ids)
    recorder = _OpRecorder()
    with torch.inference_mode(), recorder:
        model(ids, mask)
    return recorder.ops


def measure_model_profile(model: torch.nn.Module, name: str = "model",
                          grid: Sequence[tuple[int, int]] = DEFAULT_GRID) -> ModelProfile:
    """Measure a model profile on this machine (fp32, CPU is fine: counts, FLOPs and bytes do not depend on it)."""
    model = model.float().cpu().eval()
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    vocab = min(tables) if tables else 1001  # a token id every embedding table holds
    runs = [record_ops(model, b, t, vocab) for b, t in grid]
    names = [op[0] for op in runs[0]]
    for (b, t), run in zip(grid, runs):
        if [op[0] for op in run] != names:
            raise ValueError(f"model {name!r} runs a different operator sequence at batch={b}, length={t} than at "
                             f"{grid[0]}: the simulated device needs a shape-independent forward (no data-dependent "
                             "control flow); profile it at one shape per bucket instead")
    x = features(*np.asarray(grid, dtype=float).T)
    coefs, worst = {}, 0.0
    for col, key in ((2, "flops"), (3, "float_bytes"), (4, "other_bytes")):
        y = np.asarray([[op[col] for op in run] for run in runs])  # shapes x ops
        c, *_ = np.linalg.lstsq(x, y, rcond=None)
        fitted = x @ c
        denom = np.maximum(np.abs(y).sum(axis=1), 1.0)
        worst = max(worst, float((np.abs(fitted - y).sum(axis=1) / denom).max()))
        coefs[key] = np.round(c.T, 6).tolist()
    launches = [bool(any(run[i][1] for run in runs)) for i in range(len(names))]
    with torch.inference_mode():
        out = model(torch.ones((1, 4), dtype=torch.long), torch.ones((1, 4), dtype=torch.long))
    return ModelProfile(
        name=name, ops=names, launches=launches, flops=coefs["flops"], float_bytes=coefs["float_bytes"],
        other_bytes=coefs["other_bytes"], param_bytes_fp32=float(sum(p.numel() * 4 for p in model.parameters())),
        output_dim=int(out.shape[-1]), grid=[list(g) for g in grid], fit_error=worst,
        source=f"measured with FlopCounterMode and a dispatch-mode op recorder, torch {torch.__version__}",
    )


@dataclass(frozen=True)
class CallCost:
    """The predicted cost of one forward call (seconds) on a device."""

    host_s: float  # host CPU time: launches (eager/compile) or one replay (cuda_graph)
    device_s: float  # device compute time (sum of kernel times)
    call_s: float  # wall time of the call, until the result is ready
    kernels: int
    launches: int
    memory_bytes: float

    @property
    def device_share(self) -> float:
        return self.device_s / self.call_s if self.call_s > 0 else 0.0


def fused_groups(model: ModelProfile, flops: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kernels after compile-style fusion: FLOP-heavy ops alone, runs of other launching ops fused into one."""
    out_flops, out_bytes = [], []
    run_bytes: list[float] = []
    for f, b, launches in zip(flops, nbytes, model.launches):
        if not launches:
            continue
        if f > 0:
            if run_bytes:
                out_flops.append(0.0), out_bytes.append(max(run_bytes))
                run_bytes = []
            out_flops.append(f), out_bytes.append(b)
        else:
            run_bytes.append(b)
    if run_bytes:
        out_flops.append(0.0), out_bytes.append(max(run_bytes))
    return np.asarray(out_flops), np.asarray(out_bytes)


def predict(model: ModelProfile, device: DeviceProfile, batch: int, length: int, dtype: str = "fp32",
            graph: str = "eager") -> CallCost:
    """The cost of one forward at (batch, length) per the module docstring's formula."""
    flops, nbytes, launches = model.per_op(batch, length, dtype)
    if graph in ("compile", "compile_graph"):
        k_flops, k_bytes = fused_groups(model, flops, nbytes)
    else:
        k_flops, k_bytes = flops[launches], nbytes[launches]
    peak = device.flops_for(dtype) * device.flops_efficiency
    bandwidth = device.mem_bandwidth * device.bandwidth_efficiency
    kernels = np.maximum(device.min_kernel_s, np.maximum(k_flops / peak, k_bytes / bandwidth))
    device_s = float(kernels.sum())
    n = len(kernels)
    if graph in ("cuda_graph", "compile_graph"):  # compile_graph: compile with mode='reduce-overhead'
        host_s, n_launches = device.graph_replay_s, 1
        call_s = host_s + device_s
    else:
        host_s, n_launches = n * device.launch_s, n
        if device.synchronous:
            call_s = host_s + device_s
        else:
            launched = device.launch_s * np.arange(1, n + 1)
            end = 0.0
            for t_launch, k in zip(launched, kernels):
                end = max(end, t_launch) + k
            call_s = float(end)
    # weights, plus the live activations around the largest operator (its inputs and outputs, twice for the
    # next layer's and the allocator's slack), plus the CUDA context on an accelerator
    memory = (model.param_bytes_fp32 * DTYPE_BYTES[dtype] / 4 + 2 * float(nbytes.max(initial=0.0))
              + (0.0 if device.synchronous else CUDA_CONTEXT_BYTES))
    return CallCost(host_s, device_s, call_s, n, n_launches, memory)


def copy_seconds(device: DeviceProfile, nbytes: float, pinned: bool) -> float:
    """Host-to-device copy of ``nbytes`` (pinned or pageable host memory)."""
    if nbytes <= 0:
        return 0.0
    bandwidth = device.h2d_pinned_bps if pinned else device.h2d_pageable_bps
    return device.copy_latency_s + nbytes / bandwidth
