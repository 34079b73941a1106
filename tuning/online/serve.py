"""The online driver: bounded admission, preprocessing workers, a dynamic batcher, double
buffering, one model executor, and a future per request.

    request -> [admission: max_queue] -> preprocess workers (num_workers: read, format, tokenize)
            -> batcher (max_batch_size, max_batch_tokens, max_wait_ms, per length bucket; pads, builds
               tensors; starts the host-to-device copy when it can overlap: pinned, on a copy stream)
            -> ready queue (one batch prepared while the model runs the current one)
            -> model executor (the model call only) -> completer (answers, futures, metrics) -> future

The model's critical path holds only the model: the executor hands a finished batch to the
completer thread and takes the next batch at once; metrics are observed outside the server's
lock; deadlines are checked from a heap (nothing is rescanned per arrival).

Tokenizing before batching lets the batcher group by exact token length, so bucket
padding pads little (a byte-size guess would put long and short requests together).

Every submitted request gets exactly one :class:`Response` with outcome ``ok``, ``error``,
``timeout`` or ``rejected``; shutdown drains or explicitly fails what is queued.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tuning.base import clock as _clock
from tuning.base.threads import name_this_thread
from tuning.inputs.records import TextFormatter, format_record
from tuning.inputs.tokenize import Tokenized, Tokenizer, pad_length
from tuning.knobs import Knobs
from tuning.online.batching import BatchFormer
from tuning.online.metrics import ServerMetrics
from tuning.online.response import OUTCOMES, SERVE_STAGES, Response
from tuning.runtime.engine import Engine, Item, PreparedBatch, Preparer, make_tokenizer

IN_FLIGHT_BATCHES = 2  # one batch running + one prepared and waiting: double buffering
WORKER_BATCH_MAX = 64  # requests a preprocessing worker tokenizes in one call, at most
BATCH_LOG_MAX = 100_000  # recent model calls kept for busy-time and batch-size series
_STOP = object()
_WAKE = object()  # the executor finished a batch: the batcher may send the next


@dataclass
class _Request:
    rid: int
    raw: Any
    t_submit: float
    deadline: float | None
    future: Future
    keep_embedding: bool = True
    item: Item | None = None
    encoded: Tokenized | None = None
    t_prep_start: float = 0.0
    t_prep_end: float = 0.0
    read_s: float = 0.0
    prep_s: float = 0.0


@dataclass
class BatchLog:
    t_start: float
    t_end: float
    size: int
    padded_length: int
    wait_for_input_ms: float
    error: str | None


class Server:
    """In-process inference server. ``submit()`` returns a future that always resolves.

    Use as a context manager (``with Server(knobs) as s: s.submit(...).result()``) or call
    :meth:`start` and :meth:`close`. ``completion="inline"`` answers a batch on the executor before it
    takes the next one (the arm that ``bench/serving.py --compare critical-path`` measures the completer thread
    against: the executor then waits on each answer's copy and reply instead of computing the next batch).
    """

    def __init__(self, knobs: Knobs, engine: Engine | None = None, tokenizer: Tokenizer | None = None,
                 formatter: TextFormatter = format_record, model: Any = None, clock: _clock.Clock | None = None,
                 completion: str = "thread", reserved_cores: int = 0):
        """``reserved_cores``: cores other work in this process keeps busy (an in-process load generator),
        left to it when the server builds its engine (see :class:`tuning.runtime.engine.Engine`)."""
        if completion not in ("thread", "inline"):
            raise ValueError(f"completion={completion!r} is not allowed; allowed: thread | inline")
        self.completion = completion
        self.engine = engine or Engine(knobs, model, reserved_cores=reserved_cores)
        self.knobs = self.engine.knobs if engine is None else knobs.resolve(torch.cuda.is_available())
        self.clock = clock or _clock.now
        self.preparer = Preparer(self.knobs, tokenizer or make_tokenizer(self.knobs), formatter, self.clock)
        k = self.knobs
        self.workers = max(1, k.num_workers)
        buckets = k.bucket_lengths

        def length_of(r: _Request) -> int:  # the request's padded length on its own
            return pad_length([len(r.encoded.ids)], k.padding, k.max_length, buckets)

        if k.padding == "bucket":
            self.former: BatchFormer[_Request] = BatchFormer(
                k.batch_size, k.max_wait_ms / 1000,
                lambda r: next(i for i, b in enumerate(buckets) if b >= len(r.encoded.ids)), buckets,
                max_batch_tokens=k.max_batch_tokens, length_of=length_of)
        else:
            self.former = BatchFormer(k.batch_size, k.max_wait_ms / 1000, max_batch_tokens=k.max_batch_tokens,
                                      length_of=length_of)
        self._deadlines: list[tuple[float, int, _Request]] = []  # (deadline, rid, request) of requests batching
        self._incoming: queue.Queue = queue.Queue()
        self._tokenized: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()  # finished batches for the completer
        self._in_flight = 0  # batches dispatched and not yet run (bounded by IN_FLIGHT_BATCHES)
        self._lock = threading.Lock()
        self._open: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._accepting = False
        self._abort = False
        self.failure: str | None = None  # set when a server thread failed: health turns bad, requests fail
        self._threads: list[threading.Thread] = []
        self.counts = {o: 0 for o in OUTCOMES}
        self.batches: deque[BatchLog] = deque(maxlen=BATCH_LOG_MAX)
        self.waiting_for_batch = 0  # tokenized requests in the batcher (the queue_size gauge)
        self.busy_total_s = 0.0
        self.metrics = ServerMetrics(self, SERVE_STAGES, OUTCOMES)  # every outcome: a rejection is a latency too

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, warmup: bool = True) -> "Server":
        if self._threads:
            return self
        if warmup:
            self.engine.warmup()
        self._accepting, self._abort = True, False
        specs = [(f"preprocess-{i}", self._worker_loop) for i in range(self.workers)]
        specs += [("batcher", self._batcher_loop), ("model-executor", self._executor_loop)]
        if self.completion == "thread":
            specs.append(("completer", self._completer_loop))
        for name, target in specs:
            t = threading.Thread(target=self._named(name, target), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _named(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            name_this_thread(name)
            try:
                target()
            except BaseException as exc:  # a bug escaped a loop: never leave a future pending behind it
                self._thread_failed(name, exc)
        return run

    def _thread_failed(self, name: str, exc: BaseException) -> None:
        """A server thread died: the server is broken. Stop accepting, fail every open request with the
        reason, and let :meth:`health` say so (the HTTP front answers ``/healthz`` with 503)."""
        reason = f"server thread {name!r} failed: {type(exc).__name__}: {exc}"
        with self._lock:
            self.failure = self.failure or reason
            self._accepting = False
            leftovers = list(self._open.values())
        for req in leftovers:
            self._finish(req, Response(req.rid, "error", self.failure, req.item.id if req.item else None))
        # wake the other threads so close() never waits on a queue nobody feeds
        self._abort = True
        for q in (self._tokenized, self._ready, self._answers):
            q.put(_STOP)

    def health(self) -> tuple[bool, str]:
        """``(healthy, reason)``: unhealthy when a server thread failed or the server is not accepting."""
        if self.failure:
            return False, self.failure
        if not self._accepting:
            return False, "stopping" if self._threads else "not started"
        return True, "ok"

    def _guarded(self, reqs: list["_Request"], where: str, fn: Callable[[], Any]) -> Any:
        """Run one step for ``reqs``; an unexpected exception fails those requests only (with the reason)
        and the loop goes on."""
        try:
            return fn()
        except Exception as exc:
            for req in reqs:
                self._finish(req, Response(req.rid, "error", f"{where} failed: {type(exc).__name__}: {exc}",
                                           req.item.id if req.item else None))
            return None

    def close(self, drain: bool = True, timeout: float = 60.0) -> None:
        """Stop accepting; finish (``drain=True``) or fail what is queued; never leaves a future pending."""
        with self._lock:
            if not self._accepting and not self._threads:
                return
            self._accepting = False
            # a close that drains never undoes one that abandons the queue (a load test's, on another thread)
            self._abort = self._abort or not drain or self.failure is not None
        for _ in range(self.workers):
            self._incoming.put(_STOP)
        deadline = _clock.now() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - _clock.now()))
        self._threads = []
        with self._lock:
            leftovers = list(self._open.values())
        for req in leftovers:
            self._fail_shutdown(req)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- admission ---------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._open)

    def submit(self, raw: Any, deadline_ms: float | None = None, embedding: bool = True) -> Future:
        """Queue one request (a JSONL line, a :class:`~tuning.inputs.records.Record` or a text); returns its future.

        ``embedding=False``: the response carries no embedding (a load test needs only the outcome and
        its timings; kept ones are copied out of the batch, so they do not hold the batch alive).
        """
        now = self.clock()
        future: Future = Future()
        rid = next(self._ids)
        deadline_ms = deadline_ms if deadline_ms is not None else self.knobs.deadline_ms
        req = _Request(rid, raw, now, now + deadline_ms / 1000 if deadline_ms else None, future, embedding)
        with self._lock:
            if self.failure:
                reason = f"rejected: the server is broken ({self.failure})"
            elif not self._accepting:
                reason = "rejected: server is not running (start it, or it is shutting down)"
            elif len(self._open) >= self.knobs.max_queue:
                reason = f"rejected: overloaded, {len(self._open)} requests queued (max_queue={self.knobs.max_queue})"
            else:
                reason = None
                self._open[rid] = req
        if reason:
            response = Response(rid, "rejected", reason, t_submit=now, t_done=self.clock())
            with self._lock:
                self.counts["rejected"] += 1
            self.metrics.observe(response)
            future.set_result(response)
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
        self.metrics.observe(response)  # outside the lock: admission never waits for a histogram
        req.future.set_result(response)

    def _fail_shutdown(self, req: _Request) -> None:
        self._finish(req, Response(req.rid, "error", "server shut down before this request was processed",
                                   req.item.id if req.item else None))

    # --- threads -------------------------------------------------------------------------------
    def _worker_loop(self) -> None:
        """read and format each request, then tokenize every request already waiting in one call (the Rust
        tokenizer runs a batch without the GIL, and one call costs less than many); bad input is answered here."""
        stopping = False
        while not stopping:
            got = [self._incoming.get()]
            while got[-1] is not _STOP and len(got) < WORKER_BATCH_MAX:  # one stop per worker: never take two
                try:
                    got.append(self._incoming.get_nowait())
                except queue.Empty:
                    break
            if got[-1] is _STOP:
                stopping = True
                got.pop()
            texts: list[tuple[_Request, str]] = []
            for req in got:
                if self._abort:
                    self._fail_shutdown(req)
                    continue
                req.t_prep_start = t0 = self.clock()
                if req.deadline is not None and t0 > req.deadline:  # expired while queued: costs nothing more
                    self._finish(req, Response(req.rid, "timeout", "deadline exceeded before preprocessing",
                                               t_done=t0, queue_wait_ms=(t0 - req.t_submit) * 1000))
                    continue
                parsed = self.preparer.read(req.rid, req.raw)
                t1 = self.clock()
                item, text = self.preparer.to_text(req.rid, parsed)
                req.item, req.read_s, req.t_prep_end = item, t1 - t0, self.clock()
                req.prep_s = req.t_prep_end - t1
                if text is None:
                    self._finish(req, Response(req.rid, "error", item.error or "preprocess failed", item.id,
                                               input_error=True, queue_wait_ms=(t0 - req.t_submit) * 1000,
                                               read_ms=req.read_s * 1000, preprocess_ms=req.prep_s * 1000))
                else:
                    texts.append((req, text))
            if texts:
                reqs = [req for req, _ in texts]
                self._guarded(reqs, "preprocessing", lambda: self._tokenize(reqs, [text for _, text in texts]))
        self._tokenized.put(_STOP)

    def _tokenize(self, reqs: list[_Request], texts: list[str]) -> None:
        t0 = self.clock()
        encoded = self.preparer.tokenize([req.item for req in reqs], texts)
        t1 = self.clock()
        share = (t1 - t0) / len(reqs)  # the call's time, shared by its requests
        for i, req in enumerate(reqs):
            req.prep_s += share
            req.t_prep_end = t1
            if encoded is not None and len(encoded[i].ids) > self.knobs.max_length:  # a tokenizer that did not cut
                req.item.error = (f"tokenizer returned {len(encoded[i].ids)} ids, over max_length="
                                  f"{self.knobs.max_length}: a tokenizer must truncate to max_length")
            if encoded is None or req.item.error is not None:
                self._finish(req, Response(req.rid, "error", req.item.error or "preprocess failed", req.item.id,
                                           input_error=True, queue_wait_ms=(req.t_prep_start - req.t_submit) * 1000,
                                           read_ms=req.read_s * 1000, preprocess_ms=req.prep_s * 1000))
            else:
                req.encoded = encoded[i]
                self._tokenized.put(req)

    def _expire(self, now: float) -> None:
        """Time out waiting requests whose deadline has passed; looks only at the due ones (a heap)."""
        due: set[int] = set()
        while self._deadlines and self._deadlines[0][0] <= now:
            due.add(heapq.heappop(self._deadlines)[1])
        if not due:
            return
        for req in self.former.remove(lambda r: r.rid in due):
            self._finish(req, Response(req.rid, "timeout", "deadline exceeded while queued for a batch",
                                       req.item.id, t_done=now, queue_wait_ms=(now - req.t_submit) * 1000))

    def _dispatch(self, batch: list[_Request]) -> None:
        """Pad and build the batch's tensors, start its copy where it can overlap the running batch (see
        :meth:`Engine.stage`), then hand it to the executor."""
        t0 = self.clock()
        items = [req.item for req in batch]
        ids, mask, length = self.preparer.build(items, [req.encoded for req in batch])
        t1 = self.clock()
        prepared = self.engine.stage(PreparedBatch(items, ids, mask, 0.0, t1 - t0, t1, 0, length))
        self._ready.put((batch, prepared, t0))

    def _room(self) -> int:
        """How many batches may leave now (double buffering bounds batches in flight)."""
        with self._lock:
            return max(0, IN_FLIGHT_BATCHES - self._in_flight)

    def _batch_done(self) -> None:
        with self._lock:
            self._in_flight -= 1
        self._tokenized.put(_WAKE)

    def _batcher_loop(self) -> None:
        stops = 0
        while stops < self.workers:
            wake = self.former.next_deadline()
            if wake is None or not self._room():
                timeout = None  # nothing due, or the model side is full: sleep until a request or a _WAKE
            else:
                timeout = max(0.0, wake - self.clock())
            try:
                item = self._tokenized.get(timeout=timeout)
            except queue.Empty:
                item = None
            while item is not None:  # take everything already waiting before deciding
                if item is _STOP:
                    stops += 1
                elif item is not _WAKE:
                    added = self._guarded([item], "batching", lambda: self.former.add(item, item.t_prep_end) or True)
                    if added and item.deadline is not None:
                        heapq.heappush(self._deadlines, (item.deadline, item.rid, item))
                try:
                    item = self._tokenized.get_nowait()
                except queue.Empty:
                    item = None
            now = self.clock()
            self._expire(now)
            for batch in self.former.pop_ready(now, self._room()):
                with self._lock:
                    self._in_flight += 1
                if self._guarded(batch, "batch preparation", lambda: self._dispatch(batch) or True) is None:
                    with self._lock:
                        self._in_flight -= 1
            self.waiting_for_batch = len(self.former)
        self.waiting_for_batch = 0
        for batch in self.former.drain():
            if self._abort:
                for req in batch:
                    self._fail_shutdown(req)
            else:
                self._dispatch(batch)
        self._ready.put(_STOP)

    def _executor_loop(self) -> None:
        """The model call and nothing else: a finished batch goes to the completer, the next one starts."""
        self.engine.use_threads()
        t_idle = self.clock()
        while True:
            got = self._ready.get()
            if got is _STOP:
                self._answers.put(_STOP)
                return
            batch, prepared, t_batched = got
            t_received = self.clock()
            if self._abort:
                for req in batch:
                    self._fail_shutdown(req)
                self._batch_done()
                continue
            if all(r.deadline is not None and r.deadline < t_received for r in batch):  # nobody waits for it
                for req in batch:
                    self._finish(req, Response(req.rid, "timeout", "deadline exceeded before the model ran",
                                               req.item.id, t_done=t_received,
                                               queue_wait_ms=(t_received - req.t_submit) * 1000))
                self._batch_done()
                continue
            out = self.engine.run(prepared)
            self.busy_total_s += out.t_infer_end - out.t_infer_start  # before any answer: a client that reads
            self._batch_done()                                        # the total after its answer sees its batch
            self.batches.append(BatchLog(out.t_infer_start, out.t_infer_end, len(prepared.ok_items),
                                         prepared.padded_length, (t_received - t_idle) * 1000, out.error))
            if self.completion == "thread":
                self._answers.put((batch, prepared, out, t_batched, t_received))
            else:
                self._guarded(batch, "answering", lambda: self._answer(batch, prepared, out, t_batched, t_received))
            t_idle = self.clock()

    def _completer_loop(self) -> None:
        while (got := self._answers.get()) is not _STOP:
            self._guarded(got[0], "answering", lambda: self._answer(*got))

    def _answer(self, batch: list[_Request], prepared: PreparedBatch, out: Any, t_batched: float,
                t_received: float) -> None:
        self._complete(batch, prepared, out, t_batched, t_received)
        if prepared.ok_items:
            self.metrics.observe_batch(len(prepared.ok_items), prepared.padded_length)

    def _complete(self, batch: list[_Request], prepared: PreparedBatch, out: Any, t_batched: float,
                  t_received: float) -> None:
        now = self.clock()
        n_ok = len(prepared.ok_items)
        row = 0
        for req in batch:
            item = req.item
            reason = item.error or out.error
            embedding = None
            if item.error is None:
                if out.error is None and req.keep_embedding:
                    embedding = out.embeddings[row].copy()  # a view would keep the whole batch alive
                row += 1
            waited = (req.t_prep_start - req.t_submit) + (t_batched - req.t_prep_end)
            self._finish(req, Response(
                req.rid, "error" if reason else "ok", reason, item.id, embedding, item.n_tokens, item.truncated,
                n_ok, t_done=now, queue_wait_ms=waited * 1000, read_ms=req.read_s * 1000,
                preprocess_ms=(req.prep_s + prepared.preprocess_s) * 1000,
                wait_for_model_ms=max(t_received - prepared.t_ready, 0.0) * 1000, copy_ms=out.copy_s * 1000,
                inference_ms=out.inference_s * 1000, postprocess_ms=out.postprocess_s * 1000))

    # --- observability ----------------------------------------------------------------------
    def spans(self, since: float = 0.0) -> list[tuple[float, float]]:
        return [(b.t_start, b.t_end) for b in list(self.batches) if b.t_end > since and b.t_end > b.t_start]

    def busy_seconds(self, t0: float, t1: float) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.spans(t0))
