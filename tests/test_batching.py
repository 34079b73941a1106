import pytest

from tuning.base.clock import FakeClock
from tuning.online.batching import BatchFormer


def test_full_batch_leaves_at_once():
    clock = FakeClock()
    former = BatchFormer(max_batch_size=3, max_wait_s=0.010)
    for i in range(7):
        former.add(i, clock())
    assert former.pop_ready(clock()) == [[0, 1, 2], [3, 4, 5]]
    assert len(former) == 1 and former.next_deadline() == pytest.approx(0.010)


def test_partial_batch_leaves_when_oldest_waited_max_wait():
    clock = FakeClock()
    former = BatchFormer(max_batch_size=4, max_wait_s=0.010)
    former.add("a", clock())
    clock.advance(0.006)
    former.add("b", clock())
    assert former.pop_ready(clock()) == []
    clock.advance(0.004)  # "a" has now waited exactly max_wait
    assert former.pop_ready(clock()) == [["a", "b"]]
    assert former.next_deadline() is None and len(former) == 0


def test_zero_wait_sends_immediately_and_capacity_holds_back():
    clock = FakeClock()
    former = BatchFormer(max_batch_size=8, max_wait_s=0.0)
    for i in range(3):
        former.add(i, clock())
    assert former.pop_ready(clock(), capacity=0) == []  # model side full: keep gathering
    former.add(3, clock())
    assert former.pop_ready(clock(), capacity=1) == [[0, 1, 2, 3]]


def test_every_request_in_exactly_one_batch():
    clock = FakeClock()
    former = BatchFormer(max_batch_size=5, max_wait_s=0.002, bucket_of=lambda x: x % 3)
    seen = []
    for i in range(103):
        former.add(i, clock())
        clock.advance(0.0007)
        for batch in former.pop_ready(clock()):
            seen.extend(batch)
    for batch in former.drain():
        seen.extend(batch)
    assert sorted(seen) == list(range(103))


def test_buckets_group_by_length_and_top_up_only_within_padding_limit():
    clock = FakeClock()
    lengths = (32, 64, 128, 256)
    former = BatchFormer(max_batch_size=4, max_wait_s=0.001, bucket_of=lambda x: x[1], bucket_lengths=lengths,
                         max_padding=0.5)
    for name, bucket in [("s1", 0), ("L1", 3), ("s2", 0), ("m1", 1), ("L2", 3)]:
        former.add((name, bucket), clock())
    clock.advance(0.001)
    batches = [[n for n, _ in b] for b in former.pop_ready(clock())]
    # oldest is s1 (bucket 32): topped up from 64 (32 >= 0.5*64), never from 256
    assert batches[0] == ["s1", "s2", "m1"]
    assert batches[1] == ["L1", "L2"]


@pytest.mark.parametrize("kwargs,needle", [
    (dict(max_batch_size=0, max_wait_s=0.0), "max_batch_size=0"),
    (dict(max_batch_size=2, max_wait_s=-1), "max_wait_s=-1"),
])
def test_batcher_validates(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        BatchFormer(**kwargs)


def test_remove_expired():
    former = BatchFormer(max_batch_size=4, max_wait_s=1.0)
    for i in range(4 - 1):
        former.add(i, 0.0)
    assert former.remove(lambda x: x == 1) == [1]
    assert former.drain() == [[0, 2]]


def test_overdue_request_leaves_before_full_batches():
    """Review finding (issue 11, item 7): with room for one batch, a full bucket went before a request of a rare
    length that was past max_wait, so under saturation that request waited until no bucket was full."""
    clock = FakeClock()
    former = BatchFormer(max_batch_size=2, max_wait_s=0.010, bucket_of=lambda x: x[1], bucket_lengths=(32, 256))
    former.add(("rare", 1), clock())
    clock.advance(0.011)  # "rare" is overdue
    for name in ("a", "b", "c", "d"):
        former.add((name, 0), clock())  # two full batches of short requests
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=1)] == [["rare"]]
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=2)] == [["a", "b"], ["c", "d"]]


def test_full_first_order_is_kept_for_comparison():
    clock = FakeClock()
    former = BatchFormer(max_batch_size=2, max_wait_s=0.010, bucket_of=lambda x: x[1], bucket_lengths=(32, 256),
                         overdue_first=False)
    former.add(("rare", 1), clock())
    clock.advance(0.011)
    former.add(("a", 0), clock())
    former.add(("b", 0), clock())
    assert [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=1)] == [["a", "b"]]


def _token_former(**kw):
    lengths = (16, 32, 64)
    return BatchFormer(max_batch_size=kw.pop("max_batch_size", 64), max_wait_s=kw.pop("max_wait_s", 0.010),
                       bucket_of=lambda x: lengths.index(x[1]), bucket_lengths=lengths, length_of=lambda x: x[1],
                       max_batch_tokens=kw.pop("max_batch_tokens", 128), **kw)


def test_token_budget_sends_a_batch_when_the_next_request_would_break_it():
    clock = FakeClock()
    former = _token_former()
    for i in range(3):
        former.add((f"m{i}", 32), clock())  # 3 x 32 = 96 tokens: a fourth (128) still fits
    assert former.pop_ready(clock()) == []
    former.add(("m3", 32), clock())  # 4 x 32 = 128 = the budget: one more would break it
    assert [[n for n, _ in b] for b in former.pop_ready(clock())] == [["m0", "m1", "m2", "m3"]]
    for i in range(9):
        former.add((f"s{i}", 16), clock())  # short requests travel 8 to a batch under the same budget
    assert [[n for n, _ in b] for b in former.pop_ready(clock())] == [[f"s{i}" for i in range(8)]]
    assert len(former) == 1


def test_token_budget_holds_for_timed_out_batches_topped_up_from_longer_buckets():
    clock = FakeClock()
    former = _token_former(max_padding=0.6)
    former.add(("s0", 16), clock())
    for i in range(3):
        former.add((f"m{i}", 32), clock())
    clock.advance(0.010)  # s0 is overdue: topped up from 32 (16 >= 0.4 x 32) while 32 x n <= 128
    batches = [[n for n, _ in b] for b in former.pop_ready(clock(), capacity=1)]
    assert batches == [["s0", "m0", "m1", "m2"]]  # 4 x 32 = 128


def test_token_budget_and_batch_size_both_bound_and_one_request_always_fits():
    clock = FakeClock()
    former = _token_former(max_batch_size=3, max_batch_tokens=10_000)
    for i in range(4):
        former.add((f"s{i}", 16), clock())
    assert [[n for n, _ in b] for b in former.pop_ready(clock())] == [["s0", "s1", "s2"]]
    alone = _token_former(max_batch_tokens=50)
    alone.add(("long", 64), clock())  # over the budget on its own: travels alone, never stuck
    alone.add(("next", 64), clock())
    assert [[n for n, _ in b] for b in alone.pop_ready(clock())] == [["long"], ["next"]]
    assert alone.drain() == []


def test_drain_respects_the_token_budget():
    former = _token_former()
    for i in range(5):
        former.add((f"m{i}", 32), 0.0)
    assert [[n for n, _ in b] for b in former.drain()] == [["m0", "m1", "m2", "m3"], ["m4"]]
