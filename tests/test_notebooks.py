"""The seven notebooks run top to bottom in quick mode, once per test session (``tests/notebook_runs.py``):
01-04 on this machine's real CPU (``TUNING_DEVICE=cpu``), 05-07 on the notebooks' default device, the
simulated H200 (``TUNING_DEVICE=cuda`` runs them on a GPU). Their own asserts state the invariants; these
tests add that no cell failed, that each notebook printed its conclusions, and that no NVML warning reached
stderr without a GPU."""

import pytest

from tests.notebook_runs import NOTEBOOKS, ON_THE_REAL_CPU

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]


def test_seven_notebooks_run_here():
    assert [n[:2] for n in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_to_the_end_and_prints_its_conclusions(name, notebook_runs):
    run = notebook_runs(name)
    assert run.ok, f"{name} (TUNING_QUICK=1 TUNING_DEVICE={run.device}) failed:\n{run.failure}"
    import nbformat

    nb = nbformat.read(run.path, as_version=4)
    printed = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
               if out.output_type == "stream" and out.name == "stdout" and out.text.strip()]
    assert printed, f"{name}: the conclusions are printed"


@pytest.mark.parametrize("name", [n for n in NOTEBOOKS if n[:2] in ON_THE_REAL_CPU])
def test_no_nvml_warning_without_a_gpu(name, notebook_runs):
    run = notebook_runs(name)
    warned = [line for text in run.stderr for line in text.splitlines()
              if "RuntimeWarning" in line and ("NVML" in line or "GPU sampling" in line)]
    assert not warned, "NVML warned on stderr:\n" + "\n".join(warned)
