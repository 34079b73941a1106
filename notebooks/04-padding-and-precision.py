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
# # 04 · Padding, vectorized preprocessing and precision
#
# **Question.** Once the model is fed, how much of the work is waste? Per-record Python tokenization,
# padded tokens the model computes for nothing, and more precision than the answer needs.
#
# **What this notebook measures.** The naive (pure-Python) and fast (batched Rust) tokenizers on the same
# texts (ids must be identical, then time per record); padded tokens per real token for dynamic, fixed and
# planned-bucket padding, and what each does to throughput; fp32 against bf16/fp16 embeddings on the **real
# model** (accuracy is never simulated), then their speed on the device.

# %%
import os

import tuning
from tuning import viz

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
LIMIT = 200 if QUICK else 1200  # records per run
TEXTS = 32 if QUICK else 256  # texts for the accuracy check (real model)
K = 4  # bucket lengths to plan (= shapes to compile or capture)
MIN_COSINE = tuning.MIN_COSINE  # the investigation's line: a precision's worst text keeps this cosine to fp32

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: vectorized preprocessing, naive against fast tokenizer
#
# Same texts, same batches. The fast tokenizer must give the *same ids*; only then does its speed count.

# %%
texts = tuning.load_texts(limit=LIMIT)
tok = tuning.compare_tokenizers(texts)
tok.to_frame()

# %%
assert tok.ids_identical, f"the tokenizers disagree on texts {tok.mismatches[:5]}"
print(f"Identical ids on all {tok.texts} texts; the fast tokenizer takes {1e6 * tok.seconds['fast'] / tok.texts:.0f} µs "
      f"per record against {1e6 * tok.seconds['naive'] / tok.texts:.0f} ({tok.speedup:.1f}x the naive one's speed, "
      "one run on this host's CPU).")
viz.tokenizer_chart(tok)

# %% [markdown]
# ## Step 2: padding waste by strategy
#
# The model computes every padded token (on a CPU as much as a real one). *Dynamic* pads each batch to
# its longest request in arrival order; *fixed* pads everything to one length (one shape, easy to capture);
# *planned buckets* pad to the nearest of `K` lengths chosen from the observed length histogram.

# %%
waste = tuning.padding_waste(tuning.observed_lengths(limit=LIMIT), batch_size=16, k=K)
viz.padding_chart(waste)

# %%
w = waste.to_frame().set_index("strategy").waste
fixed, planned = w.filter(like="fixed").iloc[0], w.filter(like="planned").iloc[0]
assert planned < fixed, "planned buckets must waste less than fixed padding"
print(f"Extra tokens computed: fixed {fixed:.0%}, dynamic (arrival order) {w.iloc[0]:.0%}, "
      f"{K} planned buckets {list(waste.planned)} {planned:.0%}, with {K} shapes instead of one.")

# %% [markdown]
# ## Step 3: what the padding does to throughput on the device

# %%
base = tuning.preset("tuned", device=device.knob, dtype="fp32", buckets=waste.planned)
pads = {p: tuning.Pipeline(base.replace(padding=p)).run(limit=LIMIT) for p in ("dynamic", "fixed", "bucket")}
viz.throughput_chart(pads)

# %%
fastest = max(pads, key=lambda p: pads[p].qps)
print("; ".join(f"{p}: {r.qps:.1f} req/s, padding waste {r.padding_waste:.0%}, "
                f"device busy {viz.pct(r.device_busy)}, model busy {r.model_busy:.0%}" for p, r in pads.items())
      + f". Fastest in this run: {fastest}; padding costs throughput once the model side is the bottleneck.")

# %% [markdown]
# ## Step 4: half precision, checked on the real model first
#
# Cosine similarity of each text's embedding against fp32, on the real model on this machine (CUDA when
# present, else the CPU). A precision the device cannot run is listed as refused.

# %%
report = tuning.precision_report(texts[:TEXTS])
report.to_frame()

# %%
ok = report.to_frame().query("status == 'ok'")
assert len(ok) and (ok.min_cosine >= MIN_COSINE).all(), \
    f"a half precision fell under cosine {MIN_COSINE}, so the investigation would not screen it"
print("; ".join(f"{r.dtype}: worst text {r.min_cosine:.5f}, mean {r.mean_cosine:.5f}" for r in ok.itertuples())
      + f" (real model on {report.device}).")
viz.precision_chart(report)

# %% [markdown]
# ## Step 5: and its speed on the device

# %%
dtypes = ("fp32", "bf16") if device.knob == "cpu" else ("fp32", "bf16", "fp16")
runs = {d: tuning.Pipeline(base.replace(padding="bucket", dtype=d)).run(limit=LIMIT) for d in dtypes}
viz.throughput_chart(runs)

# %%
print("; ".join(f"{d}: {r.qps:.1f} req/s, model busy {r.model_busy:.0%}, device busy {viz.pct(r.device_busy)}"
                for d, r in runs.items())
      + f". bf16 against fp32: {runs['bf16'].qps / runs['fp32'].qps:.2f}x throughput, "
      f"{runs['bf16'].model_busy / runs['fp32'].model_busy:.2f}x model time.")

# %% [markdown]
# ## Takeaways
#
# - Check equality before speed: a faster tokenizer or precision only counts if the output is the same
#   (ids) or close enough (cosine).
# - Padding is compute: plan a few bucket lengths from the observed lengths instead of padding everything
#   to the maximum.
# - The number of buckets is also the number of shapes to compile or capture (notebook 05).
# - Accuracy is always measured on the real model; only device time is ever simulated.
#
# **Next:** [05 · Graph capture](05-graph-capture.ipynb).
