"""Experiments that drive the runtime and the load: sweeps, precision checks, profiled runs, the ladder,
watching a service from outside, and the whole investigation."""
