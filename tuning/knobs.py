"""Every knob of the pipeline, in one frozen, validated dataclass, plus named presets.

A knob that is wrong raises ``ValueError``/``TypeError`` naming the field, the value
and what is allowed. Contradictory knobs raise (or, where a safe fallback exists,
warn) with the fix in the message. Presets are the rungs of the investigation's
ladder: ``baseline`` is where it starts, ``tuned`` is the best measured on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from tuning.base.assets import shipped_profiles

TOKENIZERS = ("naive", "fast")
PADDINGS = ("dynamic", "fixed", "bucket")
DTYPES = ("fp32", "bf16", "fp16")
GRAPHS = ("eager", "compile", "cuda_graph")
DEVICES = ("auto", "cpu", "cuda", "sim")
GROUP_BY = ("bytes", "tokens")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")

# where a knob applies: the offline replay (a DataLoader over a file), the served path (the server, its batcher
# and the load that tests it), or both (the shared preprocessing and model call)
ROLES = ("offline", "served", "both")
_RUNS_IN = {"offline": ("offline",), "served": ("served",), "both": ("offline", "served")}
_LENGTHS_ALLOWED = "a non-empty tuple of integers, e.g. (32, 64, 128, 256)"


def _knob(default: Any, help: str, role: str, *, choices: tuple[str, ...] = (), minimum: float | None = None,
          maximum: float | None = None, strict: bool = False, steps: tuple = (), panel: bool = False,
          null_label: str = "", allowed: str = "", applies: Callable[[Any], bool] | None = None) -> Any:
    """A knob's one declaration: everything the checks, the ``knobs`` listing, the knob panel and a result's
    ``knobs:`` line say about it comes from here (:class:`KnobSpec` documents each entry)."""
    if role not in ROLES:
        raise ValueError(f"knob role {role!r} is not allowed; allowed: {' | '.join(ROLES)}")
    return field(default=default, metadata={
        "help": help, "role": role, "choices": choices, "minimum": minimum, "maximum": maximum, "strict": strict,
        "steps": steps, "panel": panel, "null_label": null_label, "allowed": allowed, "applies": applies})


@dataclass(frozen=True)
class Knobs:
    """The configuration of one run: loading, preprocessing, model and serving knobs."""

    # offline loading (torch DataLoader)
    num_workers: int = _knob(2, "offline: DataLoader worker processes preparing batches (0: in the main process); "
                                "served: the server's preprocessing threads (at least 1)", "both",
                             minimum=0, steps=(0, 1, 2, 3, 4), panel=True)
    prefetch_factor: int | None = _knob(None, "batches each worker prepares ahead (needs num_workers > 0; "
                                              "None: torch's default of 2)", "offline",
                                        minimum=1, steps=(1, 2, 4, 8), panel=True, null_label="torch default",
                                        applies=lambda k: k.num_workers > 0)
    pin_memory: bool = _knob(False, "page-locked host batches for faster, asynchronous copies (needs CUDA)", "both")
    batch_size: int = _knob(1, "requests per model call (offline batch; online: the batcher's max batch size)", "both",
                            minimum=1, steps=(1, 2, 4, 8, 16, 32, 64), panel=True)
    # preprocessing
    tokenizer: str = _knob("naive", "'naive': pure-Python WordPiece per record; 'fast': the tokenizers library, batched",
                           "both", choices=TOKENIZERS, panel=True)
    padding: str = _knob("dynamic", "'dynamic': longest in batch; 'fixed': always max_length; "
                                    "'bucket': group by length, pad to the bucket", "both", choices=PADDINGS, panel=True)
    max_length: int = _knob(256, "token limit per request, [CLS] and [SEP] included (the model's max_seq_length is 256)",
                            "both", minimum=3, maximum=512)
    buckets: tuple[int, ...] = _knob((32, 64, 128, 256), "bucket lengths for padding='bucket' (ascending; "
                                                         "lengths >= max_length are replaced by max_length)", "both",
                                     minimum=3, allowed=_LENGTHS_ALLOWED, applies=lambda k: k.padding == "bucket")
    bucket_window: int = _knob(256, "requests looked at together when grouping by length (bounds reordering and delay)",
                               "offline", minimum=1)
    group_by: str = _knob("bytes", "offline length grouping key: 'bytes' (line size, free) or 'tokens' "
                          "(exact, a batched tokenizer pass per window, its time counted in the run)", "offline",
                          choices=GROUP_BY)
    # model
    dtype: str = _knob("fp32", "model precision: fp32, bf16 or fp16 (fp16 needs CUDA)", "both", choices=DTYPES,
                       panel=True)
    graph: str = _knob("eager", "'eager'; 'compile' (torch.compile); "
                                "'cuda_graph' (capture and replay, needs CUDA and fixed shapes)", "both", choices=GRAPHS,
                       panel=True)
    compile_mode: str = _knob("default", "graph='compile' only: torch.compile mode; 'default' still launches every "
                              "(fused) kernel; 'reduce-overhead' adds CUDA graphs (one replay per call, needs CUDA)",
                              "both", choices=COMPILE_MODES, applies=lambda k: k.graph == "compile")
    tf32: bool = _knob(False, "CUDA only: fp32 matmuls on TF32 tensor cores (faster, ~1e-3 relative error); off, "
                       "fp32 vs bf16 on a GPU overstates what half precision buys", "both")
    device: str = _knob("auto", "'auto' (CUDA when available, else the CPU), 'cpu', 'cuda', or 'sim' (the real host "
                        "pipeline against a simulated accelerator, see sim_profile; every result is labelled simulated)",
                        "both", choices=DEVICES)
    sim_profile: str = _knob("h200-sxm-estimate", f"device='sim' only: a shipped device profile "
                             f"({', '.join(shipped_profiles())}: the files in tuning/sim/devices/) or the path of a "
                             "JSON profile from `python -m tuning calibrate`", "both",
                             allowed="a shipped profile name or a JSON path", applies=lambda k: k.device == "sim")
    torch_threads: int | None = _knob(None, "intra-op threads of the model (None: the usable cores less those the "
                                            "tool's own load generators keep busy, at least 1)", "both", minimum=1)
    # online serving
    max_wait_ms: float = _knob(0.0, "dynamic batching: longest a request waits for its batch to fill (0: no waiting)",
                               "served", minimum=0.0, steps=(0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0), panel=True)
    max_batch_tokens: int | None = _knob(None, "dynamic batching: padded-token budget per batch, batch size x padded "
                                         "length (text-embeddings-inference's max-batch-tokens); a batch leaves when "
                                         "the next request would break it, so short requests travel in larger batches "
                                         "(batch_size still caps the count); >= max_length; None: no budget", "served",
                                         minimum=1)
    max_queue: int = _knob(1024, "bounded request queue; a full queue rejects with an overload outcome", "served",
                           minimum=1)
    concurrency: int = _knob(1, "load generator: requests in flight at once (closed loop)", "served", minimum=1,
                             steps=(1, 2, 4, 8, 16, 32, 64), panel=True)
    deadline_ms: float | None = _knob(None, "per-request deadline; a request not done by then gets a timeout outcome",
                                      "served", minimum=0.0, strict=True)

    def __post_init__(self) -> None:
        for spec in knob_specs(type(self)).values():
            check_value(spec, getattr(self, spec.name))
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError(
                f"prefetch_factor={self.prefetch_factor} needs num_workers > 0 (got num_workers=0); "
                "set num_workers>=1 or leave prefetch_factor unset"
            )
        if self.compile_mode != "default" and self.graph != "compile":
            raise ValueError(f"compile_mode={self.compile_mode!r} only applies with graph='compile' (got graph="
                             f"{self.graph!r}); set graph='compile' or leave compile_mode='default'")
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.max_length:
            raise ValueError(
                f"knob max_batch_tokens={self.max_batch_tokens} is below max_length={self.max_length}: a request of "
                f"max_length tokens could never fit a batch; set max_batch_tokens >= {self.max_length} "
                "(e.g. batch_size x a typical padded length) or None")
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


@dataclass(frozen=True)
class KnobSpec:
    """One knob as its field declares it. The checks, ``parse_knob_value``, the ``knobs`` listing, the knob
    panel and a result's ``knobs:`` line all read this, so that a knob is added in one place and an error
    message lists the same values as the help."""

    name: str
    kind: str  # int | number | bool | choice | text | lengths: from the field's annotation (and its choices)
    role: str  # where it applies: offline | served | both (ROLES)
    help: str
    default: Any
    nullable: bool  # None is allowed: the annotation says ``| None``
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False  # the minimum itself is refused
    steps: tuple = ()  # a slider's positions in the knob panel
    panel: bool = False  # a control in the knob panel of each mode its role applies in
    null_label: str = ""  # what the panel's slider calls None
    allowed_text: str = ""  # what a text or lengths knob allows, in words
    applies: Callable[[Any], bool] | None = None  # whether it does anything, given the other knobs (None: always)

    @property
    def runs_in(self) -> tuple[str, ...]:
        """The modes it applies in: ``("offline",)``, ``("served",)`` or both."""
        return _RUNS_IN[self.role]

    def allowed(self) -> str:
        """What a value may be, in the words the error message uses."""
        if self.kind == "choice":
            return " | ".join(self.choices)
        if self.kind in ("int", "number"):
            noun = "an integer" if self.kind == "int" else "a number"
            if self.maximum is not None:
                return f"{noun} between {self.minimum} and {self.maximum}"
            return noun if self.minimum is None else f"{noun} {'>' if self.strict else '>='} {self.minimum}"
        return "True or False" if self.kind == "bool" else self.allowed_text

    def describe(self) -> str:
        """``allowed()`` and whether None is too, for the listing."""
        return self.allowed() + (" (or none)" if self.nullable else "")


_KINDS = {"int": "int", "float": "number", "bool": "bool", "str": "text", "tuple[int, ...]": "lengths"}


def _spec(f: dataclasses.Field) -> KnobSpec:
    # a string under ``from __future__ import annotations``, else the type itself
    annotation = f.type.__name__ if type(f.type) is type else str(f.type)
    base = annotation.replace(" | None", "")
    if base not in _KINDS:
        raise TypeError(f"knob {f.name} is declared as {annotation}; declare it as one of {', '.join(_KINDS)} "
                        "(or one of them | None)")
    meta = f.metadata
    kind = "choice" if meta["choices"] else _KINDS[base]
    return KnobSpec(name=f.name, kind=kind, role=meta["role"], help=meta["help"], default=f.default,
                    nullable=base != annotation, choices=meta["choices"], minimum=meta["minimum"],
                    maximum=meta["maximum"], strict=meta["strict"], steps=meta["steps"], panel=meta["panel"],
                    null_label=meta["null_label"], allowed_text=meta["allowed"], applies=meta["applies"])


@functools.cache
def _specs_of(cls: type) -> dict[str, KnobSpec]:
    return {f.name: _spec(f) for f in fields(cls)}


def knob_specs(cls: type | None = None) -> dict[str, KnobSpec]:
    """Every knob's declaration, in declaration order (of ``Knobs``, looked up when called)."""
    return _specs_of(cls or Knobs)


def knobs_for(mode: str, panel: bool = False) -> tuple[str, ...]:
    """The knobs that apply in ``mode`` (offline | served), in declaration order; ``panel``: those with a control."""
    if mode not in ("offline", "served"):
        raise ValueError(f"mode={mode!r} is not allowed; allowed: offline | served")
    return tuple(s.name for s in knob_specs().values() if mode in s.runs_in and (s.panel or not panel))


def settings(knobs: Knobs, mode: str = "offline") -> dict[str, Any]:
    """The knobs that matter in ``mode``, in declaration order, less those that do nothing given the others
    (``buckets`` without bucket padding, ``sim_profile`` off the simulated device)."""
    specs = knob_specs(type(knobs))
    return {name: getattr(knobs, name) for name in knobs_for(mode)
            if specs[name].applies is None or specs[name].applies(knobs)}


def _fail_type(name: str, value: Any, allowed: str) -> None:
    raise TypeError(f"knob {name}={value!r} has type {type(value).__name__}; allowed: {allowed}")


def _out_of_range(s: KnobSpec, value: Any) -> None:
    low = s.minimum is not None and (value < s.minimum or (s.strict and value == s.minimum))
    if low or (s.maximum is not None and value > s.maximum) or value != value:
        raise ValueError(f"knob {s.name}={value!r} is out of range; allowed: {s.allowed()}")


def _check_int(s: KnobSpec, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail_type(s.name, value, "an integer")
    _out_of_range(s, value)


def _check_number(s: KnobSpec, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail_type(s.name, value, "a number")
    _out_of_range(s, value)


def _check_bool(s: KnobSpec, value: Any) -> None:
    if not isinstance(value, bool):
        _fail_type(s.name, value, s.allowed())


def _check_choice(s: KnobSpec, value: Any) -> None:
    if not isinstance(value, str):
        _fail_type(s.name, value, s.allowed())
    if value not in s.choices:
        raise ValueError(f"knob {s.name}={value!r} is not allowed; allowed: {s.allowed()}")


def _check_text(s: KnobSpec, value: Any) -> None:
    if not isinstance(value, str) or not value:
        _fail_type(s.name, value, s.allowed())


def _check_lengths(s: KnobSpec, value: Any) -> None:
    if not isinstance(value, tuple) or not value or not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        _fail_type(s.name, value, s.allowed())
    if list(value) != sorted(set(value)) or value[0] < (s.minimum or 1):
        raise ValueError(f"knob {s.name}={value!r} must be strictly ascending integers >= {s.minimum or 1}, e.g. "
                         "(32, 64, 128, 256)")


_CHECKS: dict[str, Callable[[KnobSpec, Any], None]] = {
    "int": _check_int, "number": _check_number, "bool": _check_bool, "choice": _check_choice, "text": _check_text,
    "lengths": _check_lengths}


def check_value(spec: KnobSpec, value: Any) -> None:
    """Raise, naming the knob, the value and what its declaration allows, unless ``value`` is allowed."""
    if value is None and spec.nullable:
        return
    _CHECKS[spec.kind](spec, value)


def declared(name: str, *values: Any) -> Any:
    """``values`` (one: that value), each checked against knob ``name``'s declaration, for code that names a
    level of a knob (the screen's factors): a choice renamed or dropped here fails at import, naming what is
    allowed, not in the middle of a run."""
    if name not in knob_names():
        raise ValueError(f"unknown knob {name!r}; known knobs: {', '.join(knob_names())}")
    for value in values:
        check_value(knob_specs()[name], value)
    return values[0] if len(values) == 1 else values

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


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _read_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE + _FALSE:
        return lowered in _TRUE
    raise ValueError(text)


_READERS: dict[str, Callable[[str], Any]] = {
    "bool": _read_bool, "int": int, "number": float,
    "lengths": lambda text: tuple(int(part) for part in text.split(",") if part.strip())}
_READ_AS = {"bool": "true/false", "int": "int", "number": "float", "lengths": "tuple"}


def parse_knob_value(name: str, text: str) -> Any:
    """Parse ``--set name=text`` into the knob's declared kind and check it as ``Knobs`` would, so that
    ``--set`` refuses a value with the same words (and the same list of choices) as the listing."""
    if name not in knob_names():
        raise ValueError(f"unknown knob {name!r}; known knobs: {', '.join(knob_names())}")
    spec = knob_specs()[name]
    if text.strip().lower() in ("none", "null") and spec.nullable:
        return None
    try:
        value = _READERS.get(spec.kind, str)(text)
    except ValueError:
        kind = "a number" if spec.nullable else _READ_AS[spec.kind]
        raise ValueError(f"knob {name}={text!r} cannot be read as {kind}") from None
    check_value(spec, value)
    return value
