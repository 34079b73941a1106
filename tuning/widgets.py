"""The knob panel: sliders and toggles for the pipeline's knobs; changing one reruns a short
measurement and updates a plotly ``FigureWidget`` in place.

    panel = knob_panel(preset("baseline"), limit=200)       # offline replay
    panel = knob_panel(preset("tuned"), mode="online")       # a few seconds of load on a server
    panel                                                    # display it; move a slider
    panel.result, panel.history                              # the last result, every run so far

Sliders use ``continuous_update=False`` (one measurement per release, not per pixel). A knob
combination the pipeline refuses is shown with the reason and not measured; the panel keeps
the last valid knobs. ``measure`` is injectable (any ``knobs -> result`` callable whose result has
``ledger()`` and ``summary()``), so the panel can be driven from Python and tested.
"""

from __future__ import annotations

import html
import time
from typing import Any, Callable, Sequence

import ipywidgets as w
import plotly.graph_objects as go

from tuning import viz
from tuning.knobs import Knobs, knob_specs, knobs_for

# the panel's controls: the declared knobs with ``panel=True`` that apply in each mode (tuning.knobs)
OFFLINE_CONTROLS = knobs_for("offline", panel=True)
ONLINE_CONTROLS = knobs_for("served", panel=True)
_NULL = 0  # a slider cannot hold None: a nullable knob's None sits at 0, which its declared steps never hold
_STYLE = {"description_width": "110px"}


def _with_controls() -> list[str]:
    return [s.name for s in knob_specs().values() if s.kind in ("choice", "bool") or s.steps]


def make_control(name: str, value: Any) -> w.ValueWidget:
    """The widget for one knob, set to ``value``, from its declaration: toggle buttons for its choices, a
    slider over its steps (no update while dragging), a toggle for a bool."""
    spec = knob_specs().get(name)
    if spec is None or name not in _with_controls():
        raise ValueError(f"no control for knob {name!r}; choose from {', '.join(_with_controls())}")
    if spec.kind == "choice":
        return w.ToggleButtons(options=list(spec.choices), value=value, description=name, style=_STYLE)
    if spec.kind == "bool":
        return w.ToggleButton(value=value, description=name)
    options: list[Any] = sorted(set(spec.steps) | ({value} - {None}))
    if spec.nullable:
        options = [(spec.null_label or "none", _NULL)] + [(str(v), v) for v in options]
    return w.SelectionSlider(options=options, value=_shown(name, value), description=name, continuous_update=False,
                             style=_STYLE, layout=w.Layout(width="420px"))


def _shown(name: str, value: Any) -> Any:
    """The control's value for a knob's value (None: the slider's null position)."""
    return _NULL if value is None and knob_specs()[name].nullable else value


def _knob_value(name: str, shown: Any) -> Any:
    """The knob's value for a control's value."""
    spec = knob_specs()[name]
    return None if spec.nullable and spec.steps and shown == _NULL else shown


def _label(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "start"


class KnobPanel(w.VBox):
    """Controls, a status line and a ``FigureWidget``; ``result`` is the last measurement,
    ``history`` one row per run (what changed, throughput, seconds it took)."""

    def __init__(self, knobs: Knobs, measure: Callable[[Knobs], Any], controls: Sequence[str] | None = None,
                 chart: Callable[..., go.Figure] = viz.panel_chart, run: bool = True, device: Any = None):
        self.knobs = knobs
        self.measure = measure
        self.chart = chart
        self.device = device
        self.result: Any = None
        self.history: list[dict[str, Any]] = []
        self.error: str | None = None
        controls = knobs_for("offline", panel=True) if controls is None else controls
        self.controls = {name: make_control(name, getattr(knobs, name)) for name in controls}
        self.status = w.HTML()
        self.figure = go.FigureWidget()
        for name, control in self.controls.items():
            control.observe(self._on_change(name), names="value")
        grid = w.GridBox(list(self.controls.values()), layout=w.Layout(grid_template_columns="repeat(2, 460px)"))
        super().__init__([grid, self.status, self.figure])
        if run:
            self.rerun()

    def _on_change(self, name: str) -> Callable[[dict], None]:
        def handler(change: dict) -> None:
            self.apply(**{name: _knob_value(name, change["new"])})
        return handler

    def set(self, **changes: Any) -> Any:
        """Move controls from Python, as a user would; returns the new result."""
        for name, value in changes.items():
            if name in self.controls:
                widget_value = _shown(name, value)
                if self.controls[name].value == widget_value:
                    self.apply(**{name: value})
                else:
                    self.controls[name].value = widget_value  # the observer measures
            else:
                self.apply(**{name: value})
        return self.result

    def apply(self, **changes: Any) -> Any:
        """Change knobs (validated) and measure; a refused combination is reported, not measured."""
        try:
            knobs = self.knobs.replace(**changes)
        except (ValueError, TypeError) as exc:
            self._say(f"not measured: {exc}", error=True)
            return self.result
        self.knobs = knobs
        return self.rerun(changes)

    def rerun(self, changes: dict[str, Any] | None = None) -> Any:
        """Measure the current knobs and show the result (:meth:`_draw`)."""
        self._say(f"measuring {_label(changes or {})} ...")
        t0 = time.perf_counter()
        try:
            result = self.measure(self.knobs)
        except Exception as exc:  # a refused knob on this machine, an OOM: say it, keep the last result
            self._say(f"not measured: {type(exc).__name__}: {exc}", error=True)
            return self.result
        seconds = time.perf_counter() - t0
        self.result = result
        self.history.append({"label": _label(changes or {}), "throughput": viz.throughput(result),
                             "model_busy": result.summary().get("model_busy"), "seconds": seconds,
                             "knobs": self.knobs})
        self._draw(self.chart(result, self.history, device=self.device))
        self._say(f"run {len(self.history)} ({_label(changes or {})}): {viz.throughput(result):.1f} req/s, "
                  f"measured in {seconds:.1f} s")
        return result

    def _say(self, text: str, error: bool = False) -> None:
        self.error = text if error else None
        color = "#b00020" if error else "#333"
        self.status.value = f'<span style="color:{color}">{html.escape(text)}</span>'

    def _draw(self, fig: go.Figure) -> None:
        """Show ``fig``: the same traces are updated in place inside one batch update; traces of another shape
        get a new ``FigureWidget`` built from ``fig``. A widget's traces added after it was made travel only as
        messages, which a browser whose widget code is still loading drops (plotly's anywidget FigureWidget);
        one built from the figure carries them in the state the browser opens it with."""
        target = self.figure
        same = len(target.data) == len(fig.data) and all(a.type == b.type for a, b in zip(target.data, fig.data))
        if not same:
            self.figure = go.FigureWidget(fig)
            self.children = (*self.children[:-1], self.figure)
            target.close()
            return
        with target.batch_update():
            for old, new in zip(target.data, fig.data):
                props = new.to_plotly_json()
                props.pop("type", None)
                props.pop("uid", None)
                old.update(props, overwrite=True)
            target.layout.update(fig.layout.to_plotly_json(), overwrite=True)


def offline_measure(data: Any = None, limit: int | None = 200, model: Any = None) -> Callable[[Knobs], Any]:
    """``knobs -> PipelineResult``: a short offline replay of ``data`` (default: the shipped records)."""
    from tuning.base.assets import DEFAULT_DATA
    from tuning.offline.pipeline import Pipeline

    def measure(knobs: Knobs) -> Any:
        return Pipeline(knobs, model=model).run(data if data is not None else DEFAULT_DATA, limit,
                                                keep_embeddings=False)
    return measure


def online_measure(inputs: Sequence[Any] | None = None, duration_s: float = 3.0, warmup_requests: int = 8,
                   model: Any = None) -> Callable[[Knobs], Any]:
    """``knobs -> LoadResult``: ``duration_s`` of closed-loop load at ``knobs.concurrency`` on a fresh server."""
    from tuning.inputs.readers import read_lines
    from tuning.load.generator import run_load
    from tuning.online.serve import Server

    bodies = list(inputs) if inputs is not None else [raw for _, raw in read_lines(limit=500)]

    def measure(knobs: Knobs) -> Any:
        with Server(knobs, model=model) as server:
            return run_load(server, bodies, concurrency=knobs.concurrency, duration_s=duration_s,
                            warmup_requests=warmup_requests)
    return measure


def knob_panel(knobs: Knobs, mode: str = "offline", controls: Sequence[str] | None = None,
               measure: Callable[[Knobs], Any] | None = None, limit: int | None = 200, data: Any = None,
               duration_s: float = 3.0, inputs: Sequence[Any] | None = None, model: Any = None,
               device: Any = None, run: bool = True) -> KnobPanel:
    """A knob panel measuring offline (``limit`` records) or online (``duration_s`` of load)."""
    if mode not in ("offline", "online"):
        raise ValueError(f"mode={mode!r} is not allowed; allowed: offline | online")
    if measure is None:
        measure = (offline_measure(data, limit, model) if mode == "offline"
                   else online_measure(inputs, duration_s, model=model))
    controls = controls or knobs_for("offline" if mode == "offline" else "served", panel=True)
    return KnobPanel(knobs, measure, controls, run=run, device=device)
