"""The knob panel, driven from Python as a user would drive it with the mouse."""

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go
import pytest

from tests.helpers import TinyModel
from tuning import widgets
from tuning.knobs import Knobs

STAGES = ("read", "preprocess", "inference")


class FakeResult:
    """What the panel reads from a result; its numbers follow the knobs so a change is visible."""

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.throughput_rps = 10.0 * knobs.batch_size + knobs.num_workers

    def ledger(self) -> pd.DataFrame:
        ms = [1.0, 2.0 + self.knobs.num_workers, 10.0 / self.knobs.batch_size]
        return pd.DataFrame({"p50_ms": ms, "p99_ms": [2 * m for m in ms]}, index=pd.Index(STAGES, name="stage"))

    def summary(self) -> dict:
        return {"model_busy": 0.5, "device": {"kind": "cpu"}}


class Recorded:
    def __init__(self):
        self.calls: list[Knobs] = []

    def __call__(self, knobs: Knobs) -> FakeResult:
        self.calls.append(knobs)
        return FakeResult(knobs)


@pytest.fixture
def panel():
    return widgets.knob_panel(Knobs(device="cpu", num_workers=0), measure=Recorded())


def test_panel_has_the_issue_controls_and_sliders_wait_for_release():
    offline = widgets.knob_panel(Knobs(device="cpu"), measure=Recorded(), run=False)
    online = widgets.knob_panel(Knobs(device="cpu"), mode="online", measure=Recorded(), run=False)
    names = set(offline.controls) | set(online.controls)
    assert {"batch_size", "num_workers", "prefetch_factor", "padding", "dtype", "graph", "max_wait_ms"} <= names
    for control in list(offline.controls.values()) + list(online.controls.values()):
        if hasattr(control, "continuous_update"):
            assert control.continuous_update is False
    assert isinstance(offline, w.VBox) and isinstance(offline.figure, go.FigureWidget)
    assert offline.result is None and not offline.measure.calls


def test_moving_a_slider_reruns_and_updates_the_figure_in_place(panel):
    assert len(panel.measure.calls) == 1 and panel.result is not None
    figure, traces = panel.figure, panel.figure.data
    before = [tuple(t.x) for t in traces[:-1]], tuple(traces[-1].y)
    panel.controls["batch_size"].value = 8  # what a user's slider release does
    assert panel.measure.calls[-1].batch_size == 8
    assert panel.result.knobs.batch_size == 8 and panel.knobs.batch_size == 8
    assert panel.figure is figure and all(a is b for a, b in zip(panel.figure.data, traces))  # same traces, updated
    after = [tuple(t.x) for t in panel.figure.data[:-1]], tuple(panel.figure.data[-1].y)
    assert after != before
    assert after[1] == (10.0, 80.0)  # throughput per run: the history line grew by one point
    assert [h["label"] for h in panel.history] == ["start", "batch_size=8"]


def test_toggles_and_set_from_python(panel):
    panel.set(padding="bucket", dtype="bf16")
    assert panel.knobs.padding == "bucket" and panel.knobs.dtype == "bf16"
    assert len(panel.measure.calls) == 3
    panel.set(num_workers=2, prefetch_factor=4)
    assert panel.knobs.num_workers == 2 and panel.knobs.prefetch_factor == 4
    assert panel.controls["prefetch_factor"].value == 4
    panel.set(prefetch_factor=None)  # torch's default shows as 0 on the slider
    assert panel.controls["prefetch_factor"].value == 0 and panel.knobs.prefetch_factor is None


def test_a_refused_combination_is_explained_not_measured(panel):
    calls = len(panel.measure.calls)
    panel.controls["prefetch_factor"].value = 4  # needs num_workers > 0
    assert len(panel.measure.calls) == calls
    assert panel.error and "num_workers" in panel.error and "prefetch_factor=4" in panel.status.value
    assert panel.knobs.prefetch_factor is None  # the panel keeps the last valid knobs


def test_a_failing_measurement_keeps_the_last_result():
    def measure(knobs):
        if knobs.batch_size > 4:
            raise RuntimeError("out of memory at batch 8")
        return FakeResult(knobs)

    panel = widgets.knob_panel(Knobs(device="cpu"), measure=measure)
    first = panel.result
    panel.set(batch_size=8)
    assert panel.result is first and "out of memory" in panel.error


def test_bad_mode_and_control_names():
    with pytest.raises(ValueError, match="mode='batch'"):
        widgets.knob_panel(Knobs(device="cpu"), mode="batch", measure=Recorded())
    with pytest.raises(ValueError, match="no control for knob 'deadline_ms'"):
        widgets.knob_panel(Knobs(device="cpu"), controls=["deadline_ms"], measure=Recorded())


def test_real_offline_and_online_measurements_with_a_tiny_model():
    panel = widgets.knob_panel(Knobs(device="cpu", num_workers=0, tokenizer="fast"), limit=16, model=TinyModel())
    assert panel.result.summary()["requests"] == 16 and panel.error is None
    panel.set(batch_size=4)
    assert {b.size for b in panel.result.batches} == {4}
    online = widgets.knob_panel(Knobs(device="cpu", tokenizer="fast", concurrency=2), mode="online", duration_s=0.3,
                                inputs=["one text", "another text"], model=TinyModel())
    s = online.result.summary()
    assert online.error is None and s["submitted"] == s["ok"] > 0
    online.set(max_wait_ms=5.0)
    assert online.result.knobs.max_wait_ms == 5.0


def test_the_controls_offer_exactly_the_declared_choices_and_steps():
    """The panel is built from the knob declarations (tuning.knobs): no list of its own to drift."""
    from tuning.knobs import knob_specs, knobs_for

    assert widgets.OFFLINE_CONTROLS == knobs_for("offline", panel=True)
    assert widgets.ONLINE_CONTROLS == knobs_for("served", panel=True)
    assert "prefetch_factor" in widgets.OFFLINE_CONTROLS and "prefetch_factor" not in widgets.ONLINE_CONTROLS
    assert {"max_wait_ms", "concurrency"} <= set(widgets.ONLINE_CONTROLS) - set(widgets.OFFLINE_CONTROLS)
    for spec in knob_specs().values():
        if not spec.panel:
            continue
        control = widgets.make_control(spec.name, spec.default)
        if spec.kind == "choice":
            assert list(control.options) == list(spec.choices), spec.name
        else:
            values = [v for _, v in control._options_full] if spec.nullable else list(control.options)
            assert [v for v in values if v != 0 or not spec.nullable] == list(spec.steps), spec.name


def test_a_front_end_that_opens_the_figure_late_gets_its_traces(panel):
    """The state a browser reads when it opens the figure's widget holds the traces on show: trace messages sent
    before the browser's widget code has loaded are dropped (plotly's anywidget FigureWidget), and a loaded
    machine showed an empty chart under the panel."""
    def synced(figure: go.FigureWidget) -> int:
        return len(figure.get_state()["_widget_data"])

    assert panel.children[-1] is panel.figure and synced(panel.figure) == len(panel.figure.data) > 0
    one_bar = lambda result, history, device=None: go.Figure(go.Bar(y=[viz_throughput(result)]))  # noqa: E731
    panel.chart = one_bar
    panel.set(batch_size=8)  # a figure of another shape
    assert panel.children[-1] is panel.figure and synced(panel.figure) == len(panel.figure.data) == 1


def viz_throughput(result) -> float:
    return result.throughput_rps
