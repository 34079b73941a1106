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
# # 03 · DataLoader tuning and the batch-size sweep
#
# **Question.** How much of the model's idle time do loader workers, prefetching and pinned memory remove,
# and what batch size buys throughput before latency pays for it?
#
# **What this notebook measures.** The offline pipeline with one knob changed at a time, from `baseline`:
# `num_workers`, then `prefetch_factor`, then `pin_memory`, each judged by the model's wait for input (the
# share of the window the model sat idle for lack of a batch). Then the batch-size sweep at fixed shapes
# and its knee, and a knob panel to try combinations yourself.

# %%
import os

import tuning
from tuning import viz, widgets

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
LIMIT = 200 if QUICK else 1200  # records replayed per run
WORKERS = (0, 2, 4)  # num_workers values to compare
SIZES = (1, 2, 4, 8, 16, 32) if QUICK else (1, 2, 4, 8, 16, 32, 64, 128)  # batch sweep

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: loader workers, one value at a time
#
# Everything else stays at `baseline` (batch 1, naive tokenizer). With `num_workers=0` the main process
# reads and tokenizes between model calls; with workers, other processes prepare batches in parallel.

# %%
base = tuning.preset("baseline", device=device.knob)
runs = {f"workers={n}": tuning.Pipeline(base.replace(num_workers=n)).run(limit=LIMIT) for n in WORKERS}
viz.waits_chart(runs)

# %%
def starved(r):
    """The share of the window the model sat idle for input."""
    return r.waits()["wait_for_input"]["share_of_window"]


best = min(runs, key=lambda k: starved(runs[k]))
print("; ".join(f"{k}: model waited {starved(r):.0%}, {r.qps:.1f} req/s" for k, r in runs.items())
      + f". Least starved: {best}.")

# %% [markdown]
# ## Step 2: prefetching, then pinned memory, on top of the best worker count
#
# `prefetch_factor` batches per worker are prepared ahead (double buffering); `pin_memory` makes
# host-to-device copies faster and asynchronous (on a CPU-only run it has nothing to copy to and is
# refused, so that run is skipped).

# %%
n = min((n for n in WORKERS if n > 0), key=lambda n: starved(runs[f"workers={n}"]))
workers, ref = base.replace(num_workers=n), runs[f"workers={n}"]
extra = {f"workers={n}, prefetch 4": tuning.Pipeline(workers.replace(prefetch_factor=4)).run(limit=LIMIT)}

# %%
if device.knob != "cpu":
    pinned = workers.replace(prefetch_factor=4, pin_memory=True)
    extra[f"workers={n}, prefetch 4, pinned"] = tuning.Pipeline(pinned).run(limit=LIMIT)
viz.waits_chart({f"workers={n}": ref, **extra})

# %%
print("; ".join(f"{k}: model waited {starved(r):.0%} (without: {starved(ref):.0%}), "
                f"{r.qps:.1f} req/s (without: {ref.qps:.1f})" for k, r in extra.items()) + ".")

# %% [markdown]
# ## Step 3: the batch-size sweep and its knee
#
# Fixed shapes (64 tokens, no padding), so only the batch size changes. The knee is the smallest batch
# whose per-sample cost is within 5% of the best; past it, bigger batches add latency for little
# throughput. The team found a batch of 8 cost about 1.8x a batch of 1.

# %%
sweep = tuning.run_batch_sweep(base.replace(batch_size=1), sizes=list(SIZES), length=64)
viz.batch_sweep_chart(sweep)

# %%
f = sweep.to_frame().set_index("batch_size")
assert sweep.knee in f.index, "the knee is one of the measured sizes"
print(f"A batch of 8 costs {f.per_batch_ms[8] / f.per_batch_ms[1]:.1f}x a batch of 1 "
      f"({f.per_sample_ms[8] / f.per_sample_ms[1]:.0%} per request). "
      f"Knee at batch {sweep.knee}; doubling stops paying (< 5%) after batch {sweep.diminishing}.")

# %% [markdown]
# ## Step 4: try it yourself
#
# Each control reruns a short replay (a few seconds) and redraws the chart in place; the panel keeps the
# last result (`panel.result`) and every run (`panel.history`). A combination the pipeline refuses is
# explained instead of measured.

# %%
panel = widgets.knob_panel(workers.replace(batch_size=sweep.knee), limit=LIMIT, device=device)
panel

# %%
assert panel.result is not None and panel.history, panel.status.value
print(f"panel: {panel.history[-1]['throughput']:.1f} req/s with batch_size={panel.knobs.batch_size}, "
      f"num_workers={panel.knobs.num_workers}")

# %% [markdown]
# ## Takeaways
#
# - Judge loader knobs by the model's wait for input, not by CPU use: the goal is a model that never waits.
# - More workers help until they compete with the model and each other for cores; measure, do not assume.
# - Batch up to the knee of the per-sample cost; beyond it latency grows for little throughput.
#
# **Next:** [04 · Padding, vectorized preprocessing and precision](04-padding-and-precision.ipynb).
