"""Figure builders: each takes a result (or its frame) and returns a plotly figure.

A chart function never measures and a measurement never draws. Every title carries the
device the numbers came from (``simulated h200-sxm-estimate (datasheet estimate)``, ``real
CPU``, ``CUDA``), taken from the result's ``summary()["device"]`` or, for a bare frame,
from ``device=`` or ``frame.attrs["device"]``, so a simulated figure never passes for a
measured one.

In a notebook, call :func:`setup_notebook` once: plotly.js is inlined (no CDN, works
offline) and executed notebooks keep a static chart (JupyterLab shows the plotly mimetype,
an exported HTML file shows the inlined one).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from tuning.base.contract import Measured, as_device
from tuning.base.format import pct

RENDERER = "tuning_offline"
DEFAULT_RENDERER = f"plotly_mimetype+{RENDERER}"
TEMPLATE = "plotly_white"
STAGE_COLORS = {
    "queue_wait": "#bab0ac", "read": "#4c78a8", "preprocess": "#f58518", "wait_for_model": "#e45756",
    "copy": "#72b7b2", "inference": "#54a24b", "postprocess": "#b279a2",
}


# --- notebook setup and labels ----------------------------------------------------------------

def _offline_renderer():
    from plotly.io._base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        """The classic notebook renderer with plotly.js inlined once and no MathJax CDN tag."""

        def to_mimebundle(self, fig_dict):
            html = pio.to_html(fig_dict, config=self.config, include_plotlyjs=False, include_mathjax=False,
                               full_html=False, default_width="100%", default_height=480, validate=False)
            return {"text/html": html}

    return OfflineNotebookRenderer(connected=False)


def setup_notebook(renderer: str = DEFAULT_RENDERER, template: str = TEMPLATE) -> None:
    """Offline plotly for notebooks: inline plotly.js (no CDN) and keep static charts in saved outputs.

    Call it in a notebook's first cell (``plotly.io.renderers.default`` then names the renderer).
    """
    if RENDERER not in pio.renderers:
        pio.renderers[RENDERER] = _offline_renderer()
    pio.templates.default = template
    pio.renderers.default = renderer  # activating the notebook part displays plotly.js once, inline


class Banner:
    """One line saying which device the numbers come from; rich in a notebook, plain in a terminal."""

    def __init__(self, text: str, simulated: bool):
        self.text, self.simulated = text, simulated

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        color = "#8a5a00" if self.simulated else "#1f5f2a"
        background = "#fff4dc" if self.simulated else "#e9f5ec"
        return (f'<div style="padding:6px 10px;border-left:4px solid {color};background:{background};'
                f'color:{color};font-weight:600">{_escape(self.text)}</div>')


def banner(device: Any) -> Banner:
    """The device object's banner (see ``tuning.device_for``) as a displayable line."""
    text = getattr(device, "banner", None) or device_label(device)
    return Banner(str(text), bool(getattr(device, "simulated", False)) or "simulated" in str(text))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _device_info(obj: Any) -> Any:
    """The contract's device object (:mod:`tuning.base.contract`) of a result, a frame (``attrs["device"]``),
    a device choice, or the first of a mapping of results; a plain string (a knob value or a label) as it is."""
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, pd.DataFrame):
        return as_device(obj.attrs.get("device"))
    if isinstance(obj, Mapping) and "kind" not in obj:
        return next((d for d in map(_device_info, obj.values()) if d is not None), None)
    return as_device(obj)


def device_label(obj: Any) -> str:
    """A short device label: ``simulated <profile> (<source>)``, ``real CPU``, ``CUDA ...`` or ``''``."""
    info = _device_info(obj)
    if info is None:
        return ""
    if isinstance(info, str):
        return {"cpu": "real CPU", "cuda": "CUDA", "sim": "simulated device"}.get(info, _compact(info, False))
    kind = info.get("kind")
    if kind == "simulated" and not info.get("profile") and info.get("label"):
        return _compact(str(info["label"]), True)
    if kind == "simulated":
        source = str(info.get("source") or "").split(" (")[0].split(":")[0].strip()  # "datasheet estimate"
        profile = info.get("profile") or "device"
        return f"simulated {profile}" + (f" ({source})" if source else "")
    if kind == "cpu":
        return "real CPU"
    if kind == "cuda":
        return f"CUDA {info['name']}" if info.get("name") else "CUDA"
    return str(kind or "")


def _compact(label: str, simulated: bool) -> str:
    """``simulated NAME (SOURCE (details...))`` -> ``simulated NAME (SOURCE)``."""
    if simulated and not label.startswith("simulated"):
        label = f"simulated {label}"
    match = re.match(r"(simulated \S+) \(([^(:]+)", label)
    return f"{match[1]} ({match[2].strip()})" if match else label


def is_simulated(obj: Any) -> bool:
    return device_label(obj).startswith("simulated")


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


TITLE_CHARS = 90  # a title line wraps at a word boundary past this many characters (a 1,280 px page's chart)


def _title(text: str, source: Any, device: Any = None) -> str:
    """The chart's title, wrapped at word boundaries (plotly does not wrap, and cuts a long one at the
    chart's edge), with the device's label under it."""
    import textwrap

    label = _short(device_label(device if device is not None else source))
    wrapped = "<br>".join(textwrap.wrap(text, TITLE_CHARS, break_long_words=False)) or text
    return f"{wrapped}<br><sup>{_escape(label)}</sup>" if label else wrapped


def _finish(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    # The legend stands right of the plot, top-aligned: above it, a wrapping legend would cover the
    # title's device line and the subplot titles (seen in a browser); plotly widens the margin to fit.
    # The top margin holds the title's lines.
    lines = title.count("<br>") + 1
    fig.update_layout(title=title, height=height + 22 * max(lines - 2, 0),
                      margin=dict(t=36 + 22 * lines, l=60, r=30, b=50),
                      legend=dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.02))
    return fig


def _as_results(results: Any) -> dict[str, Any]:
    """One result, a list of them, or a mapping of label -> result, as a mapping."""
    if isinstance(results, Mapping):
        return {str(k): v for k, v in results.items()}
    if isinstance(results, (list, tuple)):
        return {f"run {i + 1}": r for i, r in enumerate(results)}
    return {"": results}


def throughput(result: Measured | Any) -> float:
    """The contract's ``qps`` of a result (ok answers per second of its measured window); a result that only
    has the deprecated ``throughput_rps`` (kept one release) is read by that."""
    qps = getattr(result, "qps", None)
    if qps is None:
        qps = getattr(result, "throughput_rps", math.nan)
    return float(qps)


# --- 01: trends -----------------------------------------------------------------------------

def trend_chart(profile: Any, device: Any = None) -> go.Figure:
    """Model busy and device busy over time with their averages: how an average hides idle gaps.

    ``profile`` is a recorder :class:`~tuning.profile.Profile` (offline run or load test).
    """
    busy = profile.to_frame("busy")
    gpu = profile.to_frame("gpu")
    has_power = len(gpu) and gpu["power_w"].notna().any() and gpu["power_limit_w"].notna().any()
    rows = 2 if has_power else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.7, 0.3][:rows] if rows == 2 else None,
                        subplot_titles=["utilization over time", "power, share of limit"][:rows])
    sim = is_simulated(device if device is not None else profile)
    if len(busy):
        fig.add_trace(go.Scatter(x=busy.t, y=100 * busy.busy, mode="lines", name="model busy %",
                                 line=dict(color="#54a24b", shape="hv")), row=1, col=1)
        avg = 100 * float(profile.workload.model_busy)
        fig.add_hline(y=avg, line=dict(color="#54a24b", dash="dash"), row=1, col=1,
                      annotation_text=f"model busy average {avg:.0f}%", annotation_position="top left")
    if len(gpu) and gpu["sm_util"].notna().any():
        per_t = gpu.groupby("t", as_index=False)["sm_util"].mean()
        name = "device busy % (simulated sampler)" if sim else "GPU utilization % (NVML)"
        fig.add_trace(go.Scatter(x=per_t.t, y=per_t.sm_util, mode="lines+markers", name=name,
                                 line=dict(color="#4c78a8")), row=1, col=1)
        avg_dev = float(per_t.sm_util.mean())
        fig.add_hline(y=avg_dev, line=dict(color="#4c78a8", dash="dot"), row=1, col=1,
                      annotation_text=f"device busy average {avg_dev:.0f}%", annotation_position="bottom right")
        if has_power:
            frac = (100 * gpu.power_w / gpu.power_limit_w).groupby(gpu.t).mean()
            fig.add_trace(go.Scatter(x=frac.index, y=frac.values, mode="lines", name="power % of limit"
                                     + (" (simulated)" if sim else ""), line=dict(color="#e45756")), row=2, col=1)
    fig.update_yaxes(title_text="%", range=[0, 105], row=1, col=1)
    fig.update_xaxes(title_text="seconds since the recorder started", row=rows, col=1)
    return _finish(fig, _title("Trend: busy over time vs its average", profile, device), 460 if rows == 1 else 560)


def threads_chart(profile: Any, top: int = 6, device: Any = None) -> go.Figure:
    """Per-thread CPU % over time (like ``top -H``) for the busiest threads, with their names."""
    threads = profile.to_frame("threads")
    fig = go.Figure()
    if len(threads):
        threads = threads.assign(label=threads["name"] + " (" + threads["tid"].astype(str) + ")")
        order = threads.groupby("label")["cpu_percent"].mean().sort_values(ascending=False)
        for label in order.index[:top]:
            part = threads[threads.label == label].sort_values("t")
            fig.add_trace(go.Scatter(x=part.t, y=part.cpu_percent, mode="lines",
                                     name=f"{label}: mean {order[label]:.0f}%"))
    else:  # say so on the chart, not an empty frame
        fig.add_annotation(text="no per-thread samples: the window was shorter than one sampling interval",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font=dict(size=14))
    fig.add_hline(y=100, line=dict(color="grey", dash="dot"), annotation_text="one core",
                  annotation_position="top left")
    fig.update_yaxes(title_text="CPU % of one core")
    fig.update_xaxes(title_text="seconds since the recorder started")
    return _finish(fig, _title(f"Per-thread CPU, top {top} threads (host side runs for real)", profile, device), 440)


# --- 02: the stage ledger --------------------------------------------------------------------

def _ledger(obj: Any) -> pd.DataFrame:
    return obj if isinstance(obj, pd.DataFrame) else obj.ledger()


def ledger_chart(results: Any, device: Any = None) -> go.Figure:
    """Per-request time by stage, p50 next to p99, as stacked bars (one pair per result).

    ``results``: a result with ``ledger()``, a ledger frame, or a mapping label -> either.
    """
    runs = _as_results(results)
    fig = go.Figure()
    stages: list[str] = []
    for ledger in (_ledger(r) for r in runs.values()):
        stages += [s for s in ledger.index if s not in stages]
    ys = [f"{label} {q}".strip() for label in runs for q in ("p50", "p99")]
    for stage in stages:
        xs, shares = [], []
        for r in runs.values():
            ledger = _ledger(r)
            for q, share in (("p50_ms", "share"), ("p99_ms", "share_p99")):
                has = stage in ledger.index
                xs.append(float(ledger.loc[stage, q]) if has else 0.0)
                shares.append(float(ledger.loc[stage, share]) if has and share in ledger else math.nan)
        fig.add_trace(go.Bar(y=ys, x=xs, name=stage, orientation="h", marker_color=STAGE_COLORS.get(stage),
                             customdata=np.asarray(shares) * 100,
                             hovertemplate=f"{stage}: %{{x:.2f}} ms (%{{customdata:.0f}}% of the sum)<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="ms per request (sum of the stage percentiles)")
    return _finish(fig, _title("Where a request's time goes: stage ledger, p50 vs p99", results, device),
                   260 + 60 * len(ys))


def waits_chart(results: Any, device: Any = None) -> go.Figure:
    """Per configuration: share of the window the model waited for input (starvation), the ready
    batches waited for the model (back-pressure), and model busy; throughput on the right axis."""
    runs = _as_results(results)
    labels = list(runs)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    waits = [r.waits() for r in runs.values()]
    series = {
        "model waits for input": [w["wait_for_input"]["share_of_window"] or 0.0 for w in waits],
        "batch waits for model": [w["wait_for_model"]["share_of_window"] or 0.0 for w in waits],
        "model busy": [float(r.model_busy) for r in runs.values()],
    }
    device_busy = [float(getattr(r, "device_busy", math.nan)) for r in runs.values()]
    if any(not math.isnan(x) for x in device_busy):
        series["device busy"] = device_busy
    colors = {"model waits for input": "#e45756", "batch waits for model": "#f58518", "model busy": "#54a24b",
              "device busy": "#4c78a8"}
    for name, values in series.items():
        fig.add_trace(go.Bar(x=labels, y=[100 * v for v in values], name=name + " %", marker_color=colors[name],
                             texttemplate="%{y:.0f}%", textposition="outside"), secondary_y=False)
    fig.add_trace(go.Scatter(x=labels, y=[throughput(r) for r in runs.values()], name="throughput (req/s)",
                             mode="lines+markers", line=dict(color="black")), secondary_y=True)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="% of the measured window", range=[0, 115], secondary_y=False)
    fig.update_yaxes(title_text="req/s", rangemode="tozero", secondary_y=True, showgrid=False)
    return _finish(fig, _title("Is the model fed? Waits and busy share per configuration", results, device), 460)


def throughput_chart(results: Any, device: Any = None) -> go.Figure:
    """Throughput per configuration (bars) with model busy and device busy (markers, right axis)."""
    runs = _as_results(results)
    labels = list(runs)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    waste = [float(getattr(r, "padding_waste", math.nan)) for r in runs.values()]
    fig.add_trace(go.Bar(x=labels, y=[throughput(r) for r in runs.values()], name="throughput (req/s)",
                         marker_color="#4c78a8", texttemplate="%{y:.1f}", textposition="outside",
                         customdata=np.asarray(waste) * 100,
                         hovertemplate="%{x}: %{y:.1f} req/s, padding waste %{customdata:.0f}%<extra></extra>"),
                  secondary_y=False)
    for attr, color, name in (("model_busy", "#f58518", "model busy %"), ("device_busy", "#54a24b", "device busy %")):
        values = [100 * float(getattr(r, attr, math.nan)) for r in runs.values()]
        if any(not math.isnan(v) for v in values):
            fig.add_trace(go.Scatter(x=labels, y=values, name=name, mode="markers",
                                     marker=dict(size=12, color=color, symbol="diamond")), secondary_y=True)
    fig.update_yaxes(title_text="req/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="busy % of the window", range=[0, 105], secondary_y=True, showgrid=False)
    return _finish(fig, _title("Throughput per configuration", results, device), 420)


# --- 03: batch sweep -------------------------------------------------------------------------

def batch_sweep_chart(sweep: Any, device: Any = None) -> go.Figure:
    """Per-sample cost and throughput by batch size, the knee marked, out-of-memory points flagged."""
    frame = sweep if isinstance(sweep, pd.DataFrame) else sweep.to_frame()
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ok = frame[frame.status == "ok"] if "status" in frame else frame
    fig.add_trace(go.Scatter(x=ok.batch_size, y=ok.per_sample_ms, mode="lines+markers", name="ms per sample",
                             line=dict(color="#4c78a8")), secondary_y=False)
    fig.add_trace(go.Scatter(x=ok.batch_size, y=ok.texts_per_s, mode="lines+markers", name="samples/s",
                             line=dict(color="#54a24b", dash="dot")), secondary_y=True)
    if "status" in frame and (frame.status == "oom").any():
        oom = frame[frame.status == "oom"]
        for size in oom.batch_size:
            fig.add_vline(x=size, line=dict(color="#e45756", dash="dot"), annotation_text="out of memory")
    knee = getattr(sweep, "knee", None)
    if knee is not None:
        fig.add_vline(x=knee, line=dict(color="black", dash="dash"), annotation_text=f"knee: batch {knee}",
                      annotation_position="top right")
    fig.update_xaxes(title_text="batch size", type="log", tickvals=list(frame.batch_size))
    fig.update_yaxes(title_text="ms per sample", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", secondary_y=True, showgrid=False)
    length = getattr(sweep, "length", None)
    what = f"Batch-size sweep at {length} tokens" if length else "Batch-size sweep"
    return _finish(fig, _title(f"{what}: per-sample cost and its knee", sweep, device))


def _per_batch_frame(obj: Any) -> pd.DataFrame:
    """A batch sweep's rows, or an offline run's model calls as (batch_size, median per_batch_ms) rows."""
    if isinstance(obj, pd.DataFrame):
        return obj
    if hasattr(obj, "batches_frame"):
        calls = obj.batches_frame()
        calls = calls[~calls.warmup & (calls.ok > 0)] if len(calls) else calls
        grouped = calls.groupby("ok")["inference_ms"].agg(["median", "size"]).reset_index()
        return grouped.rename(columns={"ok": "batch_size", "median": "per_batch_ms", "size": "calls"})
    return obj.to_frame()


def graph_modes_chart(sweeps: Mapping[str, Any], device: Any = None) -> go.Figure:
    """Per-batch time by batch size for each graph mode (eager, compile, cuda_graph): from batch sweeps,
    or from offline runs (median model-call time per batch size, warm-up and compilation excluded)."""
    fig = go.Figure()
    for mode, sweep in sweeps.items():
        frame = _per_batch_frame(sweep)
        frame = frame[frame.status == "ok"] if "status" in frame else frame
        label = f"{mode} ({device_label(sweep)})" if device is None and device_label(sweep) else mode
        fig.add_trace(go.Bar(x=[str(b) for b in frame.batch_size], y=frame.per_batch_ms, name=label,
                             texttemplate="%{y:.2f}", textposition="outside"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="batch size")
    fig.update_yaxes(title_text="ms per batch (median)", rangemode="tozero")
    return _finish(fig, _title("Graph modes: time per batch", sweeps, device))


def launch_budget_chart(ops: Any, device: Any = None) -> go.Figure:
    """One model call split into launch overhead (what capture can save at most) and the rest.

    ``ops``: a recorder Profile (its signals: launch share of the median model call, simulated or
    measured), or op statistics (``OpStats``, or its summary)."""
    signals = getattr(ops, "signals", None)
    if signals is not None:
        busy = float(signals.median_span_ms)
        batches = ops.workload.batch_sizes() if hasattr(ops.workload, "batch_sizes") else []
        s = {"busy_ms_per_batch": busy, "launch_share": signals.launch_share,
             "launch_overhead_ms": busy * signals.launch_share,
             "batch_shape": None, "mean_batch": float(np.mean(batches)) if batches else None}
    else:
        s = ops.summary() if hasattr(ops, "summary") else dict(ops)
    busy = float(s.get("busy_ms_per_batch") or 0.0)
    launch = float(s.get("launch_overhead_ms") or 0.0)
    launch = min(launch, busy) if math.isfinite(launch) else 0.0
    fig = go.Figure()
    for name, value, color in (("launch overhead (capture can save at most this)", launch, "#e45756"),
                               ("compute and the rest", busy - launch, "#54a24b")):
        fig.add_trace(go.Bar(x=[value], y=["one batch"], orientation="h", name=name, marker_color=color,
                             texttemplate="%{x:.2f} ms", textposition="inside"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ms per batch")
    shape = s.get("batch_shape")
    what = (f" at batch x length = {shape[0]} x {shape[1]}" if shape else
            f" at mean batch {s['mean_batch']:.1f}" if s.get("mean_batch") else "")
    return _finish(fig, _title(f"Launch-overhead budget{what}: {pct(s.get('launch_share'))} of busy time",
                               ops, device), 300)


# --- 04: tokenizers, padding, precision -----------------------------------------------------

def tokenizer_chart(comparison: Any, device: Any = None) -> go.Figure:
    """Time per record of each tokenizer (same ids, different cost)."""
    frame = comparison if isinstance(comparison, pd.DataFrame) else comparison.to_frame()
    fig = go.Figure(go.Bar(x=frame["tokenizer"], y=frame["us_per_record"], marker_color=["#e45756", "#54a24b"][:len(frame)],
                           texttemplate="%{y:.0f} µs", textposition="outside"))
    fig.update_yaxes(title_text="µs per record (host CPU)", rangemode="tozero")
    return _finish(fig, _title("Tokenizing: time per record (identical ids)", comparison, device or "cpu"), 380)


def padding_chart(report: Any, device: Any = None) -> go.Figure:
    """Padded tokens per real token by padding strategy (1.0: no padding), with the shapes each needs."""
    frame = report if isinstance(report, pd.DataFrame) else report.to_frame()
    fig = go.Figure(go.Bar(x=frame["strategy"], y=frame["padded_over_real"], customdata=frame["shapes"],
                           marker_color="#4c78a8", texttemplate="%{y:.2f}x", textposition="outside",
                           hovertemplate="%{x}: %{y:.2f} padded tokens per real token, %{customdata} shapes<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot"), annotation_text="no padding")
    fig.update_yaxes(title_text="model tokens / real tokens", rangemode="tozero")
    return _finish(fig, _title("Padding waste by strategy (the model computes every padded token)", report,
                               device or "cpu"), 420)


def precision_chart(report: Any, device: Any = None) -> go.Figure:
    """Cosine similarity of each half-precision dtype's embeddings against fp32, per text."""
    fig = go.Figure()
    for dtype, cos in getattr(report, "cosines", {}).items():
        fig.add_trace(go.Box(y=np.asarray(cos, dtype=float), name=dtype, boxpoints="all", jitter=0.4, pointpos=0))
    fig.update_yaxes(title_text="cosine vs fp32 (1.0: identical)")
    real = f"real model on {getattr(report, 'device', 'cpu')}"
    return _finish(fig, _title("Half precision vs fp32, per text (accuracy: always measured, never simulated)",
                               None, device or real), 420)


# --- 06: online batching and the ladder -----------------------------------------------------

def load_sweep_chart(frame: pd.DataFrame, x: str | None = None, device: Any = None) -> go.Figure:
    """QPS and p99 latency against one swept variable (``max_wait_ms`` or ``concurrency``)."""
    x = x or frame.columns[0]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=[str(v) for v in frame[x]], y=frame["qps"], name="QPS", marker_color="#4c78a8",
                         texttemplate="%{y:.0f}", textposition="outside"), secondary_y=False)
    fig.add_trace(go.Scatter(x=[str(v) for v in frame[x]], y=frame["p99_ms"], name="p99 ms", mode="lines+markers",
                             line=dict(color="#e45756")), secondary_y=True)
    if "mean_batch" in frame:
        fig.add_trace(go.Scatter(x=[str(v) for v in frame[x]], y=frame["mean_batch"], name="mean batch",
                                 mode="markers", marker=dict(symbol="diamond", color="black")), secondary_y=False)
    fig.update_xaxes(title_text=x)
    fig.update_yaxes(title_text="QPS (ok responses/s)", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="p99 latency (ms)", rangemode="tozero", secondary_y=True, showgrid=False)
    return _finish(fig, _title(f"Online: QPS and p99 against {x}", frame, device))


def _num(value: Any) -> float:
    """A float from a frame cell or a JSON value (None, NaN and text: NaN)."""
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _ms(value: Any, unknown: str = "n/a") -> str:
    v = _num(value)
    return f"{v:.0f}" if math.isfinite(v) else unknown


def _error_bars(mid: Sequence[Any], low: Sequence[Any], high: Sequence[Any]) -> dict[str, Any]:
    """Asymmetric plotly error bars from an interval's ends (an end unknown: no bar on that side)."""
    up = [h - m if math.isfinite(h) and math.isfinite(m) else math.nan for m, h in zip(map(_num, mid), map(_num, high))]
    down = [m - lo if math.isfinite(lo) and math.isfinite(m) else math.nan for m, lo in zip(map(_num, mid), map(_num, low))]
    return dict(type="data", symmetric=False, array=up, arrayminus=down, thickness=1.5, width=6)


def _unique(labels: Sequence[str]) -> list[str]:
    """Category labels made unique (plotly merges equal categories into one)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def effects_chart(result: Any, device: Any = None) -> go.Figure:
    """The screen's effects (``docs/deciding.md``, stage 1): each factor's and interaction's throughput ratio,
    high level over low, with its interval, filled when the model kept it; the no-effect line at 1.
    ``result``: a ``run_ladder`` result or its ``summary()["screen"]``."""
    tables = result.get("screen") or {} if isinstance(result, Mapping) else (
        result.decision.explored.tables if result.decision is not None and result.decision.explored is not None else {})
    rows = tables.get("effects") or []
    fig = go.Figure()
    for kept in (True, False):
        part = [r for r in rows if bool(r.get("kept")) is kept]
        if not part:
            continue
        fig.add_trace(go.Scatter(
            x=[r["term"] for r in part], y=[r["ratio"] for r in part], mode="markers",
            name="in the model" if kept else "no effect told",
            marker=dict(size=11, color="#54a24b" if kept else "#9d9d9d", symbol="circle" if kept else "circle-open",
                        line=dict(width=2)),
            error_y=_error_bars([r["ratio"] for r in part], [r["low"] for r in part], [r["high"] for r in part]),
            hovertext=[f"{r['term']}: x{r['ratio']:.3f} [{r['low']:.3f}-{r['high']:.3f}]" for r in part],
            hoverinfo="text"))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash"), annotation_text="no effect",
                  annotation_position="top left")
    fig.update_yaxes(title="throughput ratio, high level / low")
    return _finish(fig, _title(f"The screen: effects on throughput ({len(tables.get('design') or [])} windows)",
                               result, device))


def confirm_chart(result: Any, device: Any = None) -> go.Figure:
    """The confirmation (``docs/deciding.md``, stage 2): each winner's paired throughput ratio over the
    baseline with its 95% interval and its verdict, against the line at 1 and the minimum effect."""
    summary = result if isinstance(result, Mapping) else result.summary()
    rows = summary.get("confirmations") or []
    fig = go.Figure()
    for r in rows:
        ok = r.get("verdict") == "better"
        fig.add_trace(go.Scatter(
            x=[r["candidate"]], y=[r["ratio"]], mode="markers", name=f"{r['candidate'][:40]}: {r['verdict']}",
            marker=dict(size=12, color="#54a24b" if ok else "#9d9d9d", symbol="circle" if ok else "circle-open",
                        line=dict(width=2)),
            error_y=_error_bars([r["ratio"]], [r.get("low")], [r.get("high")]),
            hovertext=[f"{r['candidate']}: x{_num(r['ratio']):.3f} [{_num(r.get('low')):.3f}-{_num(r.get('high')):.3f}]"
                       f" after {r['pairs']} pairs: {r['verdict']}"], hoverinfo="text"))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash"), annotation_text="no gain", annotation_position="top left")
    effect = next((r.get("effect") for r in rows if r.get("effect")), None)
    if effect:
        fig.add_hline(y=1 + effect, line=dict(color="#54a24b", dash="dot"),
                      annotation_text=f"minimum effect +{100 * effect:.0f}%", annotation_position="bottom right")
    fig.update_yaxes(title="throughput ratio, winner / baseline")
    return _finish(fig, _title("The confirmation on fresh interleaved pairs", result, device))


def target_check_chart(result: Any, device: Any = None) -> go.Figure:
    """The target checks (``docs/deciding.md``, stage 3): every window's p99 against its rate, per
    configuration checked, the p99 target line and each capacity found (:func:`capacity_chart`)."""
    if isinstance(result, Mapping):
        caps = {c["configuration"]: c for c in result.get("target_checks") or []}
        target = result.get("target_p99_ms")
    else:
        caps = {label: cap for label, cap in (result.decision.checks if result.decision is not None else [])}
        target = result.target_p99_ms
    return capacity_chart(caps, device=device if device is not None else result, target_p99_ms=target)


def _capacity_summary(obj: Any) -> dict[str, Any] | None:
    """A capacity's ``summary()`` from a capacity object (anything with ``summary()`` giving ``probes``) or
    the summary itself."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return dict(obj)
    summary = getattr(obj, "summary", None)
    if callable(summary):
        return summary()
    raise TypeError(f"capacity_chart takes a capacity (with .summary()) or its summary dict, not {type(obj).__name__}")


def _count(value: Any) -> str:
    return str(value) if isinstance(value, int) and value >= 0 else "?"  # -1: a probe without its outcomes


def _capacities(obj: Any) -> dict[str, dict[str, Any]]:
    """One capacity (object or summary) or a mapping label -> capacity, as label -> summary."""
    if isinstance(obj, Mapping) and "probes" not in obj:
        out = {str(k): _capacity_summary(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v is not None}
    return {"": _capacity_summary(obj)}


_CONFIG_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2")


def _why_not(p: Mapping[str, Any]) -> str:
    """What a probe that did not pass says on the chart itself: its verdict and the rule that decided it (a
    failed probe's p99 can sit under the target line when errors or the over-target share decided it)."""
    return f"{p.get('verdict')}: {p.get('by')}" if p.get("verdict") != "fail" else f"fail: {p.get('by')}"


def _probe_hover(p: Mapping[str, Any], p99: float, label: str = "", unit: str = "req/s") -> str:
    """A capacity probe's hover text: its rate, verdict, counts, p50 and p99 with its interval."""
    return (f"{label + ': ' if label else ''}{_num(p.get('rate')):.1f} {unit}: {p.get('verdict')} by {p.get('by')} "
            f"({_count(p.get('exceed'))} of {p.get('n')} over the target or failed; {p.get('errors')} errors)"
            f"<br>p50 {_ms(p.get('p50_ms'))} ms, p99 " + (f"{p99:.0f}" if math.isfinite(p99) else "unbounded (over 1% failed)")
            + f" [{_ms(p.get('p99_low_ms'))}-{_ms(p.get('p99_high_ms'), 'unbounded')}] ms")


def capacity_chart(capacity: Any, device: Any = None, target_p99_ms: float | None = None) -> go.Figure:
    """The capacity search's probes: offered Poisson rate against the open-loop p99 with its interval
    (error bars; an upper end the outcomes cannot bound runs off the top edge), each probe marked pass or fail (its
    verdict and rule in the hover), the p99 target as a horizontal line and each capacity as a vertical one.

    ``capacity``: a capacity (``tuning.experiments.capacity.Capacity``), its ``summary()`` dict, or a mapping
    label -> either (``{"baseline": ..., "recommended": ...}``) to draw several on one chart. A probe whose
    p99 is unbounded (more than 1% of its outcomes failed) is drawn at the top edge as a triangle."""
    caps = _capacities(capacity)
    unit = next((c["unit"] for c in caps.values() if c.get("unit")), "req/s")  # texts/s where a request carries several
    target = target_p99_ms
    if target is None:
        target = next((_num(c.get("target_p99_ms")) for c in caps.values() if c.get("target_p99_ms") is not None),
                      None)
    finite = [v for c in caps.values() for p in c.get("probes") or []
              for v in (_num(p.get("p99_ms")), _num(p.get("p99_low_ms"))) if math.isfinite(v)]
    top = 1.15 * max(finite + ([target] if target is not None else []) + [1.0])
    fig = go.Figure()
    for i, (label, cap) in enumerate(caps.items()):
        color = _CONFIG_COLORS[i % len(_CONFIG_COLORS)]
        probes = sorted(cap.get("probes") or [], key=lambda p: _num(p.get("rate")))
        for passed in (True, False):
            part = [p for p in probes if bool(p.get("passed")) is passed]
            if not part:
                continue
            p99 = [_num(p.get("p99_ms")) for p in part]
            y = [v if math.isfinite(v) else top for v in p99]
            # an upper end the outcomes cannot bound (too few of them): the bar runs off the chart's top edge
            high = [p.get("p99_high_ms") if p.get("p99_high_ms") is not None else top * 3 for p in part]
            bars = _error_bars(p99, [p.get("p99_low_ms") for p in part], high)
            hover = [_probe_hover(p, v, label, unit) for p, v in zip(part, p99)]
            what = "pass" if passed else "fail"
            fig.add_trace(go.Scatter(
                x=[_num(p.get("rate")) for p in part], y=y, mode="markers" if passed else "markers+text",
                text=None if passed else [_why_not(p) for p in part], textposition="top center",
                textfont=dict(size=10, color="#e45756"),
                name=f"{label}: {what}" if label else what, legendgroup=label,
                marker=dict(size=12, color=color if passed else "#e45756",
                            symbol=["circle" if passed else "x" if math.isfinite(v) else "triangle-up" for v in p99],
                            line=dict(width=1, color=color)),
                error_y=bars, hovertext=hover, hoverinfo="text"))
        if cap.get("capacity") is not None:
            # labels stagger by capacity: the lowest reads left of its line, the others right, each lower
            # than the one before, so that two capacities close together do not print over each other
            rank = sorted((_num(c["capacity"]), k) for k, c in caps.items() if c.get("capacity") is not None).index(
                (_num(cap["capacity"]), label))
            fig.add_vline(x=_num(cap["capacity"]), line=dict(color=color, dash="dot"),
                          annotation_text=f"{label + ' ' if label else ''}capacity {_num(cap['capacity']):.1f} {unit}",
                          annotation_position="top left" if rank == 0 else "top right",
                          annotation_yshift=-18 * rank)
    if target is not None:
        fig.add_hline(y=target, line=dict(color="black", dash="dash"), annotation_text=f"p99 target {target:.0f} ms",
                      annotation_position="top left")
    if not any(c.get("probes") for c in caps.values()):
        fig.add_annotation(text="no capacity probe was run", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font=dict(size=14))
    fig.update_xaxes(title_text=f"offered Poisson rate ({unit})", rangemode="tozero")
    fig.update_yaxes(title_text="p99 latency from the scheduled arrival (ms)", range=[0, top * 1.02])
    fig.update_layout(showlegend=True)
    met = [f"{k + ' ' if k else ''}{_num(c['capacity']):.1f} {unit}" for k, c in caps.items()
           if c.get("capacity") is not None]
    what = f"capacity {', '.join(met)}" if met else "no rate met the target"
    fig = _finish(fig, _title(f"Capacity at the p99 target: each probe's p99 and its interval ({what})", None,
                              device), 460)
    # several configurations' pass/fail entries would squeeze the plot from the right: the legend goes under it
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.16, xanchor="left", x=0),
                      margin=dict(b=90))
    return fig


# --- tune: a service's own knobs -----------------------------------------------------------------

_TUNE_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#eeca3b", "#ff9da6", "#9d755d",
                "#bab0ac", "#e45756")


def _tune_summary(obj: Any) -> dict[str, Any]:
    """A tune result's ``summary()`` from the result (anything with ``summary()`` giving ``rows``) or the
    summary itself (tune.json, loaded)."""
    if isinstance(obj, Mapping) and "rows" in obj:
        return dict(obj)
    summary = getattr(obj, "summary", None)
    if callable(summary):
        return summary()
    raise TypeError(f"tune charts take a tune result (with .summary()) or its summary dict (tune.json), "
                    f"not {type(obj).__name__}")


def _first_line(text: Any, limit: int = 160) -> str:
    return _short((str(text or "").strip().splitlines() or [""])[0], limit)


def tune_chart(result: Any, device: Any = None) -> go.Figure:
    """``tune``'s exploration: each configuration's sustained throughput over the baseline's with its 95%
    interval, the shipped one in green, the capacity at the target written over the configurations checked,
    a configuration whose server failed a red cross at 1 with its error in the hover. ``result``: a
    ``TuneResult`` or its summary (tune.json)."""
    s = _tune_summary(result)
    rows = s.get("rows") or []
    names = list(s.get("space") or {})
    labels = _unique([" ".join(f"{k}={r.get(k)}" for k in names) for r in rows])
    best = s.get("best") or {}
    best_label = " ".join(f"{k}={best.get(k)}" for k in names) if best else None
    fig = go.Figure()
    ok = [i for i, r in enumerate(rows) if not r.get("error") and r.get("throughput_ratio") is not None]
    for shipped in (True, False):
        idx = [i for i in ok if (labels[i] == best_label) is shipped]
        if not idx:
            continue
        part = [rows[i] for i in idx]
        text = [f"capacity {_num(r['capacity']):.1f}" if r.get("capacity") is not None else
                ("target not met" if r.get("checked") else "") for r in part]
        fig.add_trace(go.Bar(
            x=[labels[i] for i in idx], y=[_num(r["throughput_ratio"]) for r in part],
            name="shipped" if shipped else "explored", marker_color="#54a24b" if shipped else "#4c78a8",
            error_y=_error_bars([r["throughput_ratio"] for r in part], [r.get("low") for r in part],
                                [r.get("high") for r in part]),
            text=text, textposition="outside", cliponaxis=False,
            hovertext=[f"{labels[i]}: x{_num(rows[i]['throughput_ratio']):.3f}, {_num(rows[i].get('qps')):.1f} req/s "
                       f"over {rows[i].get('windows')} windows" for i in idx], hoverinfo="text"))
    errors = [i for i, r in enumerate(rows) if r.get("error")]
    if errors:
        fig.add_trace(go.Scatter(x=[labels[i] for i in errors], y=[1.0] * len(errors), mode="markers", name="error",
                                 marker=dict(symbol="x", size=14, color="#e45756"),
                                 hovertext=[f"{labels[i]}: {_escape(_first_line(rows[i]['error']))}" for i in errors],
                                 hoverinfo="text"))
    if not rows:
        fig.add_annotation(text="no configuration was measured", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font=dict(size=14))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash"), annotation_text="the baseline",
                  annotation_position="top left")
    fig.update_xaxes(title_text=f"configuration ({', '.join(names)})" if names else "configuration", type="category")
    fig.update_yaxes(title_text="sustained throughput over the baseline's", rangemode="tozero")
    what = f"shipped: {best_label}" if best_label else "no configuration met the target"
    return _finish(fig, _title(f"tune: throughput per configuration ({what})", None, device), 460)


# --- the knob panel's figure ----------------------------------------------------------------

def panel_chart(result: Any, history: Sequence[Mapping[str, Any]] = (), device: Any = None) -> go.Figure:
    """The knob panel's figure: the last run's stage ledger (p50 ms per stage) and throughput per run.

    ``history``: one mapping per run with ``throughput`` and ``label`` (what changed).
    The trace count is fixed (one per stage, plus the history line) so a widget updates in place.
    """
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.14,  # room for "req/s"
                        subplot_titles=["last run: ms per request by stage (p50)", "throughput per run"])
    ledger = result.ledger()
    for stage in ledger.index:
        fig.add_trace(go.Bar(x=[float(ledger.loc[stage, "p50_ms"])], y=["p50"], name=stage, orientation="h",
                             marker_color=STAGE_COLORS.get(stage)), row=1, col=1)
    runs = list(history) or [{"throughput": throughput(result), "label": "this run"}]
    fig.add_trace(go.Scatter(x=list(range(1, len(runs) + 1)), y=[h["throughput"] for h in runs],
                             text=[h.get("label", "") for h in runs], mode="lines+markers+text",
                             textposition="top center", name="req/s", line=dict(color="black"),
                             cliponaxis=False), row=1, col=2)  # the last run's label is not cut at the edge
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ms", row=1, col=1)
    fig.update_xaxes(title_text="run", dtick=1, range=[0.5, len(runs) + 0.5], row=1, col=2)
    fig.update_yaxes(title_text="req/s", rangemode="tozero", row=1, col=2)
    s = result.summary()
    busy = f"model busy {pct(s.get('model_busy'))}"
    return _finish(fig, _title(f"{throughput(result):.1f} req/s, {busy}", result, device), 400)
