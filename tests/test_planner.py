"""The bucket planner against brute force, and the padding simulation it is scored with (issue 17 item 6).

Rule (tuning/inputs/buckets.py): ``plan_buckets`` returns the ``k`` bucket lengths that minimise total padded tokens
when each request pads to the smallest bucket that holds it; the largest length is always a bucket (the
planner keeps its own top bucket). The brute force tries every choice of the other ``k - 1`` buckets among the
distinct lengths, including choices where a bucket holds one value only (issue 17: ``[1]*100 + [50, 51]``
planned as (50, 51) instead of (1, 51) passed the old random cases).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuning.inputs.buckets import padded_to_buckets, padding_waste, plan_buckets, simulate_padding
from tuning.knobs import Knobs


def _cost(lengths, buckets) -> int:
    return int(padded_to_buckets(np.asarray(lengths), buckets).sum())


def _brute_force(lengths, k):
    """(cost, buckets) of the cheapest choice; the smallest buckets on a tie."""
    values = sorted(set(lengths))
    k = min(k, len(values))
    return min((_cost(lengths, combo + (values[-1],)), combo + (values[-1],))
               for combo in itertools.combinations(values[:-1], k - 1))


@pytest.mark.parametrize("lengths,k,expected", [
    ([1] * 100 + [50, 51], 2, (1, 51)),  # a one-value bottom bucket
    ([1] * 100 + [50, 51], 3, (1, 50, 51)),  # k = distinct lengths: every bucket holds one value
    ([10] * 5 + [11] * 5 + [200] * 50, 2, (11, 200)),  # a one-value top bucket
    ([5, 6, 7] + [30] * 40 + [31, 32], 3, (7, 30, 32)),  # a one-value middle bucket
    ([8] * 3 + [9] * 3 + [100], 2, (9, 100)),
    ([3, 3, 4, 4, 4, 90, 91, 92], 4, (3, 4, 90, 92)),
    ([1, 1, 1, 7, 14, 14, 22, 22, 22, 24, 24], 2, (1, 24)),  # by one token: (7, 24) pads 196, (1, 24) 195
    ([9, 16, 16, 16, 18, 18, 23], 3, (9, 18, 23)),
])
def test_one_value_buckets_when_they_are_optimal(lengths, k, expected):
    planned = plan_buckets(lengths, k)
    assert planned == expected and _cost(lengths, planned) == _brute_force(lengths, k)[0]


# skewed lists with few distinct values: heavy repeats make one-value buckets optimal often
skewed = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=7).map(
    lambda pairs: [value for value, count in pairs for _ in range(count)])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(skewed, st.integers(1, 8))
def test_planner_matches_brute_force_on_skewed_lengths(lengths, k):
    """The dynamic programme is exact: its cost equals the brute force's for every k, and it returns
    min(k, distinct) strictly ascending buckets ending at the longest request."""
    planned = plan_buckets(lengths, k)
    distinct = sorted(set(lengths))
    assert len(planned) == min(k, len(distinct)) and list(planned) == sorted(set(planned))
    assert set(planned) <= set(distinct) and planned[-1] == distinct[-1]
    assert _cost(lengths, planned) == _brute_force(lengths, k)[0]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=12), st.integers(1, 4))
def test_planner_matches_brute_force_on_short_lists(lengths, k):
    """Close calls (a few tokens between two plans) on short lists of small lengths."""
    assert _cost(lengths, plan_buckets(lengths, k)) == _brute_force(lengths, k)[0]


@pytest.mark.parametrize("seed", range(4))
def test_k_equal_to_the_distinct_lengths_pads_nothing(seed):
    lengths = np.random.default_rng(seed).integers(3, 300, size=50).tolist()
    distinct = sorted(set(lengths))
    assert plan_buckets(lengths, len(distinct)) == tuple(distinct)
    assert plan_buckets(lengths, len(distinct) + 3) == tuple(distinct)
    assert _cost(lengths, plan_buckets(lengths, len(distinct))) == sum(lengths)
    assert plan_buckets(lengths, 1) == (max(lengths),)


def test_multiple_of_rounds_candidates_up():
    assert plan_buckets([3, 9, 9, 17], 2, multiple_of=8) == (16, 24)  # 8, 16, 16, 24: (16, 24) pads 72, (8, 24) 80
    assert plan_buckets([1, 2, 3], 5, multiple_of=4) == (4,)
    assert plan_buckets([5, 64], 2, multiple_of=1) == (5, 64)
    assert plan_buckets([3, 5], 2, multiple_of=2) == (4, 6)


@pytest.mark.parametrize("k,message", [
    (0, "k=0 must be an integer >= 1 (the number of bucket lengths)"),
    (True, "k=True must be an integer >= 1 (the number of bucket lengths)"),
    (2.0, "k=2.0 must be an integer >= 1 (the number of bucket lengths)"),
])
def test_planner_refuses_a_bad_k(k, message):
    with pytest.raises(ValueError) as info:
        plan_buckets([1, 2], k)
    assert str(info.value) == message


def test_planner_refuses_no_lengths():
    with pytest.raises(ValueError) as info:
        plan_buckets([], 2)
    assert str(info.value) == "lengths is empty: run some requests first"


def test_padded_to_buckets_pads_to_the_smallest_bucket_that_holds_it():
    assert padded_to_buckets(np.array([1, 32, 33, 64]), (64, 32)).tolist() == [32, 32, 64, 64]
    with pytest.raises(ValueError) as info:
        padded_to_buckets(np.array([10, 65]), (16, 32, 64))
    assert str(info.value) == "a length of 65 does not fit the largest bucket 64"


# --- the simulation the strategies are scored with ------------------------------------------------------------
def test_simulated_arrival_order_batches_and_failed_inputs():
    """Arrival order, dynamic padding: batches of batch_size in order; a failed input (length 0) takes a slot
    but no tokens; a batch of failed inputs pads to 0; lengths over max_length are truncated."""
    knobs = Knobs(batch_size=3, max_length=64, padding="dynamic")
    sim = simulate_padding([10, 0, 20, 0, 0, 0, 100, 5], knobs)
    assert sim.batches == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sim.padded_lengths == [20, 0, 64]
    assert (sim.real_tokens, sim.padded_tokens) == (10 + 20 + 64 + 5, 2 * 20 + 2 * 64)
    assert sim.shapes == 2 and sim.padding_waste == (2 * 20 + 2 * 64) / 99 - 1


def test_simulated_token_grouping_with_buckets_and_fixed_padding():
    lengths = [30, 5, 31, 6, 60, 7]
    grouped = simulate_padding(lengths, Knobs(batch_size=2, padding="bucket", group_by="tokens", bucket_window=6,
                                              buckets=(8, 32), max_length=64))
    assert grouped.batches == [[1, 3], [5, 0], [2, 4]] and grouped.padded_lengths == [8, 32, 64]
    fixed = simulate_padding(lengths, Knobs(batch_size=4, padding="fixed", max_length=64))
    assert fixed.batches == [[0, 1, 2, 3], [4, 5]] and fixed.padded_lengths == [64, 64] and fixed.shapes == 1
    assert math.isnan(simulate_padding([0, 0], Knobs(batch_size=2)).padding_waste)


def test_simulated_byte_grouping_needs_sizes():
    knobs = Knobs(batch_size=2, padding="bucket", group_by="bytes", bucket_window=4, buckets=(16, 64))
    sim = simulate_padding([10, 40, 12, 50], knobs, sizes=[100, 400, 90, 300])
    assert sim.batches == [[2, 0], [3, 1]] and sim.padded_lengths == [16, 64]
    with pytest.raises(ValueError) as info:
        simulate_padding([10, 40], knobs, sizes=[1])
    assert str(info.value) == ("group_by='bytes' groups by line size: pass sizes, one per input (bytes of each line)")
    with pytest.raises(ValueError):
        simulate_padding([10, 40], knobs)


def test_the_window_bounds_reordering():
    knobs = Knobs(batch_size=1, padding="dynamic", group_by="tokens", bucket_window=2)
    assert simulate_padding([9, 1, 8, 2], knobs).batches == [[1], [0], [3], [2]]
    wide = Knobs(batch_size=1, padding="dynamic", group_by="tokens", bucket_window=1)
    assert simulate_padding([9, 1], wide.replace(batch_size=2)).batches == [[1, 0]]  # window >= batch_size


def test_waste_report_rows_and_settings():
    lengths = [10, 200] * 8
    report = padding_waste(lengths, batch_size=4, max_length=256, k=2, window=16, sizes=[100, 900] * 8,
                           current_buckets=(16, 256))
    table = report.to_frame().set_index("key")
    assert list(table.index) == ["arrival-dynamic", "arrival-fixed", "grouped-dynamic", "grouped-planned",
                                 "bytes-planned", "knob-buckets"]
    assert report.planned == (10, 200)
    assert table.loc["grouped-planned", "settings"] == "--set padding=bucket --set group_by=tokens --set buckets=10,200"
    assert table.loc["arrival-fixed", "settings"] == "--set padding=fixed"
    assert table.loc["bytes-planned", "padded_tokens"] == 1680 and table.loc["knob-buckets", "padded_tokens"] == 2176
    assert table.loc["arrival-fixed", "waste"] == 16 * 256 / 1680 - 1
    assert table.loc["grouped-planned", "strategy"] == "grouped by tokens, planned buckets k=2 [10, 200]"
    assert (table.loc["grouped-dynamic", "batches"], table.loc["grouped-dynamic", "shapes"]) == (4, 2)
    with pytest.raises(KeyError) as info:
        report.row("nope")
    assert "no strategy 'nope'" in str(info.value) and "knob-buckets" in str(info.value)


def test_waste_report_with_knobs_and_tiny_lengths():
    knobs = Knobs(batch_size=2, max_length=64, padding="bucket", group_by="tokens", buckets=(8, 32))
    report = padding_waste([1, 2, 40, 0], k=2, knobs=knobs)
    assert report.planned == (2, 40) and report.knobs is knobs
    assert list(report.to_frame().key) == ["arrival-dynamic", "arrival-fixed", "grouped-dynamic", "grouped-planned",
                                           "knob-buckets", "knobs"]
    assert report.row("grouped-planned").settings == "--set padding=bucket --set buckets=3,40"  # lengths >= 3
    with pytest.raises(ValueError) as info:
        padding_waste([0, 0], k=2)
    assert str(info.value) == "lengths has no valid input: run some requests first"


def test_waste_report_defaults_are_the_documented_ones():
    """padding_waste(lengths): batch 16, max_length 256, k = 4, window 256."""
    lengths = [5, 10, 20, 40, 80, 300] * 3
    report = padding_waste(lengths)
    table = report.to_frame().set_index("key")
    assert report.planned == (10, 40, 80, 256) and len(report.planned) == 4  # 300 is truncated to 256
    assert set(table.batch_size) == {16} and set(table.window) == {256}
    assert table.loc["arrival-fixed", "padded_tokens"] == 18 * 256
    assert list(table.columns) == ["strategy", "settings", "batch_size", "window", "batches", "shapes", "padded_tokens",
                                   "real_tokens", "padded_over_real", "waste"]


def test_waste_report_uses_the_given_max_length_and_window():
    lengths = [100, 1] * 8
    report = padding_waste(lengths, batch_size=2, max_length=64, k=2, window=2)
    table = report.to_frame().set_index("key")
    assert report.planned == (1, 64) and table.loc["arrival-fixed", "padded_tokens"] == 16 * 64
    assert table.loc["grouped-dynamic", "padded_tokens"] == 8 * 2 * 64  # a window of one pair cannot group
    assert padding_waste(lengths, batch_size=2, max_length=64, k=2).row("grouped-dynamic").padded_tokens == 4 * 2 + 4 * 128
    assert set(table.window) == {2}


def test_waste_report_labels_every_strategy():
    knobs = Knobs(batch_size=2, max_length=64, padding="bucket", group_by="tokens", buckets=(8, 32))
    report = padding_waste([5, 9, 30, 60], k=2, sizes=[1, 2, 3, 4], knobs=knobs)
    assert list(report.to_frame().strategy) == [
        "arrival order, dynamic padding", "arrival order, fixed padding (64)", "grouped by tokens, dynamic padding",
        "grouped by tokens, planned buckets k=2 [9, 60]", "grouped by bytes, planned buckets k=2",
        "grouped by tokens, knob buckets (3 lengths)", "the knobs as set"]
    assert report.row("bytes-planned").settings == "--set padding=bucket --set group_by=bytes --set buckets=9,60"


def test_each_strategy_keeps_its_own_grouping_and_padding_whatever_the_knobs():
    """The rows compare strategies on the knobs' batch size and window: arrival order is arrival order and the
    grouped rows group by tokens even when the knobs group otherwise; dynamic rows pad dynamically."""
    lengths = [1, 40, 2, 39]
    tokens = Knobs(batch_size=2, max_length=64, padding="bucket", group_by="tokens", buckets=(8, 32))
    table = padding_waste(lengths, k=2, knobs=tokens).to_frame().set_index("key")
    assert table.loc["arrival-dynamic", "padded_tokens"] == 2 * 40 + 2 * 39  # [1, 40] [2, 39]
    assert table.loc["grouped-dynamic", "padded_tokens"] == 2 * 2 + 2 * 40  # [1, 2] [39, 40], not bucketed
    by_bytes = tokens.replace(group_by="bytes")
    table = padding_waste(lengths, k=2, knobs=by_bytes).to_frame().set_index("key")
    assert list(table.index) == ["arrival-dynamic", "arrival-fixed", "grouped-dynamic", "grouped-planned",
                                 "knob-buckets"]  # the knobs group by bytes: no sizes, no row for them
    assert table.loc["knob-buckets", "padded_tokens"] == 2 * 8 + 2 * 64  # grouped by tokens, knob buckets
    assert table.loc["knob-buckets", "settings"] == "--set padding=bucket --set group_by=tokens"
    with_sizes = padding_waste(lengths, k=2, sizes=[4, 1, 3, 2], knobs=by_bytes).to_frame().set_index("key")
    assert with_sizes.loc["knobs", "padded_tokens"] == 2 * 64 + 2 * 8  # [40, 39] [2, 1] by bytes, buckets 8/32/64


def test_a_one_token_input_is_valid():
    assert padding_waste([1] * 10 + [50], k=2).planned == (1, 50)
    sim = simulate_padding([1, 3], Knobs(batch_size=2))
    assert (sim.real_tokens, sim.padded_tokens, sim.padded_lengths) == (4, 6, [3])


def test_unknown_strategy_names_the_known_ones():
    report = padding_waste([5, 9], k=1)
    with pytest.raises(KeyError) as info:
        report.row("nope")
    assert info.value.args[0] == ("no strategy 'nope'; have arrival-dynamic, arrival-fixed, grouped-dynamic, "
                                  "grouped-planned")
