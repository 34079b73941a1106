"""The stages both drivers share: prepare a batch (read -> format -> tokenize -> pad) and run it
(copy -> forward -> pool/normalize -> postprocess). Nothing here is written twice.

``Preparer`` is picklable and holds no model, so DataLoader workers and serving workers run
it; ``Engine`` owns the model, the device and the graph mode.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from tuning.base import clock as _clock
from tuning.base.contract import device_object
from tuning.base.machine import cpu_name, intra_op_threads
from tuning.inputs.readers import parse_line
from tuning.inputs.records import Record, RecordError, TextFormatter, format_record
from tuning.inputs.tokenize import FastTokenizer, NaiveWordPiece, Tokenized, Tokenizer, pad_length
from tuning.knobs import Knobs


@dataclass
class Item:
    """One request inside a batch: where it came from and, once known, its outcome."""

    index: int  # position in the input (line number for files, submission order online)
    id: str | None = None
    error: str | None = None
    n_tokens: int = 0
    truncated: bool = False


@dataclass
class PreparedBatch:
    """A batch after preprocessing: tensors for the good requests, errors for the bad ones."""

    items: list[Item]
    input_ids: torch.Tensor | None
    attention_mask: torch.Tensor | None
    read_s: float
    preprocess_s: float
    t_ready: float  # when preparation finished (shared clock)
    worker: int = 0  # process id that prepared it
    padded_length: int = 0
    staged: Any = None  # set by Engine.stage: the copy already started (a CUDA event, or the simulated copy's end)
    staged_copy_s: float = 0.0  # host time spent starting that copy (off the model's critical path)

    @property
    def ok_items(self) -> list[Item]:
        return [it for it in self.items if it.error is None]

    def pin_memory(self) -> "PreparedBatch":  # called by DataLoader(pin_memory=True)
        if self.input_ids is not None:
            self.input_ids = self.input_ids.pin_memory()
            self.attention_mask = self.attention_mask.pin_memory()
        return self


def make_tokenizer(knobs: Knobs, model_dir: str | None = None) -> Tokenizer:
    """The tokenizer a ``tokenizer`` knob names, for the embedded model."""
    from tuning.base.assets import tokenizer_files

    vocab, tokenizer_json = tokenizer_files(model_dir)
    if knobs.tokenizer == "naive":
        return NaiveWordPiece.from_vocab_file(vocab, knobs.max_length)
    return FastTokenizer(tokenizer_json, knobs.max_length)


class Preparer:
    """read -> format -> tokenize -> pad, for a list of raw inputs; never raises for bad input.

    ``inputs`` are ``(index, raw)`` where ``raw`` is the bytes of a JSONL line, a :class:`Record`
    or an already formatted ``str``.
    """

    def __init__(self, knobs: Knobs, tokenizer: Tokenizer, formatter: TextFormatter = format_record,
                 clock: _clock.Clock | None = None):
        self.knobs = knobs
        self.tokenizer = tokenizer
        self.formatter = formatter
        self.clock = clock or _clock.now
        # encodings made ahead by a pass in this process (offline token-length grouping), by input index:
        # used once, instead of tokenizing the same text twice
        self.encoded_ahead: dict[int, Tokenized] = {}

    def __getstate__(self) -> dict:  # a worker process gets no encodings made in the parent
        return {**self.__dict__, "encoded_ahead": {}}

    def read(self, index: int, raw: Any) -> Record | RecordError | str:
        if isinstance(raw, (bytes, bytearray)):
            return parse_line(bytes(raw), index)
        if isinstance(raw, (Record, RecordError, str)):
            return raw
        return RecordError(index, f"unsupported input type {type(raw).__name__}; send a JSONL line, a Record or a str")

    def to_text(self, index: int, raw: Any) -> tuple[Item, str | None]:
        """read + format one input: its :class:`Item` and model text (None when it failed, with the reason)."""
        rec = self.read(index, raw)
        if isinstance(rec, RecordError):
            return Item(index, rec.id, rec.reason), None
        item = Item(index, rec.id if isinstance(rec, Record) else None)
        try:
            text = rec if isinstance(rec, str) else self.formatter(rec)
        except Exception as exc:  # a user formatter failing on one record fails that record only
            item.error = f"format failed: {type(exc).__name__}: {exc}"
            return item, None
        if not text.strip():
            item.error = "empty text"
            return item, None
        return item, text

    def tokenize(self, items: Sequence[Item], texts: Sequence[str]) -> list[Tokenized] | None:
        """Tokenize the texts of good items (in order), recording token counts; None (items failed) on error."""
        try:
            ahead = [self.encoded_ahead.pop(it.index, None) for it in items] if self.encoded_ahead else [None] * len(items)
            todo = [j for j, enc in enumerate(ahead) if enc is None]
            fresh = iter(self.tokenizer.encode_batch([texts[j] for j in todo]) if todo else [])
            encoded = [enc if enc is not None else next(fresh) for enc in ahead]
        except Exception as exc:
            for it in items:
                it.error = f"preprocess failed: {type(exc).__name__}: {exc}"
            return None
        for it, enc in zip(items, encoded):
            it.n_tokens, it.truncated = enc.n_tokens, enc.truncated
        return encoded

    def build(self, items: Sequence[Item], encoded: Sequence[Tokenized]) -> tuple[Any, Any, int]:
        """Pad to the batch's length (by the padding knob) and build tensors: ``(ids, mask, length)``."""
        try:
            length = pad_length([len(e.ids) for e in encoded], self.knobs.padding, self.knobs.max_length,
                                self.knobs.bucket_lengths)
            ids, mask = self.tokenizer.build_batch(encoded, length)
            return ids, mask, length
        except Exception as exc:
            for it in items:
                it.error = f"preprocess failed: {type(exc).__name__}: {exc}"
            return None, None, 0

    def __call__(self, inputs: Sequence[tuple[int, Any]]) -> PreparedBatch:
        t0 = self.clock()
        parsed = [(i, self.read(i, raw)) for i, raw in inputs]
        t1 = self.clock()
        converted = [self.to_text(i, rec) for i, rec in parsed]
        items = [item for item, _ in converted]
        ok = [item for item, text in converted if text is not None]
        ids = mask = None
        length = 0
        if ok:
            encoded = self.tokenize(ok, [text for _, text in converted if text is not None])
            if encoded is not None:
                ids, mask, length = self.build(ok, encoded)
        t2 = self.clock()
        return PreparedBatch(items, ids, mask, t1 - t0, t2 - t1, t2, os.getpid(), length)


@dataclass
class BatchOutput:
    embeddings: np.ndarray | None
    copy_s: float
    inference_s: float
    postprocess_s: float
    t_infer_start: float
    t_infer_end: float
    error: str | None = None


class Engine:
    """The model side: device, dtype, graph mode; runs a :class:`PreparedBatch`."""

    def __init__(self, knobs: Knobs, model: torch.nn.Module | Callable | None = None, clock: _clock.Clock | None = None,
                 reserved_cores: int = 0):
        """``reserved_cores``: cores that load generators the tool started keep busy beside the model (a
        locust master and its workers); with ``torch_threads=None`` the model's intra-op threads are the usable
        cores less these and less ``TUNING_RESERVED_CORES`` (set for a process the tool spawns beside its own
        load), at least 1 (:func:`tuning.base.machine.intra_op_threads`). Helpers that mostly wait (loader
        workers, an in-process client) are not counted: reserving a core for them measured slower."""
        from tuning.runtime.model import load_minilm, prepare_model

        self.knobs = knobs.resolve(torch.cuda.is_available())
        self.torch_threads = self.knobs.torch_threads or intra_op_threads(reserved_cores)
        self.use_threads()
        self.clock = clock or _clock.now
        self.compile_s = 0.0
        self.sim = None
        self.dispatch_source: str | None = None  # where the simulated device's host cost per launch comes from
        if self.knobs.device == "sim":
            # the simulated accelerator: tensors stay on the CPU, the forward is a timed stand-in
            from tuning.sim import SimulatedDevice, load_profile, model_profile_for

            self.device = torch.device("cpu")
            profile, device = model_profile_for(model), load_profile(self.knobs.sim_profile)
            dispatch, self.dispatch_source = sim_host_dispatch(model, device)
            self.sim = SimulatedDevice(device, profile, self.clock, host_dispatch_s=dispatch,
                                       dispatch_source=self.dispatch_source)
            self.model = model
        else:
            self.device = torch.device(self.knobs.device)
            if self.device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = self.knobs.tf32
            base = model if model is not None else load_minilm()
            self.model = prepare_model(base, self.device, self.knobs.dtype) if isinstance(base, torch.nn.Module) else base
        self.runner = self.make_runner()

    @property
    def device_info(self) -> dict[str, Any]:
        """The ``device`` block of a summary: kind (``simulated``, ``cpu`` or ``cuda``), name and source."""
        if self.sim is not None:
            return self.sim.info()
        if self.device.type == "cuda":
            return device_object("cuda", torch.cuda.get_device_name(self.device), source="measured")
        return device_object("cpu", cpu_name(), source="measured")

    def use_threads(self) -> None:
        """Give torch this engine's intra-op thread count. It is process-wide, so a driver calls this when it
        starts running this engine (another engine built since may have set its own)."""
        if torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)

    @property
    def simulated(self) -> bool:
        return self.sim is not None

    def device_timeline(self):
        """A copy of the simulated device's timeline (None on a real device)."""
        return self.sim.timeline.copy() if self.sim is not None else None

    def make_runner(self, batch_sizes: Sequence[int] | None = None) -> Callable:
        """The callable that runs the model under the ``graph`` knob.

        ``batch_sizes``: the batch sizes compiled or captured exactly (default: ``knobs.batch_size``;
        a ragged batch is padded up to the nearest, so no new shape reaches compiled or captured
        code inside a measured window). The batch sweep passes every size it times.
        """
        k = self.knobs
        sizes = tuple(sorted(set(batch_sizes or (k.batch_size,))))
        if self.sim is not None:
            from tuning.sim import SimulatedModel

            return SimulatedModel(self.sim, k.dtype, k.graph, sizes if k.graph != "eager" else (),
                                  compile_mode=k.compile_mode, tf32=k.tf32)
        if k.graph == "compile":
            from tuning.runtime.graphs import CompiledRunner

            dynamic = k.padding == "dynamic"
            lengths = 1 if dynamic else len(self._warmup_lengths())
            mode = None if k.compile_mode == "default" else k.compile_mode
            return CompiledRunner(self.model, sizes, dynamic=dynamic, mode=mode, expected_shapes=len(sizes) * lengths)
        if k.graph == "cuda_graph":
            from tuning.runtime.graphs import CudaGraphRunner

            return CudaGraphRunner(self.model, self.device, batch_sizes=sizes)
        return self.model

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _warmup_lengths(self) -> list[int]:
        k = self.knobs
        return [k.max_length] if k.padding == "fixed" else list(k.bucket_lengths)

    def warmup_shapes(self) -> list[tuple[int, int]]:
        """The (batch, length) shapes to run before measuring.

        Compiled and captured graphs need every shape they will see (one per bucket at
        ``batch_size``: ragged batches are padded up to it); eager, and compile with dynamic
        shapes, need one representative shape to settle allocators and thread pools.
        """
        k = self.knobs
        if k.graph == "eager" or k.padding == "dynamic":
            return [(k.batch_size, min(64, k.max_length))]
        return [(k.batch_size, n) for n in self._warmup_lengths()]

    def warmup(self, shapes: Sequence[tuple[int, int]] | None = None, repeats: int = 2) -> float:
        """Run dummy batches (compiling or capturing each shape); returns the seconds it took.

        Afterwards the runner is sealed: a compiled runner warns (and counts) for each shape it
        compiles later, a graph runner refuses to capture inside the measured window.
        """
        t0 = time.perf_counter()
        if hasattr(self.runner, "sealed"):
            self.runner.sealed = False
        for batch, length in shapes or self.warmup_shapes():
            ids = torch.full((batch, length), 1000, dtype=torch.long, device=self.device)
            mask = torch.ones_like(ids)
            with torch.inference_mode():
                for _ in range(repeats):
                    self.runner(ids, mask)
        self._sync()
        if hasattr(self.runner, "seal"):
            self.runner.seal()
        self.compile_s = time.perf_counter() - t0
        return self.compile_s

    def stage(self, batch: PreparedBatch) -> PreparedBatch:
        """Start the batch's host-to-device copy so that it overlaps the batch the model is running (the
        online batcher calls this while the executor runs the previous batch). Only with ``pin_memory``:
        on CUDA the tensors are pinned and copied on a side stream, recorded by an event that the model's
        stream waits on; on the simulated device the copy engine works while the device computes, so the
        copy ends at a time :meth:`run` waits for only if it has not come. Otherwise the batch is returned
        as it is and :meth:`run` copies it."""
        if batch.input_ids is None or not self.knobs.pin_memory or batch.staged is not None:
            return batch
        t0 = self.clock()
        nbytes = (batch.input_ids.numel() * batch.input_ids.element_size()
                  + batch.attention_mask.numel() * batch.attention_mask.element_size())
        if self.sim is not None:
            from tuning.sim.costmodel import copy_seconds

            batch.staged = ("sim", t0 + copy_seconds(self.sim.profile, nbytes, pinned=True))
        elif self.device.type == "cuda":
            if getattr(self, "_copy_stream", None) is None:
                self._copy_stream = torch.cuda.Stream(self.device)
            host = (batch.input_ids.pin_memory(), batch.attention_mask.pin_memory())
            with torch.cuda.stream(self._copy_stream):
                batch.input_ids = host[0].to(self.device, non_blocking=True)
                batch.attention_mask = host[1].to(self.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
            batch.staged = ("cuda", event, host)  # the pinned host tensors live until the copy is done
        else:
            return batch
        batch.staged_copy_s = self.clock() - t0
        return batch

    def _wait_staged(self, batch: PreparedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        kind = batch.staged[0]
        if kind == "sim":
            self.sim.wait(batch.staged[1] - self.clock(), spin=False)  # only what is left of the copy
        else:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(batch.staged[1])
            batch.input_ids.record_stream(stream)  # made on the copy stream, used on this one
            batch.attention_mask.record_stream(stream)
        return batch.input_ids, batch.attention_mask

    def run(self, batch: PreparedBatch) -> BatchOutput:
        """copy -> forward -> postprocess for one batch; a failure fails this batch only."""
        t0 = self.clock()
        if batch.input_ids is None:
            return BatchOutput(None, 0.0, 0.0, 0.0, t0, t0)
        try:
            if batch.staged is not None:  # copied (or copying) already, overlapped with the previous batch
                ids, mask = self._wait_staged(batch)
            else:
                non_blocking = self.knobs.pin_memory and self.device.type == "cuda"
                ids = batch.input_ids.to(self.device, non_blocking=non_blocking)
                mask = batch.attention_mask.to(self.device, non_blocking=non_blocking)
                if self.sim is not None:  # host-to-device copy of ids and mask on the simulated device
                    self.sim.copy_in(ids.numel() * ids.element_size() + mask.numel() * mask.element_size(),
                                     pinned=self.knobs.pin_memory)
                self._sync()
            t1 = self.clock()
            with torch.inference_mode():
                out = self.runner(ids, mask)
            self._sync()
            t2 = self.clock()
            embeddings = out.float().cpu().numpy()
            if self.sim is not None:  # the result's copy back to the host
                self.sim.copy_out(embeddings.nbytes)
            t3 = self.clock()
            rows = len(batch.ok_items)
            if embeddings.ndim != 2 or embeddings.shape[0] != rows:
                return BatchOutput(None, t1 - t0, t2 - t1, t3 - t2, t1, t2,
                                   f"model returned shape {tuple(embeddings.shape)} for a batch of {rows}; "
                                   "a model must return one row per input: [batch, dim]")
            return BatchOutput(embeddings, t1 - t0, t2 - t1, t3 - t2, t1, t2)
        except Exception as exc:
            t = self.clock()
            reason = f"inference failed: {type(exc).__name__}: {exc}"
            if is_out_of_memory(exc):
                reason = f"out of memory at batch {len(batch.ok_items)} x {batch.padded_length}: lower batch_size or max_length"
            return BatchOutput(None, 0.0, t - t0, 0.0, t0, t, reason)


def sim_host_dispatch(model: Any, device: Any = None) -> tuple[float, str]:
    """The host seconds per launched kernel the simulated device charges for ``model``'s eager forward on this
    host (None: the embedded model), and their source: its own code at a miniature size
    (:func:`tuning.runtime.model.miniature`, :func:`tuning.sim.dispatch.model_dispatch_s`); the tiny op's
    dispatch for a module that cannot be rebuilt small, or for a ``device`` profile fitted beyond a tiny op
    (``host_dispatch == "tiny op"``: what a calibration subtracted is what is added back)."""
    from tuning.runtime.model import miniature
    from tuning.sim.costmodel import record_ops
    from tuning.sim.dispatch import MINIATURE_TOKENS, host_dispatch_s, model_dispatch_s

    if device is not None and getattr(device, "host_dispatch", "model") == "tiny op":
        return host_dispatch_s(), ("tiny op on this host (tuning.sim.dispatch.host_dispatch_s): the profile's launch_s "
                                   "was fitted beyond one tiny op")
    small = miniature(model)
    if small is None:
        return model_dispatch_s(None)
    vocab = small.config.vocab_size
    return model_dispatch_s(small, sum(op[1] for op in record_ops(small, 1, MINIATURE_TOKENS, vocab)))


def is_out_of_memory(exc: BaseException) -> bool:
    """An out-of-memory failure: torch's own, or a cuBLAS/cuDNN handle or workspace allocation that failed
    (those arrive as a plain RuntimeError)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom_type):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("ALLOC_FAILED" in text or "out of memory" in text.lower())


@contextlib.contextmanager
def quiet_fork_warnings() -> Iterator[None]:
    """Around the start of DataLoader workers: they inherit ``TOKENIZERS_PARALLELISM=false`` (unless
    it is set already), so the Rust tokenizer stays single-threaded in them and does not warn about
    the fork; on exit this process gets its own value back, so its later runs keep their threads.
    The loader's worker-count warning is silenced inside the block only."""
    name = "TOKENIZERS_PARALLELISM"
    before = os.environ.get(name)
    if before is None:
        os.environ[name] = "false"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*This DataLoader will create.*")
            yield
    finally:
        if before is None:
            os.environ.pop(name, None)
