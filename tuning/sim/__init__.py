"""The simulated accelerator: the real host pipeline against a device whose time comes from a
calibrated cost model (model profile x device profile; see :mod:`tuning.sim.costmodel`).

Use it with the knobs ``device='sim'`` and ``sim_profile`` (a shipped profile's name or a JSON
path; default ``h200-sxm-estimate``). Everything made on it is labelled simulated.
"""

from __future__ import annotations

from tuning.base.assets import ASSETS, shipped_profiles
from tuning.sim.costmodel import CallCost, ModelProfile, measure_model_profile, predict
from tuning.sim.device import DeviceChoice, device_for
from tuning.sim.dispatch import host_dispatch_s
from tuning.sim.profiles import DEFAULT_PROFILE, DeviceProfile, load_profile
from tuning.sim.standin import SimulatedDevice, SimulatedModel
from tuning.sim.timeline import DeviceTimeline

MINILM_PROFILE = ASSETS / "minilm_model_profile.json"

__all__ = ["CallCost", "DeviceProfile", "ModelProfile", "SimulatedDevice", "SimulatedModel", "DeviceChoice",
           "device_for", "DeviceTimeline", "load_profile", "shipped_profiles", "measure_model_profile", "predict",
           "embedded_model_profile", "model_profile_for", "DEFAULT_PROFILE", "host_dispatch_s"]


def embedded_model_profile() -> ModelProfile:
    """The shipped model profile of all-MiniLM-L6-v2 (regenerate: ``python -m tuning.runtime.regenerate``)."""
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


