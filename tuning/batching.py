"""The dynamic batcher's rules, free of threads and clocks so they can be tested exactly.

A batch leaves when it is full (``max_batch_size``) or when its oldest request has waited
``max_wait_s``, and only when the model side has room for it (``capacity``): while the
model is busy, requests keep gathering, so batches grow with load instead of queueing up
as batches of one. With length buckets, requests are grouped per bucket (padded tokens
cost real compute); a batch that leaves on time is topped up from the nearest buckets,
shorter ones first, as long as no member would be padded by more than ``max_padding``
of the batch's length (so sparse narrow buckets do not turn into batches of one, and a
long request does not drag short ones up to its length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass
class Pending(Generic[T]):
    item: T
    t_arrival: float
    bucket: int = 0


@dataclass
class BatchFormer(Generic[T]):
    """Collects requests into batches by the full-or-timeout rule, one queue per length bucket."""

    max_batch_size: int
    max_wait_s: float
    bucket_of: Callable[[T], int] = field(default=lambda item: 0)
    bucket_lengths: tuple[int, ...] | None = None  # length of each bucket index; None: one bucket
    # a topped-up member may be padded by at most this share of the batch length
    # (0.15 measured best of 0.15, 0.25, 0.4, 0.6 at concurrency 32 on the 2-core CPU)
    max_padding: float = 0.15
    _pending: dict[int, list[Pending[T]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size!r} must be an integer >= 1")
        if isinstance(self.max_wait_s, bool) or not isinstance(self.max_wait_s, (int, float)) or self.max_wait_s < 0:
            raise ValueError(f"max_wait_s={self.max_wait_s!r} must be a number >= 0")

    def __len__(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def add(self, item: T, now: float) -> None:
        bucket = self.bucket_of(item)
        self._pending.setdefault(bucket, []).append(Pending(item, now, bucket))

    def pop_ready(self, now: float, capacity: int | None = None) -> list[list[T]]:
        """Up to ``capacity`` batches that may leave now: full ones first, then timed-out ones (oldest first)."""
        out: list[list[T]] = []
        room = capacity if capacity is not None else 1 << 30
        full = sorted((q[0].t_arrival, b) for b, q in self._pending.items() if len(q) >= self.max_batch_size)
        for _, bucket in full:
            queue = self._pending[bucket]
            while room and len(queue) >= self.max_batch_size:
                out.append([p.item for p in queue[: self.max_batch_size]])
                del queue[: self.max_batch_size]
                room -= 1
        while room:
            oldest = min(((q[0].t_arrival, b) for b, q in self._pending.items() if q), default=None)
            if oldest is None or now - oldest[0] < self.max_wait_s:
                break
            out.append(self._take_around(oldest[1]))
            room -= 1
        self._pending = {b: q for b, q in self._pending.items() if q}
        return out

    def _take_around(self, bucket: int) -> list[T]:
        """The bucket's requests, topped up from the nearest buckets (shorter first on a tie)."""
        order = sorted((b for b, q in self._pending.items() if q), key=lambda b: (abs(b - bucket), b))
        length = (lambda b: self.bucket_lengths[b]) if self.bucket_lengths else (lambda b: 1)
        batch: list[T] = []
        lo = hi = length(bucket)
        for b in order:
            new_lo, new_hi = min(lo, length(b)), max(hi, length(b))
            if new_lo < (1 - self.max_padding) * new_hi:
                continue
            lo, hi = new_lo, new_hi
            queue = self._pending[b]
            take = min(len(queue), self.max_batch_size - len(batch))
            batch.extend(p.item for p in queue[:take])
            del queue[:take]
            if len(batch) == self.max_batch_size:
                break
        return batch

    def next_deadline(self) -> float | None:
        """When the oldest waiting request's batch may leave (None when nothing waits)."""
        oldest = [q[0].t_arrival for q in self._pending.values() if q]
        return min(oldest) + self.max_wait_s if oldest else None

    def drain(self) -> list[list[T]]:
        """Everything still waiting, as batches (used at shutdown)."""
        out = []
        for bucket in sorted(self._pending):
            queue = self._pending[bucket]
            out.extend([p.item for p in queue[i: i + self.max_batch_size]] for i in range(0, len(queue), self.max_batch_size))
        self._pending = {}
        return out

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Take out (and return) waiting items that match, e.g. expired deadlines."""
        removed: list[T] = []
        for bucket, queue in self._pending.items():
            removed.extend(p.item for p in queue if predicate(p.item))
            self._pending[bucket] = [p for p in queue if not predicate(p.item)]
        self._pending = {b: q for b, q in self._pending.items() if q}
        return removed
