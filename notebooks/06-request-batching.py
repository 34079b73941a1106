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
# # 06 · Request batching and the whole ladder
#
# **Question.** Online, requests arrive one at a time. How long should the batcher wait to fill a batch,
# how does that trade QPS against p99, and what did each change of the investigation buy, one at a time?
#
# **What this notebook measures.** The server under closed-loop load: a `max_wait_ms` sweep and a
# concurrency sweep (QPS and p99 per value); then the ladder from `baseline` to the recommended
# configuration, one variable per rung, each measured against the one before (the same function
# `python -m tuning investigate` runs), as one table and one chart; and a knob panel over the live server.

# %%
import os

import tuning
from tuning import viz, widgets

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "auto")  # "auto": CUDA if present, else the simulated H200; "cpu": the real CPU
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
REQUESTS = 150 if QUICK else 1500  # measured requests per sweep point
CONCURRENCY = 16  # clients in flight
WAITS = (0.0, 5.0, 20.0) if QUICK else (0.0, 2.0, 5.0, 10.0, 20.0, 50.0)  # max_wait_ms values
CONCURRENCIES = (1, 8, 32) if QUICK else (1, 4, 8, 16, 32, 64)
LADDER = dict(duration_s=1.0, warmup_s=0.3, max_pairs=3, min_effect=0.05, sweep_sizes=(1, 8), sweep_rounds=1,
              waits_ms=(5.0,), joint_rounds=1, joint_moves=1, precision_texts=16, limit=300,
              capacity=tuning.CapacitySettings(max_windows=1, tolerance=0.25, max_probes=4, halvings=2, doublings=2)
              ) if QUICK else {}  # ladder settings (seconds of load per run, pairs per step, the capacity search)
STEPS = ("batch", "tokenizer", "batching", "joint") if QUICK else tuning.STEPS  # the ladder's rungs, in order
TARGET_P99_MS = 200.0  # the p99 target: a configuration's capacity is the highest rate that meets it

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: how long should a batch wait to fill?
#
# `max_wait_ms` is the longest the oldest request in a forming batch waits for company. Zero sends
# whatever is there; more fills batches (throughput) at the cost of waiting (latency).

# %%
inputs = [raw for _, raw in tuning.read_lines(limit=500)]
online = tuning.preset("tuned", device=device.knob, concurrency=CONCURRENCY)
waits = tuning.load_sweep(online, inputs, "max_wait_ms", list(WAITS), requests=REQUESTS)

# %%
assert (waits.ok + waits.errors + waits.timeouts + waits.rejected == REQUESTS).all(), "outcome counts add up per point"
viz.load_sweep_chart(waits, "max_wait_ms", device=device)

# %%
best = waits.loc[waits.qps.idxmax()]
print("; ".join(f"max_wait {r.max_wait_ms:g} ms: {r.qps:.0f} QPS, p99 {r.p99_ms:.0f} ms, mean batch {r.mean_batch:.1f}"
                for r in waits.itertuples()) + f". Highest QPS at max_wait {best.max_wait_ms:g} ms.")

# %% [markdown]
# ## Step 2: concurrency, at that wait

# %%
at_best = online.replace(max_wait_ms=float(best.max_wait_ms))
conc = tuning.load_sweep(at_best, inputs, "concurrency", list(CONCURRENCIES), requests=REQUESTS)
viz.load_sweep_chart(conc, "concurrency", device=device)

# %%
print("; ".join(f"{r.concurrency} in flight: {r.qps:.0f} QPS, p99 {r.p99_ms:.0f} ms" for r in conc.itertuples())
      + f". From {conc.concurrency.iloc[0]} to {conc.concurrency.iloc[-1]} clients QPS went "
      f"{conc.qps.iloc[-1] / conc.qps.iloc[0]:.1f}x and p99 {conc.p99_ms.iloc[-1] / conc.p99_ms.iloc[0]:.1f}x.")

# %% [markdown]
# ## Step 3: the ladder, one change at a time
#
# From `baseline`, each rung changes one thing and is measured against the rung before it in interleaved
# pairs (AB, BA, BA, AB, ...) at the same offered rate, the reference's capacity at the p99 target. A change
# is kept only when the paired latency ratio's interval clears the minimum effect and the candidate meets the
# target there; its own capacity is then searched. What each row shows is what was judged: the ratio, its
# interval, the pairs. This is the package function the `investigate` command runs.

# %%
ladder = tuning.run_ladder(device=device, target_p99_ms=TARGET_P99_MS, steps=STEPS,
                           settings=tuning.LadderSettings(concurrency=CONCURRENCY, **LADDER))
ladder.to_frame()[["step", "change", "status", "ratio", "low", "high", "pairs", "p50_ms", "p99_ms", "errors",
                   "capacity", "reason"]]

# %%
viz.ladder_chart(ladder)

# %%
s = ladder.summary()
kept = [f"{r['step']} ({r['change']})" for r in s["steps"] if r["status"] == "kept"]
before, after = ladder.baseline_capacity, ladder.capacity
print(f"capacity at p99 <= {TARGET_P99_MS:.0f} ms: baseline {before.sentence()}")
print(f"recommended: {after.sentence()}" + ("" if ladder.target_met else "  (TARGET NOT MET)"))
print(f"kept: {', '.join(kept) or 'nothing'}; ship it with: {ladder.set_line()}")

# %% [markdown]
# ## Step 4: the live server, under your hands
#
# Each control restarts the server with the new knobs and runs a few seconds of load; the chart updates
# in place and `panel.result` keeps the last load result.

# %%
panel = widgets.knob_panel(at_best, mode="online", duration_s=3, device=device)
panel

# %%
assert panel.result is not None, panel.status.value
r = panel.result.summary()
assert r["submitted"] == r["ok"] + r["errors"] + r["timeouts"] + r["rejected"], "every request gets one outcome"
print(f"panel: {r['qps']:.0f} QPS, p99 {r['p99_ms']:.0f} ms; {r['submitted']} = {r['ok']} ok + {r['errors']} errors "
      f"+ {r['timeouts']} timeouts + {r['rejected']} rejected")

# %% [markdown]
# ## Takeaways
#
# - Dynamic batching trades a bounded wait for fuller batches: sweep `max_wait_ms` against your p99 target.
# - Change one thing at a time and measure it against the step before; keep only what helps.
# - Build the queue and the batcher into the service from day one, after deciding whether latency or
#   throughput comes first.
# - Why stop near 80% busy: the last points cost latency stability.
#
# **Next:** [07 · Your own service](07-your-own-service.ipynb): the same steps on your model, data or URL;
# or run the whole ladder with `python -m tuning investigate`.
