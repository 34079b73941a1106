"""The screen's factors, declared once: each says which knobs it sets, its high level, and when it does
not apply (``docs/deciding.md``, stage 1). The low level is always the baseline's value. A new factor is
one registered function.

A declaration gets the :class:`Context` (what was measured before the screen: the batch sweep's knee, the
planned buckets, half precision's accuracy) and returns the changes of its high level, or a
:class:`NotApplicable` with the reason, which the report shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tuning.knobs import declared

MIN_COSINE = 0.999  # worst-case cosine of half-precision vs fp32 embeddings under which a dtype is not screened
# the high levels the factors name, checked against the knobs' declarations (tuning.knobs) when imported
FAST = declared("tokenizer", "fast")
BUCKET = declared("padding", "bucket")
HALF = {"cuda": declared("dtype", "fp16", "bf16"), "other": (declared("dtype", "bf16"),)}  # tried in this order
CAPTURE, COMPILE = declared("graph", "cuda_graph", "compile")
ACCELERATED = declared("device", "cuda", "sim")  # where pinned copies and graph capture pay


@dataclass
class Context:
    device: str  # the knob: cpu | cuda | sim
    cores: int  # usable CPU cores
    knee: int | None = None  # the batch sweep's knee at the data's median length
    plan: dict[str, Any] | None = None  # planned buckets: {"buckets": [...], "k": n, "waste": share}
    cosines: dict[str, Any] = field(default_factory=dict)  # dtype -> min cosine (float) or why refused (str)
    workers: int = 4
    workers_min_cores: int = 3
    compile_on_cpu: bool = False
    max_batch: int | None = None  # the closed loop's concurrency caps a useful batch (objective qps)


@dataclass(frozen=True)
class NotApplicable:
    reason: str


@dataclass(frozen=True)
class Factor:
    name: str
    title: str
    high: Callable[[Context], "dict[str, Any] | NotApplicable"]


FACTORS: dict[str, Factor] = {}


def factor(name: str, title: str) -> Callable:
    def register(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
        FACTORS[name] = Factor(name, title, fn)
        return fn
    return register


@factor("workers", "more preprocessing workers")
def _workers(c: Context) -> dict[str, Any] | NotApplicable:
    if c.device == "cpu" and c.cores < c.workers_min_cores:
        return NotApplicable(f"a CPU host with {c.cores} usable cores (fewer than {c.workers_min_cores}): the "
                             "served path's preprocess workers are threads of one process, and torch's intra-op "
                             "threads already use every core")
    changes: dict[str, Any] = {"num_workers": c.workers}
    if c.device in ACCELERATED:
        changes["pin_memory"] = True
    return changes


@factor("batch", "batch size from the sweep's knee")
def _batch(c: Context) -> dict[str, Any] | NotApplicable:
    if not c.knee or c.knee <= 1:
        return NotApplicable("the batch sweep found no batch size that lowers the per-sample cost")
    size = min(c.knee, c.max_batch) if c.max_batch else c.knee
    if size <= 1:
        return NotApplicable(f"the closed loop's concurrency ({c.max_batch}) leaves no batch to fill")
    return {"batch_size": size}


@factor("tokenizer", "batched Rust tokenizer")
def _tokenizer(c: Context) -> dict[str, Any] | NotApplicable:
    return {"tokenizer": FAST}


@factor("buckets", "planned length buckets")
def _buckets(c: Context) -> dict[str, Any] | NotApplicable:
    if not c.plan:
        return NotApplicable("no token lengths to plan buckets from")
    return {"padding": BUCKET, "buckets": tuple(c.plan["buckets"])}


@factor("precision", "half precision")
def _precision(c: Context) -> dict[str, Any] | NotApplicable:
    for dtype in HALF["cuda" if c.device == "cuda" else "other"]:
        cos = c.cosines.get(dtype)
        if isinstance(cos, float) and cos >= MIN_COSINE:
            return {"dtype": dtype}
    why = "; ".join(f"{d}: " + (f"min cosine {v:.5f} < {MIN_COSINE}" if isinstance(v, float) else str(v))
                    for d, v in c.cosines.items()) or "no half precision was checked for accuracy in this run"
    return NotApplicable(f"not recommended: {why}")


@factor("graph", "graph capture")
def _graph(c: Context) -> dict[str, Any] | NotApplicable:
    if c.device in ACCELERATED:
        if not c.plan:  # capture needs fixed shapes
            return NotApplicable("capture needs fixed shapes and there are no token lengths to plan buckets from")
        return {"graph": CAPTURE, "padding": BUCKET, "buckets": tuple(c.plan["buckets"])}
    if not c.compile_on_cpu:
        return NotApplicable("torch.compile costs tens of seconds per shape on a CPU: screened only when asked "
                             "(investigate --compile-on-cpu)")
    return {"graph": COMPILE}


def screened(context: Context, names: tuple[str, ...] | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``({factor: high-level changes}, {factor: why not screened})`` for the factors ``names`` (all: None)."""
    on: dict[str, dict[str, Any]] = {}
    off: dict[str, str] = {}
    for name in names or tuple(FACTORS):
        got = FACTORS[name].high(context)
        if isinstance(got, NotApplicable):
            off[name] = got.reason
        else:
            on[name] = got
    return on, off


def apply_levels(base: Any, highs: dict[str, dict[str, Any]], levels: dict[str, int]) -> Any:
    """``base`` with every factor at +1 set to its high level (a later factor's changes win a shared knob,
    so graph capture's buckets stand whether or not the buckets factor is high)."""
    changes: dict[str, Any] = {}
    for name, high in highs.items():
        if levels.get(name, -1) > 0:
            changes.update(high)
    return base.replace(**changes) if changes else base
