"""The dynamic batcher's rules, free of threads and clocks so they can be tested exactly.

A batch leaves when it is full or when its oldest request has waited ``max_wait_s``, and
only when the model side has room for it (``capacity``): while the model is busy, requests
keep gathering, so batches grow with load instead of queueing up as batches of one. Full
means that one more request would break a limit: ``max_batch_size`` requests, or (with
``max_batch_tokens``, text-embeddings-inference's ``max-batch-tokens``) batch size x padded
length over the token budget, so short requests travel in larger batches than long ones.
Overdue batches leave first (earliest deadline first), then full ones: under saturation a
request of a rare length does not wait behind every full bucket. With length buckets,
requests are grouped per bucket (padded tokens cost real compute); a batch that leaves on
time is topped up from the nearest buckets, shorter ones first, as long as no member would
be padded by more than ``max_padding`` of the batch's length (so sparse narrow buckets do
not turn into batches of one, and a long request does not drag short ones up to its length).
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
    length: int = 0  # the item's padded length on its own (its bucket's length), for the token budget


@dataclass
class BatchFormer(Generic[T]):
    """Collects requests into batches by the full-or-timeout rule, one queue per length bucket."""

    max_batch_size: int
    max_wait_s: float
    bucket_of: Callable[[T], int] = field(default=lambda item: 0)
    bucket_lengths: tuple[int, ...] | None = None  # length of each bucket index; None: one bucket
    # a topped-up member may be padded by at most this share of the batch length: a padded token costs as much as a
    # real one, so a looser bound fills batches sooner but spends the saved wait on padding
    max_padding: float = 0.15
    # padded-token budget per batch: batch size x padded length (None: no budget)
    max_batch_tokens: int | None = None
    length_of: Callable[[T], int] = field(default=lambda item: 0)
    # overdue batches before full ones, so that a short bucket's lone request is not starved by busy ones (False:
    # full ones first, the order bench/serving.py --compare fairness measures this one against)
    overdue_first: bool = True
    _pending: dict[int, list[Pending[T]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size!r} must be an integer >= 1")
        if isinstance(self.max_wait_s, bool) or not isinstance(self.max_wait_s, (int, float)) or self.max_wait_s < 0:
            raise ValueError(f"max_wait_s={self.max_wait_s!r} must be a number >= 0")
        if self.max_batch_tokens is not None and (isinstance(self.max_batch_tokens, bool) or not isinstance(
                self.max_batch_tokens, int) or self.max_batch_tokens < 1):
            raise ValueError(f"max_batch_tokens={self.max_batch_tokens!r} must be None or an integer >= 1")

    def __len__(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def add(self, item: T, now: float) -> None:
        bucket = self.bucket_of(item)
        self._pending.setdefault(bucket, []).append(Pending(item, now, bucket, self.length_of(item)))

    def _fits(self, n: int, longest: int) -> bool:
        """Whether ``n`` requests padded to ``longest`` are within both limits."""
        return n <= self.max_batch_size and (self.max_batch_tokens is None or n * longest <= self.max_batch_tokens)

    def _head(self, queue: list[Pending[T]]) -> tuple[int, bool]:
        """How many requests from the head of ``queue`` make one batch, and whether that batch is full
        (one more request, the next in the queue or one as long as the longest, would break a limit)."""
        if self.max_batch_tokens is None:
            return min(len(queue), self.max_batch_size), len(queue) >= self.max_batch_size
        n = longest = 0
        for p in queue:
            if not self._fits(n + 1, max(longest, p.length)):
                return max(n, 1), True  # a request over the budget on its own travels alone
            n, longest = n + 1, max(longest, p.length)
        return n, not self._fits(n + 1, longest)

    def pop_ready(self, now: float, capacity: int | None = None) -> list[list[T]]:
        """Up to ``capacity`` batches that may leave now: overdue ones first (earliest deadline first, each
        topped up from the nearest buckets), then full ones (oldest first)."""
        out: list[list[T]] = []
        room = [capacity if capacity is not None else 1 << 30]
        if self.overdue_first:
            self._pop_overdue(now, out, room)
            self._pop_full(out, room)
        else:
            self._pop_full(out, room)
            self._pop_overdue(now, out, room)
        self._pending = {b: q for b, q in self._pending.items() if q}
        return out

    def _pop_full(self, out: list[list[T]], room: list[int]) -> None:
        heads = sorted((q[0].t_arrival, b) for b, q in self._pending.items() if q)
        for _, bucket in heads:
            queue = self._pending[bucket]
            while room[0] and queue:
                n, full = self._head(queue)
                if not full:
                    break
                out.append([p.item for p in queue[:n]])
                del queue[:n]
                room[0] -= 1

    def _pop_overdue(self, now: float, out: list[list[T]], room: list[int]) -> None:
        while room[0]:
            oldest = min(((q[0].t_arrival, b) for b, q in self._pending.items() if q), default=None)
            if oldest is None or now - oldest[0] < self.max_wait_s:
                return
            out.append(self._take_around(oldest[1]))
            room[0] -= 1

    def _take_around(self, bucket: int) -> list[T]:
        """The bucket's requests, topped up from the nearest buckets (shorter first on a tie), within the
        padding limit, the batch size and the token budget."""
        order = sorted((b for b, q in self._pending.items() if q), key=lambda b: (abs(b - bucket), b))
        length = (lambda b: self.bucket_lengths[b]) if self.bucket_lengths else (lambda b: 1)
        batch: list[T] = []
        longest = 0
        lo = hi = length(bucket)
        for b in order:
            new_lo, new_hi = min(lo, length(b)), max(hi, length(b))
            if new_lo < (1 - self.max_padding) * new_hi:
                continue
            lo, hi = new_lo, new_hi
            queue = self._pending[b]
            take = 0
            for p in queue:
                if batch and not self._fits(len(batch) + 1, max(longest, p.length)):
                    break
                batch.append(p.item)
                longest = max(longest, p.length)
                take += 1
            del queue[:take]
            if queue:  # more waiting than fits: the batch is full
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
            while queue:
                n, _ = self._head(queue)
                out.append([p.item for p in queue[:n]])
                del queue[:n]
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
