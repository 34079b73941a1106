"""The verdict sentences: what a table's numbers mean and the knob to try next, computed from them."""

from __future__ import annotations

import math
from typing import Any


def _num(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def run_verdict(s: dict[str, Any]) -> str:
    """One sentence for the offline run: where the time went and the knob to try next."""
    if not s.get("ok"):
        return "verdict: nothing was embedded; see the errors above."
    knobs = s.get("knobs") or {}
    waits = s.get("waits") or {}
    starved = _num((waits.get("wait_for_input") or {}).get("share_of_window")) or 0.0
    queued = _num((waits.get("wait_for_model") or {}).get("share_of_window")) or 0.0
    busy = _num(s.get("model_busy")) or 0.0
    waste = _num(s.get("padding_waste")) or 0.0
    if starved > 0.3:
        step = (f"the model waited for input {starved:.0%} of the window (starved): raise num_workers "
                f"(now {knobs.get('num_workers')}) or use tokenizer=fast")
    elif waste > 0.3:
        step = f"{waste:.0%} of the model's tokens are padding: try padding=bucket (see `plan`)"
    elif busy > 0.8 and (knobs.get("batch_size") or 1) < 8:
        step = (f"the model is busy {busy:.0%} of the window at batch_size={knobs.get('batch_size')}: "
                "larger batches amortize per-call cost (see `sweep batch`)")
    elif busy > 0.8:
        step = (f"the model is the bottleneck (busy {busy:.0%}, ready batches queued {queued:.0%} of the "
                "window): try dtype=bf16 or a faster device")
    else:
        step = f"the model is busy only {busy:.0%} of the window: look at the stage ledger's largest share"
    failed = int(s.get("errors") or 0)
    total = int(s.get("requests") or 0)
    lead = f"{failed} of {total} records failed ({failed / total:.0%}): see the errors above; " if failed and total else ""
    return f"verdict: {lead}{s.get('qps') or 0:.1f} ok answers/s; {step}."


def load_verdict(s: dict[str, Any]) -> str:
    """One sentence for a load test."""
    if not s.get("ok"):
        return "verdict: no request succeeded; see the reasons above."
    knobs = s.get("knobs") or {}
    batch = _num(s.get("mean_batch"))
    size = knobs.get("batch_size")
    busy = _num(s.get("model_busy"))
    err = _num(s.get("error_rate")) or 0.0
    parts = [f"{s.get('qps') or 0:.1f} QPS at p99 {s.get('p99_ms') or 0:.0f} ms"]
    if err > 0.01:
        parts.append(f"{err:.0%} of requests failed: fix those first (reasons above)")
    elif batch is not None and size and batch < 0.5 * size:
        parts.append(f"mean batch {batch:.1f} of batch_size {size}: too few requests in flight fill a batch "
                     f"before max_wait_ms ({knobs.get('max_wait_ms')}) expires; raise --concurrency, or max_wait_ms "
                     "if latency allows")
    elif busy is not None and busy > 0.85:
        parts.append(f"the model is busy {busy:.0%}: this is near capacity; more QPS needs a faster model step "
                     "(dtype, device) or a bigger batch_size")
    elif busy is not None:
        parts.append(f"the model is busy only {busy:.0%}: the server can take more load (raise --concurrency)")
    return "verdict: " + "; ".join(parts) + "."


def batch_sweep_verdict(summary: dict[str, Any]) -> str:
    """One sentence for ``sweep batch``: the knee and the knob to set."""
    ok = [p for p in summary.get("points") or [] if p.get("status") == "ok" and _num(p.get("per_sample_ms"))]
    if not ok:
        return "verdict: no batch size ran; see the status column."
    knee = summary.get("knee")
    best = min(ok, key=lambda p: p["per_sample_ms"])
    one = next((p for p in ok if p["batch_size"] == min(q["batch_size"] for q in ok)), ok[0])
    gain = one["per_sample_ms"] / best["per_sample_ms"] if best["per_sample_ms"] else 1.0
    if knee is None:
        return f"verdict: best per-sample cost at batch {best['batch_size']}; try --set batch_size={best['batch_size']}."
    return (f"verdict: the knee is batch {knee} ({gain:.1f}x cheaper per sample than batch {one['batch_size']}); "
            f"try --set batch_size={knee}; larger batches add latency for little throughput.")


def load_sweep_verdict(variable: str, rows: list[dict[str, Any]]) -> str:
    """One sentence for ``sweep concurrency`` / ``sweep wait``: the knee and the knob to try."""
    rows = [r for r in rows if _num(r.get("qps"))]
    if not rows:
        return "verdict: no point measured any request."
    best = max(rows, key=lambda r: r["qps"])
    knee = next(r for r in rows if r["qps"] >= 0.9 * best["qps"])
    knob = "--concurrency (clients in flight)" if variable == "concurrency" else f"--set {variable}={knee[variable]}"
    return (f"verdict: QPS reaches 90% of its best ({best['qps']:.1f}) at {variable}={knee[variable]} "
            f"(p99 {knee.get('p99_ms') or 0:.0f} ms); beyond it latency grows for little throughput: try {knob}.")


def precision_verdict(rows: list[dict[str, Any]], threshold: float | None = None) -> str:
    """Names the dtype to use and why, from the min cosine against fp32; the line is the investigation's own
    (MIN_COSINE), so that ``precision`` never recommends a dtype the investigation would not screen."""
    if threshold is None:
        from tuning.experiments.factors import MIN_COSINE

        threshold = MIN_COSINE
    ok = [r for r in rows if r.get("status") == "ok" and _num(r.get("min_cosine")) is not None]
    good = [r for r in ok if r["min_cosine"] >= threshold and r["dtype"] != "fp32"]
    skipped = [r["dtype"] for r in rows if r.get("status") != "ok"]
    if good:
        pick = max(good, key=lambda r: (r["dtype"] == "bf16", r["min_cosine"]))
        return (f"verdict: use --set dtype={pick['dtype']}: its worst text keeps cosine {pick['min_cosine']:.4f} "
                f">= {threshold} against fp32 (half the memory traffic)"
                + (f"; not measured on this device: {', '.join(skipped)}" if skipped else "") + ".")
    if ok:
        worst = min(ok, key=lambda r: r["min_cosine"])
        return (f"verdict: keep dtype=fp32: {worst['dtype']}'s worst text falls to cosine {worst['min_cosine']:.4f} "
                f"(< {threshold}).")
    return "verdict: keep dtype=fp32: no reduced precision could be measured on this device (see status)."
