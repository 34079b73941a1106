"""Every knob of the pipeline, in one frozen, validated dataclass, plus named presets.

A knob that is wrong raises ``ValueError``/``TypeError`` naming the field, the value
and what is allowed. Contradictory knobs raise (or, where a safe fallback exists,
warn) with the fix in the message. Presets are the rungs of the investigation's
ladder: ``baseline`` is where it starts, ``tuned`` is the best measured on a CPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

from tuning.base.assets import shipped_profiles

TOKENIZERS = ("naive", "fast")
PADDINGS = ("dynamic", "fixed", "bucket")
DTYPES = ("fp32", "bf16", "fp16")
GRAPHS = ("eager", "compile", "cuda_graph")
DEVICES = ("auto", "cpu", "cuda", "sim")
GROUP_BY = ("bytes", "tokens")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def _knob(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class Knobs:
    """The configuration of one run: loading, preprocessing, model and serving knobs."""

    # offline loading (torch DataLoader)
    num_workers: int = _knob(2, "DataLoader worker processes preparing batches (0: in the main process)")
    prefetch_factor: int | None = _knob(None, "batches each worker prepares ahead (needs num_workers > 0; "
                                              "None: torch's default of 2)")
    pin_memory: bool = _knob(False, "page-locked host batches for faster, asynchronous copies (needs CUDA)")
    batch_size: int = _knob(1, "requests per model call (offline batch; online: the batcher's max batch size)")
    # preprocessing
    tokenizer: str = _knob("naive", "'naive': pure-Python WordPiece per record; 'fast': the tokenizers library, batched")
    padding: str = _knob("dynamic", "'dynamic': longest in batch; 'fixed': always max_length; "
                                    "'bucket': group by length, pad to the bucket")
    max_length: int = _knob(256, "token limit per request, [CLS] and [SEP] included (the model's max_seq_length is 256)")
    buckets: tuple[int, ...] = _knob((32, 64, 128, 256), "bucket lengths for padding='bucket' (ascending; "
                                                         "lengths >= max_length are replaced by max_length)")
    bucket_window: int = _knob(256, "requests looked at together when grouping by length (bounds reordering and delay)")
    group_by: str = _knob("bytes", "offline length grouping key: 'bytes' (line size, free) or 'tokens' "
                          "(exact, a batched tokenizer pass per window, its time counted in the run)")
    # model
    dtype: str = _knob("fp32", "model precision: fp32, bf16 or fp16 (fp16 needs CUDA)")
    graph: str = _knob("eager", "'eager'; 'compile' (torch.compile); "
                                "'cuda_graph' (capture and replay, needs CUDA and fixed shapes)")
    compile_mode: str = _knob("default", "graph='compile' only: torch.compile mode; 'default' still launches every "
                              "(fused) kernel; 'reduce-overhead' adds CUDA graphs (one replay per call, needs CUDA)")
    tf32: bool = _knob(False, "CUDA only: fp32 matmuls on TF32 tensor cores (faster, ~1e-3 relative error); off, "
                       "fp32 vs bf16 on a GPU overstates what half precision buys")
    device: str = _knob("auto", "'auto' (CUDA when available, else the CPU), 'cpu', 'cuda', or 'sim' (the real host "
                        "pipeline against a simulated accelerator, see sim_profile; every result is labelled simulated)")
    sim_profile: str = _knob("h200-sxm-estimate", f"device='sim' only: a shipped device profile "
                             f"({', '.join(shipped_profiles())}: the files in tuning/sim/devices/) or the path of a "
                             "JSON profile from `python -m tuning calibrate`")
    torch_threads: int | None = _knob(None, "intra-op threads of the model (None: the usable cores less those the "
                                            "tool's own load generators keep busy, at least 1)")
    # online serving
    max_wait_ms: float = _knob(0.0, "dynamic batching: longest a request waits for its batch to fill (0: no waiting)")
    max_batch_tokens: int | None = _knob(None, "dynamic batching: padded-token budget per batch, batch size x padded "
                                         "length (text-embeddings-inference's max-batch-tokens); a batch leaves when "
                                         "the next request would break it, so short requests travel in larger batches "
                                         "(batch_size still caps the count); >= max_length; None: no budget")
    max_queue: int = _knob(1024, "bounded request queue; a full queue rejects with an overload outcome")
    concurrency: int = _knob(1, "load generator: requests in flight at once (closed loop)")
    deadline_ms: float | None = _knob(None, "per-request deadline; a request not done by then gets a timeout outcome")

    def __post_init__(self) -> None:
        _check_int(self, "num_workers", minimum=0)
        if self.prefetch_factor is not None:
            _check_int(self, "prefetch_factor", minimum=1)
            if self.num_workers == 0:
                raise ValueError(
                    f"prefetch_factor={self.prefetch_factor} needs num_workers > 0 (got num_workers=0); "
                    "set num_workers>=1 or leave prefetch_factor unset"
                )
        _check_bool(self, "pin_memory")
        _check_int(self, "batch_size", minimum=1)
        _check_choice(self, "tokenizer", TOKENIZERS)
        _check_choice(self, "padding", PADDINGS)
        _check_int(self, "max_length", minimum=3, maximum=512)
        _check_buckets(self)
        _check_int(self, "bucket_window", minimum=1)
        _check_choice(self, "group_by", GROUP_BY)
        _check_choice(self, "dtype", DTYPES)
        _check_choice(self, "graph", GRAPHS)
        _check_choice(self, "compile_mode", COMPILE_MODES)
        _check_bool(self, "tf32")
        if self.compile_mode != "default" and self.graph != "compile":
            raise ValueError(f"compile_mode={self.compile_mode!r} only applies with graph='compile' (got graph="
                             f"{self.graph!r}); set graph='compile' or leave compile_mode='default'")
        _check_choice(self, "device", DEVICES)
        if not isinstance(self.sim_profile, str) or not self.sim_profile:
            _fail_type("sim_profile", self.sim_profile, "a shipped profile name or a JSON path")
        if self.torch_threads is not None:
            _check_int(self, "torch_threads", minimum=1)
        _check_number(self, "max_wait_ms", minimum=0.0)
        if self.max_batch_tokens is not None:
            _check_int(self, "max_batch_tokens", minimum=1)
            if self.max_batch_tokens < self.max_length:
                raise ValueError(
                    f"knob max_batch_tokens={self.max_batch_tokens} is below max_length={self.max_length}: a request of "
                    f"max_length tokens could never fit a batch; set max_batch_tokens >= {self.max_length} "
                    "(e.g. batch_size x a typical padded length) or None")
        _check_int(self, "max_queue", minimum=1)
        _check_int(self, "concurrency", minimum=1)
        if self.deadline_ms is not None:
            _check_number(self, "deadline_ms", minimum=0.0, strict=True)
        if self.graph == "cuda_graph" and self.padding == "dynamic":
            raise ValueError(
                "graph='cuda_graph' needs fixed shapes but padding='dynamic' makes a new shape per batch; "
                "set padding='bucket' (or 'fixed')"
            )
        if self.graph == "cuda_graph" and self.device == "cpu":
            raise ValueError("graph='cuda_graph' needs CUDA but device='cpu'; on a CPU use graph='compile' or graph='eager'")
        if self.dtype == "fp16" and self.device == "cpu":
            raise ValueError("dtype='fp16' is not supported on the CPU here; use dtype='bf16' (or 'fp32')")
        if self.pin_memory and self.device == "cpu":
            raise ValueError("pin_memory=True only helps copies to CUDA but device='cpu'; set pin_memory=False")

    @property
    def bucket_lengths(self) -> tuple[int, ...]:
        """The bucket lengths in use: ``buckets`` below ``max_length``, then ``max_length`` itself."""
        return tuple(b for b in self.buckets if b < self.max_length) + (self.max_length,)

    def replace(self, **changes: Any) -> "Knobs":
        """A copy with some knobs changed (validated again)."""
        unknown = sorted(set(changes) - set(knob_names()))
        if unknown:
            raise ValueError(f"unknown knob(s) {unknown}; known knobs: {', '.join(knob_names())}")
        return dataclasses.replace(self, **changes)

    def resolve(self, cuda_available: bool) -> "Knobs":
        """The knobs for this machine: ``device='auto'`` made concrete, CUDA-only knobs checked.

        Raises where a CUDA-only knob cannot work, warns (naming the fix) where a safe fallback
        exists (``pin_memory`` without CUDA is turned off).
        """
        device = self.device if self.device != "auto" else ("cuda" if cuda_available else "cpu")
        if device == "sim":
            from tuning.base.assets import device_profile_path

            device_profile_path(self.sim_profile)  # a clear error now, not in the middle of a run
            return self
        if device == "cuda" and not cuda_available:
            raise ValueError("device='cuda' but no CUDA device is available here; set device='cpu' or 'auto'")
        changes: dict[str, Any] = {"device": device}
        if device == "cpu":
            if self.graph == "cuda_graph":
                raise ValueError(
                    "graph='cuda_graph' needs a CUDA device and none is available here; "
                    "use graph='compile' (torch.compile) or graph='eager' on a CPU"
                )
            if self.dtype == "fp16":
                raise ValueError("dtype='fp16' needs a CUDA device and none is available here; use dtype='bf16' on a CPU")
            if self.pin_memory:
                warnings.warn("pin_memory=True has no effect without CUDA; running with pin_memory=False", stacklevel=2)
                changes["pin_memory"] = False
            if self.tf32:
                warnings.warn("tf32=True has no effect without CUDA; running with tf32=False", stacklevel=2)
                changes["tf32"] = False
            if self.compile_mode == "reduce-overhead":
                raise ValueError("compile_mode='reduce-overhead' captures CUDA graphs and needs CUDA; on a CPU use "
                                 "compile_mode='default'")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    def help(self) -> dict[str, str]:
        """Each knob's help text."""
        return {f.name: f.metadata["help"] for f in fields(self)}


def knob_names() -> list[str]:
    return [f.name for f in fields(Knobs)]


def _fail_type(name: str, value: Any, allowed: str) -> None:
    raise TypeError(f"knob {name}={value!r} has type {type(value).__name__}; allowed: {allowed}")


def _check_int(k: Knobs, name: str, minimum: int | None = None, maximum: int | None = None) -> None:
    value = getattr(k, name)
    if isinstance(value, bool) or not isinstance(value, int):
        _fail_type(name, value, "an integer")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"knob {name}={value!r} is out of range; allowed: an integer {bounds}")


def _check_number(k: Knobs, name: str, minimum: float, strict: bool = False) -> None:
    value = getattr(k, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail_type(name, value, "a number")
    if value < minimum or (strict and value == minimum) or value != value:
        raise ValueError(f"knob {name}={value!r} is out of range; allowed: a number {'>' if strict else '>='} {minimum}")


def _check_bool(k: Knobs, name: str) -> None:
    value = getattr(k, name)
    if not isinstance(value, bool):
        _fail_type(name, value, "True or False")


def _check_choice(k: Knobs, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(k, name)
    if not isinstance(value, str):
        _fail_type(name, value, " | ".join(choices))
    if value not in choices:
        raise ValueError(f"knob {name}={value!r} is not allowed; allowed: {' | '.join(choices)}")


def _check_buckets(k: Knobs) -> None:
    value = k.buckets
    if not isinstance(value, tuple) or not value or not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        _fail_type("buckets", value, "a non-empty tuple of integers, e.g. (32, 64, 128, 256)")
    if list(value) != sorted(set(value)) or value[0] < 3:
        raise ValueError(f"knob buckets={value!r} must be strictly ascending integers >= 3, e.g. (32, 64, 128, 256)")


PRESETS: dict[str, Knobs] = {
    # The investigation's starting point: one request per model call, two loader workers,
    # per-record Python tokenization, dynamic shapes, fp32, eager.
    "baseline": Knobs(num_workers=2, batch_size=1, tokenizer="naive", padding="dynamic", dtype="fp32", graph="eager"),
    # The best of the CPU sweeps (bench/presets.py; its result, with the machine it ran on, in
    # bench/results/presets.json): the batched Rust tokenizer in the main process (loader workers only compete
    # with the model for the cores), length-grouped batches of 16 padded to 8-token buckets (a padded token costs
    # as much as a real one on a CPU), grouped by exact token length (less padding than grouping by byte size, a
    # proxy of it). Its precision follows the hardware (tuned_precision): bf16 where the CPU computes it natively,
    # on CUDA and on the simulated device; fp32 on a CPU without, where bf16 is emulated and slower. Eager: at these
    # small shapes torch.compile saves little on a CPU and costs seconds of compilation per new shape.
    "tuned": Knobs(
        num_workers=0, batch_size=16, tokenizer="fast", padding="bucket", dtype="bf16", graph="eager",
        buckets=tuple(range(8, 257, 8)), bucket_window=1024, group_by="tokens", max_wait_ms=20.0,
    ),
}


def tuned_precision(device: str = "auto", flags: dict[str, bool] | None = None,
                    cuda: bool | None = None) -> tuple[str, str]:
    """The ``tuned`` preset's ``dtype`` on this hardware and why: ``bf16`` on CUDA, on the simulated device
    (a datasheet accelerator computes bf16) and on a CPU with native bf16 (AVX512-BF16 or AMX); ``fp32`` on a
    CPU without, where bf16 is emulated and several times slower. ``flags`` and ``cuda`` stand in for this machine's
    (tests fake a CPU with and without native bf16)."""
    from tuning.base.machine import NATIVE_BF16_FLAGS, cpu_flags

    if device == "sim":
        return "bf16", "dtype=bf16: the simulated accelerator computes bf16"
    if device in ("auto", "cuda"):
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        if cuda:
            return "bf16", "dtype=bf16: on CUDA"
    flags = cpu_flags() if flags is None else flags
    native = [f for f in NATIVE_BF16_FLAGS if flags.get(f)]
    if native:
        return "bf16", f"dtype=bf16: this CPU has native bf16 ({', '.join(native)})"
    return "fp32", "dtype=fp32: this CPU has no native bf16 (no avx512_bf16 or amx_bf16; bf16 would be emulated)"


def preset(name: str, **overrides: Any) -> Knobs:
    """A named preset, optionally with some knobs changed. ``tuned`` takes its precision from the hardware
    (:func:`tuned_precision`) unless ``dtype`` is given."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; allowed: {' | '.join(PRESETS)}")
    if name == "tuned" and "dtype" not in overrides:
        overrides = {**overrides, "dtype": tuned_precision(str(overrides.get("device", PRESETS[name].device)))[0]}
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def preset_note(name: str, overrides: dict[str, Any] | None = None) -> str:
    """What a preset chose from the hardware, for its ``knobs:`` line (empty when it chose nothing)."""
    overrides = overrides or {}
    if name != "tuned" or "dtype" in overrides:
        return ""
    return tuned_precision(str(overrides.get("device", PRESETS[name].device)))[1]


def parse_knob_value(name: str, text: str) -> Any:
    """Parse ``--set name=text`` into the knob's type (int, float, bool, None, tuple or str)."""
    if name not in knob_names():
        raise ValueError(f"unknown knob {name!r}; known knobs: {', '.join(knob_names())}")
    default = getattr(Knobs(), name)
    lowered = text.strip().lower()
    if lowered in ("none", "null") and name in ("prefetch_factor", "torch_threads", "deadline_ms", "max_batch_tokens"):
        return None
    try:
        if isinstance(default, bool):
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, tuple):
            return tuple(int(part) for part in text.split(",") if part.strip())
        if name in ("prefetch_factor", "torch_threads", "max_batch_tokens") or isinstance(default, int):
            return int(text)
        if name == "deadline_ms" or isinstance(default, float):
            return float(text)
    except ValueError:
        kind = "true/false" if isinstance(default, bool) else type(default).__name__ if default is not None else "a number"
        raise ValueError(f"knob {name}={text!r} cannot be read as {kind}") from None
    return text
