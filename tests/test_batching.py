import pytest

from tuning.batching import BatchFormer
from tuning.clock import FakeClock


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
