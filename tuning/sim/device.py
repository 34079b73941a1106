"""The one place where a device choice (``auto``, ``cpu``, ``cuda``, ``sim``) is resolved for every caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuning.base.contract import device_object
from tuning.base.machine import cpu_name
from tuning.sim.profiles import DEFAULT_PROFILE, load_profile


@dataclass(frozen=True)
class DeviceChoice:
    """What a notebook's ``DEVICE`` parameter resolves to on this machine."""

    knob: str  # the ``device`` knob value: "cuda", "sim" or "cpu"
    simulated: bool
    label: str
    banner: str
    profile: str | None = None  # the simulated device's profile name
    name: str | None = None  # the card's name (CUDA)

    def as_dict(self) -> dict[str, Any]:
        """The contract's ``device`` object (:mod:`tuning.base.contract`), with the knob, label and banner."""
        extra = {"knob": self.knob, "label": self.label, "simulated": self.simulated, "banner": self.banner}
        if self.knob == "sim":
            return {**load_profile(self.profile or DEFAULT_PROFILE).info(), **extra}
        kind = self.knob
        name = self.name or (cpu_name() if kind == "cpu" else self.label)
        return device_object(kind, name, source="measured", **extra)


FALLBACKS = ("sim", "cpu")


def device_for(choice: Any = "auto", profile: str | None = None, fallback: str = "cpu") -> DeviceChoice:
    """Resolve a device choice once, for every caller.

    ``"auto"``: CUDA when present, else the real CPU, as the ``device`` knob and the CLI mean it (one meaning
    everywhere: a caller that wants the simulated device says ``"sim"``, as the notebooks do, so that the
    starved accelerator can show on a CPU machine). ``fallback="sim"`` is kept for a caller that wants "CUDA
    when present, else simulated". ``"cpu"``, ``"cuda"``, ``"sim"``: that one. A :class:`DeviceChoice` is
    returned as it is.
    """
    import torch

    if isinstance(choice, DeviceChoice):
        return choice
    if choice not in ("auto", "cpu", "cuda", "sim"):
        raise ValueError(f"DEVICE={choice!r} is not allowed; allowed: auto | cpu | cuda | sim")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback={fallback!r} is not allowed; allowed: {' | '.join(FALLBACKS)}")
    profile = profile or DEFAULT_PROFILE
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("DEVICE='cuda' but no CUDA device is available here; use 'sim' (the simulated device) "
                         "or 'cpu'")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        name = torch.cuda.get_device_name(0)
        return DeviceChoice("cuda", False, f"cuda ({name}, measured)", f"Running on {name}: every figure is measured.",
                            name=name)
    if choice == "cpu" or (choice == "auto" and fallback == "cpu"):
        return DeviceChoice("cpu", False, "cpu (measured)", "Running on the CPU: every figure is measured; "
                            "the CPU model is the bottleneck here, so a starved accelerator cannot show.")
    p = load_profile(profile)
    why = "no CUDA device here, so " if choice == "auto" else ""
    return DeviceChoice("sim", True, p.label(), profile=str(profile), banner=
                        (f"SIMULATED DEVICE: {why}the model call runs on a stand-in for {p.name} ({p.source}); the host "
                        "pipeline is real, device times come from a cost model. Accuracy checks use the real model."))

