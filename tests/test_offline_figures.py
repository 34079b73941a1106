"""The offline figures mean what they say: waits, warm-up, stage ledger, padding plan, worker env, bench helpers."""

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tuning.base.assets import DEFAULT_DATA
from tuning.inputs.buckets import padding_waste, plan_buckets
from tuning.inputs.records import format_record
from tuning.knobs import Knobs
from tuning.offline.pipeline import BatchRecord, LineDataset, Pipeline, PipelineResult, run_pipeline

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


# --- waits: overlapping queued batches are not summed into a share ------------------------------

def _batch(number, t_ready, t_received, inference_s=0.0, ok=4, warmup=False):
    return BatchRecord(number, ok, ok, 8, 8 * ok, 0, t_ready, t_received, t_received, t_received + inference_s,
                       t_received + inference_s, 0.0, (t_received - t_ready) * 1000, 0.0, 0.0, 0.0,
                       inference_s * 1000, 0.0, warmup)


def _result(batches, t_window=0.0, t_end=4.0):
    return PipelineResult(Knobs(num_workers=0), [], batches, 0.0, t_window, t_end, 0.0)


def test_wait_for_model_share_is_the_union_of_overlapping_waits():
    # three batches queued at once behind the model, then one short wait: 1 + 2 + 2.5 + 0.25 s of waiting,
    # but the window (4 s) only had a batch waiting during [0, 3] and [3.5, 3.75]
    result = _result([_batch(0, 0.0, 1.0), _batch(1, 0.0, 2.0), _batch(2, 0.5, 3.0), _batch(3, 3.5, 3.75)])
    waits = result.waits()["wait_for_model"]
    assert waits["share_of_window"] == pytest.approx(3.25 / 4)
    assert waits["mean_queued"] == pytest.approx(5.75 / 4)  # time-average number of ready batches waiting
    assert result.wait_for_model_s() == pytest.approx(3.25)


def test_wait_union_is_clipped_to_the_measured_window():
    # a warm-up batch's wait and the part of a measured batch's wait before the window opened do not count
    result = _result([_batch(0, 0.0, 1.0, warmup=True), _batch(1, 0.5, 2.0)], t_window=1.0, t_end=3.0)
    assert result.waits()["wait_for_model"]["share_of_window"] == pytest.approx(1.0 / 2.0)


# --- the env of the parent process is left alone ----------------------------------------------

class _EnvCheck:
    """A formatter that fails its record unless the worker sees ``expected`` in TOKENIZERS_PARALLELISM."""

    def __init__(self, expected):
        self.expected = expected

    def __call__(self, record):
        seen = os.environ.get("TOKENIZERS_PARALLELISM")
        if seen != self.expected:
            raise RuntimeError(f"worker saw TOKENIZERS_PARALLELISM={seen!r}, expected {self.expected!r}")
        return format_record(record)


@pytest.mark.parametrize("before", [None, "true"])
def test_tokenizer_threads_are_turned_off_in_workers_only(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    knobs = Knobs(num_workers=1, batch_size=4, tokenizer="fast")
    result = Pipeline(knobs, formatter=_EnvCheck(before or "false")).run(limit=8, keep_embeddings=False)
    assert result.ok == 8, result.error_reasons()
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before  # the parent's later runs keep their threads


# --- warm-up does not bias the measured set; every stage is in the ledger ------------------------

def test_warmup_does_not_drop_the_shortest_requests():
    knobs = Knobs(num_workers=0, batch_size=8, tokenizer="fast", padding="bucket", group_by="tokens", bucket_window=64)
    result = run_pipeline(knobs, limit=48, keep_embeddings=False, warmup_batches=2)
    # every input is measured exactly once, so the measured set is the data set, not its longer part
    assert len(result.measured) == len(result.requests) == 48
    assert {r.index for r in result.measured} == set(range(1, 49))
    assert sum(b.size for b in result.batches if not b.warmup) == 48
    assert result.warmup_batches and all(b.warmup for b in result.warmup_batches)
    assert result.t_window_start >= max(b.t_done for b in result.warmup_batches)


def test_ledger_read_includes_the_disk_read(monkeypatch):
    slow_s = 0.01
    real = LineDataset.__getitem__

    def slow_getitem(self, i):
        time.sleep(slow_s)  # a slow disk
        return real(self, i)

    monkeypatch.setattr(LineDataset, "__getitem__", slow_getitem)
    result = run_pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), limit=12, keep_embeddings=False,
                          warmup_batches=0)
    assert all(b.read_ms >= 4 * slow_s * 1000 for b in result.batches)
    assert all(r.read_ms >= 4 * slow_s * 1000 for r in result.requests)


def test_token_grouping_pass_is_a_stage_of_the_ledger():
    knobs = Knobs(num_workers=0, batch_size=8, tokenizer="fast", padding="bucket", group_by="tokens", bucket_window=16)
    result = run_pipeline(knobs, limit=32, keep_embeddings=False)
    ledger = result.ledger()
    assert "group" in ledger.index and ledger.loc["group", "p50_ms"] > 0
    spans = {round((b - a) * 1000, 9) for a, b in result.plan_spans}
    assert len(result.plan_spans) == 2 and {round(r.group_ms, 9) for r in result.requests} <= spans
    plain = run_pipeline(knobs.replace(group_by="bytes"), limit=16, keep_embeddings=False)
    assert all(r.group_ms == 0 for r in plain.requests)


def test_padding_waste_is_padded_over_real_minus_one():
    assert "- 1" in PipelineResult.padding_waste.__doc__
    batches = [_batch(0, 0, 0, ok=2)]
    batches[0].real_tokens, batches[0].padded_length = 10, 8  # 16 padded for 10 real
    assert _result(batches).padding_waste == pytest.approx(0.6)


# --- the bucket planner and the plan table ----------------------------------------------------

def test_planner_keeps_its_optimal_top_bucket():
    lengths = np.random.default_rng(0).integers(20, 101, size=2000)
    report = padding_waste(lengths, batch_size=16, max_length=256, k=4)
    assert report.planned == plan_buckets(lengths, 4) and report.planned[-1] == 100
    planned = report.row("grouped-planned")
    assert planned.waste < 0.25  # not 0.79 from padding the top bucket to max_length


def test_plan_rows_simulate_the_pipelines_batches():
    # arrival order puts a long request in every batch; grouping by tokens inside the window does not
    lengths = [10, 200] * 8
    report = padding_waste(lengths, batch_size=4, max_length=256, k=2, window=16)
    assert report.row("arrival-dynamic").padded_tokens == 4 * 4 * 200
    assert report.row("arrival-fixed").padded_tokens == 16 * 256
    assert report.row("grouped-dynamic").padded_tokens == 1680 == report.row("grouped-dynamic").real_tokens
    assert report.row("grouped-planned").padded_tokens == 1680 and report.planned == (10, 200)
    # a window of one batch cannot group: every row sees the same batches
    narrow = padding_waste(lengths, batch_size=4, max_length=256, k=2, window=4)
    assert narrow.row("grouped-dynamic").padded_tokens == 3200


def _run_lengths(result):
    """Per input (in order), its truncated token count or 0 for an error, as the run saw it."""
    return [min(r.n_tokens, result.knobs.max_length) if r.outcome == "ok" else 0 for r in result.requests]


@pytest.mark.parametrize("changes", [
    dict(padding="bucket", group_by="tokens", buckets=tuple(range(8, 257, 8))),
    dict(padding="dynamic", group_by="tokens"),
    dict(padding="bucket", group_by="bytes"),
    dict(padding="dynamic", group_by="bytes"),
], ids=["tuned-buckets", "grouped-dynamic", "bytes-buckets", "arrival-dynamic"])
def test_simulated_batches_match_the_pipelines_padding(changes):
    knobs = Knobs(num_workers=0, batch_size=8, tokenizer="fast", bucket_window=40, **changes)
    result = run_pipeline(knobs, limit=80, keep_embeddings=False)
    from tuning.inputs.buckets import simulate_padding

    sizes = LineDataset(DEFAULT_DATA, 80).sizes
    sim = simulate_padding(_run_lengths(result), knobs, sizes)
    assert sim.padding_waste == pytest.approx(result.padding_waste)
    expected = [[r.index - 1 for r in result.requests if r.batch == b.batch] for b in result.batches]
    assert [sorted(b) for b in sim.batches] == expected


def test_length_grouping_with_dynamic_padding_pads_less_than_arrival_order():
    base = Knobs(num_workers=0, batch_size=8, tokenizer="fast", padding="dynamic", bucket_window=64)
    arrival = run_pipeline(base, limit=64, keep_embeddings=False)
    grouped = run_pipeline(base.replace(group_by="tokens"), limit=64, keep_embeddings=False)
    assert grouped.padding_waste < arrival.padding_waste / 2


# --- bench helpers -------------------------------------------------------------------------------

def test_interleaved_rounds_alternate_the_order_abba():
    common = _bench_module("common")
    calls = []
    arms = {name: (lambda name=name: calls.append(name) or len(calls)) for name in ("a", "b", "c")}
    samples = common.interleave(arms, rounds=4)
    assert calls == list("abc" "cba" "abc" "cba")
    assert samples == {"a": [1, 6, 7, 12], "b": [2, 5, 8, 11], "c": [3, 4, 9, 10]}


def test_spread_reports_the_median_with_its_spread():
    common = _bench_module("common")
    s = common.spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert s["iqr"] == pytest.approx(2.0) and s["values"] == [1.0, 2.0, 3.0, 4.0, 100.0]


def test_paired_repeats_are_sized_from_the_difference_spread():
    common = _bench_module("common")
    # sd of paired relative differences 0.06: a 95% half-width of 0.015 needs 62 pairs; 0.03 needs 16
    assert common.pairs_needed(0.06, 0.015) == 62
    assert common.pairs_needed(0.06, 0.03) == 16
    assert common.pairs_needed(0.0, 0.015, minimum=6) == 6


def test_profiler_overhead_verdict_needs_the_interval_to_clear_the_target():
    bench = _bench_module("profiler_overhead")
    mean, low, high = bench.interval([0.01, -0.01, 0.02, 0.0])
    assert mean == pytest.approx(0.005) and low < mean < high
    assert bench.verdict(-0.01, 0.02, 0.03) == "within target"
    assert bench.verdict(0.04, 0.05, 0.03) == "over target"
    assert bench.verdict(0.0, 0.05, 0.03).startswith("unresolved")


def test_presets_cite_the_sweep_that_chose_them():
    import re

    from tuning.knobs import preset

    source = (BENCH.parent / "tuning" / "knobs.py").read_text()
    cited = set(re.findall(r"bench/\w+\.py", source))
    assert "bench/presets.py" in cited and all((BENCH.parent / c).is_file() for c in cited)
    bench = _bench_module("presets")
    tuned = preset("tuned")
    for factor, label, changes in bench.VARIANTS + [bench.COMPILE]:
        variant = preset("tuned", **changes)  # every variant is a valid knob set
        changed = {k for k in tuned.as_dict() if getattr(variant, k) != getattr(tuned, k)}
        assert changed == set(changes) and (factor == "tuned") == (not changes), label
