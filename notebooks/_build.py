"""Write the workbook's notebooks from the cell lists below, without outputs.

    python notebooks/_build.py            # rewrite every notebook
    python notebooks/_build.py 02 04      # only those

Edit the cells here, not in the .ipynb files, so the notebooks stay in one house style:
the question first, a ``parameters`` cell, numbered steps of prose + a short call + an
interpretation printed from the numbers just measured, asserted facts, takeaways, a link on.
Cell ids are stable (``<notebook>-<n>``) so a rebuild changes only what was edited.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

SETUP = """import os
import tuning
from tuning import viz{widgets}
viz.setup_notebook()"""

DEVICE = """device = tuning.device_for(DEVICE)
viz.banner(device)"""


def params(*sizes: str) -> str:
    lines = ['DEVICE = os.environ.get("TUNING_DEVICE", "auto")  # "auto": CUDA if present, else the simulated H200; "cpu": the real CPU',
             'QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)']
    return "\n".join(lines + list(sizes))


def md(text: str) -> tuple[str, str]:
    return ("markdown", text.strip("\n"))


def code(text: str, *tags: str) -> tuple[str, str, tuple[str, ...]]:
    return ("code", text.strip("\n"), tags)


def header(number: str, title: str, question: str, measures: str, widgets: bool = False) -> list:
    return [
        md(f"# {number} · {title}\n\n**Question.** {question}\n\n**What this notebook measures.** {measures}"),
        code(SETUP.format(widgets=", widgets" if widgets else "")),
    ]


def footer(takeaways: list[str], next_link: str) -> list:
    return [md("## Takeaways\n\n" + "\n".join(f"- {t}" for t in takeaways) + f"\n\n**Next:** {next_link}")]


# --- 01 -----------------------------------------------------------------------------------

NB01 = header(
    "01", "Trend sampling: what does \"12% utilization\" hide?",
    "The service misses its QPS and p99 targets while the accelerator reads 12% busy. Is it steadily "
    "12%, or bursts of work between long idle gaps, and what is the host doing meanwhile?",
    "The `baseline` service under a fixed-concurrency load, recorded on one clock: model busy % and "
    "device busy % over time next to their averages, the GPU series (NVML on a GPU; on the simulated "
    "device a simulated sampler, labelled), per-thread CPU with thread names, and the computed diagnosis.",
) + [
    code(params(
        "CONCURRENCY = 16  # requests in flight (closed loop, like the team's load test)",
        "DURATION_S = 4 if QUICK else 30  # measured seconds of load",
        "INTERVAL_S = 0.25  # sampling interval (the team used nvidia-smi -l 2)",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: put the baseline service under load, with the recorder running

`Server` is the online service (bounded queue, preprocessing workers, dynamic batcher, one model
executor); `run_load` keeps `CONCURRENCY` requests in flight; `Recorder` samples the GPU (or its
simulated stand-in), every host thread and the model's busy spans on one clock.
"""),
    code("""
inputs = [raw for _, raw in tuning.read_lines(limit=500)]
with tuning.Server(tuning.preset("baseline", device=device.knob)) as server, tuning.Recorder(INTERVAL_S) as rec:
    load = tuning.run_load(server, inputs, concurrency=CONCURRENCY, duration_s=DURATION_S, warmup_requests=16)
"""),
    code("""
s = load.summary()
assert s["submitted"] == s["ok"] + s["errors"] + s["timeouts"] + s["rejected"], "every request gets one outcome"
print(f"{s['submitted']} requests in {s['window_s']:.1f} s: {s['ok']} ok, {s['errors']} errors, {s['timeouts']} timeouts, "
      f"{s['rejected']} rejected; {s['qps']:.1f} QPS, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms")
"""),
    md("""
## Step 2: the trend, not the average

Each point is the share of one short window the model (or the device) was busy. The dashed lines are
the averages a dashboard would show.
"""),
    code("""
profile = rec.join(load)
viz.trend_chart(profile)
"""),
    code("""
busy = profile.to_frame("busy").busy
avg, gaps = load.model_busy, (busy < 0.5 * load.model_busy).mean()
print(f"Average model busy {avg:.0%}, yet windows ranged from {busy.min():.0%} to {busy.max():.0%}; "
      f"{gaps:.0%} of windows were below half the average.")
gpu = profile.summary()["gpu"]
print(f"GPU section ({', '.join(gpu['devices']) or 'no GPU'}): " + (gpu["reason"] or "NVML") + (
      f"; mean utilization {gpu['sm_util_mean']:.0f}%, power {viz.pct(gpu.get('power_frac_mean'))} of the limit" if gpu.get("sm_util_mean") is not None else ""))
"""),
    md("""
## Step 3: per thread, not per process

Whole-process CPU can look moderate while one thread is pegged: a single-threaded choke point. This
is `top -H` for the service (a probe process reads it, so a busy Python thread cannot delay it).
"""),
    code("viz.threads_chart(profile)"),
    code("""
threads = "; ".join(f"{t['name']} {t['cpu_mean']:.0f}%" for t in profile.top_threads(3))
print(f"Whole process: {profile.summary()['host'].get('cpu_percent_mean', float('nan')):.0f}% of one core on average "
      f"({profile.host.cpu_count} cores here). Per thread: {threads}.")
"""),
    md("""
## Step 4: the diagnosis

The recorder joins the signals (model and device busy, waits for input, burst lengths, batch sizes,
the busiest thread, disk) and names one of `starved`, `fragmented`, `blocked`, `saturated`, with its
evidence and the next knob to try (thresholds live in `tuning/profile/diagnose.py`).
"""),
    code("""
d = profile.diagnosis
print(f"diagnosis: {d.kind}\\nevidence: " + "; ".join(d.reasons) + f"\\nnext: {d.next_step}")
"""),
] + footer([
    "Sample trends (every 0.25-2 s), never trust a window average alone: the same average can be a steady "
    "plateau or bursts between idle gaps.",
    "Read model busy and device busy side by side: the host can be busy launching work the device finishes quickly.",
    "Look per thread: one pegged thread is a choke point that the process total hides.",
    "On the simulated device every device figure is a prediction (labelled); host figures are real.",
], "[02 · Stage-time accounting](02-stage-time-accounting.ipynb): where each request's time goes.")


# --- 02 -----------------------------------------------------------------------------------

NB02 = header(
    "02", "Stage-time accounting: where does a request's time go?",
    "The model is idle much of the time (notebook 01). Which stage of a request takes the time: reading, "
    "preprocessing, waiting, copying, the model, or postprocessing? And is the tail made of the same stages?",
    "The `baseline` configuration replayed offline through the DataLoader, every stage of every request "
    "timed on one clock: `read`, `preprocess`, `wait_for_model` (a ready batch waiting for the model), "
    "`copy`, `inference`, `postprocess`; per batch also the model's wait for input. Then the two waits, the "
    "computed diagnosis, and the same ledger for `tuned`.",
) + [
    code(params("LIMIT = 200 if QUICK else 1200  # records replayed per run"), "parameters"),
    code(DEVICE),
    md("""
## Step 1: replay the baseline under the recorder

`profile_pipeline` runs the offline pipeline with the recorder around it; `profile.workload` is the
run's result (raw per-request and per-batch records; statistics on demand).
"""),
    code("""
profile = tuning.profile_pipeline(tuning.preset("baseline", device=device.knob), limit=LIMIT)
result = profile.workload
result.ledger().round(3)
"""),
    code("""
s = result.summary()
assert s["ok"] + s["errors"] == s["requests"] == LIMIT, "every record gets exactly one outcome"
print(f"{s['requests']} records: {s['ok']} ok, {s['errors']} errors; {s['throughput_rps']:.1f} req/s, model busy {s['model_busy']:.0%}")
"""),
    md("""
## Step 2: the ledger, p50 against p99

Each bar stacks the stages' percentiles for one request: the median request, then the tail. The team's
ledger read: preprocessing 680 ms, inference 42 ms (3%), other waiting 390 ms, of 1.3 s.
"""),
    code("viz.ledger_chart(result)"),
    code("""
ledger = result.ledger()
assert abs(ledger.share.sum() - 1) < 1e-6 and abs(ledger.share_p99.sum() - 1) < 1e-6, "shares add up to 100%"
top50, top99 = ledger.share.idxmax(), ledger.share_p99.idxmax()
print(f"Median request: {top50} is the largest stage ({ledger.share[top50]:.0%}); tail (p99): {top99} ({ledger.share_p99[top99]:.0%}). "
      f"The model itself (inference) is {ledger.share['inference']:.0%} of the median and {ledger.share_p99['inference']:.0%} of the tail.")
"""),
    md("""
## Step 3: the two waits

*Wait for input*: the model idle because no batch is ready (starvation: feed it faster).
*Wait for model*: a ready batch idle because the model is busy (back-pressure: the model is the constraint).
"""),
    code("""
waits = result.waits()
waits
"""),
    code("""
starved, backed = waits["wait_for_input"]["share_of_window"], waits["wait_for_model"]["share_of_window"]
verdict = ("batches sat ready while the model idled: the handoff from loader to model is slow" if min(starved, backed) >= 0.3
           else "the input side is too slow: feed the model faster" if starved > backed else "the input side keeps up: the model side is the constraint")
print(f"The model waited for input {starved:.0%} of the window (busy {result.model_busy:.0%}); ready batches waited to reach it {backed:.0%}: {verdict}.")
"""),
    md("""
## Step 4: the diagnosis, computed from these numbers
"""),
    code("""
d = profile.diagnosis
print(f"diagnosis: {d.kind}\\nevidence: " + "; ".join(d.reasons) + f"\\nnext: {d.next_step}")
"""),
    md("""
## Step 5: the same ledger after tuning

`tuned` is the end of the ladder (batched fast tokenizer, length buckets, batches of 16, bf16). The
next notebooks take it one knob at a time.
"""),
    code("""
tuned = tuning.Pipeline(tuning.preset("tuned", device=device.knob)).run(limit=LIMIT)
viz.ledger_chart({"baseline": result, "tuned": tuned})
"""),
    code("""
gain = tuned.throughput_rps / result.throughput_rps
assert gain > 1, f"tuned should beat baseline; measured {gain:.2f}x"
print(f"tuned: {tuned.throughput_rps:.1f} req/s against {result.throughput_rps:.1f} ({gain:.1f}x); "
      f"median request {tuned.ledger().p50_ms.sum():.1f} ms against {ledger.p50_ms.sum():.1f} ms (sum of stage p50s).")
"""),
] + footer([
    "A per-request ledger is the most direct evidence there is: it names the stage, not a suspect.",
    "Read p99 next to p50: the tail can be made of different stages (queues and waits) than the median.",
    "Two waits, two remedies: waiting for input means feed the model (workers, prefetch, fast tokenizer); "
    "waiting for the model means make the model side cheaper (batching, padding, precision, graphs).",
], "[03 · DataLoader tuning and the batch sweep](03-dataloader-tuning.ipynb).")


# --- 03 -----------------------------------------------------------------------------------

NB03 = header(
    "03", "DataLoader tuning and the batch-size sweep",
    "How much of the model's idle time do loader workers, prefetching and pinned memory remove, and what "
    "batch size buys throughput before latency pays for it?",
    "The offline pipeline with one knob changed at a time, from `baseline`: `num_workers`, then "
    "`prefetch_factor`, then `pin_memory`, each judged by the model's wait for input (the share of the "
    "window the model sat idle for lack of a batch). Then the batch-size sweep at fixed shapes and its "
    "knee, and a knob panel to try combinations yourself.",
    widgets=True,
) + [
    code(params(
        "LIMIT = 200 if QUICK else 1200  # records replayed per run",
        "WORKERS = (0, 2, 4)  # num_workers values to compare",
        "SIZES = (1, 2, 4, 8, 16, 32) if QUICK else (1, 2, 4, 8, 16, 32, 64, 128)  # batch sweep",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: loader workers, one value at a time

Everything else stays at `baseline` (batch 1, naive tokenizer). With `num_workers=0` the main process
reads and tokenizes between model calls; with workers, other processes prepare batches in parallel.
"""),
    code("""
base = tuning.preset("baseline", device=device.knob)
runs = {f"workers={n}": tuning.Pipeline(base.replace(num_workers=n)).run(limit=LIMIT) for n in WORKERS}
viz.waits_chart(runs)
"""),
    code("""
starved = lambda r: r.waits()["wait_for_input"]["share_of_window"]  # share of the window the model sat idle for input
best = min(runs, key=lambda k: starved(runs[k]))
print("; ".join(f"{k}: model waited {starved(r):.0%}, {r.throughput_rps:.1f} req/s" for k, r in runs.items()) + f". Least starved: {best}.")
"""),
    md("""
## Step 2: prefetching, then pinned memory, on top of the best worker count

`prefetch_factor` batches per worker are prepared ahead (double buffering); `pin_memory` makes
host-to-device copies faster and asynchronous (on a CPU-only run it has nothing to copy to and is
refused, so that run is skipped).
"""),
    code("""
n = min((n for n in WORKERS if n > 0), key=lambda n: starved(runs[f"workers={n}"]))
workers, ref = base.replace(num_workers=n), runs[f"workers={n}"]
extra = {f"workers={n}, prefetch 4": tuning.Pipeline(workers.replace(prefetch_factor=4)).run(limit=LIMIT)}
"""),
    code("""
if device.knob != "cpu":
    extra[f"workers={n}, prefetch 4, pinned"] = tuning.Pipeline(workers.replace(prefetch_factor=4, pin_memory=True)).run(limit=LIMIT)
viz.waits_chart({f"workers={n}": ref, **extra})
"""),
    code("""
print("; ".join(f"{k}: model waited {starved(r):.0%} (without: {starved(ref):.0%}), {r.throughput_rps:.1f} req/s (without: {ref.throughput_rps:.1f})"
                for k, r in extra.items()) + ".")
"""),
    md("""
## Step 3: the batch-size sweep and its knee

Fixed shapes (64 tokens, no padding), so only the batch size changes. The knee is the smallest batch
whose per-sample cost is within 5% of the best; past it, bigger batches add latency for little throughput.
The team found a batch of 8 cost about 1.8x a batch of 1.
"""),
    code("""
sweep = tuning.run_batch_sweep(base.replace(batch_size=1), sizes=list(SIZES), length=64)
viz.batch_sweep_chart(sweep)
"""),
    code("""
f = sweep.to_frame().set_index("batch_size")
assert sweep.knee in f.index, "the knee is one of the measured sizes"
print(f"A batch of 8 costs {f.per_batch_ms[8] / f.per_batch_ms[1]:.1f}x a batch of 1 ({f.per_sample_ms[8] / f.per_sample_ms[1]:.0%} per request). "
      f"Knee at batch {sweep.knee}; doubling stops paying (< 5%) after batch {sweep.diminishing}.")
"""),
    md("""
## Step 4: try it yourself

Each control reruns a short replay (a few seconds) and redraws the chart in place; the panel keeps the
last result (`panel.result`) and every run (`panel.history`). A combination the pipeline refuses is
explained instead of measured.
"""),
    code("""
panel = widgets.knob_panel(workers.replace(batch_size=sweep.knee), limit=LIMIT, device=device)
panel
"""),
    code("""
assert panel.result is not None and panel.history, panel.status.value
print(f"panel: {panel.history[-1]['throughput']:.1f} req/s with batch_size={panel.knobs.batch_size}, num_workers={panel.knobs.num_workers}")
"""),
] + footer([
    "Judge loader knobs by the model's wait for input, not by CPU use: the goal is a model that never waits.",
    "More workers help until they compete with the model and each other for cores; measure, do not assume.",
    "Batch up to the knee of the per-sample cost; beyond it latency grows for little throughput.",
], "[04 · Padding, vectorized preprocessing and precision](04-padding-and-precision.ipynb).")


# --- 04 -----------------------------------------------------------------------------------

NB04 = header(
    "04", "Padding, vectorized preprocessing and precision",
    "Once the model is fed, how much of the work is waste? Per-record Python tokenization, padded tokens the "
    "model computes for nothing, and more precision than the answer needs.",
    "The naive (pure-Python) and fast (batched Rust) tokenizers on the same texts (ids must be identical, "
    "then time per record); padded tokens per real token for dynamic, fixed and planned-bucket padding, and "
    "what each does to throughput; fp32 against bf16/fp16 embeddings on the **real model** (accuracy is never "
    "simulated), then their speed on the device.",
) + [
    code(params(
        "LIMIT = 200 if QUICK else 1200  # records per run",
        "TEXTS = 32 if QUICK else 256  # texts for the accuracy check (real model)",
        "K = 4  # bucket lengths to plan (= shapes to compile or capture)",
        "MIN_COSINE = 0.99  # accept a precision whose worst text keeps this cosine to fp32",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: vectorized preprocessing, naive against fast tokenizer

Same texts, same batches. The fast tokenizer must give the *same ids*; only then does its speed count.
"""),
    code("""
texts = tuning.load_texts(limit=LIMIT)
tok = tuning.compare_tokenizers(texts)
tok.to_frame()
"""),
    code("""
assert tok.ids_identical, f"the tokenizers disagree on texts {tok.mismatches[:5]}"
print(f"Identical ids on all {tok.texts} texts; the fast tokenizer takes {1e6 * tok.seconds['fast'] / tok.texts:.0f} µs per record "
      f"against {1e6 * tok.seconds['naive'] / tok.texts:.0f} ({tok.speedup:.1f}x faster, host CPU).")
viz.tokenizer_chart(tok)
"""),
    md("""
## Step 2: padding waste by strategy

The model computes every padded token (on a CPU as much as a real one). *Dynamic* pads each batch to
its longest request in arrival order; *fixed* pads everything to one length (one shape, easy to capture);
*planned buckets* pad to the nearest of `K` lengths chosen from the observed length histogram.
"""),
    code("""
waste = tuning.padding_waste(tuning.observed_lengths(limit=LIMIT), batch_size=16, k=K)
viz.padding_chart(waste)
"""),
    code("""
w = waste.to_frame().set_index("strategy").waste
fixed, planned = w.filter(like="fixed").iloc[0], w.filter(like="planned").iloc[0]
assert planned < fixed, "planned buckets must waste less than fixed padding"
print(f"Extra tokens computed: fixed {fixed:.0%}, dynamic (arrival order) {w.iloc[0]:.0%}, "
      f"{K} planned buckets {list(waste.planned)} {planned:.0%}, with {K} shapes instead of one.")
"""),
    md("""
## Step 3: what the padding does to throughput on the device
"""),
    code("""
base = tuning.preset("tuned", device=device.knob, dtype="fp32", buckets=waste.planned)
pads = {p: tuning.Pipeline(base.replace(padding=p)).run(limit=LIMIT) for p in ("dynamic", "fixed", "bucket")}
viz.throughput_chart(pads)
"""),
    code("""
fastest = max(pads, key=lambda p: pads[p].throughput_rps)
print("; ".join(f"{p}: {r.throughput_rps:.1f} req/s, padding waste {r.padding_waste:.0%}, device busy {viz.pct(r.device_busy)}, model busy {r.model_busy:.0%}"
                for p, r in pads.items()) + f". Fastest here: {fastest}; padding costs throughput once the model side is the bottleneck.")
"""),
    md("""
## Step 4: half precision, checked on the real model first

Cosine similarity of each text's embedding against fp32, on the real model on this machine (CUDA when
present, else the CPU). A precision the device cannot run is listed as refused.
"""),
    code("""
report = tuning.precision_report(texts[:TEXTS])
report.to_frame()
"""),
    code("""
ok = report.to_frame().query("status == 'ok'")
assert len(ok) and (ok.min_cosine >= MIN_COSINE).all(), f"a half precision fell under cosine {MIN_COSINE}"
print("; ".join(f"{r.dtype}: worst text {r.min_cosine:.5f}, mean {r.mean_cosine:.5f}" for r in ok.itertuples()) + f" (real model on {report.device}).")
viz.precision_chart(report)
"""),
    md("""
## Step 5: and its speed on the device
"""),
    code("""
dtypes = ("fp32", "bf16") if device.knob == "cpu" else ("fp32", "bf16", "fp16")
runs = {d: tuning.Pipeline(base.replace(padding="bucket", dtype=d)).run(limit=LIMIT) for d in dtypes}
viz.throughput_chart(runs)
"""),
    code("""
print("; ".join(f"{d}: {r.throughput_rps:.1f} req/s, model busy {r.model_busy:.0%}, device busy {viz.pct(r.device_busy)}" for d, r in runs.items())
      + f". bf16 against fp32: {runs['bf16'].throughput_rps / runs['fp32'].throughput_rps:.2f}x throughput, "
      f"{runs['bf16'].model_busy / runs['fp32'].model_busy:.2f}x model time.")
"""),
] + footer([
    "Check equality before speed: a faster tokenizer or precision only counts if the output is the same (ids) or close enough (cosine).",
    "Padding is compute: plan a few bucket lengths from the observed lengths instead of padding everything to the maximum.",
    "The number of buckets is also the number of shapes to compile or capture (notebook 05).",
    "Accuracy is always measured on the real model; only device time is ever simulated.",
], "[05 · Graph capture](05-graph-capture.ipynb).")


# --- 05 -----------------------------------------------------------------------------------

NB05 = header(
    "05", "Graph capture: removing launch overhead",
    "At small batches the host spends its time launching many short kernels. How much could capturing the "
    "graph once and replaying it save, and does the replay give the same outputs?",
    "The launch-overhead budget of eager at batch 1 (the most capture could save, predicted before "
    "capturing); outputs of `compile` (and `cuda_graph` on CUDA) checked against eager before anything is "
    "timed; then eager against compile against capture by batch size. Without CUDA, capture runs on the "
    "simulated device (labelled) and `compile` runs for real on the CPU.",
) + [
    code(params(
        "LIMIT = 200 if QUICK else 1200  # records per run",
        "CHECK = 64 if QUICK else 256  # records for the output check (and the compile timing)",
        "SIZES = (1, 8) if QUICK else (1, 4, 8, 16, 32)  # batch sizes to time",
        "LENGTH = 64  # tokens per request in the timed shapes",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: the launch-overhead budget, before capturing anything

Eager at batch 1 under the recorder. The launch share is the part of each model call the host spends
launching kernels instead of the device computing: on the simulated device, model busy minus device
busy; on a real device, launches x the measured cost of one launch.
"""),
    code("""
eager = tuning.preset("tuned", device=device.knob, batch_size=1, dtype="fp32")
profile = tuning.profile_pipeline(eager, limit=LIMIT)
viz.launch_budget_chart(profile)
"""),
    code("""
sig = profile.signals
print(f"model busy {sig.model_busy:.0%}, device busy {viz.pct(sig.device_busy)}: launch overhead is {sig.launch_share:.0%} of each model call, "
      f"so capture can cut at most that much of the model's time at batch 1 ({profile.diagnosis.kind}).")
"""),
    md("""
## Step 2: outputs against eager, before any timing

Real models only: `compile` on the CPU (or the GPU), and `cuda_graph` when CUDA is present. The
simulated device returns stand-in embeddings, so it is never part of this check.
"""),
    code("""
real = "cuda" if device.knob == "cuda" else "cpu"
check = tuning.preset("tuned", device=real, dtype="fp32", padding="fixed", max_length=LENGTH, batch_size=8)
outputs = {g: tuning.Pipeline(check.replace(graph=g)).run(limit=CHECK) for g in ("eager", "compile") + (("cuda_graph",) if real == "cuda" else ())}
"""),
    code("""
agree = {g: tuning.compare_outputs(outputs["eager"], r) for g, r in outputs.items() if g != "eager"}
for g, a in agree.items():
    assert a["min_cosine"] > 0.999 and a["compared"] == outputs["eager"].ok, f"{g} disagrees with eager: {a}"
print("; ".join(f"{g} vs eager on {a['compared']} records: min cosine {a['min_cosine']:.6f}, max |diff| {a['max_abs_diff']:.1e}" for g, a in agree.items()))
"""),
    md("""
## Step 3: time per batch by graph mode

First the runs just checked, on the real device: the model call per batch of 8 x `LENGTH` tokens
(compilation happened in warm-up, outside the window; each shape costs seconds to compile on a CPU, so
one shape here; `python -m tuning sweep batch --set graph=compile` sweeps more). Then capture against
eager by batch size on the device this notebook runs on.
"""),
    code("viz.graph_modes_chart(outputs)"),
    code("""
c = {g: r.ledger().loc["inference", "p50_ms"] for g, r in outputs.items()}
print(", ".join(f"{g}: {ms:.2f} ms" for g, ms in c.items()) + f" per batch of 8 on the real {real}: "
      + ", ".join(f"{g} {c['eager'] / ms:.2f}x eager's speed" for g, ms in c.items() if g != "eager") + ".")
"""),
    code("""
graph_knobs = tuning.preset("tuned", device=device.knob, dtype="bf16")
captured = {g: tuning.run_batch_sweep(graph_knobs.replace(graph=g), sizes=list(SIZES), length=LENGTH) for g in ("eager", "cuda_graph")} if device.knob != "cpu" else {}
viz.graph_modes_chart(captured) if captured else print("DEVICE='cpu': no capture on a CPU; run with DEVICE='auto' for the simulated device")
"""),
    code("""
if captured:
    g = {m: s.to_frame().set_index("batch_size").per_batch_ms for m, s in captured.items()}
    gains = {b: g["eager"][b] / g["cuda_graph"][b] for b in SIZES}
    assert gains[SIZES[0]] > 1, f"capture should beat eager at batch {SIZES[0]}: {gains}"
    print(f"cuda_graph against eager ({viz.device_label(device)}): " + ", ".join(f"batch {b}: {x:.2f}x" for b, x in gains.items()))
"""),
] + footer([
    "Predict before you capture: the launch share bounds what capture can save; at large batches it shrinks.",
    "Check replayed outputs against eager before timing anything: a fast wrong answer is not a speed-up.",
    "Capture needs fixed shapes: one graph per (batch, bucket) shape, so plan few buckets (notebook 04).",
    "`compile` can fuse operators on any device; capture removes per-kernel launches on CUDA.",
], "[06 · Request batching and the ladder](06-request-batching.ipynb).")


# --- 06 -----------------------------------------------------------------------------------

NB06 = header(
    "06", "Request batching and the whole ladder",
    "Online, requests arrive one at a time. How long should the batcher wait to fill a batch, how does "
    "that trade QPS against p99, and what did each change of the investigation buy, one at a time?",
    "The server under closed-loop load: a `max_wait_ms` sweep and a concurrency sweep (QPS and p99 per "
    "value); then the ladder from `baseline` to the recommended configuration, one variable per rung, each "
    "measured against the one before (the same function `python -m tuning investigate` runs), as one table "
    "and one chart; and a knob panel over the live server.",
    widgets=True,
) + [
    code(params(
        "REQUESTS = 150 if QUICK else 1500  # measured requests per sweep point",
        "CONCURRENCY = 16  # clients in flight",
        "WAITS = (0.0, 5.0, 20.0) if QUICK else (0.0, 2.0, 5.0, 10.0, 20.0, 50.0)  # max_wait_ms values",
        "CONCURRENCIES = (1, 8, 32) if QUICK else (1, 4, 8, 16, 32, 64)",
        "LADDER = dict(duration_s=2.0, warmup_s=0.5, repeats=0, sweep_sizes=(1, 8), sweep_rounds=1, waits_ms=(5.0, 20.0),",
        "              precision_texts=16, limit=300) if QUICK else {}  # ladder settings (seconds of load per rung, ...)",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: how long should a batch wait to fill?

`max_wait_ms` is the longest the oldest request in a forming batch waits for company. Zero sends
whatever is there; more fills batches (throughput) at the cost of waiting (latency).
"""),
    code("""
inputs = [raw for _, raw in tuning.read_lines(limit=500)]
online = tuning.preset("tuned", device=device.knob, concurrency=CONCURRENCY)
waits = tuning.load_sweep(online, inputs, "max_wait_ms", list(WAITS), requests=REQUESTS)
"""),
    code("""
assert (waits.ok + waits.errors + waits.timeouts + waits.rejected == REQUESTS).all(), "outcome counts add up per point"
viz.load_sweep_chart(waits, "max_wait_ms", device=device)
"""),
    code("""
best = waits.loc[waits.qps.idxmax()]
print("; ".join(f"max_wait {r.max_wait_ms:g} ms: {r.qps:.0f} QPS, p99 {r.p99_ms:.0f} ms, mean batch {r.mean_batch:.1f}" for r in waits.itertuples())
      + f". Highest QPS at max_wait {best.max_wait_ms:g} ms.")
"""),
    md("""
## Step 2: concurrency, at that wait
"""),
    code("""
conc = tuning.load_sweep(online.replace(max_wait_ms=float(best.max_wait_ms)), inputs, "concurrency", list(CONCURRENCIES), requests=REQUESTS)
viz.load_sweep_chart(conc, "concurrency", device=device)
"""),
    code("""
print("; ".join(f"{r.concurrency} in flight: {r.qps:.0f} QPS, p99 {r.p99_ms:.0f} ms" for r in conc.itertuples())
      + f". QPS grew {conc.qps.iloc[-1] / conc.qps.iloc[0]:.1f}x from {conc.concurrency.iloc[0]} to {conc.concurrency.iloc[-1]} clients, p99 {conc.p99_ms.iloc[-1] / conc.p99_ms.iloc[0]:.1f}x.")
"""),
    md("""
## Step 3: the ladder, one change at a time

From `baseline`, each rung changes one thing and is measured against the rung before it; a change that
does not help is not kept. This is the package function the `investigate` command runs.
"""),
    code("""
ladder = tuning.run_ladder(device=device, settings=tuning.LadderSettings(concurrency=CONCURRENCY, **LADDER))
ladder.to_frame()[["step", "change", "status", "qps", "p99_ms", "model_busy", "device_busy", "gain", "reason"]]
"""),
    code("viz.ladder_chart(ladder)"),
    code("""
s = ladder.summary()
assert s["result"]["qps_ratio"] > 1, f"the recommended configuration should beat baseline: {s['result']} vs {s['baseline']}"
kept = [r["step"] for r in s["steps"] if r["status"] == "kept"]
print(f"baseline {s['baseline']['qps']:.1f} QPS -> recommended {s['result']['qps']:.1f} QPS ({s['result']['qps_ratio']:.1f}x), "
      f"p99 {s['baseline']['p99_ms']:.0f} -> {s['result']['p99_ms']:.0f} ms; kept: {', '.join(kept)}.")
print(f"Ship it with: {ladder.set_line()}")
"""),
    md("""
## Step 4: the live server, under your hands

Each control restarts the server with the new knobs and runs a few seconds of load; the chart updates
in place and `panel.result` keeps the last load result.
"""),
    code("""
panel = widgets.knob_panel(online.replace(max_wait_ms=float(best.max_wait_ms)), mode="online", duration_s=3, device=device)
panel
"""),
    code("""
assert panel.result is not None, panel.status.value
r = panel.result.summary()
print(f"panel: {r['qps']:.0f} QPS, p99 {r['p99_ms']:.0f} ms; {r['submitted']} = {r['ok']} ok + {r['errors']} errors + {r['timeouts']} timeouts + {r['rejected']} rejected")
"""),
] + footer([
    "Dynamic batching trades a bounded wait for fuller batches: sweep `max_wait_ms` against your p99 target.",
    "Change one thing at a time and measure it against the step before; keep only what helps.",
    "Build the queue and the batcher into the service from day one, after deciding whether latency or throughput comes first.",
    "Why stop near 80% busy: the last points cost latency stability.",
], "[07 · Your own service](07-your-own-service.ipynb): the same steps on your model, data or URL; or run the "
   "whole ladder with `python -m tuning investigate`.")


# --- 07 -----------------------------------------------------------------------------------

NB07 = header(
    "07", "Your own service",
    "Your service misses its QPS or p99 target. Do the workbook's steps find why on *your* model, *your* "
    "data and *your* running service, and what would your accelerator do with it?",
    "Your model (a sentence-transformers style folder or a `module:factory`) and your requests (JSONL, "
    "CSV, Parquet or plain text) checked, then replayed through the offline pipeline with every stage "
    "timed; your service watched from outside under load (per-thread CPU, memory, the GPU's NVML series) "
    "with a diagnosis that says what it cannot see; and a simulated device fitted to a batch sweep of your "
    "model on your accelerator. Left as they are, the parameters use a tiny random BERT as the stand-in "
    "for your model, the demo records, and a service started here in a process of its own.",
) + [
    code(params(
        'MODEL = os.environ.get("TUNING_MODEL")  # a model folder or "module:factory"; None: a tiny random BERT stand-in',
        'DATA = os.environ.get("TUNING_DATA")  # your requests (.jsonl, .csv, .parquet, .txt); None: the demo records',
        "TEXT_FIELD, TEXT_COLUMN = None, None  # where the text is: a JSONL field, a CSV/Parquet column (None: 'text')",
        'PID = int(os.environ.get("TUNING_PID", "0")) or None  # your running service; None: start one here',
        'URL = os.environ.get("TUNING_URL")  # its endpoint, taking POST {"text": ...} (needed with PID)',
        'SWEEPS = [p for p in os.environ.get("TUNING_SWEEPS", "").split(",") if p]  # `sweep batch --json` files '
        "from your GPU; none: sweep here",
        "LIMIT = 200 if QUICK else 2000  # requests read",
        "DURATION_S = 3 if QUICK else 20  # seconds of load while watching",
        "CONCURRENCY = 8  # requests in flight (closed loop)",
    ), "parameters"),
    code(DEVICE),
    md("""
## Step 1: point the workbook at your model and your data

`resolve_model` takes what `--model` takes on the command line and returns the model, its tokenizer
and a label; a folder must hold `config.json`, safetensors weights and `tokenizer.json` (pickled weights
are never loaded). `read_inputs` reads any supported format; a row that cannot be a request stays in
the list as an error with its line or row number and reason, so the counts add up.
"""),
    code("""
model_dir = MODEL or str(tuning.save_tiny_bert())
real = "cuda" if device.knob == "cuda" else "cpu"  # accuracy and the service always run on a real device
model, tokenizer, label = tuning.resolve_model(model_dir, tuning.preset("tuned", device=real))
inputs = [raw for _, raw in tuning.read_inputs(DATA or tuning.DEFAULT_DATA, limit=LIMIT, text_field=TEXT_FIELD, text_column=TEXT_COLUMN)]
print(f"model: {label}\\nrequests: {len(inputs)} read from {DATA or 'the demo records'}")
"""),
    md("""
Check before timing: the model gives one finite embedding per valid request, on a real device.
"""),
    code("""
check = tuning.Pipeline(tuning.preset("tuned", device=real, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs[:64])
vectors = list(check.embeddings.values())
assert check.ok + check.errors == len(check.requests) == min(64, len(inputs)), "every request gets one outcome"
assert check.ok and all(v.shape == vectors[0].shape and bool((v == v).all()) for v in vectors), "finite embeddings"
print(f"{check.ok} embeddings of dimension {vectors[0].shape[0]}, {check.errors} invalid requests"
      + (f" (first: line/row {check.error_reasons()[0]['first_lines'][0]}: {check.error_reasons()[0]['reason']})" if check.errors else ""))
"""),
    md("""
## Step 2: account for every request's time

The offline pipeline replays your requests through your model, every stage timed on one clock:
first at the investigation's starting point (`baseline`), then at the end of its ladder (`tuned`).
"""),
    code("""
runs = {name: tuning.Pipeline(tuning.preset(name, device=device.knob, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs)
        for name in ("baseline", "tuned")}
viz.ledger_chart(runs)
"""),
    code("""
base, tuned = runs["baseline"], runs["tuned"]
ledger = base.ledger()
top = ledger.share.idxmax()
assert abs(ledger.share.sum() - 1) < 1e-6 and base.ok + base.errors == len(inputs), "shares and counts add up"
print(f"baseline: {base.throughput_rps:.1f} req/s, model busy {base.model_busy:.0%}; its largest stage is {top} "
      f"({ledger.share[top]:.0%} of the median request), the model itself {ledger.share['inference']:.0%}. "
      f"tuned: {tuned.throughput_rps:.1f} req/s ({tuned.throughput_rps / base.throughput_rps:.1f}x), model busy {tuned.model_busy:.0%}.")
"""),
    md("""
## Step 3: watch your service from outside, under load

The investigation's first step, `nvidia-smi -l` and `top -H -p PID` during a load test, as one call:
the service's threads (by the names they set), its memory, the GPU's NVML series, while `CONCURRENCY`
clients post your requests to its URL. Without `PID`, the same model is served here in a process of its
own (`python -m tuning serve --model ...`). The command line does the same:
`python -m tuning watch --pid PID --url URL --concurrency 8 --duration 20`.
"""),
    code("""
service = None if PID else tuning.ServiceProcess(model=model_dir, sets={"dtype": "fp32", "device": real}).start()
pid, url = (PID, URL) if PID else (service.pid, service.endpoint)
watched = tuning.watch_service(pid, url, inputs, concurrency=CONCURRENCY, duration_s=DURATION_S, interval=0.25)
watched.to_frame("trend")
"""),
    code("viz.threads_chart(watched, device=real)"),
    code("""
w, d = watched.summary(), watched.diagnosis
assert w["load"]["submitted"] == w["load"]["ok"] + w["load"]["errors"] + w["load"]["timeouts"] + w["load"]["rejected"]
print(f"{w['load']['qps']:.1f} QPS, p99 {w['load']['p99_ms']:.0f} ms at {CONCURRENCY} in flight; busiest thread "
      f"{w['threads'][0]['name']} at {w['threads'][0]['cpu_mean']:.0f}% of a core; RSS {w['host']['rss_mb_max']:.0f} MB; "
      f"GPU: {'sampled' if w['gpu']['available'] else w['gpu']['reason']}.")
print(f"diagnosis from outside: {d.kind}: " + "; ".join(d.reasons) + f"\\nnext: {d.next_step}\\nnot visible from outside:\\n- "
      + "\\n- ".join(d.cannot_see))
"""),
    code("""
if service is not None:
    service.close()  # stopped by its pid: it drains what is queued and exits
"""),
    md("""
## Step 4: what would your accelerator do with it?

A batch sweep of your model on your accelerator (`python -m tuning sweep batch --model ... --json > sweep.json`
on the GPU machine, one file per length, dtype and graph mode) fits a simulated-device profile; the host
pipeline then runs for real here against a stand-in whose time comes from that profile. Without `SWEEPS`
the sweep runs on this machine, so the fitted profile describes this machine and its prediction can be
checked against the measured run of step 2.
"""),
    code("""
sweeps = SWEEPS or [tuning.model_sweep(tuning.preset("tuned", device=real, dtype="fp32"), (1, 8, 16), length=n,
                                       repeats=3, rounds=3 if QUICK else 5, model=model) for n in (64, 128)]
fitted, worst, profile_path = tuning.calibrate_device(sweeps, model=model)
what_if = tuning.Pipeline(tuning.preset("tuned", device="sim", dtype="fp32", sim_profile=str(profile_path)),
                          model=model, tokenizer=tokenizer).run(inputs)
measured = runs["tuned"] if device.knob == real else tuning.Pipeline(
    tuning.preset("tuned", device=real, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs)
viz.throughput_chart({f"measured ({real})": measured, f"simulated {fitted.name}": what_if})
"""),
    code("""
assert what_if.simulated and what_if.ok + what_if.errors == len(inputs), "labelled simulated; counts add up"
trust = "close enough to use" if worst <= 0.25 else "too loose to trust: sweep again with more rounds on a quiet machine"
print(f"profile {fitted.name}: worst fit error {worst:.0%} ({trust}). On it, tuned runs {what_if.throughput_rps:.1f} req/s "
      f"with device busy {viz.pct(what_if.device_busy)} and model busy {what_if.model_busy:.0%}"
      + ("" if SWEEPS else f"; measured here: {measured.throughput_rps:.1f} req/s (simulated / measured "
                           f"{what_if.throughput_rps / measured.throughput_rps:.2f})") + ".")
"""),
] + footer([
    "Point first, then measure: the model check and the counts (every request one outcome) come before any timing.",
    "The stage ledger names the stage that holds your requests; it needs the pipeline inside the process.",
    "From outside, trends and threads separate starved, fragmented, blocked and saturated; the diagnosis lists what only "
    "an inside view (the recorder) can show.",
    "A profile fitted to your accelerator's batch sweep says whether your host can feed it, before you have one to spare.",
], "back to the [README](../README.md): `python -m tuning watch --pid PID --url URL` and `--model`/`--data` on every command.")


NOTEBOOKS = {
    "01-trend-sampling": NB01,
    "02-stage-time-accounting": NB02,
    "03-dataloader-tuning": NB03,
    "04-padding-and-precision": NB04,
    "05-graph-capture": NB05,
    "06-request-batching": NB06,
    "07-your-own-service": NB07,
}


def build(name: str, cells: list) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, cell in enumerate(cells):
        cell_id = f"{name[:2]}-{i:02d}"
        if cell[0] == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(cell[1], id=cell_id))
        else:
            c = nbformat.v4.new_code_cell(cell[1], id=cell_id)
            if cell[2]:
                c.metadata["tags"] = list(cell[2])
            nb.cells.append(c)
    nbformat.validate(nb)
    return nb


def main(argv: list[str]) -> None:
    for name, cells in NOTEBOOKS.items():
        if argv and not any(name.startswith(a) for a in argv):
            continue
        path = HERE / f"{name}.ipynb"
        nbformat.write(build(name, cells), path)
        print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main(sys.argv[1:])
