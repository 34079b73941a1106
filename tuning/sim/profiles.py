"""Device profiles of the simulated accelerator: one small JSON file per device, every field sourced.

Shipped profiles (in ``tuning/sim/devices/``) are datasheet estimates and say so in their
name (``h200-sxm-estimate``); ``python -m tuning calibrate`` fits a measured one from a batch
sweep on a real device. Any output made with a profile carries its name and source.

A card built on a chip another card shares (the H100 SXM and the H200 are both GH100) names it in ``chip``: the
chip's fit (:data:`CHIP_FIELDS`: efficiencies, per-kernel floors, the attention backend's kernels) lives once, in
``tuning/sim/devices/chips/<chip>.json``, and the card's own file gives only what its datasheet gives (peaks at its
clocks, bandwidth, memory, power), so one fit on one card moves every card of that chip together.

Each file says its ``format_version`` (:data:`FORMAT_VERSION`; a file without one is version 1), and
:func:`migrate` brings an older file's fields to the current format, one version at a time, before the profile is
built, so that a profile written by an earlier release predicts what it predicted then.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuning.base.assets import DEVICE_PROFILES, device_profile_path, shipped_profiles
from tuning.base.contract import device_object

DEFAULT_PROFILE = "h200-sxm-estimate"
# what a chip's fit gives every card built on it (tuning/sim/devices/chips/<chip>.json); a card differs from another of
# its chip in its datasheet figures only
CHIP_FIELDS = ("sm_count", "gemm_efficiency", "gemm_k_half", "min_kernel_s", "graph_min_kernel_s",
               "attention_extra_kernels", "flops_efficiency", "bandwidth_efficiency")


HOST_DISPATCH_KINDS = ("model", "tiny op")  # DeviceProfile.host_dispatch

# The device-profile file format. 1: launch_s and graph_replay_s may be whole host costs (no
# ``host_dispatch_separate``), and a separate host part was one tiny op's dispatch (no ``host_dispatch``).
# 2: both say so explicitly.
FORMAT_VERSION = 2


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    # A version-1 file without host_dispatch_separate holds whole host costs per launch and replay: the what-if adds
    # no dispatch of its own host to them. One without host_dispatch subtracted (or is meant to get back) one tiny
    # op's dispatch per launch: adding the model's miniature instead would count the model's Python twice.
    raw.setdefault("host_dispatch_separate", False)
    raw.setdefault("host_dispatch", "tiny op")
    return raw


# version -> the step that brings a file of that version to the next one
_STEPS = {1: _v1_to_v2}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A device-profile dict (a file's JSON) in the current format: each step from its ``format_version`` (missing:
    1) up to :data:`FORMAT_VERSION` applied in turn. A copy: ``raw`` is left as it is. ValueError for a version this
    release does not know (a file written by a newer one, or not a number)."""
    out = dict(raw)
    version = out.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"format_version={version!r}; this release reads 1 to {FORMAT_VERSION} (a newer file needs "
                         "a newer tuning)")
    while version < FORMAT_VERSION:
        out = _STEPS[version](out)
        version += 1
    out["format_version"] = FORMAT_VERSION
    return out

@dataclass(frozen=True)
class DeviceProfile:
    """What the cost model needs to know about one accelerator (SI units: FLOP/s, bytes/s, bytes, s)."""

    name: str
    kind: str  # "estimate" (datasheet) or "measured" (fitted from a sweep)
    description: str
    peak_flops: dict[str, float]  # dense peak per dtype: fp32, bf16, fp16
    flops_efficiency: float  # achievable fraction of peak on this workload's matmuls
    mem_bandwidth: float
    bandwidth_efficiency: float
    mem_bytes: float
    # host CPU time of the driver's part of one eager kernel launch (cudaLaunchKernel) and of one CUDA-graph
    # replay (cudaGraphLaunch); the host's own per-op dispatch is measured on the host that runs the what-if
    # (tuning.sim.dispatch) and added by the cost model, unless host_dispatch_separate is False
    launch_s: float
    graph_replay_s: float
    min_kernel_s: float  # shortest a kernel takes on the device
    h2d_pinned_bps: float
    h2d_pageable_bps: float
    copy_latency_s: float = 10e-6
    synchronous: bool = False  # True for a CPU: host dispatch and compute run in series
    idle_power_w: float = math.nan
    max_power_w: float = math.nan
    # the names the driver reports for this card (torch.cuda.get_device_name, nvidia-smi's Name): how a
    # calibration on that card finds this profile for the figures a sweep cannot measure
    device_names: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    # shape-aware device time (tuning.sim.costmodel's docstring); the defaults keep a profile without them on the
    # flat flops_efficiency and min_kernel_s (a calibrated profile, one made before these fields existed)
    sm_count: int = 0  # streaming multiprocessors: the wave-quantization model (0: no GEMM shape model)
    gemm_efficiency: dict[str, float] = field(default_factory=dict)  # asymptotic fraction of peak per dtype
    gemm_k_half: float = 64.0  # K at which a GEMM tile reaches half its asymptotic rate (prologue/epilogue)
    bandwidth_half_bytes: float = 0.0  # kernel size (bytes) at which it reaches half the achievable bandwidth
    graph_min_kernel_s: float | None = None  # shortest kernel inside a CUDA graph (None: min_kernel_s)
    # kernels the card's attention backend runs per attention call beyond the attention kernel itself (a workspace
    # memset of cuDNN's fused attention, say): device work at the mode's floor, no host launch of the model's own
    # code (the host cost per launch was measured over the whole forward, these included). 0: none
    attention_extra_kernels: int = 0
    # True: launch_s and graph_replay_s are the driver's part only (the host's dispatch is added per launch);
    # False: launch_s and graph_replay_s are whole host costs per launch, measured or estimated on some host, used
    # as they are (a version-1 file without the key)
    host_dispatch_separate: bool = True
    # what the what-if adds to launch_s per launch on its own host, and what a calibration subtracted: "model" (the
    # model's own code at a miniature size, tuning.sim.dispatch.model_dispatch_s) or "tiny op" (one tiny op's
    # dispatch: a version-1 file without the key, or a fit beside a model that cannot be rebuilt small)
    host_dispatch: str = "model"
    format_version: int = FORMAT_VERSION  # the file format this profile is written in (see migrate)
    chip: str = ""  # the chip whose fit (CHIP_FIELDS) this card shares with others of it; "": its own figures

    def __post_init__(self) -> None:
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"device profile {self.name!r}: format_version={self.format_version!r}; a profile is "
                             f"built in format {FORMAT_VERSION} (load_profile migrates an older file)")
        if self.host_dispatch not in HOST_DISPATCH_KINDS:
            raise ValueError(f"device profile {self.name!r}: host_dispatch={self.host_dispatch!r}; allowed: "
                             f"{' | '.join(HOST_DISPATCH_KINDS)}")
        if self.kind not in ("estimate", "measured"):
            raise ValueError(f"device profile {self.name!r}: kind={self.kind!r}; allowed: estimate | measured")
        missing = [d for d in ("fp32", "bf16", "fp16") if d not in self.peak_flops]
        if missing:
            raise ValueError(f"device profile {self.name!r}: peak_flops lacks {missing}; give FLOP/s for fp32, bf16, fp16")
        for name in ("flops_efficiency", "bandwidth_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"device profile {self.name!r}: {name}={value!r} must be in (0, 1]")
        for name in ("mem_bandwidth", "mem_bytes", "h2d_pinned_bps", "h2d_pageable_bps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"device profile {self.name!r}: {name}={getattr(self, name)!r} must be > 0")
        for dtype, value in self.gemm_efficiency.items():
            if dtype not in ("fp32", "tf32", "bf16", "fp16") or not 0 < value <= 1:
                raise ValueError(f"device profile {self.name!r}: gemm_efficiency[{dtype!r}]={value!r}; dtypes fp32, "
                                 "tf32, bf16, fp16, each in (0, 1]")
        if self.sm_count < 0 or self.gemm_k_half < 0 or self.bandwidth_half_bytes < 0:
            raise ValueError(f"device profile {self.name!r}: sm_count, gemm_k_half, bandwidth_half_bytes must be >= 0")
        if isinstance(self.attention_extra_kernels, bool) or not isinstance(self.attention_extra_kernels, int) \
                or self.attention_extra_kernels < 0:
            raise ValueError(f"device profile {self.name!r}: attention_extra_kernels={self.attention_extra_kernels!r} "
                             "must be a whole number >= 0")
        if self.graph_min_kernel_s is not None and not self.graph_min_kernel_s >= 0:
            raise ValueError(f"device profile {self.name!r}: graph_min_kernel_s={self.graph_min_kernel_s!r} must be >= 0")
        for name in ("launch_s", "graph_replay_s", "min_kernel_s", "copy_latency_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"device profile {self.name!r}: {name}={getattr(self, name)!r} must be >= 0 seconds")

    def min_kernel_for(self, graph: str = "eager") -> float:
        """Shortest kernel in a mode: inside a CUDA graph (cuda_graph, compile_graph) the graph floor."""
        if graph in ("cuda_graph", "compile_graph") and self.graph_min_kernel_s is not None:
            return self.graph_min_kernel_s
        return self.min_kernel_s

    @property
    def source(self) -> str:
        """One line: where the figures come from."""
        if self.kind == "estimate":
            return f"datasheet estimate ({self.description})"
        return f"measured: {self.description}"

    def flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype. ``tf32`` on a synchronous device (a CPU, which has no TF32 units: torch
        runs fp32) is fp32's; an accelerator's profile without a TF32 rate cannot say it (ValueError), since its
        fp32 rate (no tensor cores) is several times below any TF32 rate."""
        if dtype == "tf32" and "tf32" not in self.peak_flops:
            if self.synchronous:
                return self.peak_flops["fp32"]
            raise ValueError(f"device profile {self.name!r} has no peak_flops['tf32']: give the card's TF32 rate (its "
                             "datasheet's dense TF32 tensor FLOP/s), or calibrate from sweeps with tf32 on")
        return self.peak_flops[dtype]

    def label(self) -> str:
        return f"simulated {self.name} ({self.source})"

    def info(self) -> dict[str, Any]:
        """The ``device`` block of every summary made on this profile."""
        return device_object("simulated", name=f"simulated {self.name}", profile=self.name, source=self.source,
                             profile_kind=self.kind)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.as_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def replace(self, **changes: Any) -> "DeviceProfile":
        data = self.as_dict()
        data.update(changes)
        return DeviceProfile(**data)

    def slowed(self, factor: float) -> "DeviceProfile":
        """This card running ``factor`` times slower (below 1: faster): its FLOP/s, memory and copy bandwidths
        divided by ``factor``, its launch, replay, minimum-kernel and copy-latency times multiplied. The host's own
        dispatch per op (measured where the what-if runs, not part of the profile) is not scaled."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"slowed({factor!r}): give a finite factor above 0 (2: twice as slow)")
        return self.replace(
            peak_flops={k: v / factor for k, v in self.peak_flops.items()}, mem_bandwidth=self.mem_bandwidth / factor,
            h2d_pinned_bps=self.h2d_pinned_bps / factor, h2d_pageable_bps=self.h2d_pageable_bps / factor,
            launch_s=self.launch_s * factor, graph_replay_s=self.graph_replay_s * factor,
            min_kernel_s=self.min_kernel_s * factor, copy_latency_s=self.copy_latency_s * factor,
            graph_min_kernel_s=None if self.graph_min_kernel_s is None else self.graph_min_kernel_s * factor)


def profile_for_card(card: str | None) -> DeviceProfile | None:
    """The shipped profile of the card the driver names ``card`` (its ``device_names``, case and spacing
    ignored), or None when no shipped profile is of that card."""
    if not card:
        return None
    key = " ".join(str(card).lower().split())
    for name in shipped_profiles():
        profile = load_profile(name)
        if key in {" ".join(n.lower().split()) for n in profile.device_names}:
            return profile
    return None


def chip_path(chip: str) -> Path:
    return DEVICE_PROFILES / "chips" / f"{chip}.json"


def with_chip(raw: dict[str, Any]) -> dict[str, Any]:
    """A profile dict with its chip's fit (:data:`CHIP_FIELDS` and their sources) filled in where the file does not
    give them itself (a calibrated profile keeps what it fitted). A copy; ValueError for a chip with no fit file."""
    chip = raw.get("chip")
    if not chip:
        return raw
    path = chip_path(str(chip))
    try:
        fit = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"chip={chip!r}: cannot read its fit {path}: {exc}; name a chip in "
                         f"{DEVICE_PROFILES / 'chips'} or drop 'chip' and give {', '.join(CHIP_FIELDS)}") from None
    out = dict(raw)
    taken = [k for k in CHIP_FIELDS if k not in out and k in fit]
    out.update({k: fit[k] for k in taken})
    chip_sources = {k: f"{v} [the {chip} chip's fit]" for k, v in fit.get("sources", {}).items() if k in taken}
    out["sources"] = {**chip_sources, **out.get("sources", {})}
    return out


def load_profile(name_or_path: str | Path | DeviceProfile = DEFAULT_PROFILE) -> DeviceProfile:
    """A shipped profile by name, or a profile JSON file by path; a clear error naming both otherwise."""
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    text = str(name_or_path)
    path = device_profile_path(text)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"sim_profile={text!r}: cannot read {path}: {exc}") from None
    known = {f.name for f in fields(DeviceProfile)}
    if not isinstance(raw, dict):
        raise ValueError(f"sim_profile={text!r}: {path} holds {type(raw).__name__}, not a profile object")
    try:
        raw = with_chip(migrate(raw))
    except ValueError as exc:
        raise ValueError(f"sim_profile={text!r}: {exc}") from None
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"sim_profile={text!r}: unknown field(s) {unknown}; known: {', '.join(sorted(known))}")
    try:
        return DeviceProfile(**raw)
    except TypeError as exc:
        raise ValueError(f"sim_profile={text!r}: {exc}") from None
