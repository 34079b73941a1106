"""Device profiles of the simulated accelerator: one small JSON file per device, every field sourced.

Shipped profiles (in ``tuning/sim/devices/``) are datasheet estimates and say so in their
name (``h200-sxm-estimate``); ``python -m tuning calibrate`` fits a measured one from a batch
sweep on a real device. Any output made with a profile carries its name and source.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuning.base.assets import device_profile_path, shipped_profiles
from tuning.base.contract import device_object

DEFAULT_PROFILE = "h200-sxm-estimate"


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
    launch_s: float  # host CPU time per eager kernel launch
    graph_replay_s: float  # host CPU time of one CUDA-graph replay
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

    def __post_init__(self) -> None:
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
        for name in ("launch_s", "graph_replay_s", "min_kernel_s", "copy_latency_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"device profile {self.name!r}: {name}={getattr(self, name)!r} must be >= 0 seconds")

    @property
    def source(self) -> str:
        """One line: where the figures come from."""
        if self.kind == "estimate":
            return f"datasheet estimate ({self.description})"
        return f"measured: {self.description}"

    def flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; ``tf32`` falls back to fp32 where the profile has no TF32 rate."""
        if dtype == "tf32":
            return self.peak_flops.get("tf32", self.peak_flops["fp32"])
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
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"sim_profile={text!r}: unknown field(s) {unknown}; known: {', '.join(sorted(known))}")
    try:
        return DeviceProfile(**raw)
    except TypeError as exc:
        raise ValueError(f"sim_profile={text!r}: {exc}") from None
