"""Profiled runs: the offline pipeline under the :class:`~tuning.profile.Recorder`, with op statistics."""

from __future__ import annotations

from typing import Any

from tuning.knobs import Knobs
from tuning.profile.ops import OpStats
from tuning.profile.recorder import Profile, Recorder


def profile_pipeline(knobs: Knobs, data: Any = None, limit: int | None = None, interval: float = 0.5,
                     with_ops: bool = True, pipeline: Any = None, nvml: Any = None,
                     **run_kwargs: Any) -> Profile:
    """Run the offline pipeline under the :class:`Recorder` (plus op statistics) and diagnose it."""
    from tuning.base.assets import DEFAULT_DATA
    from tuning.offline.pipeline import Pipeline

    pipeline = pipeline or Pipeline(knobs)
    pipeline.warmup()
    # on the simulated device the GPU section comes from its timeline: NVML would only warn that it is absent
    with Recorder(interval, nvml=nvml, gpu=pipeline.engine.sim is None) as rec:
        result = pipeline.run(data if data is not None else DEFAULT_DATA, limit, keep_embeddings=False, **run_kwargs)
    ops = None
    if with_ops and not pipeline.engine.simulated:  # the stand-in launches no operators to count
        ops = _ops_for(pipeline, result)
    return rec.join(result, ops)


def _ops_for(pipeline: Any, result: Any) -> OpStats | None:
    """Op statistics at the run's most common batch shape."""
    from tuning.profile.ops import op_stats

    shapes = [(b.ok, b.padded_length) for b in result.batches if b.ok]
    if not shapes:
        return None
    batch, length = max(set(shapes), key=shapes.count)
    engine = pipeline.engine
    import torch

    runner = engine.runner
    if getattr(runner, "graphs", None) and not getattr(runner, "profiler_ready", False):
        # graphs captured before the profiler's first use can crash or hang when replayed under it
        # (pytorch/pytorch#75504): profile the eager model instead
        runner = engine.model
    ids = torch.full((batch, length), 1000, dtype=torch.long, device=engine.device)
    return op_stats(runner, ids, torch.ones_like(ids), batches=3)
