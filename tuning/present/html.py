"""The investigation's report: one self-contained HTML file that works offline.

plotly.js is inlined once in the head; every chart is a ``<div>`` drawn by it, with no external
script, stylesheet or font. Figures come from :mod:`tuning.viz`; each chart carries one sentence
computed from the numbers it shows. The head: a banner when the target was not met (or the run was cut
short), and the headline: the confirm run against the baseline (capacity and p99 with their intervals).
Sections: trends, the stage ledger before and after, the capacity at the target (every probe), the
ladder (each step's paired ratio with its interval), the batch sweep, the what-if on the simulated
device, and what to ship.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import re
from typing import Any, Callable, Sequence

import pandas as pd

from tuning.base.format import fixed, pct
from tuning.base.machine import machine_line
from tuning.present.tables import counted
from tuning.profile.hostcores import GIL_CORE, GIL_CROSS_CORE

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:4px}h2{margin-top:40px;border-bottom:2px solid #eee;padding-bottom:4px}
.banner{padding:8px 12px;border-left:4px solid #1f5f2a;background:#e9f5ec;color:#1f5f2a;font-weight:600}
.banner.sim{border-color:#8a5a00;background:#fff4dc;color:#8a5a00}
.banner.miss{border-color:#a4161a;background:#fdecea;color:#a4161a;margin:8px 0}
.headline{font-size:1.15em;margin:12px 0}.muted{color:#666;font-size:.9em}
figure{margin:18px 0}figcaption{font-size:.95em;color:#333;margin-top:4px}
table{border-collapse:collapse;font-size:.88em;margin:10px 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.kept td{background:#f0f8f1}tr.dropped td{color:#777}tr.failed td{background:#fdecea}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;white-space:pre-wrap}
.note{background:#fff8e6;padding:6px 10px;border-left:3px solid #e0a800}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


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


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(f: dict[str, Any], digits: int = 2) -> str:
    """``ratio [low-high]`` of a row's figures, or ''."""
    if not _finite(f.get("ratio")):
        return ""
    return f"{f['ratio']:.{digits}f} [{fixed(f.get('low'), f'.{digits}f')}-{fixed(f.get('high'), f'.{digits}f')}]"


def _p99_span(p99: Any, low: Any, high: Any) -> str:
    """``p99 [low-high]`` in ms; an end the outcomes cannot bound as ``?``; ``unbounded`` for an infinite p99."""
    if p99 is None or (isinstance(p99, float) and math.isinf(p99)):
        return "unbounded"
    if not _finite(p99):
        return "n/a"
    lo = fixed(low, ".0f") if _finite(low) else "?"
    hi = fixed(high, ".0f") if _finite(high) else "?"
    return f"{p99:.0f} [{lo}-{hi}]"


def _capacity_text(cap: Any) -> str:
    """``16.7 req/s (the next rate up, 18.2, did not pass)`` or ``none``."""
    if cap is None:
        return "not checked"
    if not cap.met:
        return "none (no rate met the target)"
    hi = (f"the next rate up, {cap.high:.1f}, did not pass" if cap.high is not None
          else "the highest fraction of its throughput passed")
    return f"{cap.capacity:.1f} req/s ({hi})"


def screen_sentence(ladder: Any) -> str:
    """What the screen found: the factors in the model with their ratios, and the winner."""
    d = ladder.decision
    if d is None or d.explored is None:
        return "The screen did not run."
    tables = d.explored.tables
    kept = [e for e in tables.get("effects", []) if e["kept"]]
    said = "; ".join(f"{e['term']} x{e['ratio']:.2f} [{e['low']:.2f}-{e['high']:.2f}]" for e in kept) or "none"
    again = tables.get("measured_again") or []
    return (f"{len(tables.get('design', []))} windows screened {len(tables.get('factors', []))} factors; terms in the "
            f"model: {said}" + (f"; {len(again)} window(s) the model could not explain were measured again" if again
                                else "") + f". Ranked first: {d.explored.candidates[0].label}."
            if d.explored.candidates else ".")


def confirm_sentence(ladder: Any) -> str:
    d = ladder.decision
    if d is None or not d.confirmations:
        return "No confirmation ran: the screen's best is the baseline."
    return "; ".join(f"{c.label}: {c.row()['verdict']} after {c.row()['pairs']} pairs, "
                     f"x{_interval(c.row()) or '?'} over the baseline" for c in d.confirmations) + "."


def capacity_sentence(caps: dict[str, Any]) -> str:
    parts = []
    for label, cap in caps.items():
        text = f"{label}: {cap.sentence()}"
        if cap.note:
            text += f" ({cap.note})"
        open_ = [p for p in cap.judged if p.verdict == "indeterminate"]
        if open_:
            text += (f"; {len(open_)} of {len(cap.judged)} windows were indeterminate (the share's interval held "
                     "1%), which does not pass")
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


def precision_sentence(report: Any) -> str:
    from tuning.experiments.factors import MIN_COSINE

    frame = report.to_frame()
    ok = frame[frame.status == "ok"]
    parts = [f"{r.dtype}: min cosine {r.min_cosine:.5f}, mean {r.mean_cosine:.5f} over {r.texts} texts"
             for r in ok.itertuples()]
    return "; ".join(parts) + f" (a dtype under {MIN_COSINE} is not recommended; measured on the real model)."


def what_if_sentence(what_if: dict[str, Any]) -> str:
    return " ".join(what_if.get("verdicts", []))


# --- the report -----------------------------------------------------------------------------------

def _headline(inv: Any) -> str:
    """Capacity at the target before and after (the target checks), and the run under the recorder."""
    ladder = inv.ladder
    t = ladder.target_p99_ms
    if ladder.objective == "target":
        base, rec = ladder.baseline_capacity, ladder.capacity
        text = (f"Capacity at p99 ≤ {t:.0f} ms (errors within {100 * ladder.settings.error_budget:.1f}%): baseline "
                f"<b>{_esc(_capacity_text(base))}</b> → recommended <b>{_esc(_capacity_text(rec))}</b>.")
        best = rec.best if rec is not None else None
        if best is not None:
            text += (f" There: p99 {_esc(_p99_span(best.p99_ms, best.p99_low_ms, best.p99_high_ms))} ms (95% "
                     f"interval), {best.errors} of {best.n} failed.")
    else:
        b, r = ladder.baseline_figures, ladder.final_figures
        text = (f"Closed-loop QPS at concurrency {ladder.settings.concurrency}: baseline <b>{fixed(b.get('qps'))}</b> → "
                f"recommended <b>{fixed(r.get('qps'))}</b> (p99 target {t:.0f} ms).")
    if inv.after is not None:
        at = f"open loop at {inv.recorder_rate:.1f} req/s" if inv.recorder_rate else "closed loop"
        text += (f" Under the recorder ({_esc(at)}): p99 {fixed(inv.after.p99_ms, '.0f')} ms, "
                 f"{inv.after.failed} of {inv.after.submitted} failed.")
    if "-?]" in text or "[?-" in text:
        text += " (Intervals are 95%; '?': too few outcomes to bound that end.)"
    return text


def _share(p: Any) -> str | None:
    if p.share is None:
        return None
    return f"{100 * p.share:.2f} [{100 * (p.share_low or 0):.2f}-{100 * (p.share_high or 0):.2f}]"


def _probe_rows(cap: Any) -> list[dict[str, Any]]:
    return [{"rate": round(p.rate, 1), "passed": p.passed, "verdict": p.verdict, "n": p.n, "share": _share(p),
             "errors": p.errors, "p50": fixed(p.p50_ms, ".0f"), "p99": _p99_span(p.p99_ms, p.p99_low_ms, p.p99_high_ms),
             "lag": fixed(p.lag_p99_ms, ".1f") if p.lag_p99_ms is not None else None} for p in cap.judged]


_PROBE_COLUMNS = [("rate", "offered rate (req/s)"), ("passed", "passed"), ("verdict", "verdict"), ("n", "outcomes"),
                  ("share", "% over target or failed [one-sided 95% bounds]"), ("errors", "failed"),
                  ("p50", "p50 (ms)"), ("p99", "p99 [95% interval] (ms)"), ("lag", "client send lag p99 (ms)")]


def _step_rows(ladder: Any) -> list[dict[str, Any]]:
    return [{"step": x.name, "change": x.change, "status": x.status, "ratio": _interval(x.figures) or None,
             "why": x.reason, "kept": x.status in ("shipped", "moved", "confirmed", "met")} for x in ladder.steps]


# the report reads top-down: what to ship, why (the engine's evidence), what was tried, then where the time went
REPORT_ORDER = ("ship", "decision", "sweep", "trends", "ledger", "what-if", "environment")
SERVICE_ORDER = ("ship", "target", "configurations", "throughput", "diagnosis")


def top_down(sections: list[str], order: Sequence[str]) -> list[str]:
    """``sections`` in ``order`` of their keys (a key not named keeps its place after those that are)."""
    def key(html: str) -> int:
        found = re.search(r'data-section="([\w-]+)"', html)
        name = found.group(1) if found else ""
        return order.index(name) if name in order else len(order)
    return sorted(sections, key=key)


def render_report(inv: Any) -> str:
    """The whole report for an :class:`~tuning.experiments.investigate.Investigation` as one HTML string."""
    from tuning import viz
    from tuning.experiments.investigate import MET, MISSED, headline, not_stable

    charts = _Charts()
    ladder = inv.ladder
    s = ladder.summary()
    dev = inv.device
    settings = ladder.settings
    target = ladder.target_p99_ms
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
        body.append(charts.block(lambda: viz.trend_chart(pa),
                                 lambda: trend_sentence(pa, "Recommended (its run under the recorder)")))
    sections.append(_section("trends", "Where the time went: trends under load", "".join(body)))

    # ledger before / after, like for like: both in the same closed loop
    same = getattr(inv, "after_same_load", None)
    loads = {"baseline": inv.before.load, "recommended": same.load if same is not None else None}
    loads = {k: v for k, v in loads.items() if v is not None}
    body = ["<p>Per-request time by stage (ok requests), p50 next to p99: where a request spends its time. "
            f"{'Both' if 'recommended' in loads else 'The baseline'} in a closed loop at concurrency "
            f"{settings.concurrency}, recorder on (the target check's windows ran with the recorder off)"
            + ("" if "recommended" in loads else "; no change was shipped, so there is no after") + ".</p>"]
    if loads:
        body.append(charts.block(lambda: viz.ledger_chart(loads, device=dev), lambda: ledger_sentence(loads)))
    sections.append(_section("ledger", "The stage ledger, before and after", "".join(body)))

    # the decision: screen, confirmation, target checks
    body = ["<p>How the engine decides is on one page, <code>docs/deciding.md</code>: a two-level factorial screen "
            "of the knobs on sustained throughput (closed loop, ok answers a second), a confirmation of each "
            "candidate against the baseline on fresh interleaved pairs (a group-sequential test at a "
            f"{100 * settings.engine.alpha:.1f}% false-'better' rate), and a target check of the confirmed candidates "
            "and the baseline on a warm server, open loop, at descending rates from their throughput; the capacity is "
            "the highest rate that passed (how a window passes is on that page).</p>",
            _table(_step_rows(ladder), [("step", "step"), ("change", "change"), ("status", "status"),
                                        ("ratio", "ratio [interval]"), ("why", "why")],
                   lambda r: "kept" if r["kept"] else "dropped")]
    d = ladder.decision
    if d is not None and d.explored is not None and d.explored.tables.get("effects"):
        body.append(charts.block(lambda: viz.effects_chart(ladder, device=dev), lambda: screen_sentence(ladder)))
        top = ladder.top()
        if len(top):
            body.append("<p>The configurations ranked by the screen's model (throughput over the baseline's):</p>")
            body.append(_table(top.to_dict("records"), [("rank", "rank"), ("change", "change"),
                                                        ("throughput_ratio", "throughput ratio"), ("qps", "QPS")]))
    if d is not None and d.confirmations:
        body.append(charts.block(lambda: viz.confirm_chart(ladder, device=dev), lambda: confirm_sentence(ladder)))
    caps = {label: cap for label, cap in (d.checks if d is not None else [])}
    if caps:
        body.append(charts.block(lambda: viz.target_check_chart(ladder, device=dev), lambda: capacity_sentence(caps)))
        for label, cap in caps.items():
            body.append(f"<p><b>{_esc(label)}</b>: {_esc(cap.sentence())}</p>")
            body.append(_table(_probe_rows(cap), _PROBE_COLUMNS, lambda r: "kept" if r["passed"] else "dropped"))
    if d is not None and d.indeterminate:
        body.append(f'<p class="note">{_esc(d.indeterminate)}</p>')
    why = ladder.why_unchanged()
    if why:
        body.append(f"<p>Nothing changed: {_esc(why)}.</p>")
    if hasattr(ladder.precision, "cosines"):
        body.append(charts.block(lambda: viz.precision_chart(ladder.precision), lambda: precision_sentence(ladder.precision)))
    sections.append(_section("decision", "The decision: screen, confirmation, target check", "".join(body)))

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
    if ladder.sweep is not None and ladder.recommended is not None:
        shipped = ladder.recommended.batch_size
        body.append("<p>The sweep times the model call alone, at one fixed shape, outside any load; whether a larger "
                    "batch pays end to end (the host stages, the queue it builds, real lengths padded) is what the "
                    f"decision above measured. Shipped: <code>batch_size={_esc(shipped)}</code>.</p>")
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
        cores = wi.get("host_cores") or {}
        if cores:
            body.append("<h3>Host cores needed</h3><ul>" + "".join(f"<li>{_esc(c['sentence'])}</li>" for c in cores.values())
                        + "</ul><p>Host CPU per request per thread is measured on this host; the device's busy share "
                        "and capacity are SIMULATED. The Python threads of one server process share one GIL (taken as "
                        f"{GIL_CORE} of a core, the most its threads get, so the processes are a lower bound; the same work "
                        f"costs {GIL_CROSS_CORE}x the CPU on 2+ cores as on one), so the "
                        "answer says how many processes it assumes.</p>")
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
    outcome = inv.outcome
    decided = outcome in (MET, MISSED)  # a run still going, or cut short before its verdict, ships nothing
    body = []
    if outcome == MISSED:
        body.append(f'<p class="note">TARGET NOT MET: no configuration measured met p99 ≤ {target:.0f} ms. What '
                    "follows is the closest configuration, not one that meets the target.</p>")
    if decided:
        body += [f"<p>Measured on {_esc(dev['label'])}. Serve it:</p>",
                 f"<pre>python -m tuning serve {_esc(rec['set_line'])}</pre>",
                 "<p>or from Python:</p>",
                 f"<pre>import tuning\nknobs = {_esc(rec['python_call'])}</pre>",
                 _table(change_rows, [("knob", "knob"), ("baseline", "baseline"), ("recommended", "recommended")])
                 if change_rows else "<p>No change was confirmed: keep the baseline.</p>"]
    else:
        body.append(f"<p>Nothing to ship yet: the run is {_esc(outcome)} (the engine decides after its target "
                    "check). The tables below hold what was measured.</p>")
    sections.append(_section("ship", "What to ship", "".join(body)))

    # environment
    env_rows = environment_rows(inv.environment)
    data_rows = [{"what": k, "value": _knob(v)} for k, v in inv.data.items()]
    sections.append(_section("environment", "Environment and input", _table(env_rows, [("what", ""), ("value", "")])
                             + _table(data_rows, [("what", ""), ("value", "")])))

    banner_cls = "banner sim" if dev.get("simulated") else "banner"
    alerts = ""
    if inv.interrupted and decided:  # cut short before its verdict, the headline says so itself
        alerts += ('<div class="banner miss">INTERRUPTED after the verdict: the profile of the recommended '
                   f"configuration is missing. <code>--resume {_esc(inv.out)}</code> adds it.</div>")
    if outcome == MISSED:
        alerts += (f'<div class="banner miss">TARGET NOT MET: no configuration kept p99 ≤ {target:.0f} ms '
                   f"(errors within {100 * settings.error_budget:.1f}%) at any rate tried. The recommendation below is "
                   "the closest measured, not one that meets the target.</div>")
    head = (f'<h1>Investigation: where the time goes and what to ship</h1>'
            f'<p class="muted">{_dt.datetime.now().isoformat(timespec="seconds")} · '
            f'{"quick" if inv.quick else "full"} run · {inv.wall_s:.0f} s · data {_esc(inv.data.get("path"))} '
            f'({inv.data.get("lines")} lines, {inv.data.get("invalid")} invalid)</p>'
            + alerts
            + f'<div class="{banner_cls}">{_esc(dev.get("banner") or dev["label"])}</div>'
            + (f'<p class="muted">{_esc(machine_line(inv.environment["machine"]))}</p>'
               if inv.environment.get("machine") else "")
            + (f'<p class="note">Note: {_esc(inv.environment["contended"])}.</p>' if inv.environment.get("contended")
               else "")
            + (f'<div class="banner sim">{_esc(not_stable(inv))}</div>' if not_stable(inv) else "")
            + (f'<p class="headline">{_headline(inv)} Ship: <code>{_esc(rec["set_line"])}</code></p>'
               f'<p class="muted">{_esc(headline(inv))}</p>' if decided
               else f'<p class="headline">{_esc(headline(inv))}</p>'))
    return _page("tuning investigate report", head + "".join(top_down(sections, REPORT_ORDER)))


def _page(title: str, body: str) -> str:
    """One self-contained page: the style and plotly.js inlined in the head (no CDN, works offline)."""
    from plotly.offline import get_plotlyjs

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title>"
            f"<style>{_CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script>'
            f"</head><body>{body}</body></html>\n")


def tune_probes_sentence(s: dict[str, Any]) -> str:
    """What the target checks' chart shows, from tune's summary."""
    checks = s.get("target_checks") or []
    windows = sum(len(c.get("probes") or []) for c in checks)
    t = s.get("target_p99_ms")
    best = s.get("best")
    unit = next((c["unit"] for c in checks if c.get("unit")), "req/s")
    tail = (f" The shipped configuration held p99 {fixed(best.get('p99_ms'), '.0f')} ms at "
            f"{fixed(best.get('capacity'), '.1f')} {unit}." if best else
            f" No configuration checked kept p99 within {fixed(t, '.0f')} ms at any rate tried.")
    return (f"{counted(windows, 'target window')} over {counted(len(checks), 'configuration')}, at descending "
            "fractions of each one's "
            f"open-loop ceiling: each rate against its open-loop p99 (from the scheduled arrival, every outcome), "
            f"the {fixed(t, '.0f')} ms target dashed." + tail)


def tune_throughput_sentence(s: dict[str, Any]) -> str:
    """What the throughput chart shows, from tune's summary."""
    rows = s.get("rows") or []
    errors = [r for r in rows if r.get("error")]
    head = (f"{counted(len(rows), 'configuration')} explored on sustained throughput ({s.get('search')})"
            + (f", {len(errors)} failed (their error in the table)" if errors else "") + ".")
    for c in s.get("confirmations") or []:
        head += (f" Confirmation of {c['candidate']} against the baseline: {c['verdict']} after {c['pairs']} pairs, "
                 f"x{fixed(c.get('ratio'), '.3f')} [{fixed(c.get('low'), '.3f')}-{fixed(c.get('high'), '.3f')}].")
    if s.get("indeterminate"):
        head += f" Note: {s['indeterminate']}."
    return head + " Error bars: 95% intervals of each configuration's throughput over the baseline's."




def shipped_capacity(s: dict[str, Any]) -> float:
    """The capacity a tune summary ships (``capacity``: the held rate where its claim was held), or in a
    tune.json written before holds, its best configuration's claim."""
    return s["capacity"] if s.get("capacity") is not None else s["best"]["capacity"]


def render_tune(result: Any, resume_dir: Any = None, title: str = "tune: the service's own knobs",
                extra: str = "") -> str:
    """``tune``'s page (tune.html): the table, the exploration, the confirmation, the target checks, the
    command line to run. ``result``: a ``TuneResult`` or its summary (tune.json, loaded); ``resume_dir``: where
    ``--resume`` would go on from (named in the banner of a run cut short)."""
    from tuning import viz
    from tuning.experiments.search import shown
    from tuning.experiments.verify import held_sentence
    from tuning.present.tables import run_it, tune_rows

    s = dict(result) if isinstance(result, dict) else result.summary()
    space = list(s.get("space") or {})
    target = s.get("target_p99_ms")
    charts = _Charts()
    unit = (s.get("windows") or {}).get("engine", {}).get("unit") or "req/s"
    rows = tune_rows(s.get("rows") or [], space, unit)
    columns = [(k, k) for k in (list(rows[0]) if rows else space)]
    errors = [r for r in s.get("rows") or [] if r.get("error")]
    best = s.get("best")
    table = _table(rows, columns, lambda r: "failed" if r[f"throughput {unit}"] == "error" else "kept")
    body = ["<p>How tune decides is on one page, <code>docs/deciding.md</code>: every configuration's sustained "
            "throughput (closed loop, its server started once and kept warm), the best confirmed against the "
            "baseline (the first value of every <code>--space</code>) on interleaved pairs, then the target checked "
            f"for both at descending fractions of their open-loop ceiling (p99 ≤ {fixed(target, '.0f')} ms).</p>", table]
    if errors:
        body.append("<ul>" + "".join(f"<li>error in {_esc(shown(' '.join(f'{k}={r.get(k)}' for k in space)))}: "
                                     f"<pre>{_esc(r['error'])}</pre></li>" for r in errors) + "</ul>")
    sections = [_section("configurations", "Configurations", "".join(body)),
                _section("throughput", "Exploration and confirmation",
                         charts.block(lambda: viz.tune_chart(s), lambda: tune_throughput_sentence(s))),
                _section("target", "Target checks",
                         charts.block(lambda: viz.target_check_chart(s), lambda: tune_probes_sentence(s)))]
    verified = s.get("verified")
    held = verified is None or verified.get("held") is not None
    if best and held:
        how, what = run_it(s)
        cap = shipped_capacity(s)
        ship = ([f"<p>{cap:.1f} {unit} at p99 ≤ {fixed(target, '.0f')} ms. Run it ({{port}}: "
                 "your port):</p>", f"<pre>{_esc(what)}</pre>"] if how == "run it" else
                [f"<p>{cap:.1f} {unit} at p99 ≤ {fixed(target, '.0f')} ms. Your client: "
                 f"{_esc(what)}.</p>"])
        if verified:
            ship.append(f"<p>{_esc(held_sentence(verified))}.</p>")
        if s.get("indeterminate"):
            ship.append(f'<p class="note">{_esc(s["indeterminate"])}.</p>')
        sections.append(_section("ship", "What to run", "".join(ship)))
    alerts = ""
    if s.get("interrupted"):
        again = f" Go on with <code>--resume {_esc(resume_dir)}</code>." if resume_dir is not None else ""
        when = "after its verdict" if best else "before a verdict: nothing was decided"
        alerts += (f'<div class="banner miss">INTERRUPTED {when}; this page holds the windows '
                   f"measured.{again}</div>")
    if s.get("error"):
        alerts += f'<div class="banner miss">NOT DECIDED: {_esc(s["error"])}</div>'
    elif not best and not s.get("interrupted"):
        alerts += (f'<div class="banner miss">TARGET NOT MET: no configuration checked kept p99 ≤ '
                   f'{fixed(target, ".0f")} ms at any rate tried.</div>')
    elif not held:
        lead = "NOT SHIPPED" if verified.get("interrupted") or verified.get("error") else "TARGET NOT MET when held"
        alerts += (f'<div class="banner miss">{lead}: its target check claimed '
                   f'{best["capacity"]:.1f} {unit}; {_esc(held_sentence(verified))}.</div>')
    resumed = s.get("resumed") or 0
    head = ("<h1>tune: the service's own knobs</h1>"
            f'<p class="muted">{_dt.datetime.now().isoformat(timespec="seconds")} · '
            f'{counted(s.get("configurations") or 0, "configuration")} ({_esc(s.get("search"))})'
            + (f" · {resumed} windows from the earlier run (--resume)" if resumed else "")
            + f' · target p99 ≤ {fixed(target, ".0f")} ms · measured on the running service</p>'
            + (f'<p class="muted">command: <code>{_esc(s.get("cmd"))}</code></p>' if s.get("cmd") else "")
            + alerts
            + (f'<p class="headline">Ship: {_esc(" ".join(f"{k}={best.get(k)}" for k in space))} at '
               f'{shipped_capacity(s):.1f} {unit}{" (held)" if verified else ""}.</p>' if best and held else ""))
    return _page("tuning tune report", head.replace("<h1>tune: the service's own knobs</h1>", f"<h1>{_esc(title)}</h1>")
                 + "".join(top_down(sections + ([extra] if extra else []), SERVICE_ORDER)))


ENV_SHOWN_ELSEWHERE = ("machine", "contended", "schema_version")  # the header, its note, the file's own version


def environment_rows(environment: dict[str, Any]) -> list[dict[str, Any]]:
    """environment.json as the report's table: each fact once and only facts (no empty row for what this
    machine lacks, nothing the header or its notes already say; the device by its label, the simulated
    profile by its name, source and use)."""
    rows = []
    for k, v in environment.items():
        if k in ENV_SHOWN_ELSEWHERE or v is None or v == "" or v == [] or v == {}:
            continue
        if k == "device" and isinstance(v, dict):
            v = v.get("label") or v.get("name")
        elif k == "sim_profile" and isinstance(v, dict):
            v = {key: v[key] for key in ("name", "source", "used_for") if v.get(key)}
        rows.append({"what": k, "value": _knob(v)})
    return rows


def _knob(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_knob(x)}" for k, x in v.items())
    return v


_STAGE_COLUMNS = [("role", "configuration"), ("total_ms", "total ms"), ("client_ms", "client ms"),
                  ("network_ms", "network ms"), ("server_queue_ms", "server queue ms"),
                  ("server_compute_ms", "server compute ms"), ("source", "server timings from")]


def render_service(summary: dict[str, Any], resume_dir: Any = None) -> str:
    """``investigate --url`` / ``--cmd``'s report.html: the engine's page (:func:`render_tune`) with the
    diagnosis of the baseline and the recommended configuration, and where their latency went."""
    service = summary.get("service") or {}
    where = "a running service (--url)" if service.get("mode") == "url" else "a service started per configuration"
    title = f"investigate: {where}" + (f", --server {service['server']}" if service.get("server") else "")
    return render_tune(summary, resume_dir, title=title, extra=_diagnosis_sections(summary.get("diagnosis") or {}))


def _diagnosis_sections(diagnosed: dict[str, Any]) -> str:
    if not diagnosed:
        return ""
    stages = [{"role": f"{role}: {' '.join(f'{k}={v}' for k, v in (d.get('configuration') or {}).items()) or 'as it runs'}",
               **{k: fixed(v, ".1f", "-") if isinstance(v, (int, float)) else (v or "-")
                  for k, v in (d.get("stages") or {}).items()}}
              for role, d in diagnosed.items() if d.get("stages")]
    body = ["<p>Each configuration watched under a closed loop: the mean latency of an ok answer split into the "
            "client's wait before sending, the network and HTTP front, and the server's own queue and compute "
            "(from its answers' timing headers or its metrics; without either, the network column holds the "
            "server's time too).</p>"]
    if stages:
        body.append(_table(stages, _STAGE_COLUMNS))
    for role, d in diagnosed.items():
        body.append(f"<h3>{_esc(role)}</h3>")
        if d.get("error"):
            body.append(f'<p class="miss">could not be watched: {_esc(d["error"])}</p>')
            continue
        diag = d.get("diagnosis") or {}
        body.append(f"<p><b>{_esc(diag.get('kind', '?'))}</b>: {_esc('; '.join(diag.get('reasons') or []))}</p>"
                    f"<p>Next: {_esc(diag.get('next_step', ''))}</p>")
        if diag.get("cannot_see"):
            body.append("<p class=\"muted\">Not visible from outside: " + _esc("; ".join(diag["cannot_see"])) + "</p>")
        threads = d.get("threads") or []
        if threads:
            body.append(_table([{k: t.get(k) for k in ("name", "cpu_mean")} for t in threads],
                               [("name", "thread"), ("cpu_mean", "CPU %")]))
    return _section("diagnosis", "Diagnosis of the baseline and the recommended configuration", "".join(body))
