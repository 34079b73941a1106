"""Regenerate the shipped model profile of the embedded model: ``python -m tuning.runtime.regenerate``."""

from tuning.runtime.model import random_minilm
from tuning.sim import MINILM_PROFILE
from tuning.sim.costmodel import measure_model_profile

if __name__ == "__main__":
    # FLOPs, bytes and op counts do not depend on the weights' values: random weights suffice.
    profile = measure_model_profile(random_minilm(), name="all-MiniLM-L6-v2")
    profile.to_json(MINILM_PROFILE)
    print(f"wrote {MINILM_PROFILE}: {profile.kernels} kernels per eager forward, fit error {profile.fit_error:.2e}")
