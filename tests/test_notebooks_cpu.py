"""Notebooks 01-04 run as plain scripts (``python notebooks/NN-name.py``) on the real CPU in quick mode,
from a temporary working directory: the percent scripts are real code, and DEVICE="cpu" measures this
machine (no simulated device), as CI runs them a second time."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_SCRIPTS = sorted(p for p in (ROOT / "notebooks").glob("0[1-4]-*.py"))
TIMEOUT_S = 900  # one notebook in quick mode on a busy 2-core machine takes a few minutes at most

pytestmark = [pytest.mark.slow]


@functools.lru_cache(maxsize=None)
def _run(script: Path, workdir: str) -> subprocess.CompletedProcess:
    """One run per script per session, shared by the tests below."""
    env = {**os.environ, "TUNING_QUICK": "1", "TUNING_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # this checkout's package
    return subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("notebooks-cpu"))


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def test_the_first_four_notebooks_are_here():
    assert [p.name[:2] for p in CPU_SCRIPTS] == ["01", "02", "03", "04"]


@pytest.mark.slow
@pytest.mark.parametrize("script", CPU_SCRIPTS, ids=lambda p: p.stem)
def test_runs_as_a_script_on_the_cpu(script, workdir):
    done = _run(script, workdir)
    assert done.returncode == 0, (f"python notebooks/{script.name} (TUNING_QUICK=1 TUNING_DEVICE=cpu) exited "
                                  f"{done.returncode}\n--- stdout (tail) ---\n{_tail(done.stdout)}\n"
                                  f"--- stderr (tail) ---\n{_tail(done.stderr)}")
    assert done.stdout.strip(), "the conclusions are printed"


@pytest.mark.slow
@pytest.mark.parametrize("script", CPU_SCRIPTS, ids=lambda p: p.stem)
def test_no_nvml_warning_without_a_gpu(script, workdir):
    done = _run(script, workdir)
    warned = [line for line in done.stderr.splitlines()
              if "RuntimeWarning" in line and ("NVML" in line or "GPU sampling" in line)]
    assert not warned, "NVML warned on stderr:\n" + "\n".join(warned)
