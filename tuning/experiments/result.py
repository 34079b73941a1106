"""What ``run_ladder`` returns: the configuration to ship, every stage's figures, every window, and the
state a resume replays. The report, the notebooks and ``summary.json`` read it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tuning.base.format import rounded
from tuning.base.stats import known_median
from tuning.experiments.factors import FACTORS, MIN_COSINE
from tuning.knobs import Knobs, knob_names, preset

# knobs that describe the test or the machine, or that the served path does not read (prefetch_factor is the
# offline DataLoader's), never part of the line to ship
NOT_RECOMMENDED = ("concurrency", "device", "sim_profile", "prefetch_factor")


def changes_of(knobs: Knobs) -> dict[str, Any]:
    """The knobs that differ from the ``baseline`` preset and that the served path reads."""
    base = preset("baseline")
    return {k: getattr(knobs, k) for k in knob_names()
            if k not in NOT_RECOMMENDED and getattr(knobs, k) != getattr(base, k)}


def set_value(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def change_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={set_value(v)}" for k, v in changes.items())


@dataclass
class Step:
    """One row of the decision's table: a screened factor, a line-search move, the confirmation or a target
    check, with what decided it."""

    name: str
    title: str
    change: str
    status: str  # shipped | not shipped | skipped | moved | not moved | confirmed | not confirmed | met | not met
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {"step": self.name, "title": self.title, "change": self.change, "status": self.status,
                "reason": self.reason, **self.figures}


def format_step(step: Step) -> str:
    return f"{step.name:<10} {step.change or '-':<40} {step.status}: {step.reason}"


def _ratio_text(f: dict[str, Any]) -> str:
    r, lo, hi = f.get("ratio"), f.get("low"), f.get("high")
    if r is None:
        return "?"
    span = f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else ""
    return f"x{r:.2f}{span}"


@dataclass
class LadderResult:
    """The decision (:class:`tuning.experiments.engine.Decision`) and what it was made from."""

    baseline: Knobs
    recommended: Knobs
    decision: Any
    settings: Any
    device: dict[str, Any]
    target_p99_ms: float
    windows: list[Any]
    screened: dict[str, dict[str, Any]]
    not_screened: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def objective(self) -> str:
        return self.settings.objective

    @property
    def sweep(self) -> Any:
        return self.extra.get("sweep")

    @property
    def precision(self) -> Any:
        return self.extra.get("precision")

    @property
    def buckets(self) -> dict[str, Any] | None:
        return self.extra.get("buckets")

    @property
    def data(self) -> dict[str, Any]:
        return self.extra.get("data") or {}

    @property
    def baseline_capacity(self) -> Any:
        return self.decision.baseline_capacity if self.decision is not None else None

    @property
    def capacity(self) -> Any:
        return self.decision.capacity if self.decision is not None else None

    @property
    def target_met(self) -> bool:
        if self.objective == "target":
            return self.capacity is not None and self.capacity.met
        p99 = self.final_figures.get("p99_ms")
        return p99 is not None and math.isfinite(p99) and p99 <= self.target_p99_ms

    def _figures_of(self, knobs: Knobs) -> dict[str, Any]:
        key = {k: (list(v) if isinstance(v, tuple) else v) for k, v in changes_of(knobs).items()}
        ws = [w for w in self.windows if w.kind == "throughput" and w.config == key]
        if not ws:
            return {}
        med = lambda k: known_median([getattr(w, k) for w in ws])  # noqa: E731
        return {"qps": med("qps"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"), "model_busy": med("model_busy"),
                "device_busy": med("device_busy"), "mean_batch": med("mean_batch"),
                "errors": sum(w.errors for w in ws), "n": sum(w.n for w in ws), "windows": len(ws)}

    @property
    def baseline_figures(self) -> dict[str, Any]:
        return self._figures_of(self.baseline)

    @property
    def final_figures(self) -> dict[str, Any]:
        return self._figures_of(self.recommended)

    # --- the table --------------------------------------------------------------------------------

    @property
    def steps(self) -> list[Step]:
        rows = [Step(n, FACTORS[n].title, "", "skipped", why) for n, why in self.not_screened.items()]
        d = self.decision
        explored = d.explored if d is not None else None
        if explored is None:
            return rows
        effects = {e["term"]: e for e in explored.tables.get("effects", [])}
        shipped = changes_of(self.recommended)
        for name, high in self.screened.items():
            e = effects.get(name, {})
            on = all(k in shipped for k in high)  # its knobs moved off the baseline
            fig = {"ratio": rounded(e.get("ratio")), "low": rounded(e.get("low")), "high": rounded(e.get("high")),
                   "in_model": e.get("kept")}
            why = (f"main effect {_ratio_text(fig)} on throughput; "
                   + ("in the model" if e.get("kept") else "its interval holds no effect"))
            rows.append(Step(name, FACTORS[name].title, change_text(high), "shipped" if on else "not shipped", why, fig))
        for c in d.confirmations:
            r = c.row()
            rows.append(Step("confirm", "candidate against the baseline", c.label, r["verdict"] == "better" and "confirmed"
                             or "not confirmed", f"{r['verdict']} after {r['pairs']} pairs: {_ratio_text(r)}", r))
        for label, cap in d.checks:
            rows.append(Step("target", "target check", label, "met" if cap.met else "not met", cap.sentence(),
                             {"capacity": rounded(cap.capacity), "throughput": rounded(cap.throughput),
                              "windows": len(cap.judged)}))
        return rows

    def step(self, name: str) -> Step:
        rows = [s for s in self.steps if s.name == name]
        if not rows:
            raise KeyError(f"no step {name!r}; steps: {', '.join(dict.fromkeys(s.name for s in self.steps))}")
        return rows[-1]

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([s.row() for s in self.steps])
        frame.attrs["device"] = self.device
        return frame

    def experiments_frame(self) -> pd.DataFrame:
        """One row per window."""
        rows = []
        for i, w in enumerate(self.windows):
            row = {"window": i, **{k: v for k, v in w.to_dict().items() if k != "config"}}
            row["change"] = change_text(w.config) or "baseline"
            row["share_over"] = rounded(w.over / w.n) if w.kind == "target" and w.n and w.verdict else None
            rows.append(row)
        frame = pd.DataFrame(rows)
        frame.attrs["device"] = self.device
        return frame

    def top(self, n: int = 5) -> pd.DataFrame:
        """The screen's best configurations, by the fitted model's throughput over the baseline's."""
        d = self.decision
        if d is None or d.explored is None:
            return pd.DataFrame()
        rows = [{"rank": i + 1, "change": c.label, "throughput_ratio": rounded(math.exp(c.log_ratio)),
                 "qps": rounded(c.qps)} for i, c in enumerate(d.explored.candidates[:n])]
        return pd.DataFrame(rows)

    def changes(self) -> dict[str, Any]:
        return changes_of(self.recommended)

    def why_unchanged(self) -> str | None:
        """When the baseline is shipped: which stage said no, with its figures (None when a change ships)."""
        d = self.decision
        if d is None or self.changes() or self.interrupted:
            return None
        if d.explored is not None and all(c.log_ratio <= 0 or c.label == "baseline" for c in d.explored.candidates[:1]):
            return "the screen found no factor that raises throughput beyond its noise"
        if d.confirmations and not any(c.confirmed for c in d.confirmations):
            c = d.confirmations[0].row()
            return (f"the winner ({d.confirmations[0].label}) was not confirmed on fresh pairs: {_ratio_text(c)} after "
                    f"{c['pairs']} pairs, under the {100 * self.settings.min_effect:.0f}% effect the test asks for")
        failed = [label for label, cap in d.checks if label != "baseline" and not cap.met]
        if failed:
            return f"the confirmed winner ({failed[0]}) met the target at no rate the baseline did not"
        return None

    def set_line(self) -> str:
        """``--preset baseline --set k=v ...``: paste after ``python -m tuning serve`` (or run/loadtest)."""
        return " ".join(["--preset baseline"] + [f"--set {k}={set_value(v)}" for k, v in self.changes().items()])

    def python_call(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.changes().items())
        return f'tuning.preset("baseline"{", " + args if args else ""})'

    @property
    def state(self) -> dict[str, Any]:
        """What ``resume`` replays: every window's figures, in order."""
        return {"log": [w.to_dict() for w in self.windows], "context": self.extra.get("context"),
                "target_p99_ms": self.target_p99_ms, "settings": self.settings.as_dict(),
                "factors": list(self.extra.get("factors") or [])}

    def summary(self) -> dict[str, Any]:
        base_cap, cap = self.baseline_capacity, self.capacity
        ratio = None
        if self.objective == "target" and base_cap is not None and cap is not None and base_cap.met and cap.met:
            ratio = rounded(cap.capacity / base_cap.capacity)
        elif self.objective == "qps" and self.baseline_figures.get("qps") and self.final_figures.get("qps"):
            ratio = rounded(self.final_figures["qps"] / self.baseline_figures["qps"])
        d = self.decision
        return {
            "device": self.device, "objective": self.objective, "target_p99_ms": self.target_p99_ms,
            "error_budget": self.settings.error_budget, "target_met": self.target_met, "interrupted": self.interrupted,
            "stage": d.stage if d is not None else "explore", "min_cosine": MIN_COSINE,
            "settings": self.settings.as_dict(),
            "baseline": {**_plain(self.baseline_figures), "capacity": base_cap.summary() if base_cap is not None else None},
            "result": {**_plain(self.final_figures), "capacity": cap.summary() if cap is not None else None,
                       "ratio": ratio, "ratio_of": "capacity" if self.objective == "target" else "qps"},
            "why_unchanged": self.why_unchanged(),
            "indeterminate": d.indeterminate if d is not None else None,
            "steps": [s.row() for s in self.steps],
            "screen": (d.explored.tables if d is not None and d.explored is not None else None),
            "confirmations": [c.row() for c in d.confirmations] if d is not None else [],
            "target_checks": [{"configuration": label, **cap.summary()} for label, cap in d.checks] if d else [],
            "top": self.top().to_dict("records"),
            "recommended": {"changes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.changes().items()},
                            "set_line": self.set_line(), "python_call": self.python_call(),
                            "knobs": self.recommended.as_dict()},
            "batch_sweep": self.sweep.summary() if hasattr(self.sweep, "summary") else None,
            "precision": self.precision.summary() if hasattr(self.precision, "summary") else self.precision,
            "buckets": self.buckets, "data": self.data, "state": self.state,
        }


def _plain(f: dict[str, Any]) -> dict[str, Any]:
    return {k: (rounded(v) if isinstance(v, float) else v) for k, v in f.items()}
