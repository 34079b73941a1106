"""Plain-text rendering of results for the terminal (charts live in ``tuning.charts``)."""

from __future__ import annotations

from typing import Any

from .cliguard import load_verdict, run_verdict


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A fixed-width text table."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def device_line(device: dict[str, Any] | None) -> str:
    """One line naming the device a result was made on; SIMULATED in capitals where it was."""
    device = device or {}
    if device.get("kind") == "simulated":
        return f"device: SIMULATED {device.get('profile')} ({device.get('source')}); host side measured, model call simulated"
    if device.get("kind"):
        return f"device: {device['kind']} ({device.get('name', '')}), measured"
    return "device: unknown"


def format_run(result) -> str:
    """The offline run as a readable block: headline figures, stage ledger, waits, errors."""
    s = result.summary()
    k = result.knobs
    lines = [
        device_line(s.get("device")),
        f"knobs: batch_size={k.batch_size} num_workers={k.num_workers} tokenizer={k.tokenizer} padding={k.padding} "
        f"dtype={k.dtype} graph={k.graph} device={k.device}",
        f"requests {s['requests']}  ok {s['ok']}  errors {s['errors']}  truncated {s['truncated']}  batches {s['batches']}",
        f"throughput {s['throughput_rps']:.1f} req/s   model busy {100 * s['model_busy']:.0f}%   "
        + (f"device busy {100 * s['device_busy']:.0f}%   " if s.get("device_busy") is not None else "")
        + f"padding waste {_fmt(s['padding_waste'])}   (window {s['window_s']:.1f} s; "
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
    return "\n".join(lines)


def format_profile(profile) -> str:
    """Diagnosis, top threads, stage ledger and the GPU section (or why there is none)."""
    s = profile.summary()
    d = s["diagnosis"]
    gpu = s["gpu"]
    device = (s.get("workload") or {}).get("device")
    lines = [*([device_line(device)] if device else []),
             f"diagnosis: {d['kind'].upper()}  ({'; '.join(d['reasons'])})", f"next step: {d['next_step']}",
             "evidence: " + ", ".join(f"{k}={_fmt(v)}" for k, v in d["evidence"].items()), ""]
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
        lines.append(f"GPU: {', '.join(gpu['devices'])}: SM util mean {_fmt(gpu.get('sm_util_mean'))}%, "
                     f"power {_fmt(gpu.get('power_w_mean'))} W ({_fmt(gpu.get('power_frac_mean'))} of limit), "
                     f"memory {_fmt(gpu.get('mem_used_mb_mean'), 0)} MB, {gpu['samples']} samples")
        if gpu.get("reason"):
            lines.append(f"GPU note: {gpu['reason']}")
    else:
        lines.append(f"GPU: none sampled: {gpu['reason']}")
    return "\n".join(lines)


def format_load(s: dict) -> str:
    """A load test's headline, latency percentiles, outcome counts and stage ledger."""
    mode = f"open loop at {s['rate']:.1f} req/s" if s["rate"] else f"closed loop at concurrency {s['concurrency']}"
    lines = [
        *([device_line(s["device"])] if s.get("device") else []),
        f"target {s['target']}: {mode}, {s['window_s']:.1f} s measured ({s['warmup_requests']} warm-up requests excluded)",
        f"QPS {s['qps']:.1f}   p50 {_fmt(s['p50_ms'], 0)} ms   p95 {_fmt(s['p95_ms'], 0)} ms   p99 {_fmt(s['p99_ms'], 0)} ms"
        f"   model busy {_fmt(None if s['model_busy'] is None else 100 * s['model_busy'], 0)}%"
        + (f"   device busy {100 * s['device_busy']:.0f}%" if s.get("device_busy") is not None else "")
        + f"   mean batch {_fmt(s['mean_batch'], 1)}",
        f"latency over every outcome (from the {s.get('latency_from', 'send')}); error rate "
        f"{_fmt(None if s.get('error_rate') is None else 100 * s['error_rate'], 1)}%   ok only: p50 "
        f"{_fmt(s.get('ok_p50_ms'), 0)} ms   p99 {_fmt(s.get('ok_p99_ms'), 0)} ms",
        *([f"offered {_fmt(s['offered_rate'], 1)} req/s   achieved {_fmt(s['achieved_rate'], 1)} req/s   send lag p50 "
           f"{_fmt(s['send_lag_p50_ms'], 1)} ms   p99 {_fmt(s['send_lag_p99_ms'], 1)} ms"] if s.get("offered_rate") else []),
        f"submitted {s['submitted']} = ok {s['ok']} + errors {s['errors']} + timeouts {s['timeouts']} + rejected {s['rejected']}",
        *([f"load generator {s.get('engine', 'tuning')}: client CPU {s['client_cpu']:.2f} cores"
           + (f", locust's own figures: {s['engine_stats'].get('rps') or 0:.1f} req/s, p99 "
              f"{_fmt(s['engine_stats'].get('p99_ms'), 0)} ms over the whole run" if s.get("engine_stats") else "")]
          if s.get("client_cpu") is not None else []),
    ]
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
    return "\n".join(lines)
