"""Plain-text rendering of results for the terminal: the tables of every command (charts live in :mod:`tuning.viz`)."""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any

from tuning.base.format import TERMINAL_WIDTH, command_lines, fit, fixed, number
from tuning.knobs import settings
from tuning.present.verdicts import load_verdict, run_verdict

if TYPE_CHECKING:
    from tuning.experiments.investigate import Investigation
    from tuning.experiments.watch import WatchResult


def counted(n: int, noun: str) -> str:
    """``1 configuration``, ``3 configurations``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def table(rows: list[dict[str, Any]], columns: list[str], width: int = TERMINAL_WIDTH) -> str:
    """A fixed-width text table that fits ``width`` columns: the widest column of words is wrapped at word
    boundaries onto continuation lines until the table fits (or no column can give more); numbers are
    right-aligned, words left-aligned."""
    cells = [[number(r.get(c)) for c in columns] for r in rows]
    numeric = [all(_numeric(r.get(c)) for r in rows) if rows else False for c in columns]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    gaps = 2 * (len(columns) - 1)
    while sum(widths) + gaps > width:
        words = [i for i in range(len(columns)) if not numeric[i]]
        if not words:
            break
        i = max(words, key=lambda j: widths[j])
        floor = max(len(w) for text in [columns[i], *(row[i] for row in cells)] for w in (text.split() or [""]))
        narrower = max(floor, widths[i] - (sum(widths) + gaps - width))
        if narrower >= widths[i]:
            break
        widths[i] = narrower

    def lines_of(values: list[str], align_numbers: bool) -> list[str]:
        wrapped = [textwrap.wrap(v, w, break_long_words=False, break_on_hyphens=False) or [""]
                   for v, w in zip(values, widths)]
        out = []
        for k in range(max(len(c) for c in wrapped)):
            parts = [(c[k] if k < len(c) else "") for c in wrapped]
            out.append("  ".join(p.rjust(w) if align_numbers and numeric[i] else p.ljust(w)
                                 for i, (p, w) in enumerate(zip(parts, widths))).rstrip())
        return out
    lines = lines_of(columns, False) + ["  ".join("-" * w for w in widths)]
    for row in cells:
        lines += lines_of(row, True)
    return "\n".join(lines)


def _numeric(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def device_line(device: dict[str, Any] | None) -> str:
    """One line naming the device a result was made on; SIMULATED in capitals where it was."""
    device = device or {}
    if device.get("kind") == "simulated":
        return f"device: SIMULATED {device.get('profile')} ({device.get('source')}); host side measured, model call simulated"
    if device.get("kind"):
        return f"device: {device['kind']} ({device.get('name', '')}), measured"
    return "device: unknown"


def _set_form(value: Any) -> str:
    """A knob's value as ``--set`` reads it back (tuples comma-joined, none, true/false)."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)


def knob_line(knobs: Any, mode: str = "offline") -> str:
    """The ``knobs:`` line of a run: every declared knob that matters in ``mode``, in declaration order, in
    ``--set`` form, so that a knob added to :mod:`tuning.knobs` shows here without an edit."""
    parts = [f"{name}={_set_form(v)}" for name, v in settings(knobs, mode).items()]
    return fit("knobs: " + " ".join(parts))


def format_run(result) -> str:
    """The offline run as a readable block: headline figures, stage ledger, waits, errors."""
    s = result.summary()
    k = result.knobs
    lines = [
        device_line(s.get("device")),
        knob_line(k),
        f"requests {s['requests']}  ok {s['ok']}  errors {s['errors']}  truncated {s['truncated']}  batches {s['batches']}",
        f"QPS {s['qps']:.1f} (ok answers/s)   model busy {100 * s['model_busy']:.0f}%   "
        + (f"device busy {100 * s['device_busy']:.0f}%   " if s.get("device_busy") is not None else "")
        + f"padding waste {number(s['padding_waste'])}   (window {s['window_s']:.1f} s; "
        + (f"{'compile' if k.graph == 'compile' else 'capture'} {s['compile_s']:.1f} s, "
           if s.get("compile_s") is not None else "")
        + f"model warm-up {s['warmup_s']:.1f} s: outside the window)",
        "",
        "stage ledger (per request, ms; share of the p50 / p99 sums)",
        table([{"stage": st, **v} for st, v in s["stages"].items()], ["stage", "p50_ms", "p99_ms", "share", "share_p99"]),
        "",
        "waits per batch: model waited for input (starvation) vs ready batch waited for the model (back-pressure)",
        table([{"wait": w, **v} for w, v in s["waits"].items()], ["wait", "p50_ms", "p99_ms", "share_of_window"]),
    ]
    if s["error_reasons"]:
        lines += ["", "errors", table(s["error_reasons"], ["count", "reason", "first_lines"])]
    lines += ["", run_verdict(s)]
    return fit("\n".join(lines))


def format_profile(profile) -> str:
    """Diagnosis, top threads, stage ledger and the GPU section (or why there is none)."""
    s = profile.summary()
    d = s["diagnosis"]
    gpu = s["gpu"]
    device = (s.get("workload") or {}).get("device")
    lines = [*([device_line(device)] if device else []),
             f"diagnosis: {d['kind'].upper()}  ({'; '.join(d['reasons'])})", f"next step: {d['next_step']}",
             "evidence: " + ", ".join(f"{k}={number(v)}" for k, v in d["evidence"].items()), ""]
    lines += ["threads by CPU (% of one core, mean over the run; wait: runnable but no CPU free)",
              table(s["threads"], ["name", "pid", "tid", "cpu_mean", "cpu_max", "wait_mean"]), ""]
    host = s["host"]
    if host.get("samples"):
        lines.append(f"process CPU {host['cpu_percent_mean']:.0f}% of one core ({host['cpu_count']} cores), "
                     f"RSS max {host['rss_mb_max']:.0f} MB, disk read {host['read_mb_s_mean']:.1f} MB/s, "
                     f"write {host['write_mb_s_mean']:.1f} MB/s")
    lines.append(f"model busy {100 * s['model_busy']:.0f}% (inference spans / window)")
    if s["ops"]:
        o = s["ops"]
        lines.append(f"ops: {o['ops_per_batch']:.0f} operators"
                     + (f", {o['kernels_per_batch']:.0f} kernels" if o["device"] == "cuda" else "")
                     + f" per batch {o['batch_shape']}, {100 * (o['short_share'] or 0):.0f}% shorter than "
                     f"{o['short_threshold_us']:.0f} us; launch overhead {o['launch_overhead_ms']:.2f} ms of "
                     f"{o['busy_ms_per_batch']:.1f} ms busy ({100 * o['launch_share']:.1f}%: the most graph capture could save)")
    lines += ["", "stage ledger (per request, ms)",
              table([{"stage": st, **v} for st, v in s["stages"].items()], ["stage", "p50_ms", "p99_ms", "share"]), ""]
    if gpu["available"]:
        lines.append(f"GPU: {', '.join(gpu['devices'])}: SM util mean {number(gpu.get('sm_util_mean'))}%, "
                     f"power {number(gpu.get('power_w_mean'))} W ({number(gpu.get('power_frac_mean'))} of limit), "
                     f"memory {number(gpu.get('mem_used_mb_mean'), 0)} MB, {gpu['samples']} samples")
        if gpu.get("reason"):
            lines.append(f"GPU note: {gpu['reason']}")
    else:
        lines.append(f"GPU: none sampled: {gpu['reason']}")
    return fit("\n".join(lines))


def format_load(s: dict) -> str:
    """A load test's headline, latency percentiles, outcome counts and stage ledger."""
    mode = f"open loop at {s['rate']:.1f} req/s" if s["rate"] else f"closed loop at concurrency {s['concurrency']}"
    lines = [
        *([device_line(s["device"])] if s.get("device") else []),
        f"target {s['target']}: {mode}, {s['window_s']:.1f} s measured ({s['warmup_requests']} warm-up requests excluded)",
        f"QPS {s['qps']:.1f}   p50 {number(s['p50_ms'], 0)} ms   p95 {number(s['p95_ms'], 0)} ms   "
        f"p99 {number(s['p99_ms'], 0)} ms"
        f"   model busy {number(None if s['model_busy'] is None else 100 * s['model_busy'], 0)}%"
        + (f"   device busy {100 * s['device_busy']:.0f}%" if s.get("device_busy") is not None else "")
        + f"   mean batch {number(s['mean_batch'], 1)}",
        f"latency over every outcome (from the {s.get('latency_from', 'send')}); error rate "
        f"{number(None if s.get('error_rate') is None else 100 * s['error_rate'], 1)}%   ok only: p50 "
        f"{number(s.get('ok_p50_ms'), 0)} ms   p99 {number(s.get('ok_p99_ms'), 0)} ms",
        *([f"offered {number(s['offered_rate'], 1)} req/s   achieved {number(s['achieved_rate'], 1)} req/s   send lag p50 "
           f"{number(s['send_lag_p50_ms'], 1)} ms   p99 {number(s['send_lag_p99_ms'], 1)} ms"] if s.get("offered_rate") else []),
        f"submitted {s['submitted']} = ok {s['ok']} + errors {s['errors']} + timeouts {s['timeouts']} + rejected {s['rejected']}",
        *([f"load generator {s.get('engine', 'tuning')}: client CPU {s['client_cpu']:.2f} cores"
           + (f", locust's own figures: {s['engine_stats'].get('rps') or 0:.1f} req/s, p99 "
              f"{number(s['engine_stats'].get('p99_ms'), 0)} ms over the whole run" if s.get("engine_stats") else "")]
          if s.get("client_cpu") is not None else []),
    ]
    m = s.get("server_metrics")
    if m:
        lines.append(server_metrics_line(m))
    if s.get("hold"):
        lines += ["", *hold_lines(s["hold"])]
    if any(v.get("p99_ms") for v in s["stages"].values()):  # locust does not read the server's stage timings
        lines += ["", "stage ledger (ok requests, ms)",
                  table([{"stage": st, **v} for st, v in s["stages"].items()], ["stage", "p50_ms", "p99_ms", "share"])]
    if s["error_reasons"]:
        lines += ["", table(s["error_reasons"], ["count", "reason"])]
    lines += ["", load_verdict(s)]
    if "diagnosis" in s:
        d = s["diagnosis"]
        lines += ["", f"diagnosis: {d['kind'].upper()}  ({'; '.join(d['reasons'])})", f"next step: {d['next_step']}",
                  "threads by CPU", table(s["threads"], ["name", "pid", "tid", "cpu_mean", "cpu_max", "wait_mean"]),
                  f"GPU: {'sampled' if s['gpu']['available'] else 'none sampled: ' + str(s['gpu']['reason'])}"]
    return fit("\n".join(lines))


def format_load_sweep(variable: str, points: list[dict[str, Any]], verdict: str) -> str:
    """A load sweep's points (the figures that decide; every column is in ``--json``) and its verdict, within
    the terminal's width."""
    rows = [{**p, "failed": sum(int(p.get(k) or 0) for k in ("errors", "timeouts", "rejected"))} for p in points]
    columns = [variable, "qps", "p50_ms", "p99_ms", "ok", "failed", "model_busy", "mean_batch"]
    if any(p.get("client_cpu") is not None for p in points):
        columns.append("client_cpu")
    return fit("\n".join([table(rows, columns), verdict]))


def hold_lines(h: dict) -> list[str]:
    """A held rate judged against the target: the verdict first, then its evidence, then what to do."""
    pct = lambda x: "n/a" if x is None else f"{100 * x:.2f}%"  # noqa: E731
    head = (f"TARGET {'MET' if h['verdict'] == 'pass' else 'NOT MET' if h['verdict'] == 'fail' else 'NOT DECIDED'}: "
            f"p99 <= {h['target_p99_ms']:g} ms at {number(h['rate'], 1)} req/s ({h['verdict']})")
    lines = [head,
             f"  {pct(h['share'])} of {h['n']} outcomes over the target or failed, 95% bounds "
             f"[{pct(h['share_low'])}, {pct(h['share_high'])}] (at most 1% to pass); p99 {number(h['p99_ms'], 0)} ms "
             f"[{number(h['p99_low_ms'], 0)}, {'unbounded' if h['p99_high_ms'] is None else number(h['p99_high_ms'], 0)}]",
             f"  {h['n']} outcomes count as {number(h['independent'], 0)} independent ones (design effect "
             f"{number(h['deff'], 1)}: outcomes in a burst move together)"]
    if h.get("needed_s") is not None:
        lines.append(f"  too short to tell: at this share and burst length a hold of about {h['needed_s']:.0f} s "
                     "would (give --duration)")
    elif h.get("undecided_by") == "errors":
        lines.append(f"  {h['errors']} errors: over the {100 * h['error_budget']:.1f}% budget, not yet beyond "
                     "chance (a longer hold tells)")
    if h.get("lag_p99_ms") is not None:
        lines.append(f"  the client's send lag p99 {h['lag_p99_ms']:.1f} ms"
                     + (" explains the exceedances: the client's figure, not the server's (a faster client, or "
                        "--client-procs)" if h.get("lag_explains") else ""))
    return lines


def server_metrics_line(m: dict) -> str:
    """The service's own Prometheus metrics over the window, in one line (or why none were read)."""
    if not m.get("exporter"):
        return f"server metrics: none read from {m['url']} ({m.get('reason') or 'no known exporter'})"
    v = m["values"]
    parts = [f"{label} {fmt.format(v[key] * scale)}" for key, label, fmt, scale in (
        ("model_busy", "model busy", "{:.0f}%", 100), ("mean_batch", "mean batch", "{:.1f}", 1),
        ("queue_ms", "queue wait", "{:.1f} ms", 1), ("inference_ms", "inference", "{:.1f} ms", 1),
        ("queue_depth", "queue depth", "{:.0f}", 1), ("gpu_util", "GPU", "{:.0f}%", 100)) if key in v]
    lacked = f"; not exported: {', '.join(m['lacked'])}" if m.get("lacked") else ""
    return f"server metrics ({m['exporter']}, {m['url']}): {', '.join(parts) or 'nothing usable'}{lacked}"


def format_watch(result: WatchResult) -> str:
    """The watch as text: what was watched, the trend table, threads, GPU, load, the verdict and what is unseen."""

    s = result.summary()
    d = s["diagnosis"]
    t0, t1 = result.window
    found = f", found from its {result.pid_from}" if getattr(result, "pid_from", None) else ""
    subject = (f"pid {result.pid} ({result.command}{found})" if result.pid is not None
               else f"no local process ({getattr(result, 'process_reason', '') or 'none found'})")
    lines = [f"watched {subject} for {result.t_end - result.t_start:.1f} s every "
             f"{result.interval:g} s" + (f", driving load at {result.target}" if result.target else ", no load driven"), ""]
    trend = result.trend_frame()
    if not trend.empty:
        lines += ["trend (per time bin; CPU in % of one core; GPU: every GPU NVML sees unless one is named)",
                  table(trend.astype(object).where(trend.notna(), None).to_dict("records"), list(trend.columns)), ""]
    lines += ["threads by CPU (% of one core, mean over the watch)",
              table(s["threads"], ["name", "pid", "tid", "cpu_mean", "cpu_max"]), ""]
    host = s["host"]
    if host.get("samples"):
        machine = result.signals.machine_cpu if result.signals else math.nan
        lines.append(f"process CPU {host['cpu_percent_mean']:.0f}% of one core ({host['cpu_count']} cores; the machine's "
                     f"cores {machine:.0%} busy, every process), RSS max {host['rss_mb_max']:.0f} MB, disk read "
                     f"{host['read_mb_s_mean']:.1f} MB/s, write {host['write_mb_s_mean']:.1f} MB/s")
    gpu = s["gpu"]
    if gpu["available"]:
        lines.append(f"GPU: {', '.join(gpu['devices'])}: util mean {number(gpu.get('sm_util_mean'))}%, power "
                     f"{number(gpu.get('power_w_mean'))} W ({number(gpu.get('power_frac_mean'))} of limit), this process "
                     f"{number(gpu.get('proc_sm_util_mean'))}% and {gpu['process_memory_mb'] or 'no memory listed'}")
    else:
        lines.append(f"GPU: none sampled: {gpu['reason']}")
    if result.load is not None:
        load = result.load.summary()
        load["target"] = result.target
        if result.server_metrics is not None:
            load["server_metrics"] = result.server_metrics.summary()
        lines += ["", format_load(load)]
    lines += ["", f"diagnosis from outside: {d['kind'].upper()}  ({'; '.join(d['reasons'])})",
              f"next step: {d['next_step']}", "not visible from outside:"]
    lines += [f"  - {c}" for c in d["cannot_see"]]
    return fit("\n".join(lines))


def _span(f: dict[str, Any], digits: int = 2) -> str | None:
    """``ratio [low-high]`` of a step's figures, or None."""
    r = f.get("ratio")
    if not isinstance(r, (int, float)) or not math.isfinite(r):
        return None
    return f"{r:.{digits}f} [{number(f.get('low'), digits)}-{number(f.get('high'), digits)}]"


def _ms(x: Any) -> str:
    if x is None or not isinstance(x, (int, float)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.0f}"


def _step_row(step: Any) -> dict[str, Any]:
    return {"step": step.name, "change": step.change or "-", "status": step.status, "ratio [low-high]": _span(step.figures),
            "why": step.reason}


def ladder_method(ladder: Any) -> str:
    """How the engine decided, in one line (``docs/deciding.md`` has the page)."""
    e = ladder.settings.engine
    if ladder.objective == "target":
        return (f"objective: capacity at p99 <= {ladder.target_p99_ms:.0f} ms; a factorial screen on throughput, a "
                f"confirmation against the baseline (false 'better' rate {100 * e.alpha:.1f}%, powered for "
                f"+{100 * e.min_effect:.0f}%), a target check of the confirmed and the baseline at descending rates; "
                "see docs/deciding.md")
    return (f"objective: closed-loop QPS at concurrency {ladder.settings.concurrency}; a factorial screen and a "
            f"confirmation against the baseline (false 'better' rate {100 * e.alpha:.1f}%)")


def format_investigation(inv: Investigation) -> str:
    """The terminal ending, from the run's outcome: a TARGET NOT MET banner only after a target check missed,
    the ladder table (each step's paired ratio with its interval), the best configurations, the ship line
    (none before a verdict), where the files are, and the headline."""
    from tuning.experiments.investigate import CUT_SHORT, MISSED, RUNNING, headline, not_stable

    ladder = inv.ladder
    t = ladder.target_p99_ms
    decided = inv.outcome not in (RUNNING, CUT_SHORT)
    lines = [not_stable(inv)] if not_stable(inv) else []
    if inv.outcome == MISSED:
        lines.append(f"TARGET NOT MET: no configuration kept p99 <= {t:.0f} ms (errors within "
                     f"{100 * ladder.settings.error_budget:.1f}%) at any rate tried; the ship line is the closest, "
                     "not one that meets the target")
    how = ladder_method(ladder)
    lines += [f"decided on {inv.device.get('label', '?')} ({how})" if decided
              else f"measured so far on {inv.device.get('label', '?')} ({how})",
              # each step's reason was printed as the step ended, just above: the table is the overview
              table([_step_row(s) for s in ladder.steps], ["step", "change", "status", "ratio [low-high]"])]
    top = ladder.top()
    if len(top):
        lines += ["", "configurations ranked by the screen (throughput over the baseline's)",
                  table([{**r, "throughput ok/s": r["qps"]} for r in top.to_dict("records")],
                        ["rank", "change", "throughput_ratio", "throughput ok/s"])]
    d = ladder.decision
    if d is not None and d.indeterminate:
        lines.append(f"note: {d.indeterminate}")
    if decided:
        closest = "\n      (the closest; TARGET NOT MET)" if inv.outcome == MISSED else ""
        why = ladder.why_unchanged()
        lines += ["", command_lines(f"python -m tuning serve {ladder.set_line()}", lead="ship: ") + closest,
                  f"      {ladder.python_call()}", *([f"      (the baseline stays: {why})"] if why else [])]
        cap = ladder.capacity
        if cap is not None and cap.met:
            lines += claim_lines(cap, f"python -m tuning loadtest {ladder.set_line()} --rate {cap.capacity:.1f} "
                                     f"--duration {hold_seconds(cap)} --target-p99-ms {t:g}")
    for v in inv.what_if.get("verdicts", []):
        lines.append(f"what-if: {v}")
    for c in (inv.what_if.get("host_cores") or {}).values():
        lines.append(f"what-if cores: {c['sentence']}")
    names = ", ".join(n for n in inv.files if n != "report.html")
    report = inv.files.get("report.html")
    lines.append((f"report: {report}  ({inv.wall_s:.0f} s; also {names})" if report else
                  f"files: {names or 'none'} under {inv.out} ({inv.wall_s:.0f} s)"))
    if ladder.objective == "target":  # the two figures a reader could take for one another
        lines.append(f"terms: capacity = the highest offered rate (req/s) whose p99 stays <= {t:.0f} ms; "
                     "throughput = ok answers/s under a closed loop, what the screen ranks")
    lines.append(headline(inv))
    return fit("\n".join(lines))


SERVER_COLUMNS = {"server_queue_ms": "server queue ms", "server_compute_ms": "server compute ms",
                  "server_mean_batch": "server batch"}


def tune_rows(rows: Any, space: Any, unit: str = "req/s") -> list[dict[str, Any]]:
    """``tune``'s table rows from its summary rows (``TuneRow.row()``, or tune.json's ``rows``): the knobs, the
    sustained throughput and its ratio over the baseline's, the capacity where checked, the server's own
    timings where its metrics gave them, peak memory, starts. ``unit``: req/s, or texts/s where configurations
    send different numbers of texts per request."""
    out = []
    server = [k for k in ("server_queue_ms", "server_compute_ms", "server_mean_batch")
              if any(r.get(k) is not None for r in rows)]
    for row in rows:
        ratio = row.get("throughput_ratio")
        span = (f"{ratio:.3f} [{fixed(row.get('low'), '.3f', '?')}-{fixed(row.get('high'), '.3f', '?')}]"
                if ratio is not None else "-")
        cap = ("-" if not row.get("checked") else f"{row['capacity']:.1f}" if row.get("capacity") is not None
               else "not met")
        out.append({**{k: row.get(k) for k in space},
                    f"throughput {unit}": "error" if row.get("error") else fixed(row.get("qps"), ".1f", "-"),
                    "ratio [95%]": span, "windows": row.get("windows"), f"capacity {unit}": cap,
                    "p99 ms": fixed(row.get("p99_ms"), ".0f", "-"),
                    **{SERVER_COLUMNS[k]: fixed(row.get(k), ".1f", "-") for k in server},
                    "peak MB": fixed(row.get("peak_memory_mb"), ".0f", "-"), "starts": row.get("starts")})
    return out


def format_tune(result: Any, unit: str = "req/s", command: str = "tune") -> str:
    """``tune``'s ending: the table, the confirmation, the target checks, and the configuration to run
    (``unit``: texts/s where configurations send different numbers of texts per request); where the claim was
    held (``result.verified``), the highest rate held is what ships."""
    from tuning.experiments.search import shown

    s = result.summary()
    rows = tune_rows(s["rows"], result.space, unit)
    lines = [f"{command}: {counted(len(result.rows), 'configuration')} ({result.search}), capacity at p99 <= "
             f"{result.target_p99_ms:.0f} ms"]
    if result.resumed:
        lines[0] += f"; {result.resumed} windows from the earlier run (--resume, not measured again)"
    if rows:
        lines.append(table(rows, list(rows[0])))
    for r in result.rows:
        if r.error:
            lines.append(f"error in {shown(' '.join(f'{k}={v}' for k, v in r.values.items()))}: {r.error}")
    for c in s["confirmations"]:
        lines.append(f"confirmation of {c['candidate']} against the baseline: {c['verdict']} after {c['pairs']} pairs, "
                     f"x{fixed(c.get('ratio'), '.3f')} [{fixed(c.get('low'), '.3f')}-{fixed(c.get('high'), '.3f')}]")
    for c in s["target_checks"]:
        cap, probes = c.get("capacity"), c.get("probes") or []
        undecided = [p for p in probes if p.get("verdict") == "indeterminate"]
        why = sorted({undecided_because(p) for p in undecided})
        lines.append(f"target check of {c['configuration']}: "
                     + (f"capacity {cap:.1f} {unit}" if cap is not None else "no rate tried met the target")
                     + (f" ({len(undecided)} of {len(probes)} windows could not tell, which does not pass: "
                        f"{'; '.join(why)})" if undecided else ""))
    if s.get("indeterminate"):
        lines.append(f"indeterminate: {s['indeterminate']}")
    if result.interrupted:
        when = "after its verdict" if result.best is not None else "before a verdict: nothing decided"
        lines.append(f"INTERRUPTED {when}; the table holds what was measured")
    if result.error:
        lines.append(f"NOT DECIDED: {result.error}")
    best, verified = result.best, result.verified
    with_values = shown(' '.join(f'{k}={v}' for k, v in best.values.items())) if best is not None else ""
    if best is None:
        if not result.interrupted and not result.error:
            lines.append(f"TARGET NOT MET: no configuration kept p99 <= {result.target_p99_ms:.0f} ms at any rate tried")
    elif verified is not None and verified.held is None:
        lead = "not shipped" if verified.interrupted or verified.error else "TARGET NOT MET when held"
        lines.append(f"{lead}: {with_values} was claimed at {best.capacity.capacity:.1f} {unit} by its target "
                     f"check; {verified.sentence()}")
    else:
        cap = result.capacity
        lines.append(f"ship: capacity {cap:.1f} {unit} at p99 <= {result.target_p99_ms:.0f} ms with {with_values}")
        if verified is not None:
            lines.append(f"      {verified.sentence()}")
        how, what = run_it(s)
        lines.append(command_lines(what, lead="run it: ") if how == "run it" else f"{how}: {what}")
        if s.get("url") and verified is None:
            lines += claim_lines(best.capacity, hold_command(s, cap, result.target_p99_ms, unit,
                                                            hold_seconds(best.capacity)))
        elif s.get("url") and verified.seconds < hold_seconds(best.capacity):  # a longer hold than this run's
            lines.append(command_lines(hold_command(s, cap, result.target_p99_ms, unit, hold_seconds(best.capacity)),
                                       lead="hold it longer: "))
    return fit("\n".join(lines))


HOLD_S = 180  # the hold a printed `loadtest --target-p99-ms` line asks for: minutes, for a bursty server's tail


def hold_seconds(cap: Any) -> int:
    """How long the printed hold asks for: :data:`HOLD_S`, or what a claim its windows could not certify with
    bursts counted would need (``Capacity.bursts``), if longer."""
    b = getattr(cap, "bursts", None) or {}
    need = b.get("hold_s") if b.get("verdict") != "pass" else None
    return max(HOLD_S, math.ceil(need)) if need is not None and math.isfinite(need) else HOLD_S


def claim_lines(cap: Any, hold: str) -> list[str]:
    """Under a met claim: whether its windows certified it with bursts counted, and the ``hold`` command."""
    said = bursts_line(cap)
    return [*([said] if said else []), command_lines(hold, lead="hold it: ")]


def bursts_line(cap: Any) -> str | None:
    """What a claim that its windows did not certify with bursts counted says (None: certified, or not known)."""
    if getattr(cap, "certified", None) is not False:
        return None
    b = cap.bursts
    need = (f"a hold of about {hold_seconds(cap)} s would" if b.get("hold_s") is not None
            else "no hold at this share would")
    return (f"      not certified with bursts counted: its slow answers came in bursts (design effect "
            f"{b['deff']:.0f}), so its windows bound the share over the target at {100 * b['share_high']:.1f}%, "
            f"not 1%; {need} tell. Hold it before you provision on it.")


def hold_command(s: dict[str, Any], rate: float, target_p99_ms: float, unit: str = "req/s",
                 duration_s: int = HOLD_S) -> str:
    """``loadtest --target-p99-ms`` holding the shipped configuration's claimed rate (``unit``: texts/s is
    turned into requests/s), runnable as printed: the run's URL (``{port}`` where the run chose a throwaway
    port for ``--cmd``) and the API flags it used."""
    import json
    import shlex
    from urllib.parse import urlsplit, urlunsplit

    url = s["url"]
    if s.get("cmd"):
        parts = urlsplit(url)
        url = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{{port}}"))
    api = s.get("api") or {}
    flags = [f"--api {api['name']}"] if api.get("name") not in (None, "tuning") else []
    flags += [f"--{k.replace('_', '-')} {api[k]}" for k in ("model_name", "input_name", "output_name") if api.get(k)]
    if api.get("template") is not None:
        flags.append(f"--body {shlex.quote(json.dumps(api['template']))}")
    batch = (s.get("best") or {}).get("client_batch") or api.get("client_batch")
    if batch and int(batch) > 1:
        flags.append(f"--client-batch {batch}")
    unit_rate = rate / int(batch) if unit == "texts/s" and batch and int(batch) > 1 else rate
    return (f"python -m tuning loadtest --url {url} {' '.join(flags) + ' ' if flags else ''}--rate {unit_rate:.1f} "
            f"--duration {duration_s} --target-p99-ms {target_p99_ms:g}")


UNDECIDED_BECAUSE = {  # why a target window could not tell, in the user's words
    "client lag": "the load generator fell behind its schedule, and its lag explains the slow answers (the "
                  "client's figure, not the server's)",
    "share": "the share over the target was too close to 1% for the window's length",
    "errors": "errors over the budget, not yet beyond chance",
}


def undecided_because(probe: dict[str, Any]) -> str:
    """Why an indeterminate target window could not tell (a probe's row): the client's lag, its share's bounds
    still holding 1%, or else its errors (over the budget, not beyond chance)."""
    from tuning.experiments.judge import EXCEED_SHARE

    if probe.get("by") == "client lag":
        return UNDECIDED_BECAUSE["client lag"]
    high = probe.get("share_high")
    return UNDECIDED_BECAUSE["share" if high is None or high > EXCEED_SHARE else "errors"]


def run_it(s: dict[str, Any]) -> tuple[str, str]:
    """How to ship the best configuration of a tune or ``investigate --url/--cmd`` summary, runnable as
    printed: ``("run it", your command line)`` with the winner's values and your own ``{port}`` and
    ``{metrics_port}`` placeholders (the run's ports were throwaway ones), or, for a running service whose
    only levers are the client's, ``("client", the setting to use)``."""
    best = s["best"]
    values = {k: str(best[k]) for k in s.get("space") or {}}
    if s.get("cmd"):
        from tuning.experiments.tune import fill

        return "run it", fill(s["cmd"], values, "{port}", "{metrics_port}")
    if "client_batch" in values:
        n = values["client_batch"]
        return "client", (f"send {n} texts per request (client_batch={n}: the batch size of your client's "
                          f"calls; --client-batch {n} here)")
    return "client", "nothing to change: the service and its client as they run"


def format_service(inv: Any) -> str:
    """``investigate --url`` / ``--cmd``'s ending: the engine's table and decision (as ``tune``), each watched
    configuration's diagnosis and latency stages, and what to ship."""
    s = inv.summary()
    lines = [format_tune(inv.tune, inv.tune.settings.engine.unit, "investigate")]
    for role, d in (s.get("diagnosis") or {}).items():
        if d.get("error"):
            lines.append(f"{role}: could not be watched: {d['error']}")
            continue
        diag = d.get("diagnosis") or {}
        lines.append(f"{role}: {diag.get('kind', '?')}: {'; '.join(diag.get('reasons') or [])}")
        st = d.get("stages") or {}
        if st.get("total_ms") is not None:
            server = (f"server {fixed(st.get('server_ms'), '.1f')} ms from {st['source']}" if st.get("source")
                      else "server time not exposed (in network)")
            lines.append(f"  latency {fixed(st['total_ms'], '.1f')} ms: client {fixed(st.get('client_ms'), '.1f')}, "
                         f"network {fixed(st.get('network_ms'), '.1f')}, {server}")
        if diag.get("cannot_see"):
            lines.append(f"  not visible: {'; '.join(diag['cannot_see'])}")
    if inv.out is not None:
        lines.append(f"files: {inv.out / 'report.html'}, {inv.out / 'summary.json'}")
    return fit("\n".join(lines))
