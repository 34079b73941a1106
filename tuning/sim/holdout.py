"""The what-if held to real cards: fit on some cards' runs, judge on the others (``docs/what-if-validation.md``).

A run is one ``bench/gpu_check.py`` result folder (``gpu_check.json``): forwards timed on one card, eager and
replayed, the profiler's launch budget (kernels per forward and their summed time), and, where the run measured
it, the host's own cost per launched kernel (the model's miniature, ``host_cost``). Runs are grouped by the card
each recorded (NVML's UUID), never by folder: two runs on one card are one card. :func:`split_by_card` puts the
card with the most runs on the fit side and every other card on the judge side, and says so before anything is
fitted.

What is fitted on the fit side (:func:`fit`), in this order, each from the measurement that isolates it:

1. the attention backend's extra kernels per attention call: the profiler's kernel count less the model's;
2. the eager floor per kernel: the profiler's kernel sum of an eager forward at batch 1, where every kernel is at
   its floor, solved for the floor that gives that sum;
3. the in-graph floor: the same from a replayed forward's kernel sum;
4. the bf16 GEMM efficiency: bounded least squares (``scipy.optimize.least_squares``, within (0, 1]) of the
   replayed forwards' wall times in log space.

The host's cost per launch is not fitted here and cannot be held out: it is the profile's ``launch_s`` (set from
the runs whose host measured its own miniature) plus each run's own miniature, which only some runs recorded.
Everything predicted is simulated; the measured figures are the runs'.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tuning.sim.costmodel import ModelProfile, is_attention, predict
from tuning.sim.profiles import DeviceProfile

RUN_GLOB = "gpu_check_*/gpu_check.json"  # every card's runs; each judged on its own card's profile
FLOOR_RANGE_S = (1e-8, 2e-5)  # where a per-kernel floor is searched: well below and above any card's
FIT_ROUNDS = 30  # rounds of floors then GEMM efficiency, each from the other's last value, until they agree


@dataclass
class Run:
    name: str
    data: dict[str, Any] = field(repr=False)
    card: str  # the card's identity as the run recorded it (NVML's name and UUID)
    host_dispatch_s: float | None  # the run's host's miniature per launch (None: the run did not measure it)

    @property
    def machine(self) -> dict[str, Any]:
        env = self.data.get("env", {})
        return {"card": self.card, "torch": env.get("torch"), "cuda": env.get("cuda")}


def card_of(data: dict[str, Any], log: str = "") -> str:
    """The card a run ran on: NVML's device line (name and UUID), else a UUID in its log, else the driver's name."""
    devices = (data.get("nvml") or {}).get("devices") or []
    if devices:
        return str(devices[0])
    for word in log.split():
        if word.startswith("GPU-") or word.startswith("(GPU-"):
            return word.strip("()")
    return str(data.get("env", {}).get("name", "unknown card"))


def load_runs(results: str | Path) -> list[Run]:
    runs = []
    for path in sorted(Path(results).glob(RUN_GLOB)):
        data = json.loads(path.read_text())
        if data.get("env", {}).get("device") != "cuda":  # a CPU or simulated run times no card
            continue
        log = path.parent / "log.txt"
        host = data.get("steps", {}).get("host_cost", {})
        mini = host["rows"][0]["miniature_us"] * 1e-6 if host.get("status") == "ok" and host.get("rows") else None
        runs.append(Run(path.parent.name, data, card_of(data, log.read_text() if log.is_file() else ""), mini))
    return runs


@dataclass
class Split:
    fit: list[Run]
    judge: list[Run]

    def describe(self) -> str:
        def side(runs: list[Run]) -> str:
            cards: dict[str, list[str]] = {}
            for r in runs:
                cards.setdefault(r.card, []).append(r.name)
            return "; ".join(f"{card}: {', '.join(names)}" for card, names in cards.items())
        return f"fit on {side(self.fit)}\njudge on {side(self.judge)}"

    def as_dict(self) -> dict[str, Any]:
        return {"fit": [{"run": r.name, **r.machine} for r in self.fit],
                "judge": [{"run": r.name, **r.machine} for r in self.judge],
                "rule": "runs grouped by the card each recorded (NVML UUID); the card with the most runs fits, "
                        "every other card judges"}


def split_by_card(runs: Sequence[Run]) -> Split:
    cards: dict[str, list[Run]] = {}
    for r in runs:
        cards.setdefault(r.card, []).append(r)
    if len(cards) < 2:
        raise ValueError(f"{len(runs)} run(s) on {len(cards)} card(s): a held-out judgement needs two cards at least")
    fit_card = max(cards, key=lambda c: (len(cards[c]), -min(runs.index(r) for r in cards[c])))
    return Split(cards[fit_card], [r for c, rs in cards.items() if c != fit_card for r in rs])


def card_profile(run: Run, fitted: DeviceProfile | None = None) -> DeviceProfile:
    """The profile a run is predicted with: ``fitted`` where it is of the run's card; the run's card's shipped
    profile with ``fitted``'s chip fit where the two cards share a chip (one chip, one set of efficiencies); else
    the card's shipped profile. ValueError for a card with no shipped profile."""
    from tuning.sim.profiles import CHIP_FIELDS, profile_for_card

    name = run.data.get("env", {}).get("name")
    if fitted is not None and name in fitted.device_names:
        return fitted
    shipped = profile_for_card(name)
    if shipped is None:
        raise ValueError(f"run {run.name}: no shipped profile of its card {name!r}; add one to tuning/sim/devices "
                         "(its device_names holding that name) to judge it")
    if fitted is not None and fitted.chip and fitted.chip == shipped.chip:
        return shipped.replace(**{k: getattr(fitted, k) for k in CHIP_FIELDS},
                               sources={**shipped.sources, **{k: fitted.sources[k] for k in CHIP_FIELDS
                                                               if k in fitted.sources}})
    return shipped


def default_dispatch_s(runs: Sequence[Run]) -> float:
    """For a run whose host did not measure its miniature: the geometric mean of the hosts that did."""
    known = [r.host_dispatch_s for r in runs if r.host_dispatch_s]
    if not known:
        raise ValueError("no run measured its host's miniature (host_cost): the host part cannot be predicted")
    return float(math.exp(statistics.fmean(math.log(x) for x in known)))


def measured_points(run: Run) -> list[dict[str, Any]]:
    """Every forward the run timed, eager and replayed: (mode, batch, length, dtype, ms, source)."""
    d, steps = run.data, run.data.get("steps", {})
    out = [{"mode": r["mode"], "batch": r["batch"], "length": r["length"], "dtype": r["dtype"], "ms": r["median_ms"],
            "source": "rows"}
           for r in d.get("rows", []) if r.get("status") == "ok" and r.get("mode") in ("eager", "cuda_graph")]
    sizes = d.get("env", {}).get("sizes", {})
    for mode in ("eager", "cuda_graph"):
        out += [{"mode": mode, "batch": p["batch_size"], "length": sizes.get("sweep_length", 128),
                 "dtype": d.get("env", {}).get("dtype", "bf16"), "ms": p["per_batch_ms"], "source": f"sweep_{mode}"}
                for p in steps.get(f"sweep_{mode}", {}).get("points", []) if p.get("status", "ok") == "ok"]
    out += [{"mode": "eager", "batch": r["batch"], "length": r["seq_len"], "dtype": r["dtype"], "ms": r["measured_ms"],
             "source": "published_shapes"} for r in steps.get("published_shapes", {}).get("rows", [])]
    seen = {(p["mode"], p["batch"], p["length"], p["dtype"]) for p in out}
    for r in steps.get("host_cost", {}).get("rows", []):
        if ("eager", r["batch"], r["length"], r["dtype"]) not in seen:
            out.append({"mode": "eager", "batch": r["batch"], "length": r["length"], "dtype": r["dtype"],
                        "ms": r["measured_ms"], "source": "host_cost"})
            seen.add(("eager", r["batch"], r["length"], r["dtype"]))
    # the launch budget's wall: its calls back to back with one synchronisation at the end, a pipelined time per
    # call (see pipelined_call_s), not one synchronised call's; timed without the profiler, before its pass
    for mode, b in steps.get("launch_budget", {}).items():
        batch, length = b["batch_shape"]
        if (mode, batch, length, "bf16") not in seen and b.get("wall_ms_per_batch"):
            out.append({"mode": mode, "batch": batch, "length": length, "dtype": "bf16", "ms": b["wall_ms_per_batch"],
                        "source": "launch_budget", "calls": int(b.get("batches", 5))})
    return out


def pipelined_call_s(cost: Any, calls: int) -> float:
    """Time per call of ``calls`` forwards issued back to back and synchronised once (the launch budget's wall):
    the first call's whole time, then each further one at the slower of the host's issue and the device's work
    (the host issues the next call while the device runs this one)."""
    return (cost.call_s + (calls - 1) * max(cost.host_s, cost.device_s)) / calls


def calibration_points(run: Run) -> list:
    """The points ``bench/gpu_check.py`` calibrates from (its rows and sweeps), as :class:`~tuning.sim.calibrate.Point`."""
    from tuning.sim.calibrate import Point

    return [Point(int(p["batch"]), int(p["length"]), p["dtype"], p["mode"], float(p["ms"]))
            for p in measured_points(run) if p["source"] in ("rows", "sweep_eager", "sweep_cuda_graph")]


def measured_graph_saving(run: Run) -> float:
    """1 - replayed / eager wall time at the launch budget's shape, as the run timed them (its rows where it has
    them, else the launch budget's walls, timed without the profiler)."""
    budget = run.data["steps"]["launch_budget"]
    batch, length = budget["eager"]["batch_shape"]
    ms = {p["mode"]: p["ms"] for p in measured_points(run)
          if (p["batch"], p["length"], p["dtype"]) == (batch, length, "bf16") and p["source"] == "rows"}
    if len(ms) < 2:
        ms = {mode: budget[mode]["wall_ms_per_batch"] for mode in ("eager", "cuda_graph")}
    return 1.0 - ms["cuda_graph"] / ms["eager"]


# -- the fit ------------------------------------------------------------------------------------------------------

def _solve_floor(model: ModelProfile, base: DeviceProfile, budget: dict[str, Any], mode: str, dispatch: float) -> float:
    """The floor (eager or in-graph) at which the model's kernel sum at the budget's shape is the profiler's."""
    from scipy.optimize import brentq

    batch, length = budget["batch_shape"]
    target = budget["busy_ms_per_batch"] / 1e3
    key = "graph_min_kernel_s" if mode == "cuda_graph" else "min_kernel_s"

    def gap(floor: float) -> float:
        return predict(model, base.replace(**{key: floor}), batch, length, "bf16", mode,
                       host_dispatch_s=dispatch).device_s - target
    lo, hi = FLOOR_RANGE_S
    if gap(lo) > 0 or gap(hi) < 0:
        raise ValueError(f"no {key} in {FLOOR_RANGE_S} gives the profiler's kernel sum {target * 1e3:.3f} ms")
    return float(brentq(gap, lo, hi, xtol=1e-10))


SHAPE_LIMIT = 2048  # the shape split: fit on batch x length at most this, judge the larger


def in_shape_fit(point: dict[str, Any], limit: int = SHAPE_LIMIT) -> bool:
    """Whether a measured point is on the fit side of the shape split (batch x length at most ``limit``)."""
    return int(point["batch"]) * int(point["length"]) <= limit


def fit(runs: Sequence[Run], base: DeviceProfile | None = None, model: ModelProfile | None = None,
        dispatch_s: float | None = None, keep: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """The figures fitted on ``runs`` (one side of a split), per the module docstring; ``dispatch_s``: the host's
    miniature for a run that did not measure one (None: the geometric mean of the runs that did, over ``runs``);
    ``keep``: which measured points the GEMM efficiency is fitted on (None: all; :func:`in_shape_fit` for the
    shape split; the floors and kernels come from the profiler at batch 1, on the fit side of any shape split)."""
    from scipy.optimize import least_squares

    from tuning.sim import embedded_model_profile

    model = model or embedded_model_profile()
    cards = {r.data.get("env", {}).get("name") for r in runs}
    if base is None and len(cards) != 1:
        raise ValueError(f"the fit runs are of {sorted(map(str, cards))}: fit on one card's runs (a split by card)")
    base = base or card_profile(runs[0])
    default = dispatch_s if dispatch_s is not None else default_dispatch_s(runs)
    # 1. kernels: the profiler's count less the model's, per attention call (the same in every fit run and mode)
    attn = sum(1 for op, launched in zip(model.ops, model.per_op(1, 64, "bf16")[2]) if launched and is_attention(op))
    extras = set()
    zero = base.replace(attention_extra_kernels=0)
    for r in runs:
        for mode, b in r.data["steps"]["launch_budget"].items():
            counted = predict(model, zero, *b["batch_shape"], "bf16", mode, host_dispatch_s=default).kernels
            extras.add((b["kernels_per_batch"] - counted) / max(attn, 1))
    if len(extras) != 1 or min(extras) < 0 or float(min(extras)) != int(min(extras)):
        raise ValueError(f"the fit runs' kernel counts disagree with one whole number per attention call: {extras}")
    extra = int(min(extras))
    profile = base.replace(attention_extra_kernels=extra)
    points = [(p, r.host_dispatch_s or default) for r in runs for p in measured_points(r)
              if p["mode"] == "cuda_graph" and p["dtype"] == "bf16" and (keep is None or keep(p))]

    def residuals(x: np.ndarray, trial_base: DeviceProfile) -> np.ndarray:
        trial = trial_base.replace(gemm_efficiency={**trial_base.gemm_efficiency, "bf16": float(x[0])})
        return np.asarray([math.log(predict(model, trial, p["batch"], p["length"], "bf16", "cuda_graph",
                                            host_dispatch_s=d).call_s * 1e3 / p["ms"]) for p, d in points])

    # 2-4 in turn until they agree: each kernel's floor is paid on top of its work, so the floors solved from the
    # profiler's kernel sums depend on the GEMM efficiency (batch 1's small GEMMs), and the efficiency on the floors
    bf16 = min(max(profile.gemm_efficiency.get("bf16", 0.5), 0.02), 0.99)
    for _ in range(FIT_ROUNDS):
        profile = profile.replace(gemm_efficiency={**profile.gemm_efficiency, "bf16": bf16})
        # 2-3. floors from the profiler's kernel sums (eager first: the graph runner's copies use the eager floor)
        eager = statistics.median(_solve_floor(model, profile, r.data["steps"]["launch_budget"]["eager"], "eager",
                                               r.host_dispatch_s or default) for r in runs)
        profile = profile.replace(min_kernel_s=eager)
        graph = statistics.median(_solve_floor(model, profile, r.data["steps"]["launch_budget"]["cuda_graph"],
                                               "cuda_graph", r.host_dispatch_s or default) for r in runs)
        profile = profile.replace(graph_min_kernel_s=graph)
        # 4. bf16 GEMM efficiency from the replayed forwards (bounded: a share of the datasheet peak)
        solution = least_squares(residuals, [bf16], bounds=([0.01], [1.0]), method="trf", args=(profile,))
        moved, bf16 = abs(float(solution.x[0]) - bf16), float(solution.x[0])
        if moved < 1e-5:
            break
    return {"attention_extra_kernels": extra, "min_kernel_s": float(eager), "graph_min_kernel_s": float(graph),
            "gemm_efficiency_bf16": bf16, "graph_points": len(points), "fit_runs": [r.name for r in runs],
            "fit_cards": sorted({str(r.data.get("env", {}).get("name")) for r in runs}),
            "host_dispatch_s_assumed": {r.name: default for r in runs if not r.host_dispatch_s}}


def refit_profile(base: DeviceProfile, fitted: dict[str, Any]) -> DeviceProfile:
    """``base`` with the fitted figures and sources that name the runs they came from."""
    runs = ", ".join(fitted["fit_runs"])
    cards = sorted({r for r in fitted.get("fit_cards", [])}) or ["one card"]
    where = f"fitted on {runs} ({', '.join(cards)}; bench/whatif_holdout.py, judged on the other cards' runs)"
    sources = dict(base.sources)
    sources["attention_extra_kernels"] = (
        f"{where}: the profiler's kernel count of a forward less the model's, per attention call; the runs' host "
        "calls show one cudaMemsetAsync per cuDNN attention call")
    sources["min_kernel_s"] = (f"{where}: the eager floor at which the model's kernel sum of an eager forward at "
                               "batch 1 equals the profiler's (every kernel there is at its floor)")
    sources["graph_min_kernel_s"] = (f"{where}: the in-graph floor at which the model's kernel sum of a replayed "
                                     "forward at batch 1 equals the profiler's")
    sources["gemm_efficiency"] = (
        f"bf16 {fitted['gemm_efficiency_bf16']:.3f} {where}: bounded least squares (0, 1] of the replayed forwards' "
        "wall times; fp16 taken as bf16's (the same tensor-core rate on the datasheet), not measured; tf32 taken as "
        "bf16's efficiency, so TF32 runs at the bf16 fit times the datasheet's TF32/bf16 peak ratio (no TF32 forward "
        "measured on Hopper); fp32 0.80 an estimate (PyTorch fp32 BERT-base on an A100 reached 0.75 of the fp32 "
        "peak whole-model, issue 25), not fitted on Hopper")
    bf16 = round(fitted["gemm_efficiency_bf16"], 4)
    return base.replace(
        attention_extra_kernels=int(fitted["attention_extra_kernels"]),
        min_kernel_s=round(fitted["min_kernel_s"], 10), graph_min_kernel_s=round(fitted["graph_min_kernel_s"], 10),
        gemm_efficiency={**base.gemm_efficiency, "bf16": bf16, "fp16": bf16, "tf32": bf16}, sources=sources)


def chip_fit(profile: DeviceProfile, chip: str) -> dict[str, Any]:
    """The chip's fit file (``tuning/sim/devices/chips/<chip>.json``) from a profile fitted on one of its cards:
    :data:`~tuning.sim.profiles.CHIP_FIELDS` and their sources, shared by every card of the chip."""
    from tuning.sim.profiles import CHIP_FIELDS

    data = profile.as_dict()
    return {"name": chip,
            "description": (f"The {chip.upper()} chip's fit, shared by every card built on it: efficiencies, per-kernel "
                            "floors and the attention backend's kernels. A card's own file gives what its datasheet "
                            "gives (peaks at its clocks, bandwidth, memory, power)"),
            **{k: data[k] for k in CHIP_FIELDS},
            "sources": {k: profile.sources[k].removesuffix(f" [the {chip} chip's fit]")
                        for k in CHIP_FIELDS if k in profile.sources}}


# -- the judgement ------------------------------------------------------------------------------------------------

def judge(profile: DeviceProfile, runs: Sequence[Run], model: ModelProfile | None = None,
          dispatch_s: float | None = None, keep: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Per measured forward of ``runs`` (those ``keep`` keeps; None: all): predicted (SIMULATED) / measured on the
    run's own card (:func:`card_profile`: ``profile`` on its card and, by its chip fit, on the chip's other cards),
    with the host's miniature each run measured (or ``dispatch_s``; None: the geometric mean over ``runs``' hosts that
    measured one)."""
    from tuning.sim import embedded_model_profile

    model = model or embedded_model_profile()
    default = dispatch_s if dispatch_s is not None else default_dispatch_s(runs)
    rows = []
    for r in runs:
        dispatch = r.host_dispatch_s or default
        card = card_profile(r, profile)
        for p in measured_points(r):
            if keep is not None and not keep(p):
                continue
            cost = predict(model, card, p["batch"], p["length"], p["dtype"], p["mode"], host_dispatch_s=dispatch)
            call_s = pipelined_call_s(cost, p["calls"]) if p.get("calls") else cost.call_s
            rows.append({"run": r.name, "card": r.card, "profile": card.name,
                         **{k: p[k] for k in ("mode", "batch", "length", "dtype", "source")},
                         "measured_ms": round(p["ms"], 4), "predicted_ms": round(call_s * 1e3, 4),
                         "ratio": round(call_s * 1e3 / p["ms"], 4), "host_dispatch_us": round(dispatch * 1e6, 3),
                         "host_dispatch_measured": bool(r.host_dispatch_s)})
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in rows]
    if not ratios:
        return {"n": 0, "median": None, "low": None, "high": None}
    return {"n": len(ratios), "median": round(statistics.median(ratios), 4), "low": round(min(ratios), 4),
            "high": round(max(ratios), 4)}
