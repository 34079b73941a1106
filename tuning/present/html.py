"""The investigation's report: one self-contained HTML file that works offline.

plotly.js is inlined once in the head; every chart is a ``<div>`` drawn by it, with no external
script, stylesheet or font. Figures come from :mod:`tuning.viz`; each chart carries one sentence
computed from the numbers it shows. Sections: trends, the stage ledger before and after, the
ladder, the batch sweep, the what-if on the simulated device, and what to ship.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from typing import Any, Callable

import pandas as pd

from tuning.base.format import pct
from tuning.base.machine import machine_line

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:4px}h2{margin-top:40px;border-bottom:2px solid #eee;padding-bottom:4px}
.banner{padding:8px 12px;border-left:4px solid #1f5f2a;background:#e9f5ec;color:#1f5f2a;font-weight:600}
.banner.sim{border-color:#8a5a00;background:#fff4dc;color:#8a5a00}
.headline{font-size:1.15em;margin:12px 0}.muted{color:#666;font-size:.9em}
figure{margin:18px 0}figcaption{font-size:.95em;color:#333;margin-top:4px}
table{border-collapse:collapse;font-size:.88em;margin:10px 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.kept td{background:#f0f8f1}tr.dropped td{color:#777}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;white-space:pre-wrap}
.note{background:#fff8e6;padding:6px 10px;border-left:3px solid #e0a800}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _num(x: Any, digits: int = 1) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{float(x):.{digits}f}"


class _Charts:
    """Collects chart blocks; a figure that fails to build says so in the report instead of vanishing."""

    def __init__(self) -> None:
        self.count = 0

    def block(self, build: Callable[[], Any], sentence: Callable[[], str]) -> str:
        import plotly.io as pio

        try:
            fig = build()
            div = pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False,
                              config={"displaylogo": False, "responsive": True}, default_width="100%",
                              div_id=f"chart-{self.count}")
        except Exception as exc:  # a broken chart must not take the report down; it is reported, not hidden
            return f'<p class="note">chart unavailable: {_esc(type(exc).__name__)}: {_esc(exc)}</p>'
        try:
            text = sentence()
        except Exception as exc:
            text = f"(no summary sentence: {type(exc).__name__}: {exc})"
        self.count += 1
        return f'<figure class="chart">{div}<figcaption>{_esc(text)}</figcaption></figure>'


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}" data-section="{key}"><h2>{_esc(title)}</h2>{body}</section>'


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], row_class: Callable[[dict], str] | None = None) -> str:
    head = "".join(f"<th>{_esc(label)}</th>" for _, label in columns)
    body = []
    for r in rows:
        cls = f' class="{row_class(r)}"' if row_class else ""
        cells = []
        for key, _ in columns:
            v = r.get(key)
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            cells.append(f'<td class="num">{_esc(v)}</td>' if num else f"<td>{_esc('' if v is None else v)}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# --- sentences computed from the data -------------------------------------------------------------

def _window_busy(profile: Any) -> pd.DataFrame:
    """The busy-over-time series inside the measured window (warm-up and shutdown left out)."""
    busy = profile.to_frame("busy")
    w = profile.workload
    t0 = getattr(w, "t_window_start", profile.t_start) - profile.t_start
    t1 = getattr(w, "t_end", profile.t_end) - profile.t_start
    return busy[(busy.t >= t0) & (busy.t <= t1)]


def trend_sentence(profile: Any, name: str) -> str:
    busy = _window_busy(profile)
    avg = float(profile.workload.model_busy)
    text = f"{name}: model busy averaged {pct(avg)}"
    if len(busy):
        text += (f", between {pct(busy.busy.min())} and {pct(busy.busy.max())} per "
                 f"{profile.busy.window_s:g} s slice of the measured window")
    dev = float(getattr(profile.workload, "device_busy", math.nan))
    if math.isfinite(dev):
        text += f"; device busy {pct(dev)}"
    return text + f"; diagnosis: {profile.diagnosis.kind}."


def threads_sentence(profile: Any) -> str:
    top = profile.top_threads(2)
    host = profile.host.summary()
    if not top:
        return "No per-thread samples were taken (the window was shorter than one sampling interval)."
    text = f"The busiest thread was '{top[0]['name']}' at {top[0]['cpu_mean']:.0f}% of a core on average"
    if len(top) > 1:
        text += f", then '{top[1]['name']}' at {top[1]['cpu_mean']:.0f}%"
    if host.get("samples"):
        text += f"; the whole process used {host['cpu_percent_mean']:.0f}% of one core out of {host['cpu_count']}"
    return text + "."


def ledger_sentence(loads: dict[str, Any]) -> str:
    parts = []
    for name, load in loads.items():
        ledger = load.ledger()
        if ledger.p50_ms.notna().any():
            stage = str(ledger.p50_ms.idxmax())
            text = (f"{name}: {stage} is the largest stage ({ledger.loc[stage, 'p50_ms']:.1f} ms p50, "
                    f"{pct(ledger.loc[stage, 'share'])} of the p50 sum")
            work = ledger.drop(index=[s for s in ("queue_wait", "wait_for_model") if s in ledger.index])
            if stage not in work.index and work.p50_ms.notna().any():
                w = str(work.p50_ms.idxmax())
                text += f"; of the working stages {w} leads with {work.loc[w, 'p50_ms']:.1f} ms"
            if "inference" in ledger.index and stage != "inference":
                text += f"; inference {pct(ledger.loc['inference', 'share'])}"
            parts.append(text + ")")
    return "; ".join(parts) + "." if parts else "No successful requests to account for."


def _judged(ladder: Any) -> list[Any]:
    """The steps measured against a reference (the ones with a paired ratio)."""
    return [x for x in ladder.steps if x.status != "baseline" and _finite(x.figures.get("ratio"))]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(f: dict[str, Any], digits: int = 2) -> str:
    """``ratio [low-high]`` of a step's frozen figures, or ''."""
    if not _finite(f.get("ratio")):
        return ""
    return f"{f['ratio']:.{digits}f} [{_num(f.get('low'), digits)}-{_num(f.get('high'), digits)}]"


def _p99_span(p99: Any, low: Any, high: Any) -> str:
    """``p99 [low-high]`` in ms; an end the outcomes cannot bound as ``?``; ``unbounded`` for an infinite p99."""
    if p99 is None or (isinstance(p99, float) and math.isinf(p99)):
        return "unbounded"
    if not _finite(p99):
        return "n/a"
    lo = _num(low, 0) if _finite(low) else "?"
    hi = _num(high, 0) if _finite(high) else "?"
    return f"{p99:.0f} [{lo}-{hi}]"


def _capacity_text(cap: Any) -> str:
    """``16.7 req/s (next failing rate 18.2)`` or ``none``."""
    if cap is None:
        return "not searched"
    if not cap.met:
        return "none (no rate met the target)"
    hi = f"next failing rate {cap.high:.1f} req/s" if cap.high is not None else "no failing rate found above it"
    return f"{cap.capacity:.1f} req/s ({hi})"


def _compare_rate(ladder: Any) -> str:
    share = getattr(ladder.settings, "compare_at", None)
    if isinstance(share, (int, float)) and share != 1:
        return f"{100 * share:.0f}% of the reference's capacity"
    return "the reference's capacity"


def ladder_sentence(ladder: Any) -> str:
    steps = [x for x in ladder.steps if x.status != "baseline"]
    judged = _judged(ladder)
    kept = [x for x in judged if x.status == "kept"]
    failed = [x for x in steps if x.status == "failed"]
    text = f"{len(kept)} of {len(judged)} measured steps were kept"
    others = len(steps) - len(judged) - len(failed)
    if others or failed:
        text += f" ({others} skipped or refused" + (f", {len(failed)} failed while measuring" if failed else "") + ")"
    if ladder.objective == "target":
        text += (f"; capacity at p99 <= {ladder.target_p99_ms:.0f} ms: {_capacity_text(ladder.baseline_capacity)} "
                 f"at baseline, {_capacity_text(ladder.capacity)} recommended")
    else:
        b, r = ladder.baseline_figures.get("qps"), ladder.final_figures.get("qps")
        text += f"; closed-loop QPS {_num(b)} -> {_num(r)}"
    if judged:
        best = max(judged, key=lambda x: x.figures["ratio"])
        f = best.figures
        text += (f"; the largest paired ratio was {best.name} ({best.change}): {_interval(f)} after {f.get('pairs')} "
                 f"pairs, {best.status}")
        level, effect = f.get("level"), f.get("min_effect")
        if _finite(level) and _finite(effect):
            text += (f". A step is kept when the lower end of its {100 * level:.1f}% interval clears "
                     f"{1 + effect:.2f}" + (" and it meets the target at that rate" if ladder.objective == "target"
                                            else ""))
    return text + "."


def capacity_sentence(caps: dict[str, Any]) -> str:
    parts = []
    for label, cap in caps.items():
        text = f"{label}: {cap.sentence()}"
        if cap.note:
            text += f" ({cap.note})"
        estimated = [p for p in cap.probes if p.by == "estimate"]
        if estimated:
            text += (f"; {len(estimated)} of {len(cap.probes)} probes had too few outcomes to count and were decided "
                     "on the p99 estimate")
        parts.append(text)
    return "; ".join(parts) + "."


def sweep_sentence(sweep: Any) -> str:
    frame = sweep.to_frame()
    ok = frame[frame.status == "ok"].sort_values("batch_size") if "status" in frame else frame
    if ok.empty:
        return "No batch size could be measured."
    first, best = ok.iloc[0], ok.loc[ok.per_sample_ms.idxmin()]
    return (f"Per-sample cost goes from {first.per_sample_ms:.2f} ms at batch {int(first.batch_size)} to "
            f"{best.per_sample_ms:.2f} ms at batch {int(best.batch_size)} ({sweep.length} tokens each); the knee, the "
            f"smallest batch within 5% of the best, is batch {sweep.knee}.")


def waits_sentence(frame: pd.DataFrame, target: float, chosen: str) -> str:
    parts = []
    for r in frame.itertuples():
        f = {"ratio": r.ratio, "low": r.low, "high": r.high}
        at = f" at {r.rate:.1f} req/s" if _finite(r.rate) else " (closed loop)"
        parts.append(f"max_wait_ms={r.max_wait_ms:g} (batch {r.batch_size}): ratio {_interval(f)} after {r.pairs} "
                     f"pairs{at}, p99 {_num(r.p99_ms, 0)} ms, {r.status}")
    return "; ".join(parts) + f" (p99 target {target:.0f} ms; kept: {chosen})."


def precision_sentence(report: Any) -> str:
    from tuning.experiments.ladder import MIN_COSINE

    frame = report.to_frame()
    ok = frame[frame.status == "ok"]
    parts = [f"{r.dtype}: min cosine {r.min_cosine:.5f}, mean {r.mean_cosine:.5f} over {r.texts} texts"
             for r in ok.itertuples()]
    return "; ".join(parts) + f" (a dtype under {MIN_COSINE} is not recommended; measured on the real model)."


def what_if_sentence(what_if: dict[str, Any]) -> str:
    return " ".join(what_if.get("verdicts", []))


# --- the report -----------------------------------------------------------------------------------

def render_report(inv: Any) -> str:
    """The whole report for an :class:`~tuning.experiments.investigate.Investigation` as one HTML string."""
    from plotly.offline import get_plotlyjs

    from tuning import viz

    charts = _Charts()
    ladder = inv.ladder
    s = ladder.summary()
    dev = inv.device
    sections = []

    # trends
    body = []
    if inv.before.profile is not None:
        p = inv.before.profile
        d = p.diagnosis
        body.append(f'<p><b>Diagnosis at baseline: {_esc(d.kind.upper())}</b> ({_esc("; ".join(d.reasons))}). '
                    f"Next step: {_esc(d.next_step)}</p>")
        body.append(charts.block(lambda: viz.trend_chart(p), lambda: trend_sentence(p, "Baseline")))
        body.append(charts.block(lambda: viz.threads_chart(p), lambda: threads_sentence(p)))
    if inv.after is not None and inv.after.profile is not None:
        pa = inv.after.profile
        body.append(charts.block(lambda: viz.trend_chart(pa), lambda: trend_sentence(pa, "Recommended")))
    sections.append(_section("trends", "Where the time went: trends under load", "".join(body)))

    # ledger before / after
    loads = {"baseline": inv.before.load}
    after_load = inv.after.load if inv.after is not None else ladder.final.last_load
    if after_load is not None:
        loads["recommended"] = after_load
    loads = {k: v for k, v in loads.items() if v is not None}
    body = ['<p>Per-request time by stage (ok requests), p50 next to p99: where a request spends its time.</p>']
    if loads:
        body.append(charts.block(lambda: viz.ledger_chart(loads, device=dev), lambda: ledger_sentence(loads)))
    sections.append(_section("ledger", "The stage ledger, before and after", "".join(body)))

    # ladder
    rows = ladder.to_frame().astype(object).where(lambda f: f.notna(), None).to_dict("records")
    for r in rows:
        for key in ("model_busy", "device_busy"):
            r[key] = pct(r[key]) if r[key] is not None else None
        r["gain"] = f"{100 * r['gain']:+.1f}%" if r["gain"] is not None else None
        r["qps"] = round(r["qps"], 1) if r["qps"] is not None else None
        r["p99_ms"] = round(r["p99_ms"]) if r["p99_ms"] is not None else None
    table = _table(rows, [("step", "step"), ("change", "change"), ("qps", "QPS"), ("p99_ms", "p99 ms"),
                          ("model_busy", "model busy"), ("device_busy", "device busy"), ("gain", "vs previous"),
                          ("runs", "runs"), ("status", "status"), ("reason", "why")],
                   lambda r: "kept" if r["kept"] else "dropped")
    measured = ladder.to_frame()
    measured = measured[measured.qps.notna()].reset_index(drop=True)
    measured.attrs["device"] = dev
    body = [f"<p>Closed-loop load at concurrency {ladder.settings.concurrency}, {ladder.settings.duration_s:g} s "
            f"measured per run after {ladder.settings.warmup_s:g} s of warm-up, the same requests in the same order. "
            "A step is kept only if its QPS beats the step before by more than the run-to-run spread; a gain within "
            "the spread is measured again before it is judged.</p>", table,
            charts.block(lambda: viz.ladder_chart(measured, device=dev), lambda: ladder_sentence(ladder))]
    if ladder.waits is not None:
        chosen = ladder.step("batching").change if any(x.name == "batching" for x in ladder.steps) else "-"
        body.append(charts.block(lambda: viz.load_sweep_chart(ladder.waits, "max_wait_ms", device=dev),
                                 lambda: waits_sentence(ladder.waits, ladder.target_p99_ms, chosen)))
    if hasattr(ladder.precision, "cosines"):
        body.append(charts.block(lambda: viz.precision_chart(ladder.precision), lambda: precision_sentence(ladder.precision)))
    sections.append(_section("ladder", "The ladder: one change at a time", "".join(body)))

    # batch sweep and buckets
    body = []
    if ladder.sweep is not None and hasattr(ladder.sweep, "to_frame"):
        body.append(charts.block(lambda: viz.batch_sweep_chart(ladder.sweep, device=dev),
                                 lambda: sweep_sentence(ladder.sweep)))
    else:
        body.append("<p>No batch sweep was run.</p>")
    if ladder.buckets:
        b = ladder.buckets
        body.append(f"<p>Planned buckets: <code>{_esc(','.join(map(str, b['buckets'])))}</code> ({b['k']} shapes, "
                    f"padding waste {100 * b['waste']:.0f}%, target {100 * b['waste_target']:.0f}%); token lengths "
                    f"p50 {b['lengths']['p50']:.0f}, p90 {b['lengths']['p90']:.0f}, max {b['lengths']['max']}.</p>")
    sections.append(_section("sweep", "Batch sweep and its knee", "".join(body)))

    # what-if
    wi = inv.what_if or {}
    if wi.get("runs"):
        runs = {f"{name} ({wi['profile']})": t for name, t in wi["runs"].items()}
        sim_loads = {name: t.load for name, t in runs.items() if t.load is not None}
        body = [f'<div class="banner sim">SIMULATED DEVICE: {_esc(wi["profile"])} ({_esc(wi.get("source"))}). The host '
                "pipeline ran for real on this machine; only the model call is a stand-in timed by the cost model. "
                "Accuracy is never simulated.</div>",
                charts.block(lambda: viz.throughput_chart(runs, device=wi["label"]), lambda: what_if_sentence(wi)),
                charts.block(lambda: viz.ledger_chart(sim_loads, device=wi["label"]),
                             lambda: ledger_sentence(sim_loads))]
        base_profile = wi["runs"]["baseline"].profile
        if base_profile is not None:
            body.append(charts.block(lambda: viz.trend_chart(base_profile),
                                     lambda: trend_sentence(base_profile, f"Baseline on the {wi['profile']} stand-in")))
        sections.append(_section("what-if", f"What if: {wi['label']}", "".join(body)))
    elif wi.get("skipped"):
        sections.append(f'<section id="what-if-skipped"><h2>What if</h2><p>Left out: {_esc(wi["skipped"])}.</p>'
                        "</section>")

    # what to ship
    rec = s["recommended"]
    change_rows = [{"knob": k, "baseline": _knob(getattr(ladder.baseline, k, None)), "recommended": _knob(v)}
                   for k, v in rec["changes"].items()]
    body = [f"<p>Measured on {_esc(dev['label'])}. Serve it:</p>",
            f"<pre>python -m tuning serve {_esc(rec['set_line'])}</pre>",
            "<p>or from Python:</p>",
            f"<pre>import tuning\nknobs = {_esc(rec['python_call'])}</pre>",
            _table(change_rows, [("knob", "knob"), ("baseline", "baseline"), ("recommended", "recommended")])
            if change_rows else "<p>No change beat the run-to-run spread: keep the baseline.</p>"]
    sections.append(_section("ship", "What to ship", "".join(body)))

    # environment
    # the machine is in the header; the rest of environment.json here
    env_rows = [{"what": k, "value": _knob(v)} for k, v in inv.environment.items() if k != "machine"]
    data_rows = [{"what": k, "value": _knob(v)} for k, v in inv.data.items()]
    sections.append(_section("environment", "Environment and input", _table(env_rows, [("what", ""), ("value", "")])
                             + _table(data_rows, [("what", ""), ("value", "")])))

    banner_cls = "banner sim" if dev.get("simulated") else "banner"
    head = (f'<h1>Investigation: where the time goes and what to ship</h1>'
            f'<p class="muted">{_dt.datetime.now().isoformat(timespec="seconds")} · '
            f'{"quick" if inv.quick else "full"} run · {inv.wall_s:.0f} s · data {_esc(inv.data.get("path"))} '
            f'({inv.data.get("lines")} lines, {inv.data.get("invalid")} invalid)</p>'
            f'<div class="{banner_cls}">{_esc(dev.get("banner") or dev["label"])}</div>'
            + (f'<p class="muted">{_esc(machine_line(inv.environment["machine"]))}</p>'
               if inv.environment.get("machine") else "")
            + (f'<p class="note">Note: {_esc(inv.environment["contended"])}.</p>' if inv.environment.get("contended")
               else "")
            + f'<p class="headline">QPS <b>{_num(s["baseline"]["qps"])} → {_num(s["result"]["qps"])}</b>, p99 '
            f'<b>{_num(s["baseline"]["p99_ms"], 0)} → {_num(s["result"]["p99_ms"], 0)} ms</b> (target '
            f'{ladder.target_p99_ms:.0f} ms), model busy {pct(s["baseline"]["model_busy"])} → '
            f'{pct(s["result"]["model_busy"])}. Ship: <code>{_esc(rec["set_line"])}</code></p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>tuning investigate report</title>"
            f"<style>{_CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script>'
            f"</head><body>{head}{''.join(sections)}</body></html>\n")


def _knob(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_knob(x)}" for k, x in v.items())
    return v
