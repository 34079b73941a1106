# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Your own service
#
# **Question.** Your service misses its QPS or p99 target. Do the workbook's steps find why on *your*
# model, *your* data and *your* running service, and what would your accelerator do with it?
#
# **What this notebook measures.** Your model (a sentence-transformers style folder or a `module:factory`)
# and your requests (JSONL, CSV, Parquet or plain text) checked, then replayed through the offline pipeline
# with every stage timed; your service watched from outside under load (per-thread CPU, memory, the GPU's
# NVML series) with a diagnosis that says what it cannot see; and a simulated device fitted to a batch
# sweep of your model on your accelerator. Left as they are, the parameters use a tiny random BERT as the
# stand-in for your model, the demo records, and a service started here in a process of its own.

# %%
import os

import tuning
from tuning import viz

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
MODEL = os.environ.get("TUNING_MODEL")  # a model folder or "module:factory"; None: a tiny random BERT stand-in
DATA = os.environ.get("TUNING_DATA")  # your requests (.jsonl, .csv, .parquet, .txt); None: the demo records
TEXT_FIELD, TEXT_COLUMN = None, None  # where the text is: a JSONL field, a CSV/Parquet column (None: 'text')
PID = int(os.environ.get("TUNING_PID", "0")) or None  # your running service; None: start one here
URL = os.environ.get("TUNING_URL")  # its endpoint (needed with PID)
API = os.environ.get("TUNING_API")  # its request schema: None (this package's POST {"text"}), tei, openai, kserve
BODY = os.environ.get("TUNING_BODY")  # or any JSON body with "{text}", e.g. '{"input": "{text}"}' (LitServe)
# `sweep batch --json` files from your GPU, comma-separated; none: sweep here
SWEEPS = [p for p in os.environ.get("TUNING_SWEEPS", "").split(",") if p]
LIMIT = 200 if QUICK else 2000  # requests read
DURATION_S = 3 if QUICK else 20  # seconds of load while watching
CONCURRENCY = 8  # requests in flight (closed loop)

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: point the workbook at your model and your data
#
# `resolve_model` takes what `--model` takes on the command line and returns the model, its tokenizer
# and a label; a folder must hold `config.json`, safetensors weights and `tokenizer.json` (pickled weights
# are never loaded). `read_inputs` reads any supported format; a row that cannot be a request stays in
# the list as an error with its line or row number and reason, so the counts add up.

# %%
model_dir = MODEL or str(tuning.save_tiny_bert())
real = "cuda" if device.knob == "cuda" else "cpu"  # accuracy and the service always run on a real device
model, tokenizer, label = tuning.resolve_model(model_dir, tuning.preset("tuned", device=real))
records = tuning.read_inputs(DATA or tuning.DEFAULT_DATA, limit=LIMIT, text_field=TEXT_FIELD, text_column=TEXT_COLUMN)
inputs = [raw for _, raw in records]
print(f"model: {label}\nrequests: {len(inputs)} read from {DATA or 'the demo records'}")

# %% [markdown]
# Check before timing: the model gives one finite embedding per valid request, on a real device.

# %%
check = tuning.Pipeline(tuning.preset("tuned", device=real, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs[:64])
vectors = list(check.embeddings.values())
assert check.ok + check.errors == len(check.requests) == min(64, len(inputs)), "every request gets one outcome"
assert check.ok and all(v.shape == vectors[0].shape and bool((v == v).all()) for v in vectors), "finite embeddings"
first = check.error_reasons()[0] if check.errors else None
print(f"{check.ok} embeddings of dimension {vectors[0].shape[0]}, {check.errors} invalid requests"
      + (f" (first: line/row {first['first_lines'][0]}: {first['reason']})" if first else ""))

# %% [markdown]
# ## Step 2: account for every request's time
#
# The offline pipeline replays your requests through your model, every stage timed on one clock:
# first at the investigation's starting point (`baseline`), then at the end of its ladder (`tuned`).

# %%
runs = {name: tuning.Pipeline(tuning.preset(name, device=device.knob, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs)
        for name in ("baseline", "tuned")}
viz.ledger_chart(runs)

# %%
base, tuned = runs["baseline"], runs["tuned"]
ledger = base.ledger()
top = ledger.share.idxmax()
assert abs(ledger.share.sum() - 1) < 1e-6 and base.ok + base.errors == len(inputs), "shares and counts add up"
print(f"baseline: {base.qps:.1f} req/s, model busy {base.model_busy:.0%}; its largest stage is {top} "
      f"({ledger.share[top]:.0%} of the median request), the model itself {ledger.share['inference']:.0%}. "
      f"tuned: {tuned.qps:.1f} req/s ({tuned.qps / base.qps:.1f}x, one run of each), "
      f"model busy {tuned.model_busy:.0%}.")

# %% [markdown]
# ## Step 3: watch your service from outside, under load
#
# The investigation's first step, `nvidia-smi -l` and `top -H -p PID` during a load test, as one call:
# the service's threads (by the names they set), its memory, the GPU's NVML series, while `CONCURRENCY`
# clients post your requests to its URL in its own schema (`API`: TEI's `/embed {"inputs": [...]}`, an
# OpenAI-style `/v1/embeddings`, KServe v2 / Triton; or `BODY`, any JSON template), each answer checked for one
# embedding per text. Its own Prometheus metrics (TEI's `te_*`, Triton's `nv_*`, this package's) are read at
# the window's edges where it exports them. Without `PID`, the same model is served here in a process of its
# own (`python -m tuning serve --model ...`). The command line does the same:
# `python -m tuning watch --pid PID --url URL --api tei --concurrency 8 --duration 20`.

# %%
service = None if PID else tuning.ServiceProcess(model=model_dir, sets={"dtype": "fp32", "device": real}).start()
pid, url = (PID, URL) if PID else (service.pid, service.endpoint)
api = tuning.Api(API or ("custom" if BODY else "tuning"), template=tuning.parse_template(BODY))
watched = tuning.watch_service(pid, api.url(url), tuning.request_bodies(api, inputs), concurrency=CONCURRENCY,
                               duration_s=DURATION_S, interval=0.25, api=api)
watched.to_frame("trend")

# %%
viz.threads_chart(watched, device=real)

# %%
w, d = watched.summary(), watched.diagnosis
assert w["load"]["submitted"] == w["load"]["ok"] + w["load"]["errors"] + w["load"]["timeouts"] + w["load"]["rejected"]
print(f"{w['load']['qps']:.1f} QPS, p99 {w['load']['p99_ms']:.0f} ms at {CONCURRENCY} in flight; busiest thread "
      f"{w['threads'][0]['name']} at {w['threads'][0]['cpu_mean']:.0f}% of a core; RSS {w['host']['rss_mb_max']:.0f} MB; "
      f"GPU: {'sampled' if w['gpu']['available'] else w['gpu']['reason']}.")
m = w["server_metrics"]
print(f"the service's own metrics: {m['exporter'] or 'none'}" + (f" {m['values']}" if m["exporter"] else f" ({m['reason']})"))
print(f"diagnosis from outside: {d.kind}: " + "; ".join(d.reasons) + f"\nnext: {d.next_step}\nnot visible from outside:\n- "
      + "\n- ".join(d.cannot_see))

# %%
if service is not None:
    service.close()  # stopped by its pid: it drains what is queued and exits

# %% [markdown]
# ## Step 4: what would your accelerator do with it?
#
# A batch sweep of your model on your accelerator (`python -m tuning sweep batch --model ... --json > sweep.json`
# on the GPU machine, one file per length, dtype and graph mode) fits a simulated-device profile; the host
# pipeline then runs for real here against a stand-in whose time comes from that profile. Without `SWEEPS`
# the sweep runs on this machine, so the fitted profile describes this machine and its prediction can be
# checked against the measured run of step 2.

# %%
sweeps = SWEEPS or [tuning.model_sweep(tuning.preset("tuned", device=real, dtype="fp32"), (1, 8, 16), length=n,
                                       repeats=3, rounds=3 if QUICK else 5, model=model) for n in (64, 128)]
fitted, worst, profile_path = tuning.calibrate_device(sweeps, model=model)
what_if = tuning.Pipeline(tuning.preset("tuned", device="sim", dtype="fp32", sim_profile=str(profile_path)),
                          model=model, tokenizer=tokenizer).run(inputs)
measured = runs["tuned"] if device.knob == real else tuning.Pipeline(
    tuning.preset("tuned", device=real, dtype="fp32"), model=model, tokenizer=tokenizer).run(inputs)
viz.throughput_chart({f"measured ({real})": measured, f"simulated {fitted.name}": what_if})

# %%
assert what_if.simulated and what_if.ok + what_if.errors == len(inputs), "labelled simulated; counts add up"
trust = "close enough to use" if worst <= 0.25 else "too loose to trust: sweep again with more rounds on a quiet machine"
print(f"profile {fitted.name}: worst fit error {worst:.0%} ({trust}). On it, tuned runs {what_if.qps:.1f} req/s "
      f"with device busy {viz.pct(what_if.device_busy)} and model busy {what_if.model_busy:.0%}"
      + ("" if SWEEPS else f"; measured here: {measured.qps:.1f} req/s (simulated / measured "
                           f"{what_if.qps / measured.qps:.2f})") + ".")

# %% [markdown]
# ## Takeaways
#
# - Point first, then measure: the model check and the counts (every request one outcome) come before any
#   timing.
# - The stage ledger names the stage that holds your requests; it needs the pipeline inside the process.
# - From outside, trends and threads separate starved, fragmented, blocked and saturated; the diagnosis
#   lists what only an inside view (the recorder) can show.
# - A profile fitted to your accelerator's batch sweep says whether your host can feed it, before you have
#   one to spare.
#
# **Next:** back to the [README](../README.md): `python -m tuning watch --pid PID --url URL` and
# `--model`/`--data` on every command.
