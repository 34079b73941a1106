"""The simulated accelerator: the real host pipeline against a device whose time comes from a
calibrated cost model (model profile x device profile; see :mod:`tuning.sim.costmodel`).

Use it with the knobs ``device='sim'`` and ``sim_profile`` (a shipped profile's name or a JSON
path; default ``h200-sxm-estimate``). Everything made on it is labelled simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .costmodel import CallCost, ModelProfile, measure_model_profile, predict
from .profiles import DEFAULT_PROFILE, DeviceProfile, load_profile, shipped_profiles
from .standin import SimulatedDevice, SimulatedModel
from .timeline import DeviceTimeline

MINILM_PROFILE = Path(__file__).resolve().parent.parent / "assets" / "minilm_model_profile.json"

__all__ = ["CallCost", "DeviceProfile", "ModelProfile", "SimulatedDevice", "SimulatedModel", "DeviceChoice",
           "device_for", "DeviceTimeline", "load_profile", "shipped_profiles", "measure_model_profile", "predict",
           "embedded_model_profile", "model_profile_for", "DEFAULT_PROFILE"]


def embedded_model_profile() -> ModelProfile:
    """The shipped model profile of all-MiniLM-L6-v2 (regenerate: ``python -m tuning.sim.regenerate``)."""
    return ModelProfile.from_json(MINILM_PROFILE)


def model_profile_for(model) -> ModelProfile:
    """The model profile of a model: the shipped one for the embedded model (None), else measured once."""
    import torch

    if model is None:
        return embedded_model_profile()
    cached = getattr(model, "_tuning_model_profile", None)
    if cached is not None:
        return cached
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"device='sim' needs a torch.nn.Module to measure its model profile; got "
                        f"{type(model).__name__}: wrap your callable in an nn.Module, or run it on device='cpu'")
    profile = measure_model_profile(model, name=type(model).__name__)
    try:
        model._tuning_model_profile = profile
    except AttributeError:
        pass
    return profile


@dataclass(frozen=True)
class DeviceChoice:
    """What a notebook's ``DEVICE`` parameter resolves to on this machine."""

    knob: str  # the ``device`` knob value: "cuda", "sim" or "cpu"
    simulated: bool
    label: str
    banner: str


def device_for(choice: str = "auto", profile: str = DEFAULT_PROFILE) -> DeviceChoice:
    """``"auto"``: CUDA when present, else the simulated ``profile``; ``"cpu"``, ``"cuda"``, ``"sim"``: that one."""
    import torch

    if choice not in ("auto", "cpu", "cuda", "sim"):
        raise ValueError(f"DEVICE={choice!r} is not allowed; allowed: auto | cpu | cuda | sim")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("DEVICE='cuda' but no CUDA device is available here; use 'auto' (simulated) or 'cpu'")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        name = torch.cuda.get_device_name(0)
        return DeviceChoice("cuda", False, f"cuda ({name}, measured)", f"Running on {name}: every figure is measured.")
    if choice == "cpu":
        return DeviceChoice("cpu", False, "cpu (measured)", "Running on the CPU: every figure is measured; "
                            "the CPU model is the bottleneck here, so a starved accelerator cannot show.")
    p = load_profile(profile)
    why = "no CUDA device here, so " if choice == "auto" else ""
    return DeviceChoice("sim", True, p.label(),
                        f"SIMULATED DEVICE: {why}the model call runs on a stand-in for {p.name} ({p.source}); the host "
                        "pipeline is real, device times come from a cost model. Accuracy checks use the real model.")
