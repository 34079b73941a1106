"""The cost model of the simulated accelerator: model profile x device profile -> time per call.

A **model profile** is measured once for any ``torch.nn.Module`` on any machine (the CPU
included): every aten operator one forward dispatches, whether it launches a kernel, its FLOPs
(``FlopCounterMode``) and the bytes it reads and writes, at a small grid of (batch B, padded
length T). An operator launches when it writes memory: an in-place or ``out=`` operator always
(``add_``, ``relu_``, ``mul.out``; metadata-only ones such as ``transpose_`` or ``resize_``, tagged
``inplace_view``, never), any other when one of its outputs is new storage (a cast, ``contiguous``
of a transposed tensor, a copying ``reshape``); a pure view (view, expand, transpose, slice,
unsqueeze, alias, detach, a no-op ``to``, a ``reshape`` that needs no copy) returns its input's
storage and launches none; allocations (``empty*``) launch none. Each operator's FLOPs and bytes
are fitted as ``c0 + c1*B + c2*T + c3*T**2 + c4*B*T + c5*B*T**2`` (linear layers and norms grow
with B*T, attention with B*T**2, pooling with B, the position-embedding add and the attention
bias with T alone), exact for every operator of a BERT-class encoder, so the profile predicts
any shape; the grid must hold at least 3 distinct lengths, two batch sizes at 3 of them, and
more points than terms (checked), and each operator's own worst fit error is kept
(``fit_errors``), so one badly fitted operator cannot hide in an aggregate.

A **device profile** (:mod:`tuning.sim.profiles`) gives peak FLOP/s per dtype, bandwidth,
their achievable fractions, the driver's part of one eager launch and of one graph replay, the
minimum kernel time per mode, the SM count and copy bandwidths. The host's part of a launch is not the
device's: it is this host's eager dispatch cost per op (:func:`tuning.sim.dispatch.host_dispatch_s`,
Python and torch's dispatcher for a tiny op, measured once per process), so a slow or busy host launches
slower.

The formula, for one forward at (B, T) in dtype d::

    kernel_i   = min_kernel_s[mode] + max(compute_i, memory_i)
                 (the floor is each kernel's fixed cost, its launch latency, prologue and tail, paid on top of its
                 work: a max() hid one of the two where they are alike, so fitted on small shapes it read the
                 larger ones 1.29-1.41x slow, bench/results/whatif_holdout.json's shape split)
    compute_i  = flops_i / (peak_flops[d] * eff_i)
    eff_i      = gemm_efficiency[d] * wave_i * K_i / (K_i + gemm_k_half)    (a GEMM with dims batch, M, N, K
                 (fused attention: K = the keys it streams, at least the head size, since its main loop runs over
                 key blocks, not over the head size);
                 flops_efficiency where the profile has no sm_count, or the op's dims were not recorded)
    wave_i     = useful tiles / (waves * sm_count): tiles of tm x tn (tn 128 in bf16/fp16, 64 in fp32/tf32;
                 tm the smallest of 16, 32, 64, 128 that holds M, as cuBLAS picks small-M kernels),
                 tiles = batch * ceil(M/tm) * ceil(N/tn) * splits, splits = min(sm_count // tiles, K // 128)
                 (>= 1: split-K when the tiles do not fill the card), waves = ceil(tiles / sm_count),
                 useful = batch * M * N * splits / (tm * tn)
    memory_i   = bytes_i(d) / (mem_bandwidth * bandwidth_efficiency)
                 (a small kernel's DRAM latency is in its floor; the profile's bandwidth_half_bytes is not added)
    min_kernel_s[mode] = min_kernel_s (eager, compile) or graph_min_kernel_s (cuda_graph, compile_graph)
    device_s   = sum_i kernel_i + attention calls x attention_extra_kernels x min_kernel_s[mode]
                 (the kernel sum: what a profiler's kernel times add up to; device busy = kernel sum / wall)
    launch     = dispatch + launch_s       (dispatch: this host's per-op dispatch, measured, or the
                 ``host_dispatch_s`` given; launch_s: the driver's cudaLaunchKernel, from the profile)
    replay     = dispatch + graph_replay_s (one Python call into the driver's cudaGraphLaunch)
    host_s     = launches * launch     (eager: every kernel; compile: fused kernels)
    host_s     = replay + copies * launch      (cuda_graph, as CudaGraphRunner runs a call:
                 2 input copies into the static buffers, 3 padding writes when the batch has fewer
                 rows than the captured size, the replay, then a clone of the output rows; each
                 copy is a bandwidth-bound kernel that the device runs too; compile_graph: the replay alone)
    dispatch_s = the dispatch part of host_s (launches * dispatch); host_s - dispatch_s is the driver's
                 (a profile with ``host_dispatch_separate`` false, a format-1 file, has launch_s and
                 graph_replay_s as whole host costs: dispatch is 0 for it)
    call_s     = end of the last kernel, where kernel i starts at max(its launch, end of kernel i-1)
                 (an asynchronous device: about max(host_s, device_s) plus the start-up lag);
                 synchronous devices (a CPU) run launch then kernel in series: host_s + device_s
    copy_s     = copy_latency_s + input bytes / (h2d_pinned_bps or h2d_pageable_bps)

GEMMs are the operators named mm, addmm, bmm, baddbmm, matmul, linear or scaled_dot_product_*
(:data:`GEMM_OPS`); the recorder keeps their (batch, M, N, K) per grid point, fitted over the same basis
(M = B*T for a linear layer, N and K fixed; attention: batch = B*heads, M = N = T). A profile made
before dims were recorded (no ``gemm_dims``) loads and runs its GEMMs at the asymptotic fraction.
Every constant's source is in the device profile's ``sources``.

``compile`` (``compile_graph``: compile with mode='reduce-overhead', fused kernels replayed as one
graph) fuses each run of operators without FLOPs between two FLOP-heavy operators into
one kernel whose traffic is the largest of the run's (inductor's pointwise/reduction fusion;
matmuls and attention stay extern kernels). ``cuda_graph`` keeps the kernels and replaces
their launches by one replay plus the runner's per-call copies. bytes_i(d) scales floating-point
traffic by the dtype's size; an operator that launches only in half precision (``.float()``,
a no-op on fp32 tensors) launches under bf16 and fp16 (``half_launches``); ``tf32`` is fp32
storage with matmuls at the profile's TF32 rate (fp32's where the profile gives none).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from tuning.sim.dispatch import host_dispatch_s as measured_dispatch_s
from tuning.sim.profiles import DeviceProfile

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}  # tf32: fp32 storage, matmuls on TF32 tensor cores
FEATURES = ("1", "B", "T", "T^2", "B*T", "B*T^2")
CUDA_CONTEXT_BYTES = 0.5e9  # CUDA context, cuBLAS workspaces: typically 0.3-0.6 GB before the first tensor
# 9 points for 6 terms: 5 distinct lengths (3 needed by 1, T, T^2), two batch sizes at 4 of them (3 needed by
# B, B*T, B*T^2), so every term is determined and 3 degrees of freedom are left to check the fit
DEFAULT_GRID = ((1, 8), (2, 8), (1, 16), (2, 16), (1, 32), (4, 32), (1, 64), (3, 48), (2, 64))
GEMM_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
            "aten._scaled_dot_product", "aten.scaled_dot_product")
TOKEN_BYTES = 8  # int64 input ids and attention mask, as the tokenizer hands them to the model
OUTPUT_BYTES = 4  # the embedded model returns fp32 embeddings (``pooled.float()``) in every dtype


def features(batch: int | np.ndarray, length: int | np.ndarray) -> np.ndarray:
    """The fit basis :data:`FEATURES` at (batch, length): ``[1, B, T, T^2, B*T, B*T^2]`` along the last axis."""
    b, t = np.asarray(batch, dtype=float), np.asarray(length, dtype=float)
    return np.stack([np.ones_like(b), b, t, t * t, b * t, b * t * t], axis=-1)


def check_grid(grid: Sequence[tuple[int, int]]) -> None:
    """Refuse a grid on which the least squares over :data:`FEATURES` is not well determined (with a fix)."""
    lengths = sorted({t for _, t in grid})
    paired = [t for t in lengths if len({b for b, tt in grid if tt == t}) >= 2]
    x = features(*np.asarray(grid, dtype=float).T) if grid else np.zeros((0, len(FEATURES)))
    scaled = x / np.maximum(np.abs(x).max(axis=0), 1.0) if len(x) else x
    if (len(lengths) < 3 or len(paired) < 3 or len(grid) <= len(FEATURES)
            or np.linalg.matrix_rank(scaled) < len(FEATURES)):
        raise ValueError(f"grid {list(grid)} cannot determine the fit basis {FEATURES}: it needs at least 3 "
                         f"distinct lengths (has {len(lengths)}), two batch sizes at 3 of them (has {len(paired)}) and "
                         f"more than {len(FEATURES)} points (has {len(grid)}); use DEFAULT_GRID")


@dataclass
class ModelProfile:
    """Per operator of one forward: name, whether it launches a kernel, fitted FLOPs and bytes."""

    name: str
    ops: list[str]
    launches: list[bool]
    flops: list[list[float]]  # per op, coefficients over FEATURES (4 in profiles made before T, T^2 joined)
    float_bytes: list[list[float]]  # floating-point traffic at fp32, per op
    other_bytes: list[list[float]]  # integer/bool traffic (ids, masks), per op
    param_bytes_fp32: float
    output_dim: int
    grid: list[list[int]] = field(default_factory=list)
    fit_error: float = 0.0  # worst relative error of the fit on its own grid, over every operator
    source: str = ""
    fit_errors: list[float] = field(default_factory=list)  # per op: its worst relative error on the grid
    # per op: launches in half precision (bf16/fp16) though not in fp32: a cast to float32 such as the embedded
    # model's ``pooled.float()``, a no-op on fp32 tensors (empty: not measured)
    half_launches: list[bool] = field(default_factory=list)
    # per op: [] (not a GEMM) or coefficients over FEATURES of its (batch, M, N, K); empty: not recorded
    gemm_dims: list[list[list[float]]] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        """Kernels one eager forward launches."""
        return int(sum(self.launches))

    @property
    def worst_fit_op(self) -> str | None:
        """The operator whose fit is worst (None for a profile without per-op errors)."""
        if not self.fit_errors:
            return None
        return self.ops[int(np.argmax(self.fit_errors))]

    def _features(self, batch: int, length: int) -> np.ndarray:
        x = features(batch, length)
        width = len(np.asarray(self.flops[0])) if self.flops else len(FEATURES)
        if width == 4:  # a profile fitted over the four-term basis (1, B, B*T, B*T^2): those columns of the six
            return x[..., [0, 1, 4, 5]]
        return x

    def per_op(self, batch: int, length: int, dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flops, bytes, launches) per operator at one shape and dtype."""
        x = self._features(batch, length)
        flops = np.maximum(np.asarray(self.flops) @ x, 0.0)
        scale = DTYPE_BYTES[dtype] / 4
        nbytes = np.maximum(np.asarray(self.float_bytes) @ x, 0.0) * scale + np.maximum(np.asarray(self.other_bytes) @ x, 0.0)
        launches = np.asarray(self.launches, dtype=bool)
        if dtype in ("bf16", "fp16") and len(self.half_launches) == len(launches):
            launches = launches | np.asarray(self.half_launches, dtype=bool)
        return flops, nbytes, launches

    def gemm_shapes(self, batch: int, length: int) -> np.ndarray:
        """Per operator its GEMM (batch, M, N, K) at one shape; NaN rows for other operators (and for every
        operator of a profile that did not record dims)."""
        out = np.full((len(self.ops), 4), np.nan)
        if len(self.gemm_dims) != len(self.ops):
            return out
        x = features(batch, length)
        for i, dims in enumerate(self.gemm_dims):
            if dims:
                out[i] = np.maximum(np.rint(np.asarray(dims) @ x), 1.0)
                if is_attention(self.ops[i]):  # fused attention loops over the keys: they amortise its prologue
                    out[i, 3] = max(out[i, 3], out[i, 2])
        return out

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
        self.dims: list[tuple[float, float, float, float] | None] = []  # per op: GEMM (batch, M, N, K)

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
        launches = launches_kernel(func, inputs, outputs)
        if "embedding" in str(func):  # a gather reads only the rows it looks up, not the whole table
            inputs = [t for t in inputs if not t.is_floating_point()] + outputs
        fbytes = sum(_nbytes(t) for t in inputs + outputs if t.is_floating_point())
        obytes = sum(_nbytes(t) for t in inputs + outputs if not t.is_floating_point())
        self.ops.append((str(func), launches, flops, float(fbytes), float(obytes)))
        self.dims.append(gemm_dims(str(func), args) if flops > 0 else None)
        return out


def is_gemm(name: str) -> bool:
    """Whether an aten operator's name is one of :data:`GEMM_OPS` (matmul-like: its FLOPs run on the GEMM units)."""
    return any(name == g or name.startswith(g + ".") or (g.endswith("dot_product") and name.startswith(g))
               for g in GEMM_OPS)


def is_attention(name: str) -> bool:
    """Whether an aten operator is fused attention (scaled_dot_product_*): what a card's attention backend runs."""
    return "scaled_dot_product" in name


def gemm_dims(name: str, args: Sequence[Any]) -> tuple[float, float, float, float] | None:
    """(batch, M, N, K) of a GEMM operator from its arguments, None for another operator (or shapes it cannot
    read). mm/addmm/bmm/baddbmm/matmul/linear as their schemas order them; attention: batch = B*heads, M = the
    queries, N = the keys, K = the head size (its second GEMM, P V, has the same work: N and K swapped)."""
    if not is_gemm(name):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if "dot_product" in name:
            q, k = tensors[0], tensors[1]
            return float(np.prod(q.shape[:-2])), float(q.shape[-2]), float(k.shape[-2]), float(q.shape[-1])
        if name.startswith(("aten.addmm", "aten.baddbmm")):
            a, b = tensors[1], tensors[2]
        elif name.startswith("aten.linear"):
            a, w = tensors[0], tensors[1]
            return 1.0, float(np.prod(a.shape[:-1])), float(w.shape[0]), float(a.shape[-1])
        else:
            a, b = tensors[0], tensors[1]
        if a.dim() == 2 and b.dim() == 2:
            return 1.0, float(a.shape[0]), float(b.shape[1]), float(a.shape[1])
        return float(np.prod(a.shape[:-2])), float(a.shape[-2]), float(b.shape[-1]), float(a.shape[-1])
    except (IndexError, AttributeError):
        return None


def writes_in_place(func) -> bool:
    """Whether an operator writes into one of its arguments' memory (in place, ``out=``): its schema marks
    that argument ``Tensor(a!)``. Metadata-only in-place operators (``transpose_``, ``resize_``, ``set_``...,
    tagged ``inplace_view``) change a tensor's shape or storage pointer, not its data, and write nothing."""
    schema = getattr(func, "_schema", None)
    if schema is None or torch.Tag.inplace_view in getattr(func, "tags", ()):
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def launches_kernel(func, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> bool:
    """Whether one dispatched operator launches a device kernel.

    In place or ``out=`` (the schema's ``Tensor(a!)``): it writes memory, so it launches (unless it writes
    nothing: empty outputs, or a metadata-only ``inplace_view`` operator). Otherwise it launches when one of its
    outputs is new storage: ``func.is_view`` only says an operator *may* alias (``to``, ``contiguous``,
    ``reshape`` are marked so and copy when they must), so the storages decide. An operator all of whose
    outputs are its inputs' storage (a pure view, a no-op cast) launches none; nor does an allocation
    (``empty``, ``empty_like``, ``new_empty``, ``empty_strided``: memory, no kernel)."""
    name = str(func)
    if not any(t.numel() for t in outputs):
        return False
    if torch.Tag.inplace_view in getattr(func, "tags", ()):
        return False
    if writes_in_place(func):
        return True
    if "empty" in name.split(".")[1]:
        return False
    in_storages = {_storage(t) for t in inputs}
    return any(_storage(t) not in in_storages for t in outputs)


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


def record_ops(model: torch.nn.Module, batch: int, length: int, vocab: int = 1000,
               dims: list | None = None) -> list[tuple[str, bool, float, float, float]]:
    """Every aten op of one fp32 forward at (batch, length): (name, launches, flops, float bytes, other bytes);
    ``dims``: a list that receives each op's GEMM (batch, M, N, K) or None."""
    ids = torch.full((batch, length), min(1000, vocab - 1), dtype=torch.long)
    mask = torch.ones_like(ids)
    recorder = _OpRecorder()
    with torch.inference_mode(), recorder:
        model(ids, mask)
    if dims is not None:
        dims.extend(recorder.dims)
    return recorder.ops


def measure_model_profile(model: torch.nn.Module, name: str = "model",
                          grid: Sequence[tuple[int, int]] = DEFAULT_GRID) -> ModelProfile:
    """Measure a model profile on this machine (fp32, CPU is fine: counts, FLOPs and bytes do not depend on it).

    ``grid``: the (batch, length) shapes recorded; :func:`check_grid` refuses one that cannot determine the
    fit. The profile keeps each operator's worst relative fit error on the grid (``fit_errors``) and the worst
    of them (``fit_error``, the operator: ``worst_fit_op``)."""
    check_grid(grid)
    model = model.float().cpu().eval()
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    vocab = min(tables) if tables else 1001  # a token id every embedding table holds
    dim_runs: list[list] = [[] for _ in grid]
    runs = [record_ops(model, b, t, vocab, dims=d) for (b, t), d in zip(grid, dim_runs)]
    names = [op[0] for op in runs[0]]
    for (b, t), run in zip(grid, runs):
        if [op[0] for op in run] != names:
            raise ValueError(f"model {name!r} runs a different operator sequence at batch={b}, length={t} than at "
                             f"{grid[0]}: the simulated device needs a shape-independent forward (no data-dependent "
                             "control flow); profile it at one shape per bucket instead")
    x = features(*np.asarray(grid, dtype=float).T)
    scale = np.maximum(np.abs(x).max(axis=0), 1.0)  # columns of one magnitude: a well-conditioned solve
    coefs, errors = {}, np.zeros(len(names))
    for col, key in ((2, "flops"), (3, "float_bytes"), (4, "other_bytes")):
        y = np.asarray([[op[col] for op in run] for run in runs])  # shapes x ops
        c, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
        c = np.round(c / scale[:, None], 6)
        fitted = x @ c
        # per operator: its worst error relative to its own largest recorded value (1 B or FLOP at least)
        denom = np.maximum(np.abs(y).max(axis=0), 1.0)
        errors = np.maximum(errors, (np.abs(fitted - y) / denom).max(axis=0))
        coefs[key] = c.T.tolist()
    launches = [bool(any(run[i][1] for run in runs)) for i in range(len(names))]
    gemm = []
    for i in range(len(names)):
        rows = [d[i] for d in dim_runs]
        if any(r is None for r in rows):
            gemm.append([])
            continue
        c, *_ = np.linalg.lstsq(x / scale, np.asarray(rows, dtype=float), rcond=None)
        gemm.append(np.round(c / scale[:, None], 6).T.tolist())  # 4 x FEATURES: batch, M, N, K
    half, half_note = _half_precision_launches(model, names, launches, grid[0], vocab)
    with torch.inference_mode():
        out = model(torch.ones((1, 4), dtype=torch.long), torch.ones((1, 4), dtype=torch.long))
    return ModelProfile(
        name=name, ops=names, launches=launches, flops=coefs["flops"], float_bytes=coefs["float_bytes"],
        other_bytes=coefs["other_bytes"], param_bytes_fp32=float(sum(p.numel() * 4 for p in model.parameters())),
        output_dim=int(out.shape[-1]), grid=[list(g) for g in grid], fit_error=float(errors.max(initial=0.0)),
        fit_errors=[float(e) for e in errors], half_launches=half, gemm_dims=gemm,
        source=f"measured with FlopCounterMode and a dispatch-mode op recorder, torch {torch.__version__}; {half_note}",
    )


def _half_precision_launches(model: torch.nn.Module, names: list[str], launches: list[bool],
                             shape: tuple[int, int], vocab: int) -> tuple[list[bool], str]:
    """Operators that launch only in half precision: one bf16 forward of a copy of the model at ``shape``
    (casts to float32 are no-ops, so free, in the fp32 recording). Empty when bf16 does not run here or runs
    another operator sequence."""
    import copy

    try:
        half = copy.deepcopy(model).to(torch.bfloat16)
        run = record_ops(half, *shape, vocab)
    except Exception as exc:  # an operator without a bf16 CPU kernel: keep the fp32 classification
        return [], f"half-precision launches not measured (bf16 forward failed here: {type(exc).__name__})"
    if [op[0] for op in run] != names:
        return [], "half-precision launches not measured (bf16 runs another operator sequence)"
    extra = [bool(op[1] and not fp32) for op, fp32 in zip(run, launches)]
    return extra, f"{sum(extra)} operator(s) launch only in bf16/fp16 (from one bf16 forward at {tuple(shape)})"


@dataclass(frozen=True)
class CallCost:
    """The predicted cost of one forward call (seconds) on a device."""

    host_s: float  # host CPU time: launches (eager/compile), one replay (+ the runner's copies under cuda_graph)
    device_s: float  # device compute time (sum of kernel times, the runner's copies included)
    call_s: float  # wall time of the call, until the result is ready
    kernels: int  # kernels the device runs (under cuda_graph: the graph's and the runner's copies)
    launches: int  # host launches: kernels (eager/compile), 1 replay (+ the copies under cuda_graph)
    memory_bytes: float
    dispatch_s: float = 0.0  # the part of host_s that is this host's per-op dispatch (launches x dispatch)

    @property
    def driver_s(self) -> float:
        """The part of ``host_s`` that is the driver's (the profile's launch and replay constants)."""
        return self.host_s - self.dispatch_s

    @property
    def device_share(self) -> float:
        return self.device_s / self.call_s if self.call_s > 0 else 0.0


def fused_groups(model: ModelProfile, flops: np.ndarray, nbytes: np.ndarray,
                 shapes: np.ndarray | None = None):
    """Kernels after compile-style fusion: FLOP-heavy ops alone, runs of other launching ops fused into one.
    Returns (flops, bytes), and (flops, bytes, GEMM shapes) when ``shapes`` (per op) is given."""
    out_flops, out_bytes, out_shapes = [], [], []
    run_bytes: list[float] = []
    none = np.full(4, np.nan)
    for i, (f, b, launches) in enumerate(zip(flops, nbytes, model.launches)):
        if not launches:
            continue
        if f > 0:
            if run_bytes:
                out_flops.append(0.0), out_bytes.append(max(run_bytes)), out_shapes.append(none)
                run_bytes = []
            out_flops.append(f), out_bytes.append(b)
            out_shapes.append(shapes[i] if shapes is not None else none)
        else:
            run_bytes.append(b)
    if run_bytes:
        out_flops.append(0.0), out_bytes.append(max(run_bytes)), out_shapes.append(none)
    if shapes is None:
        return np.asarray(out_flops), np.asarray(out_bytes)
    return np.asarray(out_flops), np.asarray(out_bytes), np.asarray(out_shapes).reshape(-1, 4)


def gemm_efficiency(device: DeviceProfile, dtype: str, shape: Sequence[float]) -> float:
    """Achievable fraction of ``dtype``'s peak for one GEMM of (batch, M, N, K), per the module docstring: the
    dtype's asymptotic fraction x the share of the card's SMs that do useful work over the waves x a K factor.
    The flat ``flops_efficiency`` where the profile has no ``sm_count`` or per-dtype fraction, or the shape is
    unknown (NaN)."""
    base = device.gemm_efficiency.get(dtype, device.gemm_efficiency.get("fp32" if dtype == "tf32" else dtype))
    if base is None or not device.sm_count:
        return device.flops_efficiency
    batch, m, n, k = (float(v) for v in shape)
    if not np.isfinite([batch, m, n, k]).all():
        return float(base)
    sms = int(device.sm_count)
    tn = 128 if dtype in ("bf16", "fp16") else 64
    tm = next((t for t in (16, 32, 64) if m <= t), 128)
    tiles_mn = batch * math.ceil(m / tm) * math.ceil(n / tn)
    splits = max(1, min(sms // max(int(tiles_mn), 1), int(k // 128)))
    tiles = tiles_mn * splits
    waves = math.ceil(tiles / sms)
    wave = batch * m * n * splits / (tm * tn) / (waves * sms)
    return float(base) * min(wave, 1.0) * k / (k + device.gemm_k_half)


def kernel_seconds(device: DeviceProfile, flops: np.ndarray, nbytes: np.ndarray, dtype: str,
                   shapes: np.ndarray | None = None, graph: str = "eager") -> np.ndarray:
    """Each kernel's device time (seconds) per the module docstring's formula."""
    flops, nbytes = np.asarray(flops, dtype=float), np.asarray(nbytes, dtype=float)
    if shapes is None:
        shapes = np.full((len(flops), 4), np.nan)
    peak = device.flops_for(dtype)
    eff = np.asarray([gemm_efficiency(device, dtype, s) if f > 0 else 1.0 for f, s in zip(flops, shapes)])
    bandwidth = device.mem_bandwidth * device.bandwidth_efficiency
    floor = device.min_kernel_for(graph)
    return floor + np.maximum(flops / (peak * eff), nbytes / bandwidth)


def copy_kernel_seconds(device: DeviceProfile, nbytes: float) -> float:
    """One small copy kernel (the graph runner's input copies, padding writes, output clone): launched from the
    host outside the graph, so with the eager floor."""
    bandwidth = device.mem_bandwidth * device.bandwidth_efficiency
    return device.min_kernel_s + nbytes / bandwidth


def graph_call_copies(model: ModelProfile, batch: int, length: int, rows: int | None = None) -> tuple[list[float], list[float]]:
    """Bytes each small copy kernel of one :class:`~tuning.runtime.graphs.CudaGraphRunner` call moves (read plus
    write), as (before the replay, after it). Before: the input ids and the mask copied into the captured
    buffers (``rows`` x ``length`` int64 each) and, when ``rows`` < ``batch`` (a ragged batch), the three
    padding writes (zero the pad rows of both buffers, then set their first mask column). After: the clone of
    the output's ``rows`` rows (fp32: the embedded model returns float32 embeddings)."""
    rows = batch if rows is None else min(int(rows), batch)
    tokens = rows * length * TOKEN_BYTES
    before = [2.0 * tokens, 2.0 * tokens]
    pad = batch - rows
    if pad > 0:
        before += [float(pad * length * TOKEN_BYTES)] * 2 + [float(pad * TOKEN_BYTES)]
    after = [2.0 * rows * model.output_dim * OUTPUT_BYTES]
    return before, after


def async_call_seconds(segments: Sequence[tuple[float, np.ndarray]]) -> float:
    """End of the last kernel of an asynchronous call: ``segments`` are (host time to issue, kernel times it
    issues) in order; a segment's kernels start once it is issued and the device is free, back to back."""
    t = end = 0.0
    for issue_s, kernels in segments:
        t += issue_s
        end = max(end, t) + float(np.sum(kernels))  # issued together: once the first starts, the rest follow
    return end


def launch_costs(device: DeviceProfile, host_dispatch_s: float | None = None) -> tuple[float, float, float]:
    """(dispatch, launch, replay) host seconds per the module docstring: this host's dispatch per op
    (``host_dispatch_s``; None: measured once per process, :func:`tuning.sim.dispatch.host_dispatch_s`; 0 for
    a profile whose constants are whole host costs), one eager launch and one graph replay."""
    if not device.host_dispatch_separate:
        dispatch = 0.0
    elif host_dispatch_s is None:
        dispatch = measured_dispatch_s()
    else:
        dispatch = float(host_dispatch_s)
    return dispatch, dispatch + device.launch_s, dispatch + device.graph_replay_s


def predict(model: ModelProfile, device: DeviceProfile, batch: int, length: int, dtype: str = "fp32",
            graph: str = "eager", rows: int | None = None, host_dispatch_s: float | None = None) -> CallCost:
    """The cost of one forward at (batch, length) per the module docstring's formula.

    ``rows``: under ``cuda_graph``, the rows the caller passed (fewer than ``batch``, the captured size,
    for a ragged batch: the runner pads the rest); None: ``batch``. ``host_dispatch_s``: the host's eager
    dispatch cost per op (seconds); None: this host's, measured once per process (pass a value to predict
    another host, or for determinism)."""
    dispatch, launch_s, replay_s = launch_costs(device, host_dispatch_s)
    flops, nbytes, launches = model.per_op(batch, length, dtype)
    shapes = model.gemm_shapes(batch, length)
    if graph in ("compile", "compile_graph"):
        k_flops, k_bytes, k_shapes = fused_groups(model, flops, nbytes, shapes)
    else:
        k_flops, k_bytes, k_shapes = flops[launches], nbytes[launches], shapes[launches]
    kernels = kernel_seconds(device, k_flops, k_bytes, dtype, k_shapes, graph)
    n_host = len(kernels)  # kernels the host launches (eager, compile) or the graph holds
    extra = int(device.attention_extra_kernels)
    n_extra = extra * sum(1 for op, launched in zip(model.ops, launches) if launched and is_attention(op))
    if n_extra and len(kernels):  # the attention backend's own kernels: device work at the mode's floor, no launch
        floor = device.min_kernel_for(graph)
        kernels = np.array(kernels, dtype=float)
        if graph in ("compile", "compile_graph"):  # fused groups keep no op identity: added to the call's last kernel
            kernels[-1] += n_extra * floor
        else:
            attention = np.asarray([is_attention(op) for op in model.ops], dtype=bool)
            kernels += extra * floor * attention[launches]
    else:
        n_extra = 0
    n = n_host + n_extra
    device_s = float(kernels.sum())
    if graph == "cuda_graph":  # the runner's copies launched from the host around one replay
        before, after = graph_call_copies(model, batch, length, rows)
        pre = [copy_kernel_seconds(device, b) for b in before]
        post = [copy_kernel_seconds(device, b) for b in after]
        copies = len(pre) + len(post)
        host_s, n_launches = replay_s + copies * launch_s, 1 + copies
        device_s += float(sum(pre) + sum(post))
        n += copies
        call_s = async_call_seconds([(launch_s, np.asarray([k])) for k in pre]
                                    + [(replay_s, kernels)]
                                    + [(launch_s, np.asarray([k])) for k in post])
    elif graph == "compile_graph":  # compile with mode='reduce-overhead'
        host_s, n_launches = replay_s, 1
        call_s = host_s + device_s
    else:
        host_s, n_launches = n_host * launch_s, n_host
        if device.synchronous:
            call_s = host_s + device_s
        else:
            call_s = async_call_seconds([(launch_s, np.asarray([k])) for k in kernels])
    # weights, plus the live activations around the largest operator (its inputs and outputs, twice for the
    # next layer's and the allocator's slack), plus the CUDA context on an accelerator
    memory = (model.param_bytes_fp32 * DTYPE_BYTES[dtype] / 4 + 2 * float(nbytes.max(initial=0.0))
              + (0.0 if device.synchronous else CUDA_CONTEXT_BYTES))
    return CallCost(host_s, device_s, call_s, n, n_launches, memory, dispatch_s=n_launches * dispatch)


def copy_seconds(device: DeviceProfile, nbytes: float, pinned: bool) -> float:
    """Host-to-device copy of ``nbytes`` (pinned or pageable host memory)."""
    if nbytes <= 0:
        return 0.0
    bandwidth = device.h2d_pinned_bps if pinned else device.h2d_pageable_bps
    return device.copy_latency_s + nbytes / bandwidth
