"""CUDA-graph capture and replay, one graph per (batch size, padded length).

Capture needs fixed shapes: each shape is captured once with static input/output buffers
(after warm-up on a side stream), then replayed with the inputs copied in. A ragged last
batch (fewer rows than a captured size) is padded with empty rows to the next captured
batch size and the extra outputs are dropped. Without CUDA the knob is refused before we
get here (see ``Knobs.resolve``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class _Graph:
    ids: torch.Tensor
    mask: torch.Tensor
    out: torch.Tensor
    replay: Callable[[], None]


def cuda_capture(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ids: torch.Tensor,
                 mask: torch.Tensor, warmup: int = 3) -> tuple[torch.Tensor, Callable[[], None]]:
    """Warm ``fn`` up on a side stream, capture it into a CUDA graph; returns (static output, replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(warmup):
            fn(ids, mask)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        out = fn(ids, mask)
    return out, graph.replay


class CudaGraphRunner:
    """Callable like the model; captures lazily per shape (or eagerly via :meth:`capture`).

    ``batch_sizes`` are the batch sizes to capture (a smaller batch is padded up to the
    nearest); ``capture_fn`` is injectable so the buffer and padding logic can be tested
    without a GPU.
    """

    def __init__(self, model: Callable, device: torch.device, batch_sizes: tuple[int, ...] | None = None,
                 capture_fn: Callable = cuda_capture):
        if device.type != "cuda" and capture_fn is cuda_capture:
            raise ValueError(f"graph='cuda_graph' needs a CUDA device, got {device}; use graph='compile' or 'eager'")
        self.model = model
        self.device = device
        self.batch_sizes = tuple(sorted(batch_sizes)) if batch_sizes else None
        self.capture_fn = capture_fn
        self.graphs: dict[tuple[int, int], _Graph] = {}

    def _capture_size(self, batch: int) -> int:
        if not self.batch_sizes:
            return batch
        fitting = [b for b in self.batch_sizes if b >= batch]
        if not fitting:
            raise ValueError(f"batch of {batch} is larger than every captured batch size {self.batch_sizes}")
        return fitting[0]

    def capture(self, batch: int, length: int) -> _Graph:
        key = (batch, length)
        if key not in self.graphs:
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
        return g.out[:rows].clone()
