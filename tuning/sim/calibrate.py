"""Fit a device profile from batch sweeps measured on a real device.

Input: the JSON of ``python -m tuning sweep batch --json`` (one object per length, dtype and graph
mode; a file may hold one object, a list of them, or one per line). Each ok point gives the
measured milliseconds of one forward at (batch, length, dtype, graph). The fit chooses the
profile's free parameters, effective FLOP/s per dtype, effective bandwidth, launch cost,
minimum kernel time and (with ``cuda_graph`` points) the replay cost, to minimise the squared
log error of :func:`tuning.sim.costmodel.predict` over the points (SciPy's trust-region least
squares in log space from a few starts: the max() in the formula makes shallow local minima). The result is a
``measured`` profile whose efficiencies are 1.0 (the fitted rates are the achieved ones).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from tuning.sim.costmodel import ModelProfile, async_call_seconds, fused_groups, graph_call_copies, is_attention
from tuning.sim.profiles import DEFAULT_PROFILE, HOST_DISPATCH_KINDS, DeviceProfile, load_profile

LAST_DEVICE_MEMORY: float | None = None  # total memory of the device the last sweeps read were measured on
LAST_DEVICE_NAME: str | None = None  # the card's name (as the driver reports it) the last sweeps read were measured on
LAST_HOST_DISPATCH: float | None = None  # the sweeping host's dispatch per op (seconds), where the sweeps recorded it
LAST_HOST_DISPATCH_KIND: str | None = None  # what that dispatch is: "model" (the model's miniature) or "tiny op"
UNKNOWN = "unknown"  # the start of a source that says no shipped profile of this card gives the figure
# a card without a shipped profile: copies at PCIe Gen4 x16 rates (most inference cards), marked unknown
GENERIC_COPIES = {"h2d_pinned_bps": 25e9, "h2d_pageable_bps": 8e9, "copy_latency_s": 10e-6}
GENERIC_MEMORY = 16 * 2**30  # placeholder memory of an unknown card whose sweeps did not record it
UNIDENTIFIED = "unidentified"  # the start of a source that says a figure could not be fitted from the points
NOT_IDENTIFIED = "not identified"  # a source's label for a parameter whose bootstrap interval the points leave wide
BOOTSTRAP_ROUNDS = 24  # resamples of the points per calibration
RESAMPLE_ROUNDS = 60  # function evaluations per parameter for one resample's refit
INTERVAL = (5.0, 95.0)  # the bootstrap interval's percentiles
IDENTIFIED_SPAN = 2.0  # an interval wider than this ratio (high / low) leaves its parameter not identified


@dataclass(frozen=True)
class Point:
    batch: int
    length: int
    dtype: str
    graph: str
    ms: float


def read_sweeps(paths: Sequence[str | Path]) -> tuple[list[Point], str]:
    """Every ok point of the sweep files, and the device kind they were measured on.

    A sweep under ``compile_mode='reduce-overhead'`` counts as ``compile_graph`` (fused kernels replayed
    as one graph) and one with ``tf32`` on as dtype ``tf32``; the device's memory, where a sweep on CUDA
    recorded it, is kept in :data:`LAST_DEVICE_MEMORY`, the card's name in :data:`LAST_DEVICE_NAME` and the sweeping
    host's dispatch per op in :data:`LAST_HOST_DISPATCH`."""
    global LAST_DEVICE_MEMORY, LAST_DEVICE_NAME, LAST_HOST_DISPATCH, LAST_HOST_DISPATCH_KIND
    LAST_DEVICE_MEMORY = LAST_DEVICE_NAME = LAST_HOST_DISPATCH = LAST_HOST_DISPATCH_KIND = None
    points: list[Point] = []
    devices: set[str] = set()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"--from {str(path)!r}: no such file; write one with `python -m tuning sweep batch --json > FILE`")
        text = path.read_text()
        try:
            loaded = json.loads(text)
            sweeps = loaded if isinstance(loaded, list) else [loaded]
        except json.JSONDecodeError:
            try:
                sweeps = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                raise ValueError(f"--from {str(path)!r} is not sweep JSON ({exc}); expected the output of "
                                 "`python -m tuning sweep batch --json`") from None
        for sweep in sweeps:
            if not isinstance(sweep, dict) or "points" not in sweep:
                raise ValueError(f"--from {str(path)!r}: an entry without 'points'; expected `sweep batch --json` output")
            device = sweep.get("device", "unknown")  # the contract's object, or a label (files made before it)
            if isinstance(device, dict):  # the contract's object: its kind is cpu, cuda or simulated
                if device.get("kind") == "cuda" and device.get("name"):
                    LAST_DEVICE_NAME = str(device["name"])
                device = "simulated" if device.get("kind") == "simulated" else str(device.get("kind"))
            devices.add(str(device))
            graph, dtype = str(sweep.get("graph", "eager")), str(sweep.get("dtype", "fp32"))
            if graph == "compile" and sweep.get("compile_mode") == "reduce-overhead":
                graph = "compile_graph"
            if dtype == "fp32" and sweep.get("tf32"):
                dtype = "tf32"
            if sweep.get("device_memory_bytes"):
                LAST_DEVICE_MEMORY = float(sweep["device_memory_bytes"])
            if sweep.get("host_dispatch_s"):
                LAST_HOST_DISPATCH = float(sweep["host_dispatch_s"])
                # a sweep that does not name the kind of its dispatch recorded one tiny op's (the only kind sweeps
                # recorded before they named it)
                LAST_HOST_DISPATCH_KIND = str(sweep.get("host_dispatch_kind") or "tiny op")
            for p in sweep["points"]:
                if p.get("status", "ok") != "ok" or p.get("per_batch_ms") is None:
                    continue
                points.append(Point(int(p["batch_size"]), int(p.get("length", sweep.get("length"))), dtype, graph,
                                    float(p["per_batch_ms"])))
    if len(points) < 4:
        raise ValueError(f"only {len(points)} ok sweep point(s) in {', '.join(map(str, paths))}; calibration needs "
                         "at least 4 over two or more lengths")
    kinds = {d.split(":")[0].replace("simulated ", "") for d in devices}
    if any(d.startswith("simulated") for d in devices):
        raise ValueError("these sweeps were measured on the simulated device; calibrate from a real device's sweep")
    return points, "cpu" if kinds == {"cpu"} else "cuda"


class _Design:
    """Per point, the model's per-kernel FLOPs and bytes, precomputed once; ``attention_extra``: the card's attention
    backend's extra kernels per attention call (from the card's profile: a sweep's wall times cannot count kernels),
    each at the floor as :func:`tuning.sim.costmodel.predict` runs them."""

    def __init__(self, model: ModelProfile, points: Sequence[Point], attention_extra: int = 0):
        self.points = list(points)
        self.kernels = []
        self.extra = []  # per point, per kernel: floors it carries beyond its own (the attention backend's kernels)
        # under cuda_graph, the runner's copies around the replay (sweeps time full batches: no padding)
        self.copies = [graph_call_copies(model, p.batch, p.length) if p.graph == "cuda_graph" else None
                       for p in self.points]
        for p in self.points:
            flops, nbytes, launches = model.per_op(p.batch, p.length, p.dtype)
            attention = np.asarray([is_attention(op) for op in model.ops], dtype=bool)
            if p.graph in ("compile", "compile_graph"):
                kf, kb = fused_groups(model, flops, nbytes)
                extra = np.zeros(len(kf))
                if len(kf):
                    extra[-1] = attention_extra * int((attention & launches).sum())
            else:
                kf, kb = flops[launches], nbytes[launches]
                extra = attention_extra * attention[launches].astype(float)
            self.kernels.append((kf, kb))
            self.extra.append(extra)
        self.measured = np.array([p.ms / 1000 for p in self.points])

    def predict(self, params: dict[str, float], synchronous: bool) -> np.ndarray:
        out = np.empty(len(self.points))
        for i, (p, (f, b)) in enumerate(zip(self.points, self.kernels)):
            k = params["min_kernel_s"] + np.maximum(f / params[f"flops_{p.dtype}"], b / params["bandwidth"])
            k = k + self.extra[i] * params["min_kernel_s"]
            if p.graph == "cuda_graph":  # as costmodel.predict: copies launched around one replay
                before, after = self.copies[i]
                copy = [params["min_kernel_s"] + c / params["bandwidth"] for c in before + after]
                pre, post = copy[:len(before)], copy[len(before):]
                out[i] = async_call_seconds([(params["launch_s"], np.asarray([c])) for c in pre]
                                            + [(params["graph_replay_s"], k)]
                                            + [(params["launch_s"], np.asarray([c])) for c in post])
            elif p.graph == "compile_graph":
                out[i] = params["graph_replay_s"] + k.sum()
            elif synchronous:
                out[i] = len(k) * params["launch_s"] + k.sum()
            else:
                launched = params["launch_s"] * np.arange(1, len(k) + 1)
                # end of the last kernel: kernel i starts at max(launch i, end of kernel i-1)
                out[i] = float(np.max(launched + np.cumsum(k[::-1])[::-1]))
        return out


def _initial_guess(design: _Design, dtypes: Sequence[str]) -> dict[str, float]:
    """Rates from the largest points (compute- or bandwidth-bound there), launch cost from the smallest."""
    order = np.argsort([p.batch * p.length for p in design.points])
    small, large = order[0], order[-1]
    f_small, _ = design.kernels[small]
    f, b = design.kernels[large]
    t_large = design.measured[large]
    guess = {"bandwidth": max(float(b.sum()) / t_large, 1e9), "launch_s": design.measured[small] / max(len(f_small), 1) / 2,
             "min_kernel_s": design.measured[small] / max(len(f_small), 1) / 4, "graph_replay_s": 15e-6}
    for d in dtypes:
        idx = [i for i in order if design.points[i].dtype == d]
        f_d, _ = design.kernels[idx[-1]]
        guess[f"flops_{d}"] = max(float(f_d.sum()) / design.measured[idx[-1]], 1e9)
    return guess


def _bounds(key: str, limits: dict[str, float]) -> tuple[float, float]:
    """A parameter's (lower, upper) bound: rates from 1e3 up to their physical ceiling (``limits``), times within
    (1 ns, 1 s)."""
    if key.startswith(("flops", "bandwidth")):
        return 1e3, limits.get(key, 1e18)
    return 1e-9, 1.0


def fit_parameters(model: ModelProfile, points: Sequence[Point], synchronous: bool,
                   start: dict[str, float] | None = None, rounds: int = 400,
                   limits: dict[str, float] | None = None, attention_extra: int = 0,
                   fixed: dict[str, float] | None = None, one_start: bool = False,
                   design: _Design | None = None) -> tuple[dict[str, float], float]:
    """Least squares in log space within bounds; returns the parameters and the worst relative error.

    ``limits``: the physical ceiling of a parameter (``flops_<dtype>``: the datasheet's dense peak of that dtype,
    ``bandwidth``: the card's memory bandwidth); a fitted rate never exceeds its ceiling (a max() in the formula lets
    an unbounded fit trade an impossible rate for a floor). Times are bounded to (1 ns, 1 s). ``fixed``: parameters
    held at a value, not fitted. ``one_start``: from ``start`` alone (a bootstrap resample near a known optimum)."""
    design = design or _Design(model, points, attention_extra)
    dtypes = sorted({p.dtype for p in points})
    params = _initial_guess(design, dtypes)
    params.update({k: v for k, v in (start or {}).items() if k in params})
    fixed = {k: float(v) for k, v in (fixed or {}).items() if k in params}
    params.update(fixed)
    free = [k for k in params if k != "graph_replay_s" or any(p.graph in ("cuda_graph", "compile_graph") for p in points)]
    if synchronous:
        free = [k for k in free if k != "graph_replay_s"]
    free = [k for k in free if k not in fixed]
    limits = {k: float(v) for k, v in (limits or {}).items() if v and math.isfinite(v)}
    if not free:
        return params, float(np.max(np.abs(design.predict(params, synchronous) / design.measured - 1)))
    lower = np.log([_bounds(k, limits)[0] for k in free])
    upper = np.log([_bounds(k, limits)[1] for k in free])

    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = {**params, **dict(zip(free, np.exp(x)))}
        return np.log(design.predict(trial, synchronous)) - np.log(design.measured)

    inside = 1e-9  # a start strictly inside the bounds (least_squares refuses one on them)
    x0 = np.clip(np.log([params[k] for k in free]), lower + inside, upper - inside)
    best = None
    # a few starts around the guess: max() makes the surface piecewise smooth with shallow local minima. The replay
    # is hidden behind the copies around it in most graph points, so from a start below the truth the fit can slide
    # to no replay at all (synthetic points with a 2.5-20 us host dispatch: worst error 1.7-2.4%, replay 0): it
    # gets starts of its own
    rates = np.array([k.startswith(("flops", "bandwidth")) for k in free], dtype=float)
    replay = np.array([k == "graph_replay_s" for k in free], dtype=float)
    starts = [(s, r) for r in ((0.0, 1.5) if replay.any() else (0.0,)) for s in (0.0, -1.5, 1.5)]
    for shift, replay_shift in (starts[:1] if one_start else starts):
        x = np.clip(x0 + shift * rates + replay_shift * replay, lower + inside, upper - inside)
        fit = least_squares(residuals, x, bounds=(lower, upper), method="trf", x_scale=1.0,
                            max_nfev=rounds * len(free))
        if best is None or fit.cost < best.cost:
            best = fit
    params = {**params, **dict(zip(free, np.exp(best.x)))}
    for k in free:  # exp(log(limit)) may land a rounding above the limit
        if k in limits:
            params[k] = min(params[k], limits[k])
    worst = float(np.max(np.abs(design.predict(params, synchronous) / design.measured - 1)))
    return params, worst


@dataclass(frozen=True)
class Estimate:
    """One fitted parameter with its bootstrap interval over the points (:data:`INTERVAL` percentiles)."""

    value: float
    low: float
    high: float
    at_bound: bool

    @property
    def identified(self) -> bool:
        return not self.at_bound and self.low > 0 and self.high / self.low <= IDENTIFIED_SPAN

    def describe(self, unit: float = 1.0, suffix: str = "", name: str = "") -> str:
        where = f", the fit at a bound ({self.value / unit:.4g}{suffix})" if self.at_bound else ""
        return (f"{name}{INTERVAL[0]:g}-{INTERVAL[1]:g}% bootstrap interval {self.low / unit:.4g}-"
                f"{self.high / unit:.4g}{suffix} over {BOOTSTRAP_ROUNDS} resamples of the points{where}: "
                f"{'identified' if self.identified else NOT_IDENTIFIED}")


def bootstrap(model: ModelProfile, points: Sequence[Point], synchronous: bool, params: dict[str, float],
              limits: dict[str, float], attention_extra: int, fixed: dict[str, float],
              rounds: int = 0, seed: int = 0) -> dict[str, Estimate]:
    """Each free parameter of the fit ``params`` with its interval over ``rounds`` (default
    :data:`BOOTSTRAP_ROUNDS`) refits on points drawn with replacement, each from a start scattered about ``params``,
    and whether the fit put it at a bound (within 2% of it, in ratio)."""
    rng = np.random.default_rng(seed)
    free = [k for k in params if k not in fixed]
    draws: dict[str, list[float]] = {k: [] for k in free}
    points = list(points)
    for _ in range(rounds or BOOTSTRAP_ROUNDS):
        sample = [points[i] for i in rng.integers(0, len(points), len(points))]
        if len({p.dtype for p in sample}) < len({p.dtype for p in points}):
            continue  # a dtype drawn out of the sample cannot be refitted from it
        # from a start scattered about the fit (a factor of e either way, in log space): a direction the points do
        # not constrain stays where the start put it, so it shows as a wide interval instead of the fit's own value
        # (kept only where it fits the resample as well as a refit from the fit itself: a local minimum the scattered
        # start fell into is the optimizer's, not the points')
        design = _Design(model, sample, attention_extra)
        start = {k: v * (math.exp(rng.normal(0.0, 1.0)) if k in free else 1.0) for k, v in params.items()}
        fits = [fit_parameters(model, sample, synchronous, start=s, rounds=RESAMPLE_ROUNDS, limits=limits,
                               attention_extra=attention_extra, fixed=fixed, one_start=True, design=design)[0]
                for s in (start, params)]
        costs = [float(np.sum(np.log(design.predict(f, synchronous) / design.measured) ** 2)) for f in fits]
        refit = fits[0] if costs[0] <= costs[1] * (1 + 1e-3) + 1e-12 else fits[1]
        for k in free:
            draws[k].append(refit[k])
    out = {}
    for k in free:
        lo, hi = _bounds(k, {kk: float(v) for kk, v in limits.items() if v and math.isfinite(v)})
        low, high = (np.percentile(draws[k], INTERVAL) if draws[k] else (math.nan, math.nan))
        at_bound = params[k] <= lo * 1.02 or params[k] >= hi / 1.02
        out[k] = Estimate(float(params[k]), float(low), float(high), bool(at_bound))
    return out


def profiler_floor(launch_budget: dict[str, Any]) -> float | None:
    """The per-kernel floor from a run's profiler: its mean kernel duration in an eager forward at batch 1 (every
    kernel there at its floor; ``bench/gpu_check.py``'s launch budget); None without one."""
    eager = (launch_budget or {}).get("eager") or {}
    if not eager.get("kernels_per_batch") or not eager.get("busy_ms_per_batch") or eager.get("device") == "cpu":
        return None
    return float(eager["busy_ms_per_batch"]) / 1e3 / float(eager["kernels_per_batch"])


def prediction_error(model: ModelProfile, profile: DeviceProfile, points: Sequence[Point],
                     host_dispatch_s: float | None = None) -> float:
    """Worst relative error of a profile's predictions on measured points (e.g. shapes left out of the fit);
    ``host_dispatch_s``: the host's cost per launch the fit subtracted (None: a tiny op's, measured in this process)."""
    from tuning.sim.costmodel import predict

    errors = [abs(predict(model, profile, p.batch, p.length, p.dtype, p.graph, host_dispatch_s=host_dispatch_s).call_s
                  / (p.ms / 1000) - 1) for p in points]
    return float(max(errors)) if errors else math.nan


def _fallback_base(device_name: str | None) -> tuple[DeviceProfile, dict[str, str]]:
    """The figures a CUDA sweep cannot measure (copies, power, memory): from the shipped profile of the same card
    when there is one, else generic copy rates and unknown power, each source saying which."""
    from tuning.sim.profiles import profile_for_card

    card = device_name or "an unnamed card"
    same = profile_for_card(device_name)
    if same is not None:
        return same, {k: f"from {same.name} (the same card, {card}): {same.sources.get(k, 'its figure')}"
                      for k in ("h2d_pinned_bps", "h2d_pageable_bps", "copy_latency_s", "idle_power_w",
                                "max_power_w", "mem_bytes")}
    why = f"{UNKNOWN}: no shipped profile is of {card}"
    generic = load_profile(DEFAULT_PROFILE).replace(
        name="unknown-card", description=f"figures of {card} a sweep cannot measure", mem_bytes=float(GENERIC_MEMORY),
        idle_power_w=math.nan, max_power_w=math.nan, device_names=[], **GENERIC_COPIES)
    sources = {k: f"{why}; a PCIe Gen4 x16 estimate ({v:g}), not measured" for k, v in GENERIC_COPIES.items()}
    sources.update(idle_power_w=f"{why}; not known (NaN)", max_power_w=f"{why}; not known (NaN)",
                   mem_bytes=f"{why} and the sweeps did not record its memory; a {GENERIC_MEMORY / 2**30:.0f} GiB "
                             "placeholder: pass memory_bytes")
    return generic, sources


def calibrate(points: Sequence[Point], model: ModelProfile, device_kind: str, name: str,
              base: str | DeviceProfile | None = None, memory_bytes: float | None = None,
              device_name: str | None = None, host_dispatch_s: float | None = None,
              host_dispatch_kind: str = "tiny op", kernel_floor_s: float | None = None) -> tuple[DeviceProfile, float]:
    """A measured device profile fitted to ``points``, and the fit's worst relative error on them.

    Each fitted parameter gets a bootstrap interval over the points (:func:`bootstrap`), written in its source; one
    whose interval spans more than :data:`IDENTIFIED_SPAN` or that the fit put at a bound is labelled
    :data:`NOT_IDENTIFIED` and keeps its prior (the card's shipped profile: its datasheet rate times its efficiency,
    its floor, launch and replay costs; on a CPU, with no prior, the fitted value stays, labelled), and the others
    are fitted again beside it. ``kernel_floor_s``: the per-kernel floor from the run's profiler
    (:func:`profiler_floor`), held instead of fitted (the wall times of a forward hide it behind launches).

    The fitted host time per launch (and per replay) includes the calibrating host's own dispatch per op;
    the profile keeps the driver's part only, the fitted value minus that dispatch (clamped at 0), so a
    what-if on another host adds its own (:mod:`tuning.sim.costmodel`). ``host_dispatch_s``: the calibrating
    host's cost per launch beside the driver's, of kind ``host_dispatch_kind`` (``model``: the model's own code at
    a miniature size; ``tiny op``: one tiny op's dispatch); None: the one the sweeps recorded
    (:data:`LAST_HOST_DISPATCH`, of its kind), else this host's tiny op, measured now (calibration runs where the
    sweeps ran); ``sources['host_dispatch_s']`` says which, and the profile's ``host_dispatch`` the kind, so a
    what-if adds back the same kind measured on its own host.

    Fields the sweep cannot see (copy bandwidths, power; memory unless ``memory_bytes`` or the sweeps give
    it) come from ``base`` when given; on CUDA otherwise from the shipped profile of the same card
    (``device_name``, the driver's name of the card, matched against the profiles' ``device_names``;
    :func:`calibrate_files` passes the one the sweep files recorded), and without one they are generic
    estimates or NaN, their sources starting :data:`UNKNOWN`; on a CPU copies are free and memory is this
    machine's. On an asynchronous device, eager points alone hide device time behind the host's launches:
    the figures that only graph points reveal (minimum kernel time, bandwidth, replay cost) are then marked
    :data:`UNIDENTIFIED` in ``sources`` (see :func:`unidentified`), not passed off as fitted.
    """
    synchronous = device_kind == "cpu"
    if host_dispatch_kind not in HOST_DISPATCH_KINDS:
        raise ValueError(f"host_dispatch_kind={host_dispatch_kind!r}; allowed: {' | '.join(HOST_DISPATCH_KINDS)}")
    kind = host_dispatch_kind
    if host_dispatch_s is not None:
        dispatch, dispatch_from = float(host_dispatch_s), "given"
    elif LAST_HOST_DISPATCH is not None:
        dispatch, dispatch_from = LAST_HOST_DISPATCH, "recorded by the sweeps on the sweeping host"
        kind = LAST_HOST_DISPATCH_KIND or "tiny op"
    else:
        from tuning.sim.dispatch import host_dispatch_s as measured

        dispatch, dispatch_from, kind = measured(), "measured on the calibrating host (the sweeps recorded none)", "tiny op"
    fallback_sources: dict[str, str] = {}
    if base is None and synchronous:
        import psutil

        base_profile = load_profile(DEFAULT_PROFILE).replace(
            mem_bytes=float(psutil.virtual_memory().total), h2d_pinned_bps=1e15, h2d_pageable_bps=1e15,
            copy_latency_s=0.0, idle_power_w=math.nan, max_power_w=math.nan, device_names=[])
    elif base is None:
        base_profile, fallback_sources = _fallback_base(device_name)
    else:
        base_profile = load_profile(base)
        fallback_sources = {k: f"from {base_profile.name} (given as the base)"
                            for k in ("h2d_pinned_bps", "h2d_pageable_bps", "copy_latency_s", "idle_power_w",
                                      "max_power_w", "mem_bytes")}
    memory_bytes = memory_bytes or (LAST_DEVICE_MEMORY if not synchronous else None)
    if memory_bytes:
        base_profile = base_profile.replace(mem_bytes=float(memory_bytes))
    # the card's datasheet, where a profile of this card says it: every fitted rate stays at or below it
    datasheet = None if synchronous or not base_profile.device_names else base_profile
    limits = ({f"flops_{d}": datasheet.flops_for(d) for d in ("fp32", "tf32", "bf16", "fp16")}
              | {"bandwidth": datasheet.mem_bandwidth}) if datasheet else {}
    extra = int(datasheet.attention_extra_kernels) if datasheet else 0  # a property of this card alone
    fixed = {"min_kernel_s": float(kernel_floor_s)} if kernel_floor_s else {}
    params, worst = fit_parameters(model, points, synchronous, limits=limits, attention_extra=extra, fixed=fixed)
    estimates = bootstrap(model, points, synchronous, params, limits, extra, fixed)
    priors = {} if synchronous else _priors(base_profile, datasheet, dispatch)
    kept = {k: priors[k] for k, e in estimates.items() if not e.identified and k in priors}
    if kept:
        params, worst = fit_parameters(model, points, synchronous, start=params, limits=limits, attention_extra=extra,
                                       fixed={**fixed, **kept})
    measured = sorted({p.dtype for p in points})
    graphs = sorted({p.graph for p in points})
    peak, not_measured = {}, []
    for d in ("fp32", "bf16", "fp16"):
        if params.get(f"flops_{d}") is not None:
            peak[d] = float(params[f"flops_{d}"])
            continue
        not_measured.append(d)
        if d == "fp16" and params.get("flops_bf16") is not None and datasheet is not None \
                and datasheet.flops_for("fp16") == datasheet.flops_for("bf16"):
            peak[d] = float(params["flops_bf16"])  # one tensor-core rate for both on this card's datasheet
        elif datasheet is not None:  # the datasheet estimate of the card: its peak x its estimated efficiency
            eff = datasheet.gemm_efficiency.get(d, datasheet.flops_efficiency)
            peak[d] = datasheet.flops_for(d) * eff
        else:  # no datasheet: a measured dtype's rate stands in, marked unknown
            peak[d] = float(next(params[f"flops_{m}"] for m in measured if f"flops_{m}" in params))
    tf32, tf32_source = _tf32_rate(params, datasheet, synchronous)
    if tf32 is not None:
        peak["tf32"] = tf32
    graph_points = any(g in ("cuda_graph", "compile_graph") for g in graphs)
    hidden = (f"{UNIDENTIFIED}: eager points on an asynchronous device hide device time behind launches; "
              "add sweeps with --set graph=cuda_graph")
    # a base profile with whole host costs (host_dispatch_separate false, a format-1 file) includes its host's dispatch
    # in graph_replay_s: the new profile is marked host_dispatch_separate, so keeping that figure would count a
    # dispatch twice per replay
    kept_replay = (base_profile.graph_replay_s if base_profile.host_dispatch_separate
                   else max(base_profile.graph_replay_s - dispatch, 0.0))
    whole = "" if base_profile.host_dispatch_separate else (
        f", a whole host cost there, less this host's dispatch ({dispatch * 1e6:.2f} us): {kept_replay * 1e6:g} us")
    sources = {
        "peak_flops": _peak_source(measured, not_measured, datasheet, limits) + f"; {tf32_source}",
        "mem_bandwidth": "fitted: achieved bandwidth of operators without FLOPs" if synchronous or graph_points else hidden,
        "launch_s": (f"fitted: host time per launched operator, {params['launch_s'] * 1e6:.2f} us, less the calibrating "
                     f"host's dispatch ({dispatch * 1e6:.2f} us, clamped at 0): the driver's part"),
        "host_dispatch_s": (f"{dispatch * 1e6:.3f} us per launch on the calibrating host ({dispatch_from}; "
                            + ("the model's own code at a miniature size, tuning.sim.dispatch.model_dispatch_s)"
                               if kind == "model" else "one tiny op, tuning.sim.dispatch.host_dispatch_s)")),
        "host_dispatch": f"{kind}: what the fit subtracted, so what a what-if adds back measured on its own host",
        "min_kernel_s": "fitted: floor of one operator's time" if synchronous or graph_points else hidden,
        "graph_replay_s": ("fitted from graph points, less one dispatch of the calibrating host" if graph_points else
                           f"{UNIDENTIFIED}: no graph points; {base_profile.graph_replay_s * 1e6:g} us kept from "
                           f"{base_profile.name}" + ("" if base_profile.device_names else " (a typical estimate)") + whole),
        **fallback_sources,
        "mem_bytes": ("this machine's RAM" if synchronous else "the sweeps' device" if memory_bytes
                      else fallback_sources.get("mem_bytes", "")),
    }
    if kernel_floor_s:
        sources["min_kernel_s"] = (f"from the profiler's kernel durations: the mean kernel of an eager forward at batch "
                                   f"1, {kernel_floor_s * 1e6:.3f} us (held, not fitted)")
    _label_identification(sources, estimates, kept, params, base_profile.name)
    if synchronous:
        sources["other fields"] = "this machine: copies free, power not known"
    profile = base_profile.replace(
        name=name, kind="measured",
        description=(f"fitted to {len(points)} batch-sweep points ({device_kind}, lengths "
                     f"{sorted({p.length for p in points})}, {', '.join(measured)}, {', '.join(graphs)}) on "
                     f"{time.strftime('%Y-%m-%d')}; worst fit error {worst:.1%}"),
        peak_flops=peak, flops_efficiency=1.0, mem_bandwidth=float(params["bandwidth"]), bandwidth_efficiency=1.0,
        launch_s=max(float(params["launch_s"]) - dispatch, 0.0), min_kernel_s=float(params["min_kernel_s"]),
        graph_replay_s=(max(float(params["graph_replay_s"]) - dispatch, 0.0) if graph_points
                        else kept_replay),
        synchronous=synchronous, sources=sources, host_dispatch_separate=True, host_dispatch=kind,
        # the fit's rates are flat (one per dtype, one floor): the shape model of the base profile stays off so that
        # the profile predicts what was fitted
        sm_count=0, gemm_efficiency={}, bandwidth_half_bytes=0.0, graph_min_kernel_s=None,
        attention_extra_kernels=extra, chip="")
    if extra:
        profile.sources["attention_extra_kernels"] = (f"from {base_profile.name} ({extra} a call; a sweep's wall "
                                                      "times cannot count kernels), modelled in the fit")
    for key in ("sm_count", "gemm_efficiency", "gemm_k_half", "bandwidth_half_bytes", "graph_min_kernel_s"):
        profile.sources.pop(key, None)
    return profile, worst


SOURCE_OF = {"bandwidth": "mem_bandwidth", "launch_s": "launch_s", "min_kernel_s": "min_kernel_s",
             "graph_replay_s": "graph_replay_s"}  # a fit parameter -> the profile field whose source describes it
UNITS = {"bandwidth": (1e9, " GB/s"), "launch_s": (1e-6, " us"), "min_kernel_s": (1e-6, " us"),
         "graph_replay_s": (1e-6, " us")}


def _priors(base: DeviceProfile, datasheet: DeviceProfile | None, dispatch: float) -> dict[str, float]:
    """What a parameter the points cannot identify keeps, in the fit's terms: the card's shipped profile (its host
    costs with the calibrating host's dispatch added back, as the fit sees them)."""
    sheet = datasheet or base
    host = dispatch if base.host_dispatch_separate else 0.0
    out = {"bandwidth": base.mem_bandwidth * base.bandwidth_efficiency, "launch_s": base.launch_s + host,
           "graph_replay_s": base.graph_replay_s + host, "min_kernel_s": base.min_kernel_s}
    for d in ("fp32", "tf32", "bf16", "fp16"):
        if d in sheet.peak_flops:
            out[f"flops_{d}"] = sheet.flops_for(d) * sheet.gemm_efficiency.get(d, sheet.flops_efficiency)
    return out


def _label_identification(sources: dict[str, str], estimates: dict[str, Estimate], kept: dict[str, float],
                          params: dict[str, float], base_name: str) -> None:
    """Each fitted parameter's source with its bootstrap interval; one not identified starts :data:`NOT_IDENTIFIED`
    and says what it kept (its prior from ``base_name``, or, with no prior, the fitted value)."""
    flops_notes, flops_weak = [], False
    for key, estimate in estimates.items():
        unit, suffix = UNITS.get(key, (1e12, " TFLOP/s"))
        text = estimate.describe(unit, suffix, f"{key.removeprefix('flops_')}: " if key.startswith("flops_") else "")
        if not estimate.identified:
            keeps = (f"kept the prior {params[key] / unit:.4g}{suffix} from {base_name}" if key in kept
                     else "no prior (a CPU): the fitted value stays")
            text = f"{text}; {keeps}"
        if key.startswith("flops_"):
            flops_notes.append(text)
            flops_weak |= not estimate.identified
            continue
        field_name = SOURCE_OF[key]
        old = sources.get(field_name, "")
        if not estimate.identified and not old.startswith(UNIDENTIFIED):
            sources[field_name] = f"{NOT_IDENTIFIED}: {text}; {old}"
        else:
            sources[field_name] = f"{old}; {text}"
    if flops_notes:
        note = "; ".join(flops_notes)
        sources["peak_flops"] = (f"{NOT_IDENTIFIED}: {note}; {sources['peak_flops']}" if flops_weak
                                 else f"{sources['peak_flops']}; {note}")


def _tf32_rate(params: dict[str, float], datasheet: DeviceProfile | None,
               synchronous: bool) -> tuple[float | None, str]:
    """TF32's rate and where it comes from: measured (sweeps with tf32 on); else the bf16 fit times the datasheet's
    TF32/bf16 peak ratio (both run on the tensor cores, TF32 at a fixed fraction of bf16's rate); else the datasheet
    peak times its estimated efficiency; none on a CPU (torch runs fp32 there) or a card without a datasheet."""
    if "flops_tf32" in params:
        return float(params["flops_tf32"]), "tf32: fitted from sweeps with tf32 on"
    if synchronous:
        return None, "tf32: none (a CPU runs TF32 requests as fp32)"
    if datasheet is None or "tf32" not in datasheet.peak_flops:
        return None, (f"tf32: {UNKNOWN}: not measured and no datasheet TF32 rate of this card; a what-if in tf32 "
                      "needs one (peak_flops['tf32'])")
    if "flops_bf16" in params:
        ratio = datasheet.flops_for("tf32") / datasheet.flops_for("bf16")
        return (float(params["flops_bf16"]) * ratio,
                f"tf32: bf16's fitted rate x the datasheet's TF32/bf16 ratio ({ratio:.3f}, {datasheet.name}), not measured")
    eff = datasheet.gemm_efficiency.get("tf32", datasheet.flops_efficiency)
    return (datasheet.flops_for("tf32") * eff,
            f"tf32: {UNKNOWN}: not measured by these sweeps; {datasheet.name}'s datasheet peak x its estimated "
            "efficiency, not fitted")


def _peak_source(measured: Sequence[str], not_measured: Sequence[str], datasheet: DeviceProfile | None,
                 limits: dict[str, float]) -> str:
    fitted = f"fitted: achieved FLOP/s of {', '.join(measured)}"
    fitted += (f", bounded by {datasheet.name}'s datasheet peaks and bandwidth" if limits
               else " (no datasheet of this card known: not bounded above)")
    parts = [fitted]
    for d in not_measured:
        if datasheet is None:
            parts.append(f"{d}: {UNKNOWN}: not measured and no datasheet of this card: a measured dtype's rate stands "
                         "in, not fitted")
        elif d == "fp16" and "bf16" in measured and datasheet.flops_for("fp16") == datasheet.flops_for("bf16"):
            parts.append("fp16: bf16's fitted rate (one tensor-core peak for both on the datasheet), not measured")
        else:
            parts.append(f"{d}: {UNKNOWN}: not measured by these sweeps; {datasheet.name}'s datasheet peak x its "
                         "estimated efficiency, not fitted")
    return "; ".join(parts)


def calibrate_files(paths: Iterable[str | Path], name: str, model: ModelProfile | None = None,
                    base: str | None = None) -> tuple[DeviceProfile, float, list[Point]]:
    """:func:`calibrate` on sweep files, with the card's name and memory the sweeps recorded."""
    from tuning.sim import embedded_model_profile

    points, kind = read_sweeps(list(paths))
    profile, worst = calibrate(points, model or embedded_model_profile(), kind, name, base,
                               device_name=LAST_DEVICE_NAME)
    return profile, worst, points


def unidentified(profile: DeviceProfile) -> list[str]:
    """The profile's fields that its calibration could not fit or identify (their sources say why)."""
    return [k for k, v in profile.sources.items() if str(v).startswith((UNIDENTIFIED, NOT_IDENTIFIED))]


def describe(profile: DeviceProfile) -> dict[str, Any]:
    """The fitted figures in readable units."""
    return {"name": profile.name, "kind": profile.kind, "synchronous": profile.synchronous,
            **{f"tflops_{d}": round(v / 1e12, 4) for d, v in profile.peak_flops.items()},
            "bandwidth_gb_s": round(profile.mem_bandwidth * profile.bandwidth_efficiency / 1e9, 2),
            "launch_us": round(profile.launch_s * 1e6, 2), "min_kernel_us": round(profile.min_kernel_s * 1e6, 2),
            "graph_replay_us": round(profile.graph_replay_s * 1e6, 2)}


def calibrate_device(sweeps: Any, out: str | Path | None = None, name: str | None = None, model: Any = None,
                     base: str | None = None) -> tuple[Any, float, Path]:
    """Fit a simulated-device profile (``python -m tuning calibrate``) to batch sweeps measured on a real
    device, write it to ``out`` (None: a temporary file) and return ``(profile, worst fit error, path)``;
    use it with ``device='sim', sim_profile=str(path)``.

    ``sweeps``: sweep results or ``sweep batch --json`` files (one per length, dtype and graph mode).
    ``model``: the model the sweeps ran (None: the embedded one); its profile is measured in this process."""
    import json
    import tempfile

    from tuning.sim import embedded_model_profile, model_profile_for

    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="device-profile-")) / "my-device.json"
    items = list(sweeps) if isinstance(sweeps, (list, tuple)) else [sweeps]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, item in enumerate(items):
            if isinstance(item, (str, Path)):
                paths.append(Path(item))
            else:
                paths.append(Path(tmp) / f"sweep{i}.json")
                paths[-1].write_text(json.dumps(item.summary()))
        profile_of_model = embedded_model_profile() if model is None else model_profile_for(model)
        profile, worst, _ = calibrate_files(paths, name or out.stem, model=profile_of_model, base=base)
    profile.to_json(out)
    return profile, worst, out
