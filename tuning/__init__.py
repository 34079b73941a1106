"""tuning: a workbook for inference services that miss QPS and p99 while the accelerator idles.

Importing this package loads neither plotly nor ipywidgets (``tuning.charts`` and
``tuning.widgets`` do), so it runs on machines that only have torch and friends.
"""

from .knobs import PRESETS, Knobs, preset

__all__ = ["Knobs", "PRESETS", "preset"]
__version__ = "0.1.0"
