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
# # 05 · Graph capture: removing launch overhead
#
# **Question.** At small batches the host spends its time launching many short kernels. How much could
# capturing the graph once and replaying it save, and does the replay give the same outputs?
#
# **What this notebook measures.** The launch-overhead budget of eager at batch 1 (the most capture could
# save, predicted before capturing); outputs of `compile` (and `cuda_graph` on CUDA) checked against eager
# before anything is timed; then eager against compile against capture by batch size. Without CUDA, capture
# runs on the simulated device (labelled) and `compile` runs for real on the CPU.

# %%
import os

import tuning
from tuning import viz

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
LIMIT = 200 if QUICK else 1200  # records per run
CHECK = 64 if QUICK else 256  # records for the output check (and the compile timing)
SIZES = (1, 8) if QUICK else (1, 4, 8, 16, 32)  # batch sizes to time
LENGTH = 64  # tokens per request in the timed shapes

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: the launch-overhead budget, before capturing anything
#
# Eager at batch 1 under the recorder. The launch share is the part of each model call the host spends
# launching kernels instead of the device computing: on the simulated device, model busy minus device
# busy; on a real device, launches x the measured cost of one launch.

# %%
eager = tuning.preset("tuned", device=device.knob, batch_size=1, dtype="fp32")
profile = tuning.profile_pipeline(eager, limit=LIMIT)
viz.launch_budget_chart(profile)

# %%
sig = profile.signals
print(f"model busy {sig.model_busy:.0%}, device busy {viz.pct(sig.device_busy)}: "
      f"launch overhead is {sig.launch_share:.0%} of each model call, "
      f"so capture can cut at most that much of the model's time at batch 1 ({profile.diagnosis.kind}).")

# %% [markdown]
# ## Step 2: outputs against eager, before any timing
#
# Real models only: `compile` on the CPU (or the GPU), and `cuda_graph` when CUDA is present. The
# simulated device returns stand-in embeddings, so it is never part of this check.

# %%
real = "cuda" if device.knob == "cuda" else "cpu"
check = tuning.preset("tuned", device=real, dtype="fp32", padding="fixed", max_length=LENGTH, batch_size=8)
modes = ("eager", "compile") + (("cuda_graph",) if real == "cuda" else ())
outputs = {g: tuning.Pipeline(check.replace(graph=g)).run(limit=CHECK) for g in modes}

# %%
agree = {g: tuning.compare_outputs(outputs["eager"], r) for g, r in outputs.items() if g != "eager"}
for g, a in agree.items():
    assert a["min_cosine"] > 0.999 and a["compared"] == outputs["eager"].ok, f"{g} disagrees with eager: {a}"
print("; ".join(f"{g} vs eager on {a['compared']} records: min cosine {a['min_cosine']:.6f}, "
                f"max |diff| {a['max_abs_diff']:.1e}" for g, a in agree.items()))

# %% [markdown]
# ## Step 3: time per batch by graph mode
#
# First the runs just checked, on the real device: the model call per batch of 8 x `LENGTH` tokens
# (compilation happened in warm-up, outside the window; each shape costs seconds to compile on a CPU, so
# one shape here; `python -m tuning sweep batch --set graph=compile` sweeps more). Then capture against
# eager by batch size on the device this notebook runs on.

# %%
viz.graph_modes_chart(outputs)

# %%
c = {g: r.ledger().loc["inference", "p50_ms"] for g, r in outputs.items()}
print(", ".join(f"{g}: {ms:.2f} ms" for g, ms in c.items()) + f" per batch of 8 on the real {real}: "
      + ", ".join(f"{g} {c['eager'] / ms:.2f}x eager's speed" for g, ms in c.items() if g != "eager") + ".")

# %%
graph_knobs = tuning.preset("tuned", device=device.knob, dtype="bf16")
captured = {g: tuning.run_batch_sweep(graph_knobs.replace(graph=g), sizes=list(SIZES), length=LENGTH)
            for g in ("eager", "cuda_graph")} if device.knob != "cpu" else {}
viz.graph_modes_chart(captured) if captured else print("DEVICE='cpu': no capture on a CPU; "
                                                       "run with DEVICE='sim' for the simulated device")

# %%
if captured:
    eager_ms, graph_ms = (captured[m].to_frame().set_index("batch_size") for m in ("eager", "cuda_graph"))
    for b in SIZES:
        e, c = eager_ms.loc[b], graph_ms.loc[b]
        clear = abs(e.per_batch_ms - c.per_batch_ms) > (e.iqr_ms + c.iqr_ms) / 2  # the medians' IQRs do not overlap
        print(f"batch {b}: cuda_graph {c.per_batch_ms:.2f} ms (IQR {c.iqr_ms:.2f}) against eager {e.per_batch_ms:.2f} ms "
              f"(IQR {e.iqr_ms:.2f}): {e.per_batch_ms / c.per_batch_ms:.2f}x eager's speed, "
              + ("beyond" if clear else "within") + " the spread of the rounds.")
    print(f"One sweep on this machine ({viz.device_label(device)}); per batch, the median over the sweep's rounds.")

# %% [markdown]
# ## Takeaways
#
# - Predict before you capture: the launch share bounds what capture can save; at large batches it shrinks.
# - Check replayed outputs against eager before timing anything: a fast wrong answer is not a speed-up.
# - Capture needs fixed shapes: one graph per (batch, bucket) shape, so plan few buckets (notebook 04).
# - `compile` can fuse operators on any device; capture removes per-kernel launches on CUDA.
#
# **Next:** [06 · Request batching and the ladder](06-request-batching.ipynb).
