"""tuning: a workbook for inference services that miss QPS and p99 while the accelerator idles.

Importing this package loads neither plotly nor ipywidgets (``tuning.charts`` and
``tuning.widgets`` do), so it runs on machines that only have torch and friends.
"""

from .knobs import PRESETS, Knobs, preset

__all__ = ["Knobs", "PRESETS", "preset"]
__version__ = "0.1.0"

# The public face notebooks and scripts call, loaded on first use (``tuning.Pipeline``), so that
# importing ``tuning`` stays light and internal modules can move without breaking callers.
_LAZY = {
    "Pipeline": "pipeline", "PipelineResult": "pipeline", "run_pipeline": "pipeline",
    "Server": "serve", "run_load": "loadgen", "load_sweep": ("loadgen", "sweep"), "LoadResult": "loadgen",
    "Recorder": "profile", "Profile": "profile", "profile_pipeline": "profile",
    "batch_sweep": "sweep", "run_batch_sweep": "sweep",
    "plan_buckets": "buckets", "padding_waste": "buckets", "observed_lengths": "buckets",
    "precision_report": "precision", "compare_outputs": "precision", "compare_tokenizers": "preprocess",
    "read_lines": "data", "load_texts": "data", "DEFAULT_DATA": "data",
    "device_for": "sim", "run_ladder": "ladder", "LadderSettings": "ladder",
    # bring your own: data in any format, a model folder or factory, a service watched from outside, your device
    "read_inputs": "data", "resolve_model": "bring_your_own", "save_tiny_bert": "bring_your_own",
    "model_sweep": "bring_your_own", "calibrate_device": "bring_your_own",
    "watch_service": ("watch", "watch"), "WatchResult": "watch", "ServiceProcess": "watch",
}
__all__ += sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tuning' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
