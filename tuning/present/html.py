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
from typing import Any, Callable

import pandas as pd

from tuning.base.format import fixed, pct
from tuning.base.machine import machine_line
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


def _judged(ladder: Any) -> list[Any]:
    """The steps measured against a reference (the ones with a paired ratio)."""
    return [x for x in ladder.steps if x.status != "baseline" and _finite(x.figures.get("ratio"))]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(f: dict[str, Any], digits: int = 2) -> str:
    """``ratio [low-high]`` of a step's frozen figures, or ''."""
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
    """``16.7 req/s (next failing rate 18.2)`` or ``none``."""
    if cap is None:
        return "not searched"
    if not cap.met:
        return "none (no rate met the target)"
    hi = f"next failing rate {cap.high:.1f} req/s" if cap.high is not None else "no failing rate found above it"
    return f"{cap.capacity:.1f} req/s ({hi})"


def _compare_rate(ladder: Any) -> str:
    share = getattr(ladder.settings, "compare_at", None)
    at = (f"{100 * share:.0f}% of the reference's capacity" if isinstance(share, (int, float)) and share != 1
          else "the reference's capacity")
    return at + " (where the reference has none, its lowest probed rate)"


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
        text += f"; closed-loop QPS {fixed(b)} -> {fixed(r)}"
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
                     f"pairs{at}, p99 {fixed(r.p99_ms, '.0f')} ms, {r.status}")
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

def _confirm(inv: Any) -> dict[str, Any] | None:
    """The confirm run's pooled figures (p50, p99 with its interval, failures) at the target, or None: the
    probe with the recorder off where there is one (``inv.confirm``), else the run under the recorder; with
    ``recorder`` (on or off), and ``recorder_p99_ms`` (the run under the recorder's p99) beside a probe."""
    from tuning.experiments.capacity import pooled_figures

    c = inv.confirm
    trials = c.trials if c is not None and c.trials else [inv.after] if inv.after is not None else []
    if not trials:
        return None
    f = pooled_figures(trials, inv.ladder.target_p99_ms)
    f["failed"], f["submitted"] = sum(t.failed for t in trials), sum(t.submitted for t in trials)
    f["recorder"] = "recorder off" if c is not None else "recorder on"
    f["verdict"] = f" ({c.verdict} by {c.by}, {len(trials)} windows)" if c is not None else ""
    f["recorder_p99_ms"] = inv.after.p99_ms if c is not None and inv.after is not None else None
    recorder_rate = getattr(inv, "recorder_rate", None)
    f["recorder_at"] = ("same rate" if recorder_rate is None or recorder_rate == inv.confirm_rate else
                        f"at {recorder_rate:.1f} req/s, the rate that held")
    return f


def _confirm_text(conf: dict[str, Any], mode: str) -> str:
    under = (f"; under the recorder, {conf['recorder_at']}: p99 {fixed(conf['recorder_p99_ms'], '.0f')} ms"
             if conf["recorder_p99_ms"] is not None else "")
    return (f"Confirm run of the recommended ({_esc(mode)}, {conf['recorder']}){_esc(conf['verdict'])}: p99 "
            f"<b>{_esc(_p99_span(conf['p99_ms'], conf['p99_low_ms'], conf['p99_high_ms']))} ms</b> (95% interval), p50 "
            f"{fixed(conf['p50_ms'], '.0f')} ms, {conf['failed']} of {conf['submitted']} failed{_esc(under)}.")


def _descent_text(inv: Any) -> str:
    """The probes below a confirm that failed (one capacity-bracket step each), and the rate that held."""
    text = inv.descent_sentence()
    if not text:
        return ""
    held = inv.held
    text = _esc(text[0].upper() + text[1:])
    if held is not None:  # the rate to plan on, in bold
        said = _esc(f"{held.rate:.1f} req/s held")
        text = text.replace(said, f"<b>{said}</b>", 1)
    return f" {text}."


def _headline(inv: Any) -> str:
    """The confirm run against the baseline: capacity (with its bracket) and p99 (with its interval)."""
    ladder = inv.ladder
    t = ladder.target_p99_ms
    conf = _confirm(inv)
    if ladder.objective == "target":
        base, rec = ladder.baseline_capacity, ladder.capacity
        best = base.best if base is not None else None
        text = (f"Capacity at p99 ≤ {t:.0f} ms (errors within {100 * ladder.settings.error_budget:.1f}%): baseline "
                f"<b>{_esc(_capacity_text(base))}</b> → recommended <b>{_esc(_capacity_text(rec))}</b>.")
        if best is not None:
            where = "at its capacity" if base.met else f"closest, at {best.rate:.1f} req/s"
            text += (f" Baseline {where}: p99 {_esc(_p99_span(best.p99_ms, best.p99_low_ms, best.p99_high_ms))} ms, "
                     f"{best.errors} of {best.n} failed.")
    else:
        b, r = ladder.baseline_figures, ladder.final_figures
        text = (f"Closed-loop QPS at concurrency {ladder.settings.concurrency}: baseline <b>{fixed(b.get('qps'))}</b> → "
                f"recommended <b>{fixed(r.get('qps'))}</b> (p99 target {t:.0f} ms). Baseline p99 "
                f"{_esc(_p99_span(b.get('p99_ms'), b.get('p99_low_ms'), b.get('p99_high_ms')))} ms.")
    if conf is not None:
        at = f"open loop at {inv.confirm_rate:.1f} req/s" if inv.confirm_rate else "closed loop"
        text += " " + _confirm_text(conf, at) + _descent_text(inv)
    else:
        text += " No confirm run (the investigation was cut short)."
    if "-?]" in text or "[?-" in text:
        text += " (Intervals are 95%; '?': too few outcomes to bound that end.)"
    return text


def _probe_rows(cap: Any) -> list[dict[str, Any]]:
    return [{"rate": round(p.rate, 1), "passed": p.passed, "verdict": p.verdict, "by": p.by, "windows": p.windows, "n": p.n,
             "exceed": p.exceed if p.exceed >= 0 else None, "errors": p.errors, "p50": fixed(p.p50_ms, ".0f"),
             "p99": _p99_span(p.p99_ms, p.p99_low_ms, p.p99_high_ms)} for p in sorted(cap.probes, key=lambda p: p.rate)]


_PROBE_COLUMNS = [("rate", "offered rate (req/s)"), ("passed", "passed"), ("verdict", "verdict"), ("by", "decided by"),
                  ("windows", "windows"), ("n", "outcomes"), ("exceed", "over target or failed"), ("errors", "failed"),
                  ("p50", "p50 (ms)"), ("p99", "p99 [95% interval] (ms)")]


def _ladder_rows(ladder: Any) -> list[dict[str, Any]]:
    rows = []
    for x in ladder.steps:
        f = x.figures
        measured = bool(f) and _finite(f.get("n") if f.get("n") is not None else f.get("p99_ms"))
        rows.append({
            "step": x.name, "change": x.change or ("(baseline)" if x.status == "baseline" else ""), "status": x.status,
            "ratio": _interval(f), "pairs": f.get("pairs"),
            "rate": round(f["rate"], 1) if _finite(f.get("rate")) else None,
            "p50": fixed(f.get("p50_ms"), ".0f") if _finite(f.get("p50_ms")) else None,
            "p99": _p99_span(f.get("p99_ms"), f.get("p99_low_ms"), f.get("p99_high_ms")) if measured else None,
            "errors": (f"{f.get('errors', 0)} / {f.get('timeouts', 0)} of {f.get('n')}" if measured else None),
            "capacity": round(f["capacity"], 1) if _finite(f.get("capacity")) else None,
            "why": x.reason, "kept": x.kept, "failed": x.status == "failed"})
    return rows


def render_report(inv: Any) -> str:
    """The whole report for an :class:`~tuning.experiments.investigate.Investigation` as one HTML string."""
    from tuning import viz
    from tuning.experiments.investigate import headline

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

    # ledger before / after
    loads = {"baseline": inv.before.load}
    if inv.after is not None and inv.after.load is not None:
        loads["recommended"] = inv.after.load
    loads = {k: v for k, v in loads.items() if v is not None}
    recorder_rate = getattr(inv, "recorder_rate", None) or inv.confirm_rate
    confirm_mode = (f"open loop at {recorder_rate:.1f} req/s" if recorder_rate else "closed loop")
    body = ["<p>Per-request time by stage (ok requests), p50 next to p99: where a request spends its time. "
            f"Baseline: closed loop at concurrency {settings.concurrency}, recorder on"
            + (f"; recommended: its run under the recorder, {_esc(confirm_mode)} (the confirm probe above ran with the recorder "
               "off)" if "recommended" in loads else "")
            + ".</p>"]
    if loads:
        body.append(charts.block(lambda: viz.ledger_chart(loads, device=dev), lambda: ledger_sentence(loads)))
    sections.append(_section("ledger", "The stage ledger, before and after", "".join(body)))

    # capacity at the target
    caps: dict[str, Any] = {}
    if ladder.baseline_capacity is not None:
        same = ladder.capacity is None or ladder.capacity is ladder.baseline_capacity
        caps["baseline" + (" = recommended" if same and ladder.recommended == ladder.baseline
                           else "")] = ladder.baseline_capacity
        if not same:
            caps["recommended"] = ladder.capacity
    if caps:
        body = [f"<p>A configuration's capacity is the highest Poisson arrival rate whose open-loop p99 (from the "
                f"scheduled arrival, over every outcome: a failure counts as over the target) stays within "
                f"{target:.0f} ms with failures within the {100 * settings.error_budget:.1f}% budget. Each probe "
                "passes or fails on a count of its outcomes over the target (a p99 within the target lets fewer than "
                "1% exceed it); it fails fast past the knee, over the error budget, or when the load client fell "
                "behind; a probe with too few outcomes to count is decided on its p99 estimate ('estimate'). The "
                "search brackets the capacity and bisects it geometrically."
                + (" No step was kept: the recommended configuration is the baseline." if len(caps) == 1
                   and ladder.recommended == ladder.baseline else "") + "</p>",
                charts.block(lambda: viz.capacity_chart(caps, device=dev, target_p99_ms=target),
                             lambda: capacity_sentence(caps))]
        for label, cap in caps.items():
            body.append(f"<p><b>{_esc(label)}</b>: {_esc(cap.sentence())}</p>")
            body.append(_table(_probe_rows(cap), _PROBE_COLUMNS, lambda r: "kept" if r["passed"] else "dropped"))
        conf = _confirm(inv)
        if conf is not None:
            body.append(f"<p>{_confirm_text(conf, confirm_mode)}</p>")
    else:
        body = [f"<p>Objective {_esc(ladder.objective)}: no capacity search; every configuration was measured in a "
                f"closed loop at concurrency {settings.concurrency}, its p99 checked against {target:.0f} ms.</p>"]
    sections.append(_section("capacity", f"Capacity at the p99 target ({target:.0f} ms)", "".join(body)))

    # ladder
    table = _table(_ladder_rows(ladder),
                   [("step", "step"), ("change", "change"), ("status", "status"), ("ratio", "ratio [interval]"),
                    ("pairs", "pairs"), ("rate", "tested at (req/s)"), ("p50", "p50 (ms)"),
                    ("p99", "p99 [95% interval] (ms)"), ("errors", "errors / timeouts of n"),
                    ("capacity", "capacity (req/s)"), ("why", "why")],
                   lambda r: "failed" if r["failed"] else "kept" if r["kept"] else "dropped")
    level = next((x.figures.get("level") for x in _judged(ladder)), None)
    level_text = f"{100 * level:.1f}%" if _finite(level) else "the comparison's"
    if ladder.objective == "target":
        how = (f"Each step is measured against its reference (the configuration kept before it) in interleaved pairs "
               f"(AB BA BA AB ...), both arms open loop at the same offered Poisson rate, {_esc(_compare_rate(ladder))}; "
               f"windows of at least {settings.duration_s:g} s (stretched to {settings.min_outcomes} arrivals where the "
               f"rate allows) after a warm-up, the same arrivals for both arms of a pair, "
               f"{settings.min_pairs} to {settings.max_pairs} pairs. The figure per pair is the ratio of the geometric-mean "
               f"latency over every outcome, reference / candidate (above 1: the candidate is faster). A step is kept "
               f"when the lower end of the ratio's {level_text} interval clears 1 + {settings.min_effect:g} and the "
               f"candidate meets the {target:.0f} ms target at that rate (by the count over its pooled runs), or when it "
               "meets the target where the reference did not; a step that misses the target is never kept. A kept "
               "step's own capacity is then searched (a step whose capacity comes out below the reference's is "
               "refused after all), and it becomes the next reference.")
    else:
        how = (f"Each step is measured against its reference in interleaved pairs (AB BA BA AB ...) in a closed loop "
               f"at concurrency {settings.concurrency}, {settings.duration_s:g} s measured per run after "
               f"{settings.warmup_s:g} s of warm-up, {settings.min_pairs} to {settings.max_pairs} pairs. The figure "
               f"per pair is the QPS ratio candidate / reference; a step is kept when the lower end of its "
               f"{level_text} interval clears 1 + {settings.min_effect:g}, and never when it takes a p99 that met "
               f"the {target:.0f} ms target over it.")
    body = [f"<p>{how} Errors count every outcome other than ok, timeouts included; the p50 and p99 are the "
            "candidate's, pooled over its pair runs (the baseline's: its closed-loop run and its probe at its "
            "capacity).</p>", table]
    if _judged(ladder):
        body.append(charts.block(lambda: viz.ladder_ratio_chart(ladder, device=dev), lambda: ladder_sentence(ladder)))
    else:
        body.append(f"<p>{_esc(ladder_sentence(ladder))}</p>")
    if ladder.waits is not None:
        kept_waits = [x.change for x in ladder.steps if x.status == "kept" and "max_wait_ms" in x.change]
        chosen = ", ".join(kept_waits) or "none"
        body.append(charts.block(lambda: viz.wait_steps_chart(ladder.waits, device=dev, min_effect=settings.min_effect,
                                                              target_p99_ms=target),
                                 lambda: waits_sentence(ladder.waits, target, chosen)))
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
        cores = wi.get("host_cores") or {}
        if cores:
            body.append("<h3>Host cores needed</h3><ul>" + "".join(f"<li>{_esc(c['sentence'])}</li>" for c in cores.values())
                        + "</ul><p>Host CPU per request per thread is measured on this host; the device's busy share "
                        "and capacity are SIMULATED. The Python threads of one server process share one GIL (taken as "
                        f"{GIL_CORE} of a core; 0.61-0.84 measured here, so the processes are a lower bound; the same work "
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
    body = []
    if not ladder.target_met:
        body.append(f'<p class="note">TARGET NOT MET: no configuration measured met p99 ≤ {target:.0f} ms. What '
                    "follows is the closest configuration, not one that meets the target.</p>")
    body += [f"<p>Measured on {_esc(dev['label'])}. Serve it:</p>",
             f"<pre>python -m tuning serve {_esc(rec['set_line'])}</pre>",
             "<p>or from Python:</p>",
             f"<pre>import tuning\nknobs = {_esc(rec['python_call'])}</pre>",
             _table(change_rows, [("knob", "knob"), ("baseline", "baseline"), ("recommended", "recommended")])
             if change_rows else "<p>No step was kept: keep the baseline.</p>"]
    top = ladder.top()
    if len(top):
        key = "capacity" if ladder.objective == "target" else "qps"
        top_rows = top.astype(object).where(top.notna(), None).to_dict("records")
        for r in top_rows:
            for k in (key, "p99_ms", "ratio"):
                r[k] = round(r[k], 2 if k == "ratio" else 1) if _finite(r.get(k)) else None
        body += [f"<p>The best configurations measured (by {'capacity, req/s' if key == 'capacity' else 'QPS'}; "
                 "a capacity is searched only for a kept step):</p>",
                 _table(top_rows, [("step", "step"), ("change", "change"), ("status", "status"),
                                   (key, "capacity (req/s)" if key == "capacity" else "QPS (req/s)"),
                                   ("p99_ms", "p99 (ms)"), ("ratio", "ratio"), ("knobs", "knobs vs baseline")])]
    sections.append(_section("ship", "What to ship", "".join(body)))

    # environment
    # the machine is in the header; the rest of environment.json here
    env_rows = [{"what": k, "value": _knob(v)} for k, v in inv.environment.items() if k != "machine"]
    data_rows = [{"what": k, "value": _knob(v)} for k, v in inv.data.items()]
    sections.append(_section("environment", "Environment and input", _table(env_rows, [("what", ""), ("value", "")])
                             + _table(data_rows, [("what", ""), ("value", "")])))

    banner_cls = "banner sim" if dev.get("simulated") else "banner"
    alerts = ""
    if inv.interrupted:
        alerts += (f'<div class="banner miss">INTERRUPTED: the investigation was cut short; this report holds what '
                   f"was measured. Go on with <code>--resume {_esc(inv.out)}</code>.</div>")
    if not ladder.target_met:
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
            + f'<p class="headline">{_headline(inv)} Ship: <code>{_esc(rec["set_line"])}</code></p>'
            + f'<p class="muted">{_esc(headline(inv))}</p>')
    return _page("tuning investigate report", head + "".join(sections))


def _page(title: str, body: str) -> str:
    """One self-contained page: the style and plotly.js inlined in the head (no CDN, works offline)."""
    from plotly.offline import get_plotlyjs

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title>"
            f"<style>{_CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script>'
            f"</head><body>{body}</body></html>\n")


def tune_probes_sentence(s: dict[str, Any]) -> str:
    """What the probes chart shows, from tune's summary."""
    caps = s.get("capacities") or {}
    probes = sum(len(c.get("probes") or []) for c in caps.values())
    t = s.get("target_p99_ms")
    best = s.get("best")
    tail = (f" The best held p99 {fixed(best.get('p99_ms'), '.0f')} ms at {fixed(best.get('capacity'), '.1f')} req/s."
            if best else f" No configuration kept p99 within {fixed(t, '.0f')} ms at any rate tried.")
    return (f"{probes} probes over {len(caps)} configurations: each offered Poisson rate against its open-loop p99 "
            f"(from the scheduled arrival, every outcome), the {fixed(t, '.0f')} ms target dashed." + tail)


def tune_capacity_sentence(s: dict[str, Any]) -> str:
    """What the capacity chart shows, from tune's summary."""
    rows = s.get("rows") or []
    met = [r for r in rows if r.get("capacity") is not None and not r.get("error")]
    errors = [r for r in rows if r.get("error")]
    best = s.get("best")
    names = list(s.get("space") or {})
    head = (f"{len(met)} of {len(rows)} configurations met p99 ≤ {fixed(s.get('target_p99_ms'), '.0f')} ms"
            + (f", {len(errors)} failed (their error in the table)" if errors else "") + ".")
    if best:
        values = " ".join(f"{n}={best.get(n)}" for n in names)
        others = sorted((r["capacity"] for r in met if r.get("command") != best.get("command")), reverse=True)
        runner = f"; the next best {others[0]:.1f} req/s" if others else ""
        head += f" Best: {values} at {best['capacity']:.1f} req/s{runner}."
    return head + " Error bars: the bracket (highest passing rate to lowest failing one)."


_TUNE_COLUMNS_TAIL = ["capacity req/s", "bracket", "p50 ms", "p99 ms", "errors", "peak MB", "load tests", "measured"]


def render_tune(result: Any, resume_dir: Any = None) -> str:
    """``tune``'s page (tune.html): the table, each configuration's probes, the capacities, the best command line.
    ``result``: a ``TuneResult`` or its summary (tune.json, loaded); ``resume_dir``: where ``--resume`` would go on
    from (named in the banner of a run cut short)."""
    from tuning import viz
    from tuning.present.tables import tune_rows

    s = dict(result) if isinstance(result, dict) else result.summary()
    space = list(s.get("space") or {})
    target = s.get("target_p99_ms")
    charts = _Charts()
    rows = tune_rows(s.get("rows") or [], space)
    columns = [(k, k) for k in space] + [(k, k) for k in _TUNE_COLUMNS_TAIL if k != "measured" or s.get("resumed")]
    errors = [r for r in s.get("rows") or [] if r.get("error")]
    best = s.get("best")
    table = _table(rows, columns, lambda r: "failed" if r["capacity req/s"] == "error"
                   else "dropped" if r["capacity req/s"] == "none" else "kept")
    body = [f"<p>Per configuration: the capacity at p99 ≤ {fixed(target, '.0f')} ms (the highest Poisson arrival rate "
            "whose open-loop p99 and error rate stayed within the target and budget) with its bracket, p50/p99 at "
            "capacity, errors, and the peak memory of the server's process group.</p>", table]
    if errors:
        body.append("<ul>" + "".join(f"<li>error in {_esc(' '.join(f'{k}={r.get(k)}' for k in space))}: "
                                     f"<pre>{_esc(r['error'])}</pre></li>" for r in errors) + "</ul>")
    sections = [_section("configurations", "Configurations", "".join(body)),
                _section("probes", "Each configuration's probes",
                         charts.block(lambda: viz.tune_probes_chart(s), lambda: tune_probes_sentence(s))),
                _section("capacity", "Capacity per configuration",
                         charts.block(lambda: viz.tune_capacity_chart(s), lambda: tune_capacity_sentence(s)))]
    conf = s.get("confirmation")
    if best:
        ship = [f"<p>{best['capacity']:.1f} req/s at p99 ≤ {fixed(target, '.0f')} ms. Run it:</p>",
                f"<pre>{_esc(best.get('command'))}</pre>"]
        if conf:
            ship.append(f"<p>{_esc(conf.get('sentence'))}</p>")
        sections.append(_section("ship", "What to run", "".join(ship)))
    alerts = ""
    if s.get("interrupted"):
        again = f" Go on with <code>--resume {_esc(resume_dir)}</code>." if resume_dir is not None else ""
        alerts += ('<div class="banner miss">INTERRUPTED: tune was cut short; this page holds the configurations '
                   f"measured.{again}</div>")
    if not best:
        alerts += (f'<div class="banner miss">TARGET NOT MET: no configuration kept p99 ≤ {fixed(target, ".0f")} ms '
                   "at any rate tried.</div>")
    resumed = s.get("resumed") or 0
    head = ("<h1>tune: the service's own knobs</h1>"
            f'<p class="muted">{_dt.datetime.now().isoformat(timespec="seconds")} · {s.get("configurations")} '
            f'configurations ({_esc(s.get("search"))})'
            + (f" · {resumed} from the earlier run (--resume)" if resumed else "")
            + f' · target p99 ≤ {fixed(target, ".0f")} ms · measured on the running service</p>'
            + (f'<p class="muted">command: <code>{_esc(s.get("cmd"))}</code></p>' if s.get("cmd") else "")
            + alerts
            + (f'<p class="headline">Best: {_esc(" ".join(f"{k}={best.get(k)}" for k in space))} at '
               f'{best["capacity"]:.1f} req/s.</p>' if best else ""))
    return _page("tuning tune report", head + "".join(sections))


def _knob(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_knob(x)}" for k, x in v.items())
    return v
