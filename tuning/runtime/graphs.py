"""Fixed-shape model runners: CUDA-graph capture and replay, and ``torch.compile`` without recompiles.

Capture needs fixed shapes: each (batch size, padded length) is captured once with static
input/output buffers (after warm-up on a side stream), then replayed with the inputs copied
in. All graphs of one runner share one memory pool (they never run at the same time, and
each keeps its own output alive), so capturing several sizes costs about the largest one.
A ragged batch (fewer rows than a captured size) is padded with empty rows to the next
captured batch size and the extra outputs are dropped; the padded rows are real compute,
counted in ``rows_computed``. Without CUDA the knob is refused before we get here (see
``Knobs.resolve``).

``torch.compile`` in its static mode compiles once per input shape: a ragged batch would be
a new shape, compiled inside the measured window (seconds), and past Dynamo's recompile
limit the model silently runs eager. :class:`CompiledRunner` pads rows the same way and
counts every shape compiled after :meth:`seal` (the end of warm-up), with a warning.
Note that default-mode compile still launches every kernel from the host: only
``mode='reduce-overhead'`` (CUDA graphs under compile) removes launch overhead.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from tuning.base.refusals import batch_too_large, uncaptured_shape

_PROFILER_READY = False


def init_profiler_for_graphs() -> None:
    """Start and stop the profiler once before the first capture (a profiler first used after a
    capture can crash or hang when the graph replays under it: pytorch/pytorch#75504)."""
    global _PROFILER_READY
    if not _PROFILER_READY:
        from torch.profiler._utils import _init_for_cuda_graphs

        _init_for_cuda_graphs()
        _PROFILER_READY = True


@dataclass
class _Graph:
    ids: torch.Tensor
    mask: torch.Tensor
    out: torch.Tensor
    replay: Callable[[], None]


def cuda_capture(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ids: torch.Tensor,
                 mask: torch.Tensor, warmup: int = 3, pool=None) -> tuple[torch.Tensor, Callable[[], None]]:
    """Warm ``fn`` up on a side stream, capture it into a CUDA graph; returns (static output, replay).

    ``pool``: a memory pool handle (``torch.cuda.graph_pool_handle()``) shared with other graphs.
    """
    init_profiler_for_graphs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(warmup):
            fn(ids, mask)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
        out = fn(ids, mask)
    return out, graph.replay


def fitting_size(rows: int, batch_sizes: tuple[int, ...] | None) -> int | None:
    """The smallest of ``batch_sizes`` that holds ``rows`` (``rows`` itself without sizes; None when none fits)."""
    if not batch_sizes:
        return rows
    fitting = [b for b in batch_sizes if b >= rows]
    return fitting[0] if fitting else None


def rows_computed(knobs, rows: int) -> int:
    """Rows the model computes for a batch of ``rows`` under ``knobs``: compiled and captured runners with
    fixed shapes pad a ragged batch up to ``batch_size`` (the pad rows are real compute, and padding)."""
    if knobs.graph in ("compile", "cuda_graph") and knobs.padding != "dynamic" and rows < knobs.batch_size:
        return knobs.batch_size
    return rows


def pad_rows(ids: torch.Tensor, mask: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a batch to ``rows`` rows; padded rows carry one real-looking token so pooling stays finite."""
    extra = rows - ids.shape[0]
    if extra <= 0:
        return ids, mask
    pad_ids = ids.new_zeros((extra, ids.shape[1]))
    pad_mask = mask.new_zeros((extra, mask.shape[1]))
    pad_mask[:, 0] = 1
    return torch.cat([ids, pad_ids]), torch.cat([mask, pad_mask])


class _Sealable:
    """Shape bookkeeping shared by the runners: which shapes exist, which came after warm-up, padded rows."""

    def __init__(self, batch_sizes: Sequence[int] | None):
        self.batch_sizes = tuple(sorted(set(batch_sizes))) if batch_sizes else None
        self.sealed = False
        self.late_shapes: list[tuple[int, int]] = []
        self.rows_requested = 0
        self.rows_computed = 0

    def seal(self) -> None:
        """Warm-up is over: a shape not seen by now is a compile or capture inside the measured window.
        Row counts restart here, so they describe the measured batches only."""
        self.sealed = True
        self.rows_requested = self.rows_computed = 0

    @property
    def padded_rows_share(self) -> float:
        """Rows computed only as padding / rows requested (0: none)."""
        return (self.rows_computed - self.rows_requested) / self.rows_requested if self.rows_requested else 0.0


class CudaGraphRunner(_Sealable):
    """Callable like the model; captures lazily per shape (or eagerly via :meth:`capture`).

    ``batch_sizes`` are the batch sizes to capture (a smaller batch is padded up to the
    nearest); ``capture_fn`` is injectable so the buffer and padding logic can be tested
    without a GPU. After :meth:`seal` a shape not yet captured is refused: capturing inside
    a measured window would time the capture and grow the memory pool mid-run.
    """

    def __init__(self, model: Callable, device: torch.device, batch_sizes: Sequence[int] | None = None,
                 capture_fn: Callable | None = None):
        real = capture_fn is None
        if real:
            if device.type != "cuda":
                raise ValueError(f"graph='cuda_graph' needs a CUDA device, got {device}; use graph='compile' or 'eager'")
            capture_fn = functools.partial(cuda_capture, pool=torch.cuda.graph_pool_handle())
        super().__init__(batch_sizes)
        self._real = real
        self.profiler_ready = True  # every graph captured after the profiler's first use: safe to profile replays
        self.model = model
        self.device = device
        self.capture_fn = capture_fn
        self.graphs: dict[tuple[int, int], _Graph] = {}

    def _capture_size(self, batch: int) -> int:
        size = fitting_size(batch, self.batch_sizes)
        if size is None:
            raise ValueError(batch_too_large(batch, self.batch_sizes))
        return size

    def capture(self, batch: int, length: int) -> _Graph:
        key = (batch, length)
        if key not in self.graphs:
            if self.sealed:
                self.late_shapes.append(key)
                raise ValueError(uncaptured_shape(key, self.graphs))
            if self._real:
                init_profiler_for_graphs()
            self.profiler_ready = self.profiler_ready and _PROFILER_READY
            ids = torch.zeros((batch, length), dtype=torch.long, device=self.device)
            mask = torch.ones((batch, length), dtype=torch.long, device=self.device)
            out, replay = self.capture_fn(self.model, ids, mask)
            self.graphs[key] = _Graph(ids, mask, out, replay)
        return self.graphs[key]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        g = self.capture(self._capture_size(rows), length)
        g.ids[:rows].copy_(input_ids, non_blocking=True)
        g.mask[:rows].copy_(attention_mask, non_blocking=True)
        if rows < g.ids.shape[0]:  # ragged batch: pad rows carry one real-looking token so pooling stays finite
            g.ids[rows:].zero_()
            g.mask[rows:].zero_()
            g.mask[rows:, 0] = 1
        g.replay()
        self.rows_requested += rows
        self.rows_computed += g.ids.shape[0]
        return g.out[:rows].clone()


class CompiledRunner(_Sealable):
    """``torch.compile`` of the model, fed fixed shapes: rows padded up to the nearest of ``batch_sizes``.

    ``dynamic=True`` (for padding='dynamic') compiles shape-generic code and pads nothing.
    ``shapes`` compiled so far and ``recompiles`` (shapes first seen after :meth:`seal`, each one
    a compilation inside the measured window, reported with a ``RuntimeWarning``) are kept.
    ``compile_fn`` is injectable for tests.
    """

    def __init__(self, model: Callable, batch_sizes: Sequence[int] | None = None, dynamic: bool = False,
                 mode: str | None = None, expected_shapes: int = 1, compile_fn: Callable | None = None):
        super().__init__(None if dynamic else batch_sizes)
        import torch._dynamo

        # one compilation per expected shape: allow that many before Dynamo gives up and silently runs eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * expected_shapes + 2)
        self.dynamic = dynamic
        self.mode = mode
        self.fn = (compile_fn or torch.compile)(model, dynamic=dynamic, mode=mode)
        self.shapes: list[tuple[int, int]] = []

    @property
    def recompiles(self) -> int:
        return len(self.late_shapes)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        size = fitting_size(rows, self.batch_sizes) or rows
        ids, mask = pad_rows(input_ids, attention_mask, size)
        key = (size, length)
        if not self.dynamic and key not in self.shapes:
            self.shapes.append(key)
            if self.sealed:
                self.late_shapes.append(key)
                warnings.warn(f"torch.compile compiled a new shape {key} inside the measured window "
                              f"({self.recompiles} after warm-up; "
                              f"warmed: {[s for s in self.shapes if s not in self.late_shapes]}); "
                              "warm up every (batch, length) the run will see", RuntimeWarning, stacklevel=2)
        self.rows_requested += rows
        self.rows_computed += size
        out = self.fn(ids, mask)
        return out[:rows] if size > rows else out
