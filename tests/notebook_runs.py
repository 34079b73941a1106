"""Each notebook executed once per test run, and its executed copy kept for the tests that read it.

Why one executor of our own (nbclient, the library nbconvert and papermill execute with) rather than nbval:
a notebook must run once per test run, yet two kinds of test read it: ``tests/test_notebooks.py`` (it
runs to the end, its asserts hold, nothing warned on stderr) and the browser test (its saved charts draw in
JupyterLab). nbval executes a notebook inside its own collector and keeps nothing, so the browser had to run
the notebooks again; it also starts every kernel with the same environment, while 01-04 run on this machine's
real CPU and 05-07 on the default device (CUDA where present, else the simulated H200). Here each notebook is
executed on first request, written to ``test-artifacts/notebooks/NN-name.ipynb`` with its outputs, and every
later request in the run, from any xdist worker, reads that copy (tests/once.py).

Run one by hand the same way: ``TUNING_QUICK=1 TUNING_DEVICE=cpu jupyter execute notebooks/01-trend-sampling.ipynb``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9][0-9]-*.ipynb"))
ON_THE_REAL_CPU = ("01", "02", "03", "04")  # the host-side investigation, measured on this machine
CELL_TIMEOUT_S = 300  # one cell in quick mode; a cell past it fails its notebook
ARTIFACTS = Path(os.environ.get("TUNING_NOTEBOOK_ARTIFACTS", ROOT / "test-artifacts" / "notebooks"))


def device_for(name: str) -> str:
    """The ``TUNING_DEVICE`` a notebook runs with: "cpu" for 01-04, the notebooks' own default for 05-07 ("sim":
    the simulated H200; TUNING_DEVICE=cuda runs them on a GPU)."""
    return "cpu" if name[:2] in ON_THE_REAL_CPU else os.environ.get("TUNING_DEVICE", "sim")


@dataclass(frozen=True)
class Executed:
    """One notebook's run: its executed copy, the first failing cell (if any) and every stderr stream."""

    name: str
    device: str
    path: Path
    seconds: float
    failure: str = ""
    stderr: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failure


def checkout_env(**extra: str) -> dict[str, str]:
    """This process's environment for a kernel or a JupyterLab: quick mode, and ``tuning`` imported from this
    checkout whatever else is installed. Under xdist it carries the worker's ``OMP_NUM_THREADS=1``
    (tests/conftest.py): a kernel then runs torch on one thread, as the worker beside it does."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "TUNING_QUICK": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": pythonpath, **extra}


def kernel_env(name: str) -> dict[str, str]:
    return checkout_env(TUNING_DEVICE=device_for(name))


class ThisPythonKernel(KernelManager):
    """A kernel of this interpreter (as nbval's ``--nbval-current-env`` was), not whichever ``python3`` kernelspec
    is found first on the machine."""

    @property
    def kernel_spec(self) -> KernelSpec:
        from ipykernel.kernelspec import get_kernel_dict

        return KernelSpec(**get_kernel_dict())


def execute(name: str, out_dir: Path = ARTIFACTS) -> Executed:
    """Run ``notebooks/<name>.ipynb`` top to bottom in a fresh kernel of this environment (quick mode) and
    write the executed copy into ``out_dir``; a failing cell stops the run and is reported, not raised."""
    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    workdir = out_dir / f"{name}.run"  # what a notebook writes (a report, a checkpoint) stays out of the repo
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", kernel_manager_class=ThisPythonKernel,
                            resources={"metadata": {"path": str(workdir)}})
    failure = ""
    t0 = time.monotonic()
    try:
        client.execute(env=kernel_env(name))
    except CellTimeoutError as exc:
        failure = f"a cell ran past {CELL_TIMEOUT_S} s: {str(exc)[:1500]}"
    except CellExecutionError as exc:
        failure = str(exc)[-3000:]
    except Exception as exc:  # a kernel that died or never started: a failure of this notebook, said once
        failure = f"{type(exc).__name__}: {str(exc)[:1500]}"
    seconds = time.monotonic() - t0
    path = out_dir / f"{name}.ipynb"
    nbformat.write(nb, path)
    stderr = [out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
              if out.get("output_type") == "stream" and out.get("name") == "stderr"]
    return Executed(name, device_for(name), path, seconds, failure, stderr)


class Runs:
    """This run's executed notebooks: each executed by the first test (in any xdist worker) that asks."""

    def __init__(self, run: str, out_dir: Path = ARTIFACTS):
        self.run, self.out_dir = run, out_dir

    def __call__(self, name: str) -> Executed:
        from tests.once import once

        saved = once(f"notebook-{name}", self.run, self.out_dir, lambda: _as_json(execute(name, self.out_dir)))
        return Executed(**{**saved, "path": Path(saved["path"])})


def _as_json(run: Executed) -> dict:
    return {**dataclasses.asdict(run), "path": str(run.path)}
