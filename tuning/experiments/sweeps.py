"""Experiments one variable at a time: the batch-size sweep at fixed shapes, with its knee.

Per batch size: per-batch and per-sample latency (sizes interleaved over rounds, median of
the round medians), memory (CUDA peak reserved, so graph pools count, or process RSS on a
CPU), and an out-of-memory point (cuBLAS allocation failures included) recorded as such
while the sweep goes on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import psutil
import torch

from tuning.base.contract import device_object
from tuning.base.stats import clean
from tuning.knobs import Knobs
from tuning.sim.profiles import load_profile

KNEE_TOLERANCE = 0.05  # "within 5% of the best" and "marginal gain under 5%"


@dataclass
class BatchSweepResult:
    length: int
    device: str
    dtype: str
    graph: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    # what a calibration needs to read the figures right: compile_mode, tf32, the device's name and memory
    setup: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def _ok(self) -> pd.DataFrame:
        frame = self.to_frame()
        return frame[frame.status == "ok"] if len(frame) else frame

    @property
    def knee(self) -> int | None:
        """Smallest batch whose per-sample cost is within 5% of the best measured."""
        ok = self._ok()
        if ok.empty:
            return None
        best = ok.per_sample_ms.min()
        return int(ok[ok.per_sample_ms <= best * (1 + KNEE_TOLERANCE)].batch_size.min())

    @property
    def diminishing(self) -> int | None:
        """First batch after which doubling (the next size) cuts per-sample cost by less than 5%."""
        ok = self._ok().sort_values("batch_size")
        per, sizes = ok.per_sample_ms.to_list(), ok.batch_size.to_list()
        for i in range(len(per) - 1):
            if (per[i] - per[i + 1]) / per[i] < KNEE_TOLERANCE:
                return int(sizes[i])
        return int(sizes[-1]) if sizes else None

    def summary(self) -> dict[str, Any]:
        memory = ("CUDA peak reserved, MB (graph pools and the allocator's cache included)" if self.device == "cuda"
                  else "process RSS, MB")
        if self.device.startswith("simulated "):
            device = load_profile(self.device.split(" ", 1)[1]).info()
        else:
            device = device_object(self.device, self.setup.get("device_name") or self.device, source="measured")
        return {"length": self.length, "device": device, "device_label": self.device, "dtype": self.dtype,
                "graph": self.graph,
                "memory": memory, "knee": self.knee, "diminishing_returns_at": self.diminishing, **self.setup,
                "points": [{k: clean(v) if isinstance(v, float) else v for k, v in r.items()} for r in self.rows]}


def _memory_mb(device: torch.device) -> float:
    """Peak memory of the point: CUDA peak *reserved* (graph pools are reserved, not allocated, so
    cuda_graph rows stay comparable with eager), or the process RSS on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2**20
    return psutil.Process().memory_info().rss / 2**20


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory failure: torch's, or a cuBLAS/cuDNN workspace allocation that failed."""
    from tuning.runtime.engine import is_out_of_memory

    return is_out_of_memory(exc)


def _visit_order(sizes: list[int], rounds: int) -> list[list[int]]:
    """Each round visits every size, ascending then descending (ABBA), so a drift or a slow spell
    lands on all sizes alike instead of on whichever came first."""
    return [sizes if r % 2 == 0 else sizes[::-1] for r in range(rounds)]


def batch_sweep(runner: Callable, device: torch.device, sizes: Sequence[int], length: int = 64,
                repeats: int = 5, warmup: int = 2, dtype: str = "fp32", graph: str = "eager",
                make_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None,
                rounds: int = 5, timer: Callable[[], float] = time.perf_counter) -> BatchSweepResult:
    """Time ``runner`` at each batch size with inputs of ``length`` tokens (real tokens, no padding).

    ``warmup`` untimed calls per size first (compiling or capturing each shape; then a runner with
    ``seal()`` is sealed), then ``rounds`` interleaved rounds: each visits every size (ABBA order),
    runs one untimed call and ``repeats`` timed ones. A size's time is the median over rounds of
    its round medians; ``iqr_ms`` is their spread; ``round_ms`` keeps them. An out-of-memory size
    is recorded as such and left out of later rounds; the sweep goes on.
    """
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"sizes={list(sizes)!r} must be positive integers, e.g. 1,2,4,8,16,32")
    for name, value in (("repeats", repeats), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    make_batch = make_batch or (lambda b, n: (torch.randint(1000, 20000, (b, n), device=device),
                                              torch.ones((b, n), dtype=torch.long, device=device)))
    cuda = device.type == "cuda"
    sizes = sorted(set(sizes))
    result = BatchSweepResult(length, device.type, dtype, graph)
    rows = {s: {"batch_size": s, "length": length} for s in sizes}
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    round_ms: dict[int, list[float]] = {s: [] for s in sizes}
    memory: dict[int, float] = {s: 0.0 for s in sizes}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def fail(size: int, exc: BaseException) -> None:
        batches.pop(size, None)
        if cuda:
            torch.cuda.empty_cache()
        rows[size].update(status="oom", error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)

    def visit(size: int, calls: int, timed: int) -> None:
        """``calls`` untimed then ``timed`` timed calls at ``size``; records memory, and the round median."""
        if cuda:
            if graph == "eager":
                torch.cuda.empty_cache()  # another size's cached blocks are not this size's memory
            torch.cuda.reset_peak_memory_stats(device)
        try:
            if size not in batches:
                batches[size] = make_batch(size, length)
            ids, mask = batches[size]
            times = []
            with torch.inference_mode():
                for i in range(calls + timed):
                    sync()
                    t0 = timer()
                    runner(ids, mask)
                    sync()
                    if i >= calls:
                        times.append((timer() - t0) * 1000)
            memory[size] = max(memory[size], _memory_mb(device))
            if times:
                round_ms[size].append(float(np.median(times)))
        except Exception as exc:
            if not is_oom(exc):
                raise
            fail(size, exc)

    interrupted = None
    try:
        for size in sizes:
            visit(size, warmup, 0)
        if hasattr(runner, "seal"):
            runner.seal()
        for order in _visit_order(sizes, rounds):
            for size in order:
                if rows[size].get("status") != "oom":
                    visit(size, 1, repeats)
    except KeyboardInterrupt as exc:  # Ctrl-C: the sizes with at least one timed round are kept
        interrupted = exc
        sizes = [s for s in sizes if round_ms[s] or rows[s].get("status") == "oom"]
    for size in sizes:
        row = rows[size]
        if row.get("status") == "oom":
            row.update(per_batch_ms=math.nan, per_sample_ms=math.nan, texts_per_s=math.nan, throughput=math.nan,
                       iqr_ms=math.nan,
                       rounds=len(round_ms[size]), round_ms=round_ms[size], memory_mb=memory[size] or math.nan)
        else:
            per_batch = float(np.median(round_ms[size]))
            texts_per_s = size / per_batch * 1000 if per_batch > 0 else math.nan  # the model call's alone
            row.update(status="ok", per_batch_ms=per_batch, per_sample_ms=per_batch / size, texts_per_s=texts_per_s,
                       throughput=texts_per_s,  # deprecated alias (one release): read texts_per_s
                       iqr_ms=float(np.subtract(*np.percentile(round_ms[size], [75, 25]))),
                       rounds=len(round_ms[size]), round_ms=round_ms[size], memory_mb=memory[size])
        result.rows.append(row)
    if interrupted is not None:
        interrupted.partial = result
        raise interrupted
    return result


def run_batch_sweep(knobs, sizes: Sequence[int], length: int = 64, repeats: int = 5, engine=None,
                    rounds: int = 5) -> BatchSweepResult:
    """The batch sweep for a knob set's model, device, dtype and graph mode.

    Under ``compile`` and ``cuda_graph`` every swept size is compiled or captured exactly (its own
    graph, nothing padded up), during the sweep's warm-up, so each row times its own work.
    """
    from tuning.runtime.engine import Engine

    engine = engine or Engine(knobs)
    runner = engine.make_runner(batch_sizes=sizes) if engine.knobs.graph != "eager" else engine.runner
    result = batch_sweep(runner, engine.device, sizes, length, repeats, dtype=engine.knobs.dtype,
                         graph=engine.knobs.graph, rounds=rounds)
    k = engine.knobs
    result.setup = {"compile_mode": k.compile_mode, "tf32": k.tf32, "device_name": engine.device_info.get("name")}
    if engine.device.type == "cuda" and not engine.simulated:
        result.setup["device_memory_bytes"] = torch.cuda.get_device_properties(engine.device).total_memory
    if not engine.simulated:  # the sweeping host's cost per launch: a calibration subtracts it from its launch cost
        from tuning.runtime.engine import sim_host_dispatch

        model = engine.model if isinstance(engine.model, torch.nn.Module) else None
        seconds, source = sim_host_dispatch(model)
        result.setup.update(host_dispatch_s=seconds, host_dispatch_source=source,
                            host_dispatch_kind="model" if "miniature" in source else "tiny op")
    if engine.simulated:  # never a CPU label on the stand-in's figures
        result.device = f"simulated {k.sim_profile}"
        result.setup["device_name"] = f"simulated {k.sim_profile}"
    return result


def model_sweep(knobs: Knobs, sizes: Any = (1, 2, 4, 8), length: int = 64, repeats: int = 5, rounds: int = 5,
                model: Any = None) -> Any:
    """The batch sweep (``python -m tuning sweep batch``) of ``model`` (default: the embedded one) under
    ``knobs``: per batch size, the model call's time at fixed shapes."""
    from tuning.runtime.engine import Engine

    return run_batch_sweep(knobs, list(sizes), length, repeats, engine=Engine(knobs, model), rounds=rounds)


def load_sweep(knobs: Knobs, inputs: Sequence[Any], variable: str, values: Sequence[Any], requests: int = 200,
          concurrency: int | None = None, warmup_requests: int = 16, server_factory: Callable | None = None,
          engine: Any = None) -> pd.DataFrame:
    """Load-test one knob at several values (others fixed); one row per value, ready to chart.

    ``variable`` is ``"concurrency"`` (client side) or a server knob such as ``"max_wait_ms"``.
    The engine (model) is built once and shared by every point.
    """
    from tuning.load.generator import run_load
    from tuning.online.serve import Server
    from tuning.runtime.engine import Engine

    engine = engine or Engine(knobs)
    rows = []
    for value in values:
        point = knobs.replace(**{variable: value}) if variable != "concurrency" else knobs.replace(concurrency=value)
        make = server_factory or (lambda k: Server(k, engine=engine))
        try:
            with make(point) as server:
                result = run_load(server, inputs, concurrency=concurrency or point.concurrency, requests=requests,
                                  warmup_requests=warmup_requests)
        except KeyboardInterrupt as exc:  # Ctrl-C: the points done go up with the interrupt
            exc.partial = pd.DataFrame(rows)
            raise
        s = result.summary()
        rows.append({variable: value, **{k: s[k] for k in ("qps", "p50_ms", "p95_ms", "p99_ms", "ok", "errors",
                                                            "timeouts", "rejected", "model_busy", "mean_batch")}})
    return pd.DataFrame(rows)


def url_concurrency_sweep(url: str, bodies: Sequence[Any], values: Sequence[int], requests: int = 200,
                          warmup_requests: int = 16, api: Any = None) -> pd.DataFrame:
    """``sweep concurrency --url``: a closed-loop load test of a running service at each concurrency in turn
    (one row per value, as :func:`load_sweep`); ``bodies`` are requests already encoded for ``api``
    (:class:`tuning.load.apis.Api`). Model busy and mean batch come from the service's own metrics where it
    exports them (:mod:`tuning.load.scrape`), else they are NaN."""
    from tuning.load.generator import run_load
    from tuning.load.scrape import MetricsProbe, metrics_url

    rows = []
    for value in values:
        probe = MetricsProbe(metrics_url(url))
        try:
            result = run_load(url, bodies, concurrency=int(value), requests=requests, warmup_requests=warmup_requests,
                              busy_probe=probe, api=api)
        except KeyboardInterrupt as exc:
            exc.partial = pd.DataFrame(rows)
            raise
        s = result.summary()
        server = probe.result().values
        rows.append({"concurrency": int(value), **{k: s[k] for k in ("qps", "p50_ms", "p95_ms", "p99_ms", "ok", "errors",
                                                                     "timeouts", "rejected", "model_busy")},
                     "mean_batch": server.get("mean_batch", s.get("mean_batch")),
                     "error_rate": s["error_rate"], "client_cpu": s.get("client_cpu")})
    return pd.DataFrame(rows)
