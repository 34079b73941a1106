"""Property tests of the batch former's rules (issue 17 item 1), on the fake clock.

A random schedule of arrivals (each into a length bucket) and calls to ``pop_ready`` (with or without
room for batches) runs against a :class:`BatchFormer`; after every call the test checks, from what it
saw go in and come out:

- size: every batch holds at most ``max_batch_size`` requests (and, with a token budget, batch size x
  longest padded length stays within ``max_batch_tokens`` unless one request travels alone);
- patience: a batch that is not full leaves only once its oldest request waited ``max_wait_s`` (or at
  ``drain``), so a bucket one short of full keeps waiting;
- room: no more than ``capacity`` batches leave per call;
- deadline order: while a request is overdue, the next batch is built around the oldest waiting one
  (earliest deadline first), before any full batch;
- liveness: with room left after a call, nothing overdue and no full batch is left waiting;
- exactly once: every request comes out in exactly one batch, none is invented.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuning.base.clock import FakeClock
from tuning.online.batching import BatchFormer

LENGTHS = (16, 32, 64, 128)

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(LENGTHS) - 1), st.integers(0, 4)),  # bucket, then ms to advance
    st.tuples(st.just("pop"), st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 6)),  # capacity, ms
), max_size=60)

configs = st.fixed_dictionaries({
    "max_batch_size": st.integers(1, 6),
    "max_wait_ms": st.integers(0, 8),
    "buckets": st.integers(1, len(LENGTHS)),
    "max_padding": st.sampled_from([0.0, 0.15, 0.5, 1.0]),
    "max_batch_tokens": st.one_of(st.none(), st.sampled_from([128, 200, 256, 400])),
})


def _former(cfg: dict) -> BatchFormer:
    lengths = LENGTHS[:cfg["buckets"]]
    return BatchFormer(cfg["max_batch_size"], cfg["max_wait_ms"] / 1000, bucket_of=lambda item: item[1],
                       bucket_lengths=lengths, max_padding=cfg["max_padding"],
                       max_batch_tokens=cfg["max_batch_tokens"], length_of=lambda item: lengths[item[1]])


def _full(cfg: dict, size: int, longest: int) -> bool:
    """One more request as long as the batch's longest would break a limit (every request of a bucket has
    the bucket's length here, so this is exactly the batcher's promise)."""
    budget = cfg["max_batch_tokens"]
    return size >= cfg["max_batch_size"] or (budget is not None and (size + 1) * longest > budget)


def _check_sizes(cfg: dict, batch: list) -> None:
    assert 1 <= len(batch) <= cfg["max_batch_size"], batch
    budget = cfg["max_batch_tokens"]
    if budget is not None and len(batch) > 1:
        assert len(batch) * max(LENGTHS[b] for _, b, _ in batch) <= budget, batch


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(configs, ops)
def test_batch_former_rules_hold_on_any_schedule(cfg, schedule):
    """Size, patience, room, deadline order, liveness and exactly-once, after every call (see the module doc)."""
    clock = FakeClock()
    former = _former(cfg)
    max_wait = cfg["max_wait_ms"] / 1000
    waiting: dict[int, tuple[int, float]] = {}  # request id -> (bucket, arrival)
    seen: list[int] = []
    for n, (op, arg, advance_ms) in enumerate(schedule):
        if op == "add":
            bucket = arg % cfg["buckets"]
            waiting[n] = (bucket, clock())
            former.add((n, bucket, clock()), clock())
        else:
            now = clock()
            batches = former.pop_ready(now, arg)
            assert arg is None or len(batches) <= arg  # room: at most `capacity` batches per call
            full_phase = False
            for batch in batches:
                _check_sizes(cfg, batch)
                ids = [i for i, _, _ in batch]
                assert all(i in waiting for i in ids) and len(set(ids)) == len(ids)  # none invented or twice
                oldest = min(t for _, t in waiting.values())
                overdue_left = now - oldest >= max_wait
                if overdue_left:
                    # deadline order: the overdue batches come first, each around the oldest request waiting
                    assert not full_phase, "an overdue request waited behind a full batch"
                    assert min(t for _, _, t in batch) == oldest
                else:
                    # patience: a batch with no overdue request leaves only when it is full
                    full_phase = True
                    assert len({b for _, b, _ in batch}) == 1  # only overdue batches are topped up
                    assert _full(cfg, len(batch), LENGTHS[batch[0][1]]), batch
                for i in ids:
                    del waiting[i]
                seen.extend(ids)
            if arg is None or len(batches) < arg:
                # liveness: room was left, so nothing overdue and no full batch stays behind
                assert all(now - t < max_wait for _, t in waiting.values())
                for bucket in range(cfg["buckets"]):
                    queued = sum(b == bucket for b, _ in waiting.values())
                    assert not (queued and _full(cfg, queued, LENGTHS[bucket])), (bucket, queued)
            assert len(former) == len(waiting)
        clock.advance(advance_ms / 1000)
    for batch in former.drain():  # at drain every request leaves, short batches included
        _check_sizes(cfg, batch)
        for i, _, _ in batch:
            del waiting[i]
            seen.append(i)
    assert not waiting and len(former) == 0 and former.next_deadline() is None
    adds = [n for n, (op, _, _) in enumerate(schedule) if op == "add"]
    assert sorted(seen) == adds  # exactly once


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 8), st.integers(1, 20), st.integers(0, 5))
def test_next_deadline_is_the_oldest_arrival_plus_max_wait(max_batch_size, max_wait_ms, n_waiting):
    """The batcher sleeps until ``next_deadline``: the oldest waiting request's arrival + ``max_wait_s``."""
    clock = FakeClock(5.0)
    former = BatchFormer(max_batch_size, max_wait_ms / 1000)
    arrivals = []
    for _ in range(n_waiting):
        arrivals.append(clock())
        former.add(len(arrivals), clock())
        clock.advance(0.001)
    former.pop_ready(arrivals[0] if arrivals else 0.0, capacity=0)  # no room: nothing leaves
    assert former.next_deadline() == (arrivals[0] + max_wait_ms / 1000 if arrivals else None)


def test_a_bucket_one_short_of_full_waits_for_max_wait():
    """Rule: a batch leaves when full (``max_batch_size`` requests) or when its oldest waited ``max_wait_s``;
    a bucket holding ``max_batch_size - 1`` is not full (issue 17: this mutant survived)."""
    for size in (2, 3, 8):
        clock = FakeClock()
        former = BatchFormer(max_batch_size=size, max_wait_s=0.010)
        for i in range(size - 1):
            former.add(i, clock())
        assert former.pop_ready(clock()) == []
        clock.advance(0.00999)
        assert former.pop_ready(clock()) == []  # just under max_wait: still waiting
        clock.advance(0.00001)
        assert former.pop_ready(clock()) == [list(range(size - 1))]


def test_overdue_batches_leave_in_deadline_order_across_buckets():
    """Rule: overdue requests are served earliest deadline first, whatever their bucket's index."""
    clock = FakeClock()
    former = BatchFormer(max_batch_size=4, max_wait_s=0.005, bucket_of=lambda x: x[1], bucket_lengths=LENGTHS,
                         max_padding=0.0)
    for name, bucket in [("c", 3), ("a", 0), ("b", 2), ("d", 1)]:
        former.add((name, bucket), clock())
        clock.advance(0.001)
    clock.advance(0.005)  # all four overdue; oldest first: c, a, b, d
    order = [[n for n, _ in batch] for batch in former.pop_ready(clock(), capacity=1)]
    order += [[n for n, _ in batch] for batch in former.pop_ready(clock(), capacity=2)]
    order += [[n for n, _ in batch] for batch in former.pop_ready(clock(), capacity=None)]
    assert order == [["c"], ["a"], ["b"], ["d"]]


def test_a_timed_out_batch_is_topped_up_from_the_shorter_neighbour_first():
    """Rule: a batch that leaves on time is topped up from the nearest buckets, the shorter one first on a
    tie (a long request does not drag short ones up to its length when a shorter one can fill the slot)."""
    clock = FakeClock()
    former = BatchFormer(max_batch_size=2, max_wait_s=0.005, bucket_of=lambda x: x[1], bucket_lengths=(30, 32, 34),
                         max_padding=0.5)
    for name, bucket in [("mid", 1), ("long", 2), ("short", 0)]:
        former.add((name, bucket), clock())
        clock.advance(0.001)
    clock.advance(0.005)
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=1)] == [["mid", "short"]]


def test_top_up_stops_at_the_padding_limit_and_skips_only_what_breaks_it():
    """Rule: no member is padded by more than ``max_padding`` of the batch's length; a bucket too far away is
    skipped, and the limit is measured against the batch's longest and shortest members so far."""
    clock = FakeClock()
    lengths = (60, 80, 100)
    former = BatchFormer(max_batch_size=8, max_wait_s=0.0, bucket_of=lambda x: x[1], bucket_lengths=lengths,
                         max_padding=0.2)
    for name, bucket in [("a", 1), ("lo", 0), ("hi", 2)]:
        former.add((name, bucket), clock())
        clock.advance(0.001)
    # around 80: 60 < 0.8 * 80 is too short; 80 >= 0.8 * 100 fits; exactly at the limit counts as within it
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=1)] == [["a", "hi"]]
    assert [[n for n, _ in b] for b in former.pop_ready(clock())] == [["lo"]]


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_batch_size=2.0, max_wait_s=0.0), "max_batch_size=2.0 must be an integer >= 1"),
    (dict(max_batch_size=True, max_wait_s=0.0), "max_batch_size=True must be an integer >= 1"),
    (dict(max_batch_size=1, max_wait_s="0"), "max_wait_s='0' must be a number >= 0"),
    (dict(max_batch_size=1, max_wait_s=False), "max_wait_s=False must be a number >= 0"),
    (dict(max_batch_size=1, max_wait_s=0.0, max_batch_tokens=0), "max_batch_tokens=0 must be None or an integer >= 1"),
    (dict(max_batch_size=1, max_wait_s=0.0, max_batch_tokens=64.0),
     "max_batch_tokens=64.0 must be None or an integer >= 1"),
    (dict(max_batch_size=1, max_wait_s=0.0, max_batch_tokens=True),
     "max_batch_tokens=True must be None or an integer >= 1"),
])
def test_batcher_refuses_bad_limits_naming_them(kwargs, message):
    """Rule (Ray Serve's batch queue): max_batch_size >= 1, max_wait >= 0, a token budget >= 1 or None."""
    with pytest.raises(ValueError) as info:
        BatchFormer(**kwargs)
    assert str(info.value) == message


def test_batcher_accepts_the_smallest_limits():
    former = BatchFormer(max_batch_size=1, max_wait_s=0, max_batch_tokens=1)
    former.add("x", 0.0)
    assert former.pop_ready(0.0) == [["x"]]


def test_full_first_order_still_sends_overdue_batches_when_there_is_room():
    """The old order (kept for the before/after bench): full batches first, then overdue ones, in one call."""
    clock = FakeClock()
    former = BatchFormer(max_batch_size=2, max_wait_s=0.010, bucket_of=lambda x: x[1], bucket_lengths=(32, 256),
                         overdue_first=False)
    former.add(("rare", 1), clock())
    clock.advance(0.011)
    former.add(("a", 0), clock())
    former.add(("b", 0), clock())
    former.add(("c", 0), clock())
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=2)] == [["a", "b"], ["rare"]]
    assert [[n for n, _ in b] for b in former.pop_ready(clock() + 0.011)] == [["c"]]


def test_requests_of_unknown_length_never_break_the_token_budget():
    """Without ``length_of`` every request has length 0: the budget cannot bind, the batch size alone does
    (for full batches and for timed-out ones alike)."""
    full = BatchFormer(max_batch_size=4, max_wait_s=1.0, max_batch_tokens=1)
    overdue = BatchFormer(max_batch_size=4, max_wait_s=0.0, max_batch_tokens=1, bucket_of=lambda x: x % 2,
                          bucket_lengths=(8, 8))
    for i in range(5):
        full.add(i, 0.0)
        overdue.add(2 * i, 0.0)
    assert full.pop_ready(0.0) == [[0, 1, 2, 3]]
    assert overdue.pop_ready(0.0, capacity=1) == [[0, 2, 4, 6]]
