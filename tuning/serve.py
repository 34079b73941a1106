"""The online driver: bounded admission, a dynamic batcher, preprocessing workers with double
buffering, one model executor, and a future per request.

    request -> [admission: max_queue] -> batcher (max_batch_size, max_wait_ms, per bucket)
            -> preprocess workers (num_workers) -> ready queue (2 batches: double buffering)
            -> model executor -> future

Every submitted request gets exactly one :class:`Response` with outcome ``ok``, ``error``,
``timeout`` or ``rejected``; shutdown drains or explicitly fails what is queued.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

from . import clock as _clock
from .batching import BatchFormer
from .engine import Engine, PreparedBatch, Preparer, make_tokenizer
from .knobs import Knobs
from .metrics import BATCH_BUCKETS, SECONDS_BUCKETS, Histogram
from .preprocess import TextFormatter, Tokenizer, format_record
from .profile.threads import name_this_thread

OUTCOMES = ("ok", "error", "timeout", "rejected")
SERVE_STAGES = ("queue_wait", "read", "preprocess", "wait_for_model", "copy", "inference", "postprocess")
READY_BATCHES = 1  # a prepared batch waits while the model runs the current one: double buffering
BATCH_LOG_MAX = 100_000  # recent model calls kept for busy-time and batch-size series
_STOP = object()


@dataclass
class Response:
    """One request's single outcome, its timings (ms) and, if ok, its embedding."""

    request: int
    outcome: str
    reason: str | None = None
    id: str | None = None
    embedding: np.ndarray | None = None
    n_tokens: int = 0
    truncated: bool = False
    batch_size: int = 0
    t_submit: float = 0.0
    t_done: float = 0.0
    queue_wait_ms: float = 0.0
    read_ms: float = 0.0
    preprocess_ms: float = 0.0
    wait_for_model_ms: float = 0.0
    copy_ms: float = 0.0
    inference_ms: float = 0.0
    postprocess_ms: float = 0.0

    @property
    def latency_ms(self) -> float:
        return (self.t_done - self.t_submit) * 1000

    def as_dict(self, with_embedding: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["latency_ms"] = self.latency_ms
        emb = d.pop("embedding")
        if with_embedding and emb is not None:
            d["embedding"] = [float(x) for x in emb]
        return d


@dataclass
class _Request:
    rid: int
    raw: Any
    t_submit: float
    deadline: float | None
    future: Future
    size_hint: int
    t_batched: float = 0.0


@dataclass
class BatchLog:
    t_start: float
    t_end: float
    size: int
    padded_length: int
    wait_for_input_ms: float
    error: str | None


def size_hint(raw: Any) -> int:
    """A token-count estimate before tokenizing, for grouping by length (about 4 bytes per token)."""
    if isinstance(raw, (bytes, bytearray)):
        return len(raw) // 4 + 2
    if isinstance(raw, str):
        return len(raw.encode("utf-8", "replace")) // 4 + 2
    body = getattr(raw, "body", "")
    return (len(body) + len(getattr(raw, "title", ""))) // 4 + 20


class Server:
    """In-process inference server. ``submit()`` returns a future that always resolves.

    Use as a context manager (``with Server(knobs) as s: s.submit(...).result()``) or call
    :meth:`start` and :meth:`close`.
    """

    def __init__(self, knobs: Knobs, engine: Engine | None = None, tokenizer: Tokenizer | None = None,
                 formatter: TextFormatter = format_record, model: Any = None, clock: _clock.Clock | None = None):
        self.engine = engine or Engine(knobs, model)
        self.knobs = self.engine.knobs if engine is None else knobs.resolve(torch.cuda.is_available())
        self.clock = clock or _clock.now
        self.preparer = Preparer(self.knobs, tokenizer or make_tokenizer(self.knobs), formatter, self.clock)
        k = self.knobs
        buckets = k.bucket_lengths
        bucket_of = (lambda r: next((i for i, b in enumerate(buckets) if b >= r.size_hint), len(buckets) - 1)) \
            if k.padding == "bucket" else (lambda r: 0)
        self.former: BatchFormer[_Request] = BatchFormer(k.batch_size, k.max_wait_ms / 1000, bucket_of,
                                                        buckets if k.padding == "bucket" else None)
        self._incoming: queue.Queue = queue.Queue()
        self._to_prepare: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue(maxsize=READY_BATCHES)
        self._lock = threading.Lock()
        self._open: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._accepting = False
        self._abort = False
        self._threads: list[threading.Thread] = []
        # batches handed on but not yet taken by the model: one per worker plus the ready queue
        self._slots = threading.Semaphore(max(1, k.num_workers) + READY_BATCHES)
        self.counts = {o: 0 for o in OUTCOMES}
        self.batches: deque[BatchLog] = deque(maxlen=BATCH_LOG_MAX)
        self.batch_hist = Histogram(BATCH_BUCKETS)
        self.stage_hists = {s: Histogram(SECONDS_BUCKETS) for s in SERVE_STAGES}
        self.latency_hist = Histogram(SECONDS_BUCKETS)
        self.busy_total_s = 0.0
        self.t_started = 0.0

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, warmup: bool = True) -> "Server":
        if self._threads:
            return self
        if warmup:
            self.engine.warmup()
        self._accepting, self._abort = True, False
        workers = max(1, self.knobs.num_workers)
        specs = [("batcher", self._batcher_loop)] + [(f"preprocess-{i}", self._worker_loop) for i in range(workers)]
        specs.append(("model-executor", self._executor_loop))
        for name, target in specs:
            t = threading.Thread(target=self._named(name, target), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.t_started = self.clock()
        return self

    @staticmethod
    def _named(name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            name_this_thread(name)
            target()
        return run

    def close(self, drain: bool = True, timeout: float = 60.0) -> None:
        """Stop accepting; finish (``drain=True``) or fail what is queued; never leaves a future pending."""
        with self._lock:
            if not self._accepting and not self._threads:
                return
            self._accepting = False
            self._abort = not drain
        self._incoming.put(_STOP)
        deadline = _clock.now() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - _clock.now()))
        self._threads = []
        with self._lock:
            leftovers = list(self._open.values())
        for req in leftovers:
            self._finish(req, Response(req.rid, "error", "server shut down before this request was processed"))

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- admission ---------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._open)

    def submit(self, raw: Any, deadline_ms: float | None = None) -> Future:
        """Queue one request (a JSONL line, a :class:`~tuning.data.Record` or a text); returns its future."""
        now = self.clock()
        future: Future = Future()
        rid = next(self._ids)
        deadline_ms = deadline_ms if deadline_ms is not None else self.knobs.deadline_ms
        req = _Request(rid, raw, now, now + deadline_ms / 1000 if deadline_ms else None, future, size_hint(raw))
        with self._lock:
            if not self._accepting:
                reason = "rejected: server is not running (start it, or it is shutting down)"
            elif len(self._open) >= self.knobs.max_queue:
                reason = f"rejected: overloaded, {len(self._open)} requests queued (max_queue={self.knobs.max_queue})"
            else:
                reason = None
                self._open[rid] = req
        if reason:
            self.counts["rejected"] += 1
            future.set_result(Response(rid, "rejected", reason, t_submit=now, t_done=self.clock()))
            return future
        self._incoming.put(req)
        return future

    def _finish(self, req: _Request, response: Response) -> None:
        with self._lock:
            if self._open.pop(req.rid, None) is None:
                return  # already resolved: exactly one outcome
            response.t_submit = req.t_submit
            response.t_done = response.t_done or self.clock()
            if response.outcome == "ok" and req.deadline is not None and response.t_done > req.deadline:
                response.outcome, response.embedding = "timeout", None
                response.reason = f"deadline exceeded: done after {response.latency_ms:.0f} ms"
            self.counts[response.outcome] += 1
            if response.outcome == "ok":
                for stage in SERVE_STAGES:
                    self.stage_hists[stage].observe(getattr(response, f"{stage}_ms") / 1000)
                self.latency_hist.observe(response.latency_ms / 1000)
        req.future.set_result(response)

    # --- threads -------------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        for req in self.former.remove(lambda r: r.deadline is not None and now >= r.deadline):
            self._finish(req, Response(req.rid, "timeout", "deadline exceeded while queued", t_done=now,
                                       queue_wait_ms=(now - req.t_submit) * 1000))

    def _free_slots(self) -> int:
        n = 0
        while self._slots.acquire(blocking=False):
            n += 1
        for _ in range(n):
            self._slots.release()
        return n

    def _dispatch(self, batches: list[list[_Request]], now: float, use_slots: bool = True) -> None:
        for batch in batches:
            if use_slots:
                self._slots.acquire()
            for req in batch:
                req.t_batched = now
            self._to_prepare.put(batch)

    def _batcher_loop(self) -> None:
        stopping = False
        while not stopping:
            wake = self.former.next_deadline()
            timeout = None if wake is None else max(0.0, wake - self.clock())
            if wake is not None and timeout == 0.0 and not self._free_slots():
                timeout = 0.002  # a batch is due but the model side is full: keep gathering
            try:
                item = self._incoming.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                stopping = True
            elif item is not None:
                self.former.add(item, item.t_submit)
                while True:  # take everything already waiting before deciding
                    try:
                        more = self._incoming.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stopping = True
                        break
                    self.former.add(more, more.t_submit)
            now = self.clock()
            self._expire(now)
            self._dispatch(self.former.pop_ready(now, self._free_slots()), now)
        now = self.clock()
        if self._abort:
            for batch in self.former.drain():
                for req in batch:
                    self._finish(req, Response(req.rid, "error", "server shut down before this request was processed"))
        else:
            self._dispatch(self.former.drain(), now, use_slots=False)
        for _ in range(max(1, self.knobs.num_workers)):
            self._to_prepare.put(_STOP)

    def _worker_loop(self) -> None:
        while True:
            batch = self._to_prepare.get()
            if batch is _STOP:
                self._ready.put(_STOP)
                return
            if self._abort:
                for req in batch:
                    self._finish(req, Response(req.rid, "error", "server shut down before this request was processed"))
                continue
            t0 = self.clock()
            prepared = self.preparer([(req.rid, req.raw) for req in batch])
            self._ready.put((batch, prepared, t0))

    def _executor_loop(self) -> None:
        workers_left = max(1, self.knobs.num_workers)
        t_idle = self.clock()
        while workers_left:
            got = self._ready.get()
            if got is _STOP:
                workers_left -= 1
                continue
            batch, prepared, t_prep_start = got
            self._slots.release()
            t_received = self.clock()
            if self._abort:
                for req in batch:
                    self._finish(req, Response(req.rid, "error", "server shut down before this request was processed"))
                continue
            out = self.engine.run(prepared)
            self._complete(batch, prepared, out, t_prep_start, t_received)
            self.batches.append(BatchLog(out.t_infer_start, out.t_infer_end, len(prepared.ok_items),
                                         prepared.padded_length, (t_received - t_idle) * 1000, out.error))
            if prepared.ok_items:
                self.batch_hist.observe(len(prepared.ok_items))
            self.busy_total_s += out.t_infer_end - out.t_infer_start
            t_idle = self.clock()

    def _complete(self, batch: list[_Request], prepared: PreparedBatch, out: Any, t_prep_start: float,
                  t_received: float) -> None:
        by_rid = {req.rid: req for req in batch}
        row = 0
        now = self.clock()
        n_ok = len(prepared.ok_items)
        for item in prepared.items:
            req = by_rid[item.index]
            reason = item.error or out.error
            embedding = None
            if item.error is None:
                if out.error is None:
                    embedding = out.embeddings[row]
                row += 1
            self._finish(req, Response(
                req.rid, "error" if reason else "ok", reason, item.id, embedding, item.n_tokens, item.truncated,
                n_ok, t_done=now, queue_wait_ms=(t_prep_start - req.t_submit) * 1000,
                read_ms=prepared.read_s * 1000, preprocess_ms=prepared.preprocess_s * 1000,
                wait_for_model_ms=max(t_received - prepared.t_ready, 0.0) * 1000, copy_ms=out.copy_s * 1000,
                inference_ms=out.inference_s * 1000, postprocess_ms=out.postprocess_s * 1000))

    # --- observability ----------------------------------------------------------------------
    def spans(self, since: float = 0.0) -> list[tuple[float, float]]:
        return [(b.t_start, b.t_end) for b in list(self.batches) if b.t_end > since and b.t_end > b.t_start]

    def busy_seconds(self, t0: float, t1: float) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.spans(t0))
