"""The diagnosis as a table (issue 17 item 2): precedence where two verdicts compete, every threshold at
plus and minus a small epsilon, and the exact advice and reasons each verdict gives.

Rules (tuning/profile/diagnose.py, in order): launch-bound and not waiting -> fragmented; device busy (model
busy when unknown) >= SATURATED_BUSY -> saturated; waiting for input -> starved if a thread works or the disk
is busy, else blocked; short bursts of small batches, or the host holding the device back -> fragmented;
idle with nothing working -> blocked; otherwise fragmented for small batches, blocked for large ones.
"""

from __future__ import annotations

import importlib
import math

import pytest

from tuning.profile.diagnose import Signals, diagnose

dg = importlib.import_module("tuning.profile.diagnose")  # the package re-exports the function under this name

EPS = 1e-6

FEED = ("Feed the model faster: raise num_workers (with prefetch_factor=4), tokenizer='fast' (batched, vectorized), "
        "pin_memory=True on CUDA.")
BIGGER = ("Give the model bigger pieces: raise batch_size (or max_wait_ms online), then fixed shapes (padding='bucket') "
          "and graph='cuda_graph' on a GPU (default-mode graph='compile' still launches every kernel from the host; "
          "only torch.compile(mode='reduce-overhead') removes the launches; on a CPU graph='compile' fuses operators).")
NOTHING_WORKS = ("Nothing is working while the model waits: look for locks, a serialized queue or network waits; "
                 "raise concurrency or max_queue.")
IDLE = "Everything is idle: look for locks, a serialized queue or network waits; raise concurrency."
RAISE_BATCH = "Raise batch_size (or max_wait_ms online) so each call does more work."
OUTSIDE = ("Time goes outside the model and its input: check postprocess, back-pressure (wait_for_model) and the "
           "client.")
HEALTHY = "The model is the bottleneck (healthy); the cheap knobs are set; add replicas or a faster device."


def _s(**kw) -> Signals:
    kw.setdefault("model_busy", 0.5)
    kw.setdefault("wait_for_input_share", 0.0)
    return Signals(**kw)


# --- precedence: signals that fit two verdicts --------------------------------------------------------------
def test_starved_wins_over_fragmented_when_the_model_waits_for_a_working_input_side():
    """Rule order: waiting for input (rule 3) before short bursts of batches of one (rule 4): a slow input side
    also makes batches small and bursts short, and more batching would not feed the model."""
    d = diagnose(_s(model_busy=0.2, wait_for_input_share=0.5, median_span_ms=1.0, mean_batch=1.0,
                    max_thread_cpu=90.0, max_thread_name="tokenizer"))
    assert (d.kind, d.next_step) == ("starved", FEED)
    assert d.reasons == ["model waited for input 50% of the window (>= 30%)",
                         "thread 'tokenizer' at 90% of a core (a single-threaded choke point)"]


def test_blocked_wins_over_fragmented_when_the_model_waits_and_nothing_works():
    """Rule order: waiting with nothing working is blocked (rule 3) even with bursts of batches of one."""
    d = diagnose(_s(model_busy=0.2, wait_for_input_share=0.5, median_span_ms=1.0, mean_batch=1.0,
                    max_thread_cpu=10.0, disk_mb_s=1.0))
    assert (d.kind, d.next_step) == ("blocked", NOTHING_WORKS)
    assert d.reasons == ["model waited for input 50% of the window (>= 30%)",
                         "yet no thread is busy and the disk is idle"]


def test_launch_bound_wins_over_saturated():
    """Rule order: launch-bound (rule 1) before saturated (rule 2): a busy model call full of launches is the
    host's work, fixed by graph capture, not a healthy device."""
    d = diagnose(_s(model_busy=0.95, device_busy=0.9, launch_share=0.4, mean_batch=1.0))
    assert (d.kind, d.next_step) == ("fragmented", BIGGER)
    assert d.reasons == ["mean batch 1.0 (<= 2)", "launch overhead 40% of wall time (>= 30%)"]


def test_launch_bound_with_the_host_holding_the_device_back_gives_both_reasons():
    d = diagnose(_s(model_busy=0.9, device_busy=0.5, launch_share=0.4))
    assert d.kind == "fragmented"
    assert d.reasons == ["launch overhead 40% of wall time (>= 30%)",
                         "model busy 90% but device busy 50%: the host side of the model call (launches, Python) "
                         "holds the device back"]


def test_waiting_for_input_wins_over_launch_bound():
    """Rule 1 applies only while the model is not waiting for input: a starved model also shows launch overhead
    (each small batch launches every kernel), and feeding it comes first."""
    d = diagnose(_s(model_busy=0.4, wait_for_input_share=0.5, launch_share=0.6, max_thread_cpu=60.0,
                    max_thread_wait=30.0, max_thread_name="loader"))
    assert (d.kind, d.next_step) == ("starved", FEED)
    assert d.reasons[1] == ("thread 'loader' at 60% of a core plus 30% waiting for a free CPU (the host is "
                            "oversubscribed) (a single-threaded choke point)")


def test_saturated_wins_over_waiting_for_input():
    """Rule order: a device busy past SATURATED_BUSY is healthy even if the model also waited for input."""
    d = diagnose(_s(model_busy=0.9, wait_for_input_share=0.9, max_thread_cpu=99.0))
    assert d.kind == "saturated" and d.reasons == ["model busy 90% >= 70%"]


def test_device_busy_decides_saturation_when_known():
    """Two utilizations (DESIGN.md): a busy host with an idle device is not saturated; a busy device is, whatever
    the model busy reads."""
    host_bound = diagnose(_s(model_busy=0.9, device_busy=0.4))
    assert (host_bound.kind, host_bound.next_step) == ("fragmented", BIGGER)
    assert host_bound.reasons == ["model busy 90% but device busy 40%: the host side of the model call (launches, "
                                  "Python) holds the device back"]
    assert diagnose(_s(model_busy=0.9)).kind == "saturated"  # device unknown (a CPU): model busy decides
    device = diagnose(_s(model_busy=0.2, device_busy=0.8))
    assert device.kind == "saturated" and device.reasons == ["device busy 80% >= 70%"]
    assert diagnose(_s(model_busy=0.9, device_busy=None)).kind == "saturated"  # None reads as unknown


# --- every threshold at plus and minus epsilon ---------------------------------------------------------------
THRESHOLDS = [
    # (rule, signals at the threshold, signals just on the other side, kind at, kind across, next_step at/across)
    ("SATURATED_BUSY on model busy", _s(model_busy=0.70), _s(model_busy=0.70 - EPS),
     ("saturated", None), ("blocked", OUTSIDE)),
    ("SATURATED_BUSY on device busy", _s(model_busy=0.75, device_busy=0.70),
     _s(model_busy=0.75, device_busy=0.70 - EPS), ("saturated", None), ("fragmented", BIGGER)),
    ("SATURATED_BUSY on model busy for the host-bound rule", _s(model_busy=0.70, device_busy=0.5),
     _s(model_busy=0.70 - EPS, device_busy=0.5), ("fragmented", BIGGER), ("blocked", OUTSIDE)),
    ("IDLE_BUSY", _s(model_busy=0.30 - EPS, mean_batch=1.0), _s(model_busy=0.30, mean_batch=1.0),
     ("blocked", IDLE), ("fragmented", RAISE_BATCH)),
    ("STARVED_WAIT_SHARE", _s(wait_for_input_share=0.30, max_thread_cpu=60.0),
     _s(wait_for_input_share=0.30 - EPS, max_thread_cpu=60.0), ("starved", FEED), ("blocked", OUTSIDE)),
    ("WORKING_CPU", _s(wait_for_input_share=0.5, max_thread_cpu=50.0),
     _s(wait_for_input_share=0.5, max_thread_cpu=50.0 - EPS), ("starved", FEED), ("blocked", NOTHING_WORKS)),
    ("WORKING_CPU counts run-queue wait", _s(wait_for_input_share=0.5, max_thread_cpu=40.0, max_thread_wait=10.0),
     _s(wait_for_input_share=0.5, max_thread_cpu=40.0, max_thread_wait=10.0 - EPS), ("starved", FEED),
     ("blocked", NOTHING_WORKS)),
    ("WORKING_CPU when idle", _s(model_busy=0.1, max_thread_cpu=50.0 - EPS), _s(model_busy=0.1, max_thread_cpu=50.0),
     ("blocked", IDLE), ("blocked", OUTSIDE)),
    ("DISK_BUSY_MB_S", _s(wait_for_input_share=0.5, disk_mb_s=50.0), _s(wait_for_input_share=0.5, disk_mb_s=50.0 - EPS),
     ("starved", FEED), ("blocked", NOTHING_WORKS)),
    ("DISK_BUSY_MB_S when idle", _s(model_busy=0.1, disk_mb_s=50.0 - EPS), _s(model_busy=0.1, disk_mb_s=50.0),
     ("blocked", IDLE), ("blocked", OUTSIDE)),
    ("FRAGMENT_SPAN_MS", _s(model_busy=0.1, median_span_ms=5.0 - EPS, mean_batch=2.0),
     _s(model_busy=0.1, median_span_ms=5.0, mean_batch=2.0), ("fragmented", BIGGER), ("blocked", IDLE)),
    ("SMALL_BATCH", _s(model_busy=0.1, median_span_ms=1.0, mean_batch=2.0),
     _s(model_busy=0.1, median_span_ms=1.0, mean_batch=2.0 + EPS), ("fragmented", BIGGER), ("blocked", IDLE)),
    ("SMALL_BATCH without short bursts", _s(mean_batch=2.0), _s(mean_batch=2.0 + EPS),
     ("fragmented", RAISE_BATCH), ("blocked", OUTSIDE)),
    ("LAUNCH_BOUND_SHARE", _s(launch_share=0.30), _s(launch_share=0.30 - EPS), ("fragmented", BIGGER),
     ("blocked", OUTSIDE)),
]


@pytest.mark.parametrize("rule,at,across,expect_at,expect_across", THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_every_threshold_at_plus_and_minus_epsilon(rule, at, across, expect_at, expect_across):
    """Each named threshold decides at its value (the comparisons are >= or <, as documented) and not an
    epsilon to the other side."""
    for signals, (kind, step) in ((at, expect_at), (across, expect_across)):
        d = diagnose(signals)
        assert d.kind == kind, (rule, signals, d)
        if step is not None:
            assert d.next_step == step, (rule, d)
        assert d.reasons, d


def test_thresholds_are_the_documented_values():
    assert (dg.SATURATED_BUSY, dg.IDLE_BUSY, dg.STARVED_WAIT_SHARE, dg.PEGGED_THREAD_CPU, dg.WORKING_CPU,
            dg.DISK_BUSY_MB_S, dg.FRAGMENT_SPAN_MS, dg.SMALL_BATCH, dg.LAUNCH_BOUND_SHARE) == (
        0.70, 0.30, 0.30, 80.0, 50.0, 50.0, 5.0, 2.0, 0.30)
    assert dg.KINDS == ("starved", "fragmented", "blocked", "saturated")


@pytest.mark.parametrize("cpu,wait,label", [
    (80.0, math.nan, "a single-threaded choke point"), (80.0 - EPS, math.nan, "working"),
    (70.0, 10.0, "a single-threaded choke point"), (70.0, 10.0 - EPS, "working"),
])
def test_pegged_thread_threshold_names_the_choke_point(cpu, wait, label):
    """PEGGED_THREAD_CPU: a thread whose demand (CPU + run-queue wait) reaches 80% of a core is named a choke point."""
    d = diagnose(_s(wait_for_input_share=0.5, max_thread_cpu=cpu, max_thread_wait=wait, max_thread_name="t"))
    assert d.kind == "starved" and d.reasons[1].endswith(f"({label})")


@pytest.mark.parametrize("wait,text", [
    (5.0, "thread 't' at 60% of a core plus 5% waiting for a free CPU (the host is oversubscribed) (working)"),
    (5.0 - EPS, "thread 't' at 60% of a core (working)"),
])
def test_run_queue_wait_is_reported_from_five_percent(wait, text):
    d = diagnose(_s(wait_for_input_share=0.5, max_thread_cpu=60.0, max_thread_wait=wait, max_thread_name="t"))
    assert d.reasons[1] == text


def test_disk_reason_and_thread_reason_together():
    d = diagnose(_s(wait_for_input_share=0.4, max_thread_cpu=55.0, max_thread_name="w", disk_mb_s=120.0))
    assert d.reasons == ["model waited for input 40% of the window (>= 30%)", "thread 'w' at 55% of a core (working)",
                         "disk at 120 MB/s (>= 50)"]


@pytest.mark.parametrize("knobs,advice", [
    (dict(batch_size_knob=7, dtype_knob="fp32", padding_knob="dynamic"),
     "for more per-sample efficiency: raise batch_size (run the batch sweep for the knee); dtype='bf16' (or 'fp16' on a "
     "GPU); padding='bucket' to stop paying for padded tokens. Otherwise add"),
    (dict(batch_size_knob=8, dtype_knob="bf16", padding_knob="fixed"),
     "for more per-sample efficiency: padding='bucket' to stop paying for padded tokens. Otherwise add"),
    (dict(batch_size_knob=1, dtype_knob="bf16", padding_knob="bucket"),
     "for more per-sample efficiency: raise batch_size (run the batch sweep for the knee). Otherwise add"),
    (dict(dtype_knob="fp32", padding_knob="bucket"),
     "for more per-sample efficiency: dtype='bf16' (or 'fp16' on a GPU). Otherwise add"),
    (dict(batch_size_knob=16, dtype_knob="bf16"),
     "for more per-sample efficiency: padding='bucket' to stop paying for padded tokens. Otherwise add"),
    (dict(batch_size_knob=16, dtype_knob="bf16", padding_knob="bucket"), "the cheap knobs are set; add"),
])
def test_saturated_advice_names_only_the_cheap_knobs_not_yet_set(knobs, advice):
    """Saturated is healthy: the advice lists batch_size < 8, fp32 and unbucketed padding, then replicas."""
    d = diagnose(_s(model_busy=0.8, **knobs))
    assert d.next_step == f"The model is the bottleneck (healthy); {advice} replicas or a faster device."
    assert "batch_size_knob" not in d.evidence and "dtype_knob" not in d.evidence


def test_evidence_keeps_known_signals_rounded_and_drops_unknown_ones():
    d = diagnose(Signals(model_busy=0.123456, wait_for_input_share=0.5, max_thread_cpu=math.inf, disk_mb_s=70.0,
                         max_thread_name="x", batch_size_knob=4))
    assert d.evidence == {"model_busy": 0.1235, "wait_for_input_share": 0.5, "max_thread_cpu": None,
                          "max_thread_name": "x", "disk_mb_s": 70.0}
    assert d.as_dict() == {"kind": d.kind, "evidence": d.evidence, "next_step": d.next_step, "reasons": d.reasons}
    assert diagnose(_s(model_busy=0.9)).as_dict()["kind"] == "saturated"


def test_no_signal_beyond_model_busy_reads_blocked_or_saturated_only():
    assert diagnose(Signals(model_busy=0.1, wait_for_input_share=math.nan)).next_step == IDLE
    assert diagnose(Signals(model_busy=0.5, wait_for_input_share=math.nan)).next_step == OUTSIDE
    assert diagnose(Signals(model_busy=0.8, wait_for_input_share=math.nan, batch_size_knob=16, dtype_knob="bf16",
                            padding_knob="bucket")).next_step == HEALTHY


def test_the_reasons_and_evidence_of_the_quiet_verdicts():
    """Every verdict carries its evidence and the reasons in words, the idle and outside-the-model ones too."""
    idle = diagnose(_s(model_busy=0.1, median_span_ms=9.0))
    assert (idle.kind, idle.next_step) == ("blocked", IDLE)
    assert idle.reasons == ["model busy 10% (< 30%) and no thread using or waiting for 50% of a core"]
    outside = diagnose(_s(model_busy=0.5, mean_batch=4.0))
    assert (outside.kind, outside.next_step) == ("blocked", OUTSIDE)
    assert outside.reasons == ["model busy 50% with neither input waits nor launch-bound bursts dominating"]
    assert outside.evidence == {"model_busy": 0.5, "wait_for_input_share": 0.0, "mean_batch": 4.0,
                                "max_thread_name": ""}
    small = diagnose(_s(model_busy=0.5, mean_batch=1.5))
    assert (small.kind, small.next_step) == ("fragmented", RAISE_BATCH)
    assert small.reasons == ["model busy 50% with neither input waits nor launch-bound bursts dominating"]
    assert small.evidence["mean_batch"] == 1.5
    bursts = diagnose(_s(model_busy=0.1, median_span_ms=1.25, mean_batch=1.0))
    assert bursts.reasons == ["median busy burst 1.2 ms (< 5.0 ms)", "mean batch 1.0 (<= 2)"]


def test_a_device_exactly_at_the_saturation_threshold_is_not_held_back_by_the_host():
    """The host-bound reason needs device busy under SATURATED_BUSY: at exactly 70% the device is saturated."""
    at = diagnose(_s(model_busy=0.9, device_busy=0.70, launch_share=0.4))
    assert at.kind == "fragmented" and at.reasons == ["launch overhead 40% of wall time (>= 30%)"]


def test_an_unknown_thread_cpu_given_as_none_reads_as_unknown():
    d = diagnose(_s(wait_for_input_share=0.5, max_thread_cpu=None, max_thread_wait=20.0))
    assert (d.kind, d.next_step) == ("blocked", NOTHING_WORKS)
