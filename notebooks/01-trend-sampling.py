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
# # 01 · Trend sampling: what does "12% utilization" hide?
#
# **Question.** The service misses its QPS and p99 targets while the accelerator reads 12% busy. Is it
# steadily 12%, or bursts of work between long idle gaps, and what is the host doing meanwhile?
#
# **What this notebook measures.** The `baseline` service under a fixed-concurrency load, recorded on one
# clock: model busy % and device busy % over time next to their averages, the GPU series (NVML on a GPU; on
# the simulated device a simulated sampler, labelled), per-thread CPU with thread names, and the computed
# diagnosis.

# %%
import os

import tuning
from tuning import viz

viz.setup_notebook()

# %% tags=["parameters"]
DEVICE = os.environ.get("TUNING_DEVICE", "sim")  # "sim": simulated H200; "auto": CUDA if present, else the CPU; "cpu"
QUICK = os.environ.get("TUNING_QUICK") == "1"  # small sizes (CI runs the notebooks this way)
CONCURRENCY = 16  # requests in flight (closed loop, like the team's load test)
DURATION_S = 4 if QUICK else 30  # measured seconds of load
INTERVAL_S = 0.25  # sampling interval (the team used nvidia-smi -l 2)

# %%
device = tuning.device_for(DEVICE)
viz.banner(device)

# %% [markdown]
# ## Step 1: put the baseline service under load, with the recorder running
#
# `Server` is the online service (bounded queue, preprocessing workers, dynamic batcher, one model
# executor); `run_load` keeps `CONCURRENCY` requests in flight; `Recorder` samples the GPU (or its
# simulated stand-in), every host thread and the model's busy spans on one clock.

# %%
inputs = [raw for _, raw in tuning.read_lines(limit=500)]
with tuning.Server(tuning.preset("baseline", device=device.knob)) as server, tuning.Recorder(INTERVAL_S) as rec:
    load = tuning.run_load(server, inputs, concurrency=CONCURRENCY, duration_s=DURATION_S, warmup_requests=16)

# %%
s = load.summary()
assert s["submitted"] == s["ok"] + s["errors"] + s["timeouts"] + s["rejected"], "every request gets one outcome"
print(f"{s['submitted']} requests in {s['window_s']:.1f} s: {s['ok']} ok, {s['errors']} errors, {s['timeouts']} timeouts, "
      f"{s['rejected']} rejected; {s['qps']:.1f} QPS, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms")

# %% [markdown]
# ## Step 2: the trend, not the average
#
# Each point is the share of one short window the model (or the device) was busy. The dashed lines are
# the averages a dashboard would show.

# %%
profile = rec.join(load)
viz.trend_chart(profile)

# %%
busy = profile.to_frame("busy").busy
avg, gaps = load.model_busy, (busy < 0.5 * load.model_busy).mean()
print(f"Average model busy {avg:.0%}, yet windows ranged from {busy.min():.0%} to {busy.max():.0%}; "
      f"{gaps:.0%} of windows were below half the average.")
gpu = profile.summary()["gpu"]
sampled = (f"; mean utilization {gpu['sm_util_mean']:.0f}%, power {viz.pct(gpu.get('power_frac_mean'))} of the limit"
           if gpu.get("sm_util_mean") is not None else "")
print(f"GPU section ({', '.join(gpu['devices']) or 'no GPU'}): {gpu['reason'] or 'NVML'}{sampled}")

# %% [markdown]
# ## Step 3: per thread, not per process
#
# Whole-process CPU can look moderate while one thread is pegged: a single-threaded choke point. This
# is `top -H` for the service (a probe process reads it, so a busy Python thread cannot delay it).

# %%
viz.threads_chart(profile)

# %%
threads = "; ".join(f"{t['name']} {t['cpu_mean']:.0f}%" for t in profile.top_threads(3))
print(f"Whole process: {profile.summary()['host'].get('cpu_percent_mean', float('nan')):.0f}% of one core on average "
      f"({profile.host.cpu_count} cores here). Per thread: {threads}.")

# %% [markdown]
# ## Step 4: the diagnosis
#
# The recorder joins the signals (model and device busy, waits for input, burst lengths, batch sizes,
# the busiest thread, disk) and names one of `starved`, `fragmented`, `blocked`, `saturated`, with its
# evidence and the next knob to try (thresholds live in `tuning/profile/diagnose.py`).

# %%
d = profile.diagnosis
print(f"diagnosis: {d.kind}\nevidence: " + "; ".join(d.reasons) + f"\nnext: {d.next_step}")

# %% [markdown]
# ## Takeaways
#
# - Sample trends (every 0.25-2 s), never trust a window average alone: the same average can be a steady
#   plateau or bursts between idle gaps.
# - Read model busy and device busy side by side: the host can be busy launching work the device finishes
#   quickly.
# - Look per thread: one pegged thread is a choke point that the process total hides.
# - On the simulated device every device figure is a prediction (labelled); host figures are real.
#
# **Next:** [02 · Stage-time accounting](02-stage-time-accounting.ipynb): where each request's time goes.
