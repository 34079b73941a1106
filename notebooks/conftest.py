"""nbval settings for the workbook's notebooks (``python -m pytest`` runs them with ``--nbval-lax``).

- ``TUNING_QUICK=1`` before any kernel starts, so each ``parameters`` cell picks small sizes
  (set it to ``0`` yourself for the full sizes);
- the kernel runs in this Python environment (``--nbval-current-env``) unless a kernel is named;
- volatile outputs are never compared: plotly figures (JSON and HTML), widget views, scripts;
- the sanitize file beside this one masks timings, addresses and dates in any compared output.
"""

import os
from pathlib import Path

os.environ.setdefault("TUNING_QUICK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SANITIZE = Path(__file__).with_name("sanitize.cfg")
VOLATILE = ("application/vnd.plotly.v1+json", "text/html", "application/javascript",
            "application/vnd.jupyter.widget-view+json", "stderr")


def pytest_collectstart(collector):
    if collector.path is None or collector.path.suffix != ".ipynb":
        return
    option = collector.config.option
    if getattr(option, "nbval_sanitize_with", None) is None:
        option.nbval_sanitize_with = str(SANITIZE)
    if not getattr(option, "nbval_kernel_name", None):
        option.nbval_current_env = True
    collector.skip_compare = tuple(collector.skip_compare) + VOLATILE
