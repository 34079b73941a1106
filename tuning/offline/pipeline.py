"""The offline driver: a torch DataLoader over the records, timed stage by stage.

Per request it records group (the length-grouping pass it waited through, ``group_by='tokens'``
only), read (disk read and parse), preprocess, wait_for_model (a ready batch waiting for the
model: back-pressure), copy, inference and postprocess; per batch also wait_for_input (the
model idle, waiting for a batch: starvation). Every input line gets exactly one outcome,
``ok`` or ``error`` with its reason.

Warm-up: before the inputs, ``warmup_batches`` batches made of an evenly spaced sample of them
run through the same loader and model and are discarded; the window opens when the last one
is done. Every input is then measured exactly once, so the measured set is the data set (with a
length-sorting sampler, discarding the first batches would drop the shortest requests).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from tuning.base import clock as _clock
from tuning.base.assets import DEFAULT_DATA, tokenizer_files
from tuning.base.stats import clean, ledger_dict, stage_ledger, summarize
from tuning.base.threads import name_this_thread
from tuning.inputs.buckets import grouping_of
from tuning.inputs.readers import check_limit, detect_format, require_file
from tuning.inputs.records import Record, TextFormatter, format_record
from tuning.inputs.tokenize import FastTokenizer, NaiveWordPiece, Tokenizer, group_by_length
from tuning.knobs import Knobs
from tuning.runtime.engine import Engine, Item, PreparedBatch, Preparer, make_tokenizer, quiet_fork_warnings
from tuning.runtime.graphs import rows_computed
from tuning.sim.standin import window_device_busy

STAGES = ("group", "read", "preprocess", "wait_for_model", "copy", "inference", "postprocess")


class _Fetched(list):
    """A batch's raw inputs, with the seconds the dataset took to read them (disk included)."""

    read_s = 0.0


class LineDataset(Dataset):
    """Lines of a JSONL file, read from disk by byte offset in whichever process asks."""

    def __init__(self, path: str | Path = DEFAULT_DATA, limit: int | None = None):
        check_limit(limit)
        self.path = require_file(path)
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        pos = 0
        with self.path.open("rb") as fh:
            for raw in fh:
                if limit is not None and len(self.offsets) >= limit:
                    break
                self.offsets.append(pos)
                self.sizes.append(len(raw))
                pos += len(raw)
        self._local = threading.local()

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        fh = getattr(self._local, "fh", None)
        if fh is None:
            fh = self._local.fh = self.path.open("rb")
        # pread: no shared file offset, so forked workers that inherit the handle cannot race on it
        return i + 1, os.pread(fh.fileno(), self.sizes[i], self.offsets[i]).rstrip(b"\r\n")

    def __getitems__(self, indices: Sequence[int]) -> _Fetched:
        """A batch's lines (the loader calls this), timed: the disk read belongs to the read stage."""
        t0 = _clock.now()
        out = _Fetched(self[i] for i in indices)
        out.read_s = _clock.now() - t0
        return out

    def close(self) -> None:
        fh = getattr(self._local, "fh", None)
        if fh is not None:
            fh.close()
            self._local.fh = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_local")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


class InMemoryDataset(Dataset):
    """Already loaded inputs (records, texts or raw lines) for the same pipeline."""

    def __init__(self, inputs: Sequence[Any]):
        self.inputs = list(inputs)
        self.sizes = [len(x) if isinstance(x, (str, bytes)) else len(getattr(x, "body", "")) for x in self.inputs]

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i + 1, self.inputs[i]


class LengthGroupedBatches(Sampler[list[int]]):
    """Batches of similar-length requests (by byte size, known without reading), in bounded windows."""

    def __init__(self, sizes: Sequence[int], batch_size: int, window: int):
        self.batches = group_by_length(sizes, batch_size, max(window, batch_size))

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class TokenLengthGroupedBatches(Sampler[list[int]]):
    """Batches grouped by exact token length: each window is read and tokenized once, batched,
    before its batches are handed out. The pass runs in the main process as the loader asks for
    indices; its spans are kept so the run's throughput counts them."""

    def __init__(self, dataset: Dataset, preparer: Preparer, batch_size: int, window: int,
                 length_tokenizer: Tokenizer | None = None, share_encodings: bool = False):
        self.dataset, self.preparer = dataset, preparer
        self.tokenizer = length_tokenizer or preparer.tokenizer
        # the batches are prepared in this process with this very tokenizer: hand it the encodings of this
        # pass, so each text is tokenized once (the cost moves from 'preprocess' to the 'group' stage)
        self.share = share_encodings and self.tokenizer is preparer.tokenizer
        self.batch_size, self.window = batch_size, max(window, batch_size)
        self.spans: list[tuple[float, float]] = []  # one per window, in order

    def pass_ms(self, i: int) -> float:
        """Milliseconds of the pass over the window holding input ``i`` (0-based): what it waited through."""
        w = i // self.window
        return (self.spans[w][1] - self.spans[w][0]) * 1000 if w < len(self.spans) else 0.0

    def _lengths(self, indices: range) -> list[int]:
        texts, slots = [], []
        lengths = [0] * len(indices)
        lines = [0] * len(indices)
        for pos, i in enumerate(indices):
            line, raw = self.dataset[i]
            lines[pos] = line
            rec = self.preparer.read(line, raw)
            if isinstance(rec, (Record, str)):
                try:
                    texts.append(rec if isinstance(rec, str) else self.preparer.formatter(rec))
                    slots.append(pos)
                except Exception:
                    pass  # the collate step reports it as this request's error
        for pos, enc in zip(slots, self.tokenizer.encode_batch(texts)):
            lengths[pos] = len(enc.ids)
            if self.share:
                self.preparer.encoded_ahead[lines[pos]] = enc
        return lengths

    def __iter__(self):
        for start in range(0, len(self.dataset), self.window):
            t0 = self.preparer.clock()
            indices = range(start, min(start + self.window, len(self.dataset)))
            lengths = self._lengths(indices)
            groups = group_by_length(lengths, self.batch_size, len(indices))
            self.spans.append((t0, self.preparer.clock()))
            for group in groups:
                yield [indices[j] for j in group]

    def __len__(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size) + math.ceil(len(self.dataset) / self.window)


class WarmupFirst(Sampler[list[int]]):
    """The warm-up batches (run, then discarded), then the batches of ``sampler``."""

    def __init__(self, warmup: Sequence[list[int]], sampler: Sampler[list[int]]):
        self.warmup, self.sampler = list(warmup), sampler

    def __iter__(self):
        yield from self.warmup
        yield from self.sampler

    def __len__(self) -> int:
        return len(self.warmup) + len(self.sampler)


def warmup_sample(n: int, batch_size: int, batches: int) -> list[list[int]]:
    """``batches`` batches of inputs at evenly spaced positions of ``n`` (all of them if fewer)."""
    m = min(batches * batch_size, n)
    picked = [i * n // m for i in range(m)]
    return [picked[i:i + batch_size] for i in range(0, m, batch_size)]


class SequentialBatches(Sampler[list[int]]):
    def __init__(self, n: int, batch_size: int):
        self.batches = [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _worker_init(worker_id: int) -> None:
    torch.set_num_threads(1)  # workers tokenize; the model's threads keep the cores
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # in this worker only (forked ones inherit it)
    name_this_thread(f"loader-worker-{worker_id}")


class _Collate:
    """The loader's collate step: the preparer, with the batch's disk read counted in its read stage."""

    def __init__(self, preparer: Preparer):
        self.preparer = preparer

    def __call__(self, inputs: Sequence[tuple[int, Any]]) -> PreparedBatch:
        batch = self.preparer(inputs)
        batch.read_s += getattr(inputs, "read_s", 0.0)
        return batch


class _Loader(DataLoader):
    """A DataLoader whose workers start with tokenizer threads off, leaving this process's setting alone."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        from torch.utils.data._utils import signal_handling

        was_set = signal_handling._SIGCHLD_handler_set
        signal_handling._SIGCHLD_handler_set = True  # no SIGCHLD handler raising at any line of the run loop:
        try:                                          # a worker's death surfaces in next() (see below)
            with quiet_fork_warnings():
                return _SurvivingWorkerDeath(self, super().__iter__())  # workers fork here
        finally:
            signal_handling._SIGCHLD_handler_set = was_set


class _SurvivingWorkerDeath:
    """The loader's iterator, except that a worker process that dies (killed, out of memory) does not end
    the run with an exception: torch notices it at the next batch (a reset) or within its 5 s status check
    (its SIGCHLD handler, which would raise at any line of the run loop, is left off), then every
    batch not yet delivered comes as a batch of failed requests whose reason names the worker and the
    cause, so the run still ends with exactly one outcome per input and says which ones failed and why.
    Batches leave a DataLoader in its batch sampler's order, so the undelivered ones are the sampler's rest."""

    def __init__(self, loader: DataLoader, inner: Any):
        self.loader, self.inner = loader, inner
        self.delivered = 0
        self.rest: Any = None

    def __iter__(self) -> "_SurvivingWorkerDeath":
        return self

    def __next__(self) -> PreparedBatch:
        if self.rest is None:
            try:
                batch = next(self.inner)
            except (RuntimeError, ConnectionError, EOFError) as exc:  # a dead worker's half-sent batch: a reset
                if "DataLoader worker" not in str(exc) and not self._a_worker_died():
                    raise
                self._shutdown_workers()
                reason = (f"not processed: DataLoader worker died ({type(exc).__name__}: {exc}; killed, or out of "
                          "memory: see dmesg); the batches it had not delivered fail, the run ends")
                undelivered = list(iter(self.loader.batch_sampler))[self.delivered:]
                self.rest = iter([PreparedBatch([Item(i + 1, None, reason) for i in indices], None, None, 0.0, 0.0,
                                                _clock.now()) for indices in undelivered])
            else:
                self.delivered += 1
                return batch
        return next(self.rest)

    def __len__(self) -> int:
        return len(self.inner)

    def _a_worker_died(self, wait_s: float = 2.0) -> bool:
        deadline = _clock.now() + wait_s  # a reset connection can come a moment before the exit is seen
        while True:
            if any(not w.is_alive() for w in getattr(self.inner, "_workers", [])):
                return True
            if _clock.now() > deadline:
                return False
            threading.Event().wait(0.01)

    def _shutdown_workers(self) -> None:
        shutdown = getattr(self.inner, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


@dataclass
class RequestRecord:
    """One request's outcome and its time in each stage (ms)."""

    index: int
    id: str | None
    outcome: str  # "ok" or "error"
    reason: str | None
    batch: int
    n_tokens: int
    truncated: bool
    padded_length: int
    read_ms: float
    preprocess_ms: float
    wait_for_model_ms: float
    copy_ms: float
    inference_ms: float
    postprocess_ms: float
    wait_for_input_ms: float
    t_done: float
    warmup: bool
    group_ms: float = 0.0  # the length-grouping pass over this request's window (group_by='tokens')


@dataclass
class BatchRecord:
    """One model call: its shape, real vs padded tokens, waits and spans (shared clock, seconds)."""

    batch: int
    size: int
    ok: int
    padded_length: int
    real_tokens: int
    worker: int
    t_ready: float
    t_received: float
    t_infer_start: float
    t_infer_end: float
    t_done: float
    wait_for_input_ms: float
    wait_for_model_ms: float
    read_ms: float
    preprocess_ms: float
    copy_ms: float
    inference_ms: float
    postprocess_ms: float
    warmup: bool


@dataclass
class PipelineResult:
    """Raw per-request and per-batch records of one offline run; statistics on demand."""

    knobs: Knobs
    requests: list[RequestRecord]
    batches: list[BatchRecord]
    t_start: float
    t_window_start: float
    t_end: float
    warmup_s: float
    embeddings: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    plan_spans: list[tuple[float, float]] = field(default_factory=list)  # length-grouping passes (group_by='tokens')
    warmup_batches: list[BatchRecord] = field(default_factory=list)  # run before the window, then discarded
    device: dict[str, Any] = field(default_factory=dict)  # kind (simulated | cpu | cuda), name/profile, source
    device_timeline: Any = field(default=None, repr=False)  # the simulated device's DeviceTimeline (None: real)

    @property
    def window_s(self) -> float:
        """The measured window, plus any length-grouping pass that ran during warm-up (its cost is real)."""
        hidden = sum(min(b, self.t_window_start) - a for a, b in self.plan_spans if a < self.t_window_start)
        return max(self.t_end - self.t_window_start + hidden, 1e-9)

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.requests if not r.warmup]

    @property
    def ok(self) -> int:
        return sum(r.outcome == "ok" for r in self.requests)

    @property
    def errors(self) -> int:
        return sum(r.outcome == "error" for r in self.requests)

    @property
    def qps(self) -> float:
        """Ok answers per second over the measured window (the contract's ``qps``: errors are not throughput)."""
        return sum(r.outcome == "ok" for r in self.measured) / self.window_s

    @property
    def throughput_rps(self) -> float:
        """Deprecated (one release), read :attr:`qps`: completed requests (ok or error) per second over the window."""
        return len(self.measured) / self.window_s

    def latencies_ms(self) -> list[float]:
        """Each measured request's time in the pipeline (the sum of its stages, every outcome), ms."""
        return [sum(getattr(r, f"{s}_ms") for s in STAGES) for r in self.measured]

    @property
    def p50_ms(self) -> float:
        return summarize(self.latencies_ms())["p50"]

    @property
    def p99_ms(self) -> float:
        return summarize(self.latencies_ms())["p99"]

    @property
    def model_busy(self) -> float:
        """Inference time inside the measured window / window length."""
        busy = sum(b.inference_ms for b in self.batches if not b.warmup) / 1000
        return min(busy / self.window_s, 1.0)

    @property
    def device_busy(self) -> float:
        """Device compute time inside the measured window / window length: the simulated device's timeline;
        on a CPU the model call is the device's work (equals model busy); on CUDA NaN here (the recorder's
        NVML series measures it)."""
        return window_device_busy(self.device, self.device_timeline, self.t_window_start, self.t_end,
                                  self.window_s, self.model_busy)

    @property
    def simulated(self) -> bool:
        return self.device.get("kind") == "simulated"

    @property
    def truncated(self) -> int:
        return sum(r.truncated for r in self.requests)

    @property
    def padding_waste(self) -> float:
        """Pad tokens per real token over the measured model calls: ``padded / real - 1`` (0: no padding;
        0.5: half as many pad tokens as real ones). :func:`tuning.inputs.buckets.padding_waste` means the same."""
        measured = [b for b in self.batches if not b.warmup]
        real = sum(b.real_tokens for b in measured)
        padded = sum(rows_computed(self.knobs, b.ok) * b.padded_length for b in measured)  # graph-padded rows too
        return padded / real - 1 if real else math.nan

    def spans(self) -> list[tuple[float, float]]:
        """Inference spans (shared clock, s) of every model call, warm-up batches included."""
        return [(b.t_infer_start, b.t_infer_end) for b in self.warmup_batches + self.batches
                if b.t_infer_end > b.t_infer_start]

    def batch_sizes(self) -> list[int]:
        return [b.ok for b in self.batches if not b.warmup and b.ok]

    def wait_for_input_s(self) -> float:
        return sum(b.wait_for_input_ms for b in self.batches if not b.warmup) / 1000

    def _queued_intervals(self) -> list[tuple[float, float]]:
        """Each measured batch's wait for the model, ``[t_ready, t_received]``, clipped to the window."""
        lo, hi = self.t_window_start, self.t_end
        out = [(max(b.t_ready, lo), min(b.t_received, hi)) for b in self.batches if not b.warmup]
        return [(a, b) for a, b in out if b > a]

    def wait_for_model_s(self) -> float:
        """Seconds of the window in which at least one ready batch waited for the model (the union of
        the batches' waits: with prefetching, several batches wait at once and their waits overlap)."""
        total, end = 0.0, -math.inf
        for a, b in sorted(self._queued_intervals()):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def mean_queued(self) -> float:
        """Time-average number of ready batches waiting for the model over the window (Little's law)."""
        return sum(b - a for a, b in self._queued_intervals()) / self.window_s

    def to_frame(self) -> pd.DataFrame:
        """One row per request."""
        return pd.DataFrame([asdict(r) for r in self.requests])

    def batches_frame(self) -> pd.DataFrame:
        """One row per model call."""
        return pd.DataFrame([asdict(b) for b in self.batches])

    def ledger(self) -> pd.DataFrame:
        """Per-stage time of the measured ok requests: p50/p99 (ms) and each stage's share of the p50 and p99 sums.

        A stage's time is what the request waited through: its batch's read, preprocess, copy,
        inference and postprocess, and (``group_by='tokens'``) the grouping pass over its window."""
        return stage_ledger([r for r in self.measured if r.outcome == "ok"], STAGES)

    def waits(self) -> dict[str, dict[str, float | None]]:
        """The two waits per batch: model idle for input (starvation) vs ready batch idle (back-pressure).

        ``share_of_window`` is the share of the window in which the wait happened: for the model's
        wait for input the waits follow one another; ready batches wait side by side, so theirs is
        the union of their intervals, and ``mean_queued`` is how many waited on average.
        """
        measured = [b for b in self.batches if not b.warmup]
        out = {}
        for name, seconds in (("wait_for_input", self.wait_for_input_s()), ("wait_for_model", self.wait_for_model_s())):
            s = summarize(getattr(b, f"{name}_ms") for b in measured)
            out[name] = {"p50_ms": clean(s["p50"]), "p99_ms": clean(s["p99"]),
                         "share_of_window": clean(seconds / self.window_s)}
        out["wait_for_model"]["mean_queued"] = clean(self.mean_queued())
        return out

    def summary(self) -> dict[str, Any]:
        """Everything the CLI's ``--json`` prints."""
        ledger = self.ledger()
        latency = summarize(self.latencies_ms())
        return {
            "qps": clean(self.qps),
            "p50_ms": clean(latency["p50"]), "p99_ms": clean(latency["p99"]),
            "throughput_rps": clean(self.throughput_rps),  # deprecated alias (every outcome per second): read qps
            "model_busy": clean(self.model_busy),
            "device_busy": clean(self.device_busy),
            "device": self.device,
            "requests": len(self.requests),
            "ok": self.ok,
            "errors": self.errors,
            "truncated": self.truncated,
            "batches": len(self.batches),
            "padding_waste": clean(self.padding_waste),
            "window_s": clean(self.window_s),
            "warmup_s": clean(self.warmup_s),
            "compile_s": clean(self.warmup_s) if self.knobs.graph != "eager" else None,
            "stages": ledger_dict(ledger),
            "waits": self.waits(),
            "error_reasons": self.error_reasons(),
            "knobs": self.knobs.as_dict(),
        }

    def error_reasons(self, top: int = 10) -> list[dict[str, Any]]:
        counts: dict[str, list[int]] = {}
        for r in self.requests:
            if r.outcome == "error":
                counts.setdefault(r.reason or "unknown", []).append(r.index)
        ranked = sorted(counts.items(), key=lambda kv: -len(kv[1]))[:top]
        return [{"reason": reason, "count": len(lines), "first_lines": lines[:5]} for reason, lines in ranked]


class _ParsedLines(LineDataset):
    """Lines of a text file or of JSONL with a named text field, parsed as they are read (read stage)."""

    def __init__(self, path: str | Path, limit: int | None, parse: Callable[[bytes, int], Any]):
        super().__init__(path, limit)
        self.parse = parse

    def __getitem__(self, i: int) -> tuple[int, Any]:
        line, raw = super().__getitem__(i)
        return line, self.parse(raw, line)


def _input_dataset(data: Any, limit: int | None, text_field: str | None, text_column: str | None,
                   format: str | None) -> Dataset:
    """The dataset for :meth:`Pipeline.run`'s ``data``: a file in any supported format, or values in memory."""
    from tuning.inputs.readers import inputs_from_values, line_parser, read_table

    if isinstance(data, (str, Path)):
        fmt = detect_format(data, format)
        if fmt in ("csv", "tsv", "parquet"):
            if text_field is not None:
                line_parser(data, text_field, text_column, fmt)  # raises: which option fits this format
            return InMemoryDataset(read_table(data, text_column, limit, fmt))
        parse = line_parser(data, text_field, text_column, fmt)
        return LineDataset(data, limit) if parse is None else _ParsedLines(data, limit, parse)
    if text_field is not None or text_column is not None or format is not None:
        raise ValueError("text_field, text_column and format describe a file; for values in memory pass the texts")
    check_limit(limit)
    return InMemoryDataset(inputs_from_values(data)[:limit])


class Pipeline:
    """Offline replay of records through the DataLoader and the model, with every knob applied.

    Bring your own model (any ``(input_ids, attention_mask) -> [B, D]`` callable), tokenizer
    (see :class:`tuning.inputs.tokenize.Tokenizer`) or record formatter.
    """

    def __init__(self, knobs: Knobs, model: torch.nn.Module | Callable | None = None,
                 tokenizer: Tokenizer | None = None, formatter: TextFormatter = format_record,
                 engine: Engine | None = None):
        # loader workers take no core from the model: they mostly wait, so a core reserved for them idles while the
        # model is short of one (bench/threads.py, bench/results/threads.json and threads_baseline.json)
        self.engine = engine or Engine(knobs, model)
        self.knobs = self.engine.knobs
        self.preparer = Preparer(self.knobs, tokenizer or make_tokenizer(self.knobs), formatter)
        self._warm = False
        self._sampler: Sampler | None = None

    def warmup(self) -> float:
        if self._warm:
            return 0.0
        self._warm = True
        return self.engine.warmup()

    def _length_tokenizer(self) -> Tokenizer:
        """The batched tokenizer for the length pass: the fast one gives the naive one's lengths, faster."""
        if isinstance(self.preparer.tokenizer, NaiveWordPiece):
            return FastTokenizer(tokenizer_files()[1], self.knobs.max_length)
        return self.preparer.tokenizer

    def loader(self, dataset: Dataset, warmup: Sequence[list[int]] = ()) -> DataLoader:
        """The DataLoader over ``dataset``: ``warmup`` index batches first, then the knobs' batches.

        Length grouping (see :func:`tuning.inputs.buckets.grouping_of`): ``padding='bucket'`` groups by
        ``group_by``; ``padding='dynamic'`` with ``group_by='tokens'`` groups by exact token count
        and pads each batch to its longest; otherwise batches keep arrival order.
        """
        k = self.knobs
        sizes = getattr(dataset, "sizes", [0] * len(dataset))
        grouping = grouping_of(k)
        if grouping is None:
            sampler = SequentialBatches(len(dataset), k.batch_size)
        elif grouping == "tokens":
            sampler = TokenLengthGroupedBatches(dataset, self.preparer, k.batch_size, k.bucket_window,
                                                self._length_tokenizer(), share_encodings=k.num_workers == 0)
        else:
            sampler = LengthGroupedBatches(sizes, k.batch_size, k.bucket_window)
        self._sampler = sampler
        extra: dict[str, Any] = {}
        if k.num_workers > 0:
            extra = {"worker_init_fn": _worker_init, "persistent_workers": False}
            if k.prefetch_factor is not None:
                extra["prefetch_factor"] = k.prefetch_factor
        with quiet_fork_warnings():
            return _Loader(dataset, batch_sampler=WarmupFirst(warmup, sampler) if warmup else sampler,
                           collate_fn=_Collate(self.preparer), num_workers=k.num_workers,
                           pin_memory=k.pin_memory and self.engine.device.type == "cuda", **extra)

    def run(self, data: str | Path | Sequence[Any] = DEFAULT_DATA, limit: int | None = None,
            warmup_batches: int = 2, keep_embeddings: bool = True,
            on_batch: Callable[[BatchRecord], None] | None = None, text_field: str | None = None,
            text_column: str | None = None, format: str | None = None) -> PipelineResult:
        """Replay ``data`` and return the raw records. ``data``: a file (record JSONL, JSONL with a text
        field, CSV/TSV or Parquet with a text column, plain text: see :mod:`tuning.inputs.readers`), or in memory a
        list of texts/records/JSONL lines or a pandas Series of texts.

        ``warmup_batches`` batches of an evenly spaced sample of the inputs run first and are
        discarded (see the module's docstring); then every input is measured exactly once.
        """
        if isinstance(warmup_batches, bool) or not isinstance(warmup_batches, int) or warmup_batches < 0:
            raise ValueError(f"warmup_batches={warmup_batches!r} must be an integer >= 0")
        dataset = _input_dataset(data, limit, text_field, text_column, format)
        self.engine.use_threads()
        self.warmup()
        warmup_s = self.engine.compile_s  # model warm-up, compile or capture included; outside the window
        clock = self.engine.clock
        requests: list[RequestRecord] = []
        batches: list[BatchRecord] = []
        warm_batches: list[BatchRecord] = []
        embeddings: dict[int, np.ndarray] = {}
        warm_plan = warmup_sample(len(dataset), self.knobs.batch_size, warmup_batches) if len(dataset) else []
        t_start = clock()
        try:
            self._replay(dataset, warm_plan, keep_embeddings, on_batch, requests, batches, warm_batches, embeddings,
                         marks := {"window": t_start})
        except KeyboardInterrupt as exc:  # Ctrl-C: what was measured so far goes up with the interrupt
            if hasattr(dataset, "close"):
                dataset.close()
            exc.partial = PipelineResult(self.knobs, sorted(requests, key=lambda r: r.index), batches, t_start,
                                         marks["window"], clock(), warmup_s, embeddings, [], warm_batches,
                                         device=self.engine.device_info, device_timeline=self.engine.device_timeline())
            raise
        t_window = marks["window"]
        if hasattr(dataset, "close"):
            dataset.close()
        if len(requests) != len(dataset):
            raise RuntimeError(f"bookkeeping bug: {len(dataset)} inputs but {len(requests)} outcomes")
        t_end = clock()
        if isinstance(self._sampler, TokenLengthGroupedBatches):
            for r in requests:
                r.group_ms = self._sampler.pass_ms(r.index - 1)
        plan_spans = getattr(self._sampler, "spans", [])
        return PipelineResult(self.knobs, sorted(requests, key=lambda r: r.index), batches, t_start, t_window,
                              t_end, warmup_s, embeddings, plan_spans, warm_batches,
                              device=self.engine.device_info,
                              device_timeline=self.engine.device_timeline())

    def _replay(self, dataset: Dataset, warm_plan: list[list[int]], keep_embeddings: bool,
                on_batch: Callable[[BatchRecord], None] | None, requests: list[RequestRecord],
                batches: list[BatchRecord], warm_batches: list[BatchRecord], embeddings: dict[int, np.ndarray],
                marks: dict[str, float]) -> None:
        """The measured loop of :meth:`run`: appends to the lists it is given, so that an interrupted run
        keeps every outcome recorded before the interrupt; ``marks['window']`` is where the window opens."""
        t_prev = marks["window"]
        batches_in = iter(self.loader(dataset, warm_plan))
        try:
            self._consume(batches_in, warm_plan, keep_embeddings, on_batch, requests, batches, warm_batches,
                          embeddings, marks, t_prev)
        finally:  # loader workers end with the run, also when it is interrupted
            shutdown = getattr(batches_in, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def _consume(self, batches_in: Any, warm_plan: list[list[int]], keep_embeddings: bool,
                 on_batch: Callable[[BatchRecord], None] | None, requests: list[RequestRecord],
                 batches: list[BatchRecord], warm_batches: list[BatchRecord], embeddings: dict[int, np.ndarray],
                 marks: dict[str, float], t_prev: float) -> None:
        clock = self.engine.clock
        for position, batch in enumerate(batches_in):
            t_received = clock()
            out = self.engine.run(batch)
            t_done = clock()
            warm = position < len(warm_plan)
            number = position if warm else position - len(warm_plan)
            wait_input = (t_received - t_prev) * 1000
            wait_model = max(t_received - batch.t_ready, 0.0) * 1000
            ok_items = batch.ok_items if out.error is None else []
            record = BatchRecord(
                number, len(batch.items), len(ok_items), batch.padded_length,
                sum(min(it.n_tokens, self.knobs.max_length) for it in ok_items), batch.worker, batch.t_ready,
                t_received, out.t_infer_start, out.t_infer_end, t_done, wait_input, wait_model,
                batch.read_s * 1000, batch.preprocess_s * 1000, out.copy_s * 1000, out.inference_s * 1000,
                out.postprocess_s * 1000, warm)
            if warm:  # discarded: these inputs come again, measured, later
                warm_batches.append(record)
                marks["window"] = t_prev = clock()
                continue
            batches.append(record)
            row = 0
            for it in batch.items:
                reason = it.error or out.error
                if reason is None and keep_embeddings:
                    embeddings[it.index] = out.embeddings[row]
                row += it.error is None
                requests.append(RequestRecord(
                    it.index, it.id, "error" if reason else "ok", reason, number, it.n_tokens, it.truncated,
                    batch.padded_length, record.read_ms, record.preprocess_ms, wait_model, record.copy_ms,
                    record.inference_ms, record.postprocess_ms, wait_input, t_done, False))
            if on_batch is not None:
                on_batch(record)
            t_prev = clock()


def run_pipeline(knobs: Knobs, data: str | Path | Sequence[Any] = DEFAULT_DATA, limit: int | None = None,
                 **kwargs: Any) -> PipelineResult:
    """Build a :class:`Pipeline` for ``knobs`` and replay ``data`` once."""
    return Pipeline(knobs).run(data, limit, **kwargs)


