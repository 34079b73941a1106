"""Figure builders: each chart is built from a result or frame, carries its device label, and
the notebook renderer works offline (plotly.js inlined, no CDN)."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from tests.helpers import TinyModel
from tuning import viz
from tuning.experiments.sweeps import batch_sweep
from tuning.inputs.buckets import padding_waste
from tuning.knobs import Knobs
from tuning.offline.pipeline import Pipeline
from tuning.profile import Recorder

SIMULATED = {"kind": "simulated", "profile": "h200-sxm-estimate", "source": "datasheet estimate (NVIDIA H200 SXM)"}


@pytest.fixture(scope="module")
def run():
    knobs = Knobs(device="cpu", num_workers=0, batch_size=4, tokenizer="fast")
    return Pipeline(knobs, model=TinyModel()).run(limit=24)


class Simulated:
    """A result as the simulated device labels it (only what the charts read)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def summary(self):
        return {**self.inner.summary(), "device": SIMULATED}


def _title(fig: go.Figure) -> str:
    return fig.layout.title.text or ""


def test_device_labels():
    assert viz.device_label(SIMULATED) == "simulated h200-sxm-estimate (datasheet estimate)"
    assert viz.device_label({"kind": "cpu"}) == "real CPU"
    assert viz.device_label("cpu") == "real CPU"
    choice = SimpleNamespace(knob="sim", simulated=True, banner="SIMULATED ...",
                             label="simulated h200-sxm-estimate (datasheet estimate (NVIDIA H200, typical values))")
    assert viz.device_label(choice) == "simulated h200-sxm-estimate (datasheet estimate)"
    frame = pd.DataFrame({"x": [1]})
    frame.attrs["device"] = SIMULATED
    assert viz.is_simulated(frame)
    assert viz.device_label(None) == ""


def test_ledger_chart_stacks_every_stage_for_p50_and_p99(run):
    fig = viz.ledger_chart(run)
    assert isinstance(fig, go.Figure)
    ledger = run.ledger()
    assert [t.name for t in fig.data] == list(ledger.index)
    inference = next(t for t in fig.data if t.name == "inference")
    assert list(inference.y) == ["p50", "p99"]
    assert inference.x == pytest.approx([ledger.loc["inference", "p50_ms"], ledger.loc["inference", "p99_ms"]])
    assert "real CPU" in _title(fig)


def test_every_chart_made_on_the_simulated_device_says_so(run):
    sim = Simulated(run)
    figures = [viz.ledger_chart(sim), viz.ledger_chart({"a": sim, "b": sim}), viz.waits_chart({"a": sim}),
               viz.throughput_chart({"a": sim}), viz.panel_chart(sim)]
    for fig in figures:
        assert "simulated h200-sxm-estimate" in _title(fig), _title(fig)


def test_waits_and_throughput_charts_read_the_results(run):
    fig = viz.waits_chart({"one": run, "two": run})
    bars = {t.name: t for t in fig.data if isinstance(t, go.Bar)}
    share = run.waits()["wait_for_input"]["share_of_window"]
    assert bars["model waits for input %"].y[0] == pytest.approx(100 * share)
    line = next(t for t in fig.data if isinstance(t, go.Scatter))
    assert line.y[0] == pytest.approx(run.throughput_rps)
    fig = viz.throughput_chart({"one": run})
    assert fig.data[0].y[0] == pytest.approx(run.throughput_rps)


def test_batch_sweep_chart_marks_the_knee():
    sweep = batch_sweep(TinyModel(), torch.device("cpu"), [1, 2, 4], length=8, repeats=2, warmup=1)
    fig = viz.batch_sweep_chart(sweep, device="cpu")
    assert list(fig.data[0].x) == [1, 2, 4]
    assert any(f"knee: batch {sweep.knee}" in (a.text or "") for a in fig.layout.annotations)


def test_padding_chart_has_one_bar_per_strategy():
    report = padding_waste(list(np.random.default_rng(0).integers(5, 200, 300)), batch_size=16, k=3)
    fig = viz.padding_chart(report)
    assert list(fig.data[0].x) == list(report.to_frame().strategy)
    assert fig.data[0].y == pytest.approx(list(report.to_frame().padded_over_real))


def test_load_sweep_chart_takes_a_frame():
    frame = pd.DataFrame({"max_wait_ms": [0.0, 5.0], "qps": [10.0, 20.0], "p99_ms": [50.0, 80.0], "mean_batch": [1, 3]})
    frame.attrs["device"] = SIMULATED
    fig = viz.load_sweep_chart(frame)
    assert "simulated" in _title(fig) and list(fig.data[0].y) == [10.0, 20.0]


def test_trend_and_thread_charts_from_a_recorded_run():
    knobs = Knobs(device="cpu", num_workers=0, batch_size=2, tokenizer="fast")
    pipeline = Pipeline(knobs, model=TinyModel(delay_s=0.002))
    with Recorder(interval=0.1, gpu=False, host=False) as rec:
        result = pipeline.run(limit=40)
    profile = rec.join(result)
    fig = viz.trend_chart(profile)
    busy = profile.to_frame("busy")
    assert fig.data[0].y == pytest.approx(list(100 * busy.busy))
    assert any("average" in (a.text or "") for a in fig.layout.annotations)
    assert isinstance(viz.threads_chart(profile), go.Figure)


def test_launch_budget_from_signals():
    profile = SimpleNamespace(signals=SimpleNamespace(median_span_ms=2.0, launch_share=0.75),
                              workload=SimpleNamespace(batch_sizes=lambda: [1, 1], summary=lambda: {"device": SIMULATED}))
    fig = viz.launch_budget_chart(profile)
    assert [t.x[0] for t in fig.data] == pytest.approx([1.5, 0.5])
    assert "75%" in _title(fig) and "simulated" in _title(fig)


def test_graph_modes_chart_from_runs_and_sweeps(run):
    sweep = pd.DataFrame({"batch_size": [1, 8], "per_batch_ms": [2.0, 3.0], "status": ["ok", "ok"]})
    fig = viz.graph_modes_chart({"eager": run, "cuda_graph": sweep}, device="cpu")
    calls = run.batches_frame().query("not warmup and ok == 4")
    assert list(fig.data[0].x) == ["4"] and fig.data[0].y[0] == pytest.approx(calls.inference_ms.median())
    assert list(fig.data[1].y) == [2.0, 3.0]


def test_precision_and_tokenizer_charts():
    report = SimpleNamespace(device="cpu", cosines={"bf16": np.array([0.9999, 0.99995])})
    fig = viz.precision_chart(report)
    assert fig.data[0].name == "bf16" and "real model on cpu" in _title(fig)
    frame = pd.DataFrame({"tokenizer": ["naive", "fast"], "us_per_record": [900.0, 300.0]})
    assert list(viz.tokenizer_chart(frame).data[0].y) == [900.0, 300.0]


def test_pct_says_unknown_instead_of_nan():
    assert viz.pct(math.nan) == "n/a" and viz.pct(None) == "n/a" and viz.pct(0.256) == "26%"


def test_notebook_renderer_is_offline():
    previous = pio.renderers.default
    try:
        viz.setup_notebook()
        assert pio.renderers.default == viz.DEFAULT_RENDERER and "connected" not in pio.renderers.default
        bundle = pio.renderers[viz.RENDERER].to_mimebundle(go.Figure(go.Bar(y=[1])).to_dict())
        html = bundle["text/html"]
        assert not re.search(r"<script[^>]+src=", html), "no external script (CDN) in a chart"
        assert "cdn" not in html.lower() and "mathjax" not in html.lower()
    finally:
        pio.renderers.default = previous


def test_banner_renders_plain_and_html():
    b = viz.banner(SimpleNamespace(banner="SIMULATED DEVICE: a <stand-in>", simulated=True, label="x"))
    assert repr(b) == "SIMULATED DEVICE: a <stand-in>"
    assert "&lt;stand-in&gt;" in b._repr_html_()


# --- the decision's charts: target-check windows, effects, the confirmation -----------------------------------

def _probe(rate, passed, p99, low, high, by="count"):
    from tuning.experiments.capacity import Probe

    return Probe(rate=rate, verdict="pass" if passed else "fail", by=by, passed=passed, windows=2, n=1200,
                 exceed=3 if passed else 40, errors=0, offered_rate=rate, achieved_rate=rate, late=0,
                 p50_ms=p99 / 3 if math.isfinite(p99) else 400.0, p99_ms=p99, p99_low_ms=low, p99_high_ms=high)


def _capacity(probes, capacity, high, target=800.0):
    from tuning.experiments.capacity import Capacity

    return Capacity(target_p99_ms=target, error_budget=0.001, capacity=capacity, low=capacity, high=high,
                    probes=probes)


def _hlines(fig):
    return [s.y0 for s in fig.layout.shapes if s.y0 == s.y1 and str(s.xref).endswith("domain")]


def _vlines(fig):
    return [s.x0 for s in fig.layout.shapes if s.x0 == s.x1 and str(s.yref).endswith("domain")]


def test_capacity_chart_draws_each_probe_with_its_interval_and_the_target():
    cap = _capacity([_probe(20.0, True, 300.0, 250.0, 380.0), _probe(40.0, False, 1200.0, 1000.0, 1500.0),
                     _probe(28.3, True, 600.0, 520.0, None, by="estimate")], capacity=28.3, high=40.0)
    fig = viz.capacity_chart(cap, device=SIMULATED)
    passes, fails = (next(t for t in fig.data if t.name == n) for n in ("pass", "fail"))
    assert list(passes.x) == [20.0, 28.3] and list(passes.y) == [300.0, 600.0]  # sorted by rate
    assert passes.error_y.arrayminus == pytest.approx((50.0, 80.0))
    assert passes.error_y.array[0] == pytest.approx(80.0)
    top = fig.layout.yaxis.range[1]
    assert passes.y[1] + passes.error_y.array[1] >= top * 0.99  # an unbounded upper end runs to the top edge
    assert list(fails.x) == [40.0] and fails.error_y.array[0] == pytest.approx(300.0)
    assert fails.marker.symbol[0] != passes.marker.symbol[0]  # pass and fail marked apart
    assert list(fails.text) == [f"fail: {cap.probes[1].by}"] and passes.text is None  # why, on the chart itself
    assert 800.0 in _hlines(fig) and 28.3 in _vlines(fig)  # the target and the capacity
    assert "req/s" in fig.layout.xaxis.title.text and "ms" in fig.layout.yaxis.title.text
    assert "simulated" in _title(fig) and "28.3 req/s" in _title(fig)
    same = viz.capacity_chart(cap.summary(), device=SIMULATED)  # the summary dict draws the same points
    assert [list(t.x) for t in same.data] == [list(t.x) for t in fig.data]
    assert [y for t in same.data for y in t.y] == pytest.approx([y for t in fig.data for y in t.y])


def test_capacity_chart_of_two_configurations_and_an_unbounded_p99():
    base = _capacity([_probe(10.0, True, 500.0, 450.0, 560.0), _probe(20.0, False, math.inf, None, None)],
                     capacity=10.0, high=20.0)
    missed = _capacity([_probe(5.0, False, 900.0, 850.0, 990.0)], capacity=None, high=5.0)
    fig = viz.capacity_chart({"baseline": base, "recommended": missed}, device="cpu")
    names = [t.name for t in fig.data]
    assert names == ["baseline: pass", "baseline: fail", "recommended: fail"]
    inf_point = fig.data[1]
    assert inf_point.y[0] == pytest.approx(fig.layout.yaxis.range[1] / 1.02)  # at the top edge, not dropped
    assert inf_point.marker.symbol[0] == "triangle-up"
    assert _vlines(fig) == [10.0]  # only a met capacity gets its line
    assert "real CPU" in _title(fig)
    empty = viz.capacity_chart(_capacity([], capacity=None, high=None))
    assert any("no capacity probe" in (a.text or "") for a in empty.layout.annotations)
    with pytest.raises(TypeError, match="capacity"):
        viz.capacity_chart(42)


def _decided():
    """A decision through the seam on a simulated world where batching and bf16 matter."""
    from tests.worlds import TARGET_MS, WORLDS, World, seam_kwargs
    from tuning.experiments.ladder import LadderSettings, run_ladder

    world = World(noise=0.05, seed=1, **WORLDS["two knobs matter, with an interaction"])
    return run_ladder(device="cpu", measure=world, progress=False, settings=LadderSettings.quick(),
                      target_p99_ms=TARGET_MS, **seam_kwargs())


def test_the_decision_s_charts_show_effects_confirmation_and_target_checks():
    import json

    result = _decided()
    effects = viz.effects_chart(result, device=SIMULATED)
    kept = next(t for t in effects.data if t.name == "in the model")
    assert "batch" in list(kept.x) and "precision" in list(kept.x)
    assert 1.0 in _hlines(effects) and "simulated" in _title(effects)
    confirm = viz.confirm_chart(result)
    assert confirm.data[0].name.endswith("better") and confirm.data[0].y[0] > 1.3
    assert {1.0, 1.1} <= {round(y, 6) for y in _hlines(confirm)}
    target = viz.target_check_chart(result)
    checked = len(result.decision.checks)  # the baseline and every confirmed candidate
    assert 300.0 in _hlines(target) and len({t.legendgroup for t in target.data}) == checked >= 2
    from_json = viz.target_check_chart(json.loads(json.dumps(result.summary(), default=str)))
    assert [t.name for t in from_json.data] == [t.name for t in target.data]


def test_capacity_labels_never_print_over_each_other_even_when_equal():
    """Issue 58, finding 9 (and the review: two equal capacities took the same place)."""
    from tuning import viz

    caps = {name: {"capacity": 50.0, "probes": [], "unit": "req/s", "target_p99_ms": 100.0}
            for name in ("baseline", "recommended")}
    fig = viz.capacity_chart(caps)
    notes = [a for a in fig.layout.annotations if (a.text or "").endswith("req/s")]
    assert len(notes) == 2 and len({(a.xanchor, a.yshift) for a in notes}) == 2
    assert fig.layout.legend.orientation == "h"  # under the plot: several configurations' entries do not squeeze it
    long = viz.capacity_chart({f"configuration {i} with a long name": dict(caps["baseline"], capacity=40.0 + i)
                               for i in range(3)})
    assert all(len(line) <= viz.TITLE_CHARS + 20 for line in long.layout.title.text.split("<br>"))
