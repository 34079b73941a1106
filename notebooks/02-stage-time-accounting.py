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
# # 02 · Stage-time accounting: where does a request's time go?
#
# **Question.** The model is idle much of the time (notebook 01). Which stage of a request takes the time:
# reading, preprocessing, waiting, copying, the model, or postprocessing? And is the tail made of the same
# stages?
#
# **What this notebook measures.** The `baseline` configuration replayed offline through the DataLoader,
# every stage of every request timed on one clock: `read`, `preprocess`, `wait_for_model` (a ready batch
# waiting for the model), `copy`, `inference`, `postprocess`; per batch also the model's wait for input.
# Then the two waits, the computed diagnosis, and the same ledger for `tuned`.

# %%
import os

import tuning
from tuning import viz

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
LIMIT = 200 if QUICK else 1200  # records replayed per run

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: replay the baseline under the recorder
#
# `profile_pipeline` runs the offline pipeline with the recorder around it; `profile.workload` is the
# run's result (raw per-request and per-batch records; statistics on demand).

# %%
profile = tuning.profile_pipeline(tuning.preset("baseline", device=device.knob), limit=LIMIT)
result = profile.workload
result.ledger().round(3)

# %%
s = result.summary()
assert s["ok"] + s["errors"] == s["requests"] == LIMIT, "every record gets exactly one outcome"
print(f"{s['requests']} records: {s['ok']} ok, {s['errors']} errors; {s['qps']:.1f} req/s, "
      f"model busy {s['model_busy']:.0%}")

# %% [markdown]
# ## Step 2: the ledger, p50 against p99
#
# Each bar stacks the stages' percentiles for one request: the median request, then the tail. The team's
# ledger read: preprocessing 680 ms, inference 42 ms (3%), other waiting 390 ms, of 1.3 s.

# %%
viz.ledger_chart(result)

# %%
ledger = result.ledger()
assert abs(ledger.share.sum() - 1) < 1e-6 and abs(ledger.share_p99.sum() - 1) < 1e-6, "shares add up to 100%"
top50, top99 = ledger.share.idxmax(), ledger.share_p99.idxmax()
print(f"Median request: {top50} is the largest stage ({ledger.share[top50]:.0%}); "
      f"tail (p99): {top99} ({ledger.share_p99[top99]:.0%}). The model itself (inference) is "
      f"{ledger.share['inference']:.0%} of the median and {ledger.share_p99['inference']:.0%} of the tail.")

# %% [markdown]
# ## Step 3: the two waits
#
# *Wait for input*: the model idle because no batch is ready (starvation: feed it faster).
# *Wait for model*: a ready batch idle because the model is busy (back-pressure: the model is the constraint).

# %%
waits = result.waits()
waits

# %%
starved, backed = waits["wait_for_input"]["share_of_window"], waits["wait_for_model"]["share_of_window"]
verdict = ("batches sat ready while the model idled: the handoff from loader to model is slow" if min(starved, backed) >= 0.3
           else "the input side is too slow: feed the model faster" if starved > backed
           else "the input side keeps up: the model side is the constraint")
print(f"The model waited for input {starved:.0%} of the window (busy {result.model_busy:.0%}); "
      f"ready batches waited to reach it {backed:.0%}: {verdict}.")

# %% [markdown]
# ## Step 4: the diagnosis, computed from these numbers

# %%
d = profile.diagnosis
print(f"diagnosis: {d.kind}\nevidence: " + "; ".join(d.reasons) + f"\nnext: {d.next_step}")

# %% [markdown]
# ## Step 5: the same ledger after tuning
#
# `tuned` is the end of the ladder (batched fast tokenizer, length buckets, batches of 16, bf16). The
# next notebooks take it one knob at a time.

# %%
tuned = tuning.Pipeline(tuning.preset("tuned", device=device.knob)).run(limit=LIMIT)
viz.ledger_chart({"baseline": result, "tuned": tuned})

# %%
gain = tuned.qps / result.qps
print(f"tuned: {tuned.qps:.1f} req/s against {result.qps:.1f} ({gain:.1f}x); "
      f"median request {tuned.ledger().p50_ms.sum():.1f} ms against {ledger.p50_ms.sum():.1f} ms (sum of stage p50s).")
print(f"That is one run of each on {viz.device_label(device) or device.knob} with {os.cpu_count()} cores: a ratio a busy "
      "machine can move, not a benchmark. Notebook 06's ladder repeats runs and keeps a change only beyond their spread.")

# %% [markdown]
# ## Takeaways
#
# - A per-request ledger is the most direct evidence there is: it names the stage, not a suspect.
# - Read p99 next to p50: the tail can be made of different stages (queues and waits) than the median.
# - Two waits, two remedies: waiting for input means feed the model (workers, prefetch, fast tokenizer);
#   waiting for the model means make the model side cheaper (batching, padding, precision, graphs).
#
# **Next:** [03 · DataLoader tuning and the batch sweep](03-dataloader-tuning.ipynb).
