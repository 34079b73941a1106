"""The graph runners' refusal messages, one wording for the real runner and the simulated one.

:class:`tuning.runtime.graphs.CudaGraphRunner` and :class:`tuning.sim.standin.SimulatedModel` refuse the same
two things the same way (a shape not captured once the warm-up is sealed, a batch larger than every captured
size), so a run on the simulated device fails with the message a real card would give.
"""

from __future__ import annotations

from typing import Iterable


def uncaptured_shape(key: tuple[int, int], captured: Iterable[tuple[int, int]]) -> str:
    """A (batch, length) first seen after the warm-up was sealed: capturing it would land in the measured window."""
    return (f"shape {key} was not captured during warm-up (captured: {sorted(captured)}); capturing inside the "
            "measured window is refused: warm up every (batch, length) the run will see (Engine.warmup_shapes)")


def batch_too_large(batch: int, sizes: Iterable[int]) -> str:
    """A batch no captured size holds (graphs are captured at fixed batch sizes; rows are padded up, never split)."""
    return f"batch of {batch} is larger than every captured batch size {tuple(sizes)}"
