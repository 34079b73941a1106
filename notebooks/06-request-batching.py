# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Request batching and the whole decision
#
# **Question.** Online, requests arrive one at a time. How long should the batcher wait to fill a batch,
# how does that trade QPS against p99, and what did each change of the investigation buy, one at a time?
#
# **What this notebook measures.** The server under closed-loop load: a `max_wait_ms` sweep and a
# concurrency sweep (QPS and p99 per value); then the way from `baseline` to the recommended
# configuration, decided by the engine `python -m tuning investigate` runs (a factorial screen of the knobs on
# throughput, one confirmation against the baseline, a target check of both; `docs/deciding.md`), as one
# table and a chart per stage; and a knob panel over the live server.

# %%
import os

import tuning
from tuning import viz, widgets

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
REQUESTS = 150 if QUICK else 1500  # measured requests per sweep point
CONCURRENCY = 16  # clients in flight
WAITS = (0.0, 5.0, 20.0) if QUICK else (0.0, 2.0, 5.0, 10.0, 20.0, 50.0)  # max_wait_ms values
CONCURRENCIES = (1, 8, 32) if QUICK else (1, 4, 8, 16, 32, 64)
# the engine's settings: seconds a window, screen runs, confirmation pairs, target windows and their fractions
ENGINE = dict(window_s=1.0, max_pairs=4, target_outcomes=300, target_max_s=2.0, fractions=(0.9, 0.7, 0.5),
              warmup_s=0.3, sweep_sizes=(1, 8), sweep_rounds=1, precision_texts=16, limit=300) if QUICK else {}
FACTORS = ("batch", "tokenizer", "precision") if QUICK else None  # the knobs screened (None: every one that applies)
TARGET_P99_MS = tuning.DEFAULT_TARGET_P99_MS  # every command's p99 target: capacity is the highest rate that meets it

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
# ## Step 3: the engine, from `baseline` to what to ship
#
# The engine screens the knobs together in a two-level factorial on sustained throughput (every main effect
# from every window), confirms candidates against the baseline on fresh interleaved pairs (a group-sequential
# test), and checks the p99 target of each on a warm server at descending fractions of its open-loop ceiling: the
# capacity is the highest rate that passed in two windows, its share over the target bounded on
# consecutive blocks.
# This is the package function `investigate` runs; `docs/deciding.md` is its one-page design.

# %%
settings = (tuning.LadderSettings.quick if QUICK else tuning.LadderSettings.full)(concurrency=CONCURRENCY, **ENGINE)
ladder = tuning.run_ladder(device=device, target_p99_ms=TARGET_P99_MS, factors=FACTORS, settings=settings)
ladder.to_frame()[["step", "change", "status", "ratio", "low", "high", "reason"]]

# %%
viz.effects_chart(ladder)

# %%
viz.confirm_chart(ladder)

# %%
viz.target_check_chart(ladder)

# %%
s = ladder.summary()
before, after = ladder.baseline_capacity, ladder.capacity
print(f"capacity at p99 <= {TARGET_P99_MS:.0f} ms: baseline {before.sentence()}")
print(f"recommended: {after.sentence()}" + ("" if ladder.target_met else "  (TARGET NOT MET)"))
confirmed = [c for c in s["confirmations"] if c["verdict"] == "better"]
print(f"confirmed: {', '.join(c['candidate'] for c in confirmed) or 'nothing'}; ship it with: {ladder.set_line()}"
      + (f" ({ladder.why_unchanged()})" if ladder.why_unchanged() else ""))

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
# - Screen the knobs together, then confirm the winner once on fresh pairs: one test, one error rate.
# - Build the queue and the batcher into the service from day one, after deciding whether latency or
#   throughput comes first.
# - Why stop near 80% busy: the last points cost latency stability.
#
# **Next:** [07 · Your own service](07-your-own-service.ipynb): the same steps on your model, data or URL;
# or run the whole decision with `python -m tuning investigate`.
