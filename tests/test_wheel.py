"""A non-editable install works from any directory: build the wheel, install it into a fresh venv
and run the CLI from a temporary folder.

The venv is made with ``--system-site-packages`` so that torch and the other dependencies (already
installed for the tests) are not downloaded again; the wheel itself is installed with ``--no-deps``
into the venv, whose site-packages come first, and the test checks that ``tuning`` is imported from
there and not from the source tree or an editable install. The wheel is built from a copy of the
source tree (no stale ``build/`` folder can leak files into it), without build isolation (offline).
"""

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", "investigation",
                                ".pytest_cache", ".ipynb_checkpoints", "notebooks", "bench", "tests")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "tuning-src"
    shutil.copytree(ROOT, src, ignore=IGNORE, symlinks=True)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(out), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (path,) = out.glob("tuning-*.whl")
    return path


def test_wheel_holds_every_module_and_asset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "tuning"
    expected = {p.relative_to(ROOT).as_posix() for p in package.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".json", ".txt", ".jsonl")}
    assert expected - names == set(), f"missing from the wheel: {sorted(expected - names)}"
    assert "tuning/assets/records.jsonl" in names, "the demo records ship inside the package"


@pytest.mark.slow
def test_installed_wheel_runs_from_any_directory(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the venv's own paths
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "--quiet",
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300, env=env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    imported = subprocess.run(
        [str(python), "-c", "import tuning, tuning.profile, tuning.sim, tuning.inputs.readers as d; "
                            "print(tuning.__file__); print(d.DEFAULT_DATA.is_file())"],
        cwd=elsewhere, capture_output=True, text=True, timeout=120, env=env)
    assert imported.returncode == 0, imported.stderr[-3000:]
    where = imported.stdout.split()
    assert where[0].startswith(str(env_dir)), f"tuning imported from {where[0]}, not from the venv"
    assert where[1] == "True"
    run = subprocess.run([str(python), "-m", "tuning", "run", "--limit", "20"], cwd=elsewhere,
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "requests 20" in run.stdout, run.stdout
