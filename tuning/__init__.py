"""tuning: a workbook for inference services that miss QPS and p99 while the accelerator idles.

Importing this package loads neither plotly nor ipywidgets (``tuning.viz`` and
``tuning.widgets`` do), so it runs on machines that only have torch and friends. The rooms
(subpackages) and the direction of their imports are in README's "Layout" section.
"""

from tuning.knobs import PRESETS, Knobs, preset

__all__ = ["Knobs", "PRESETS", "preset"]
__version__ = "0.1.0"

# The public face notebooks and scripts call, loaded on first use (``tuning.Pipeline``), so that
# importing ``tuning`` stays light and internal modules can move without breaking callers.
_LAZY = {
    "Pipeline": "offline.pipeline", "PipelineResult": "offline.pipeline", "run_pipeline": "offline.pipeline",
    "Server": "online.serve", "run_load": "load.generator", "LoadResult": "load.generator",
    "Recorder": "profile", "Profile": "profile", "profile_pipeline": "experiments.profiled",
    "batch_sweep": "experiments.sweeps", "run_batch_sweep": "experiments.sweeps", "load_sweep": "experiments.sweeps",
    "plan_buckets": "inputs.buckets", "padding_waste": "inputs.buckets", "observed_lengths": "inputs.buckets",
    "precision_report": "experiments.precision", "compare_outputs": "experiments.precision",
    "compare_tokenizers": "inputs.tokenize",
    "read_lines": "inputs.readers", "load_texts": "inputs.readers", "DEFAULT_DATA": "base.assets",
    "device_for": "sim.device", "run_ladder": "experiments.ladder", "LadderSettings": "experiments.ladder",
    "FACTOR_NAMES": "experiments.ladder", "EngineSettings": "experiments.engine",
    # one default for one idea: the p99 target and the minimum cosine every command and notebook uses
    "DEFAULT_TARGET_P99_MS": "experiments.ladder", "MIN_COSINE": "experiments.factors",
    "investigate": "present.investigation", "Investigation": "experiments.investigate",
    # the engine's pieces: the target check, the measurement seam
    "check_target": "experiments.capacity", "Capacity": "experiments.capacity", "Trial": "experiments.trial",
    "LoadMeasure": "experiments.measure",
    # bring your own: data in any format, a model folder or factory, a service watched from outside, your device
    "read_inputs": "inputs.readers", "resolve_model": "runtime.custom", "save_tiny_bert": "runtime.custom",
    "model_sweep": "experiments.sweeps", "calibrate_device": "sim.calibrate",
    "watch_service": ("experiments.watch", "watch"), "WatchResult": "experiments.watch",
    "ServiceProcess": "experiments.watch",
    # a service's own request schema (TEI, OpenAI, KServe v2, a body template) and its bodies
    "Api": "load.apis", "parse_template": "load.apis", "request_bodies": "load.apis",
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
