"""PyTriton's own virtual environment, built once and cached, for the tests that start a real Triton.

PyTriton (``nvidia-pytriton``, which ships a Triton Inference Server) pins ``numpy<2``; this project runs on
numpy 2 (pandas 3 needs it), so PyTriton cannot live in the test interpreter. The environment here is
a ``python -m venv`` whose site names the test interpreter's own site-packages (:func:`link_site`), plus
``pip install nvidia-pytriton 'numpy<2'``: torch, tokenizers, safetensors and this package come from the
interpreter that runs the tests (torch built against numpy 2 imports and converts arrays with numpy 1.x), so
nothing heavy is downloaded again. ``--system-site-packages`` would not do: from an interpreter that is itself
a venv (as the README's commands are usually run) it gives the *base* interpreter's site, without the venv's
packages.

It is cached under ``$TUNING_TEST_CACHE`` (default ``~/.cache/tuning-tests``) in a folder named by a hash of
the requirements and the interpreter, so changing either builds a new one. A build ends by writing a marker;
a folder without it, or whose interpreter no longer imports PyTriton with numpy 1.x, is built again. The
build runs under a file lock: the xdist workers that ask at once wait for the first one's build.

Use the ``pytriton_python`` fixture (import it into the test module). Without a network the build fails: the
tests skip here with pip's last words, and fail in CI (``CI=true``), as the browser tests do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import in_ci

REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy<2")  # 0.7.0 ships Triton 2.51 (the version #50 was tried on)
BUILD_TIMEOUT_S = 900  # pip's download of PyTriton's wheel (about 55 MB) on a slow link, and the venv's own pip
CHECK_TIMEOUT_S = 120  # importing torch on a busy 2-core machine
MARKER = "built.json"
SITE_LINK = "tuning-test-interpreter.pth"

# What the server script needs from the venv, with numpy 1.x: PyTriton itself, and the system site's torch,
# tokenizers and safetensors working beside that numpy (an array handed to torch and back).
FULL_CHECK = ("import numpy, pytriton.triton, tokenizers, safetensors, torch; "
              "assert numpy.__version__.startswith('1.'), numpy.__version__; "
              "assert torch.from_numpy(numpy.ones(2, dtype='float32')).numpy().sum() == 2")
QUICK_CHECK = "import numpy, pytriton.triton; assert numpy.__version__.startswith('1.'), numpy.__version__"


class TritonEnvUnavailable(RuntimeError):
    """The environment could not be built or does not work; the message says why."""


def cache_root() -> Path:
    """Where built environments are kept between runs."""
    return Path(os.environ.get("TUNING_TEST_CACHE") or Path.home() / ".cache" / "tuning-tests")


def env_dir() -> Path:
    """The folder for these requirements on this interpreter: another interpreter or pin gets its own."""
    key = json.dumps({"requirements": REQUIREMENTS, "python": sys.version, "base": sys.base_prefix,
                      "site": interpreter_site_dirs()})
    return cache_root() / f"pytriton-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def python_in(folder: Path) -> Path:
    return folder / "bin" / "python"


def interpreter_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests, whatever it is (system, venv, user site)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def make_venv(folder: Path, site_dirs: list[str]) -> None:
    """A venv at ``folder`` (with pip) that also sees ``site_dirs``, after its own site-packages."""
    _step([sys.executable, "-m", "venv", str(folder)], "python -m venv")
    link_site(folder, site_dirs)


def link_site(folder: Path, site_dirs: list[str]) -> Path:
    """Write a ``.pth`` file into the venv at ``folder`` that adds ``site_dirs`` as site folders.

    ``site.addsitedir`` (not a bare path line) so that their own ``.pth`` files run too: an editable install
    of this package is one. They are appended after the venv's own site-packages, so what the venv installs
    (numpy<2) wins over the same package in the test interpreter's site (numpy 2)."""
    own = _own_site_packages(folder)
    lines = [f"import site; site.addsitedir({d!r})" for d in site_dirs]
    link = own / SITE_LINK
    link.write_text("\n".join(lines) + "\n")
    return link


def _own_site_packages(folder: Path) -> Path:
    found = sorted((folder / "lib").glob("python*/site-packages"))
    if len(found) != 1:
        raise TritonEnvUnavailable(f"the venv {folder} has {len(found)} site-packages folders, expected one")
    return found[0]


def ensure_env() -> Path:
    """The environment's interpreter, built first if missing or broken. Raises :class:`TritonEnvUnavailable`."""
    from filelock import FileLock, Timeout

    folder = env_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(folder) + ".lock", timeout=BUILD_TIMEOUT_S + CHECK_TIMEOUT_S):
            if not _usable(folder):
                shutil.rmtree(folder, ignore_errors=True)
                _build(folder)
    except Timeout:
        raise TritonEnvUnavailable(f"another process held {folder}.lock for over {BUILD_TIMEOUT_S} s") from None
    return python_in(folder)


def build_record(folder: Path | None = None) -> dict:
    """What the marker says about a build (its requirements, its wall time), or ``{}`` when there is none."""
    try:
        return json.loads(((folder or env_dir()) / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _usable(folder: Path) -> bool:
    """Built to the end (the marker) and still importing PyTriton with numpy 1.x (a system update can break it)."""
    if build_record(folder).get("requirements") != list(REQUIREMENTS):
        return False
    return _run_check(folder, QUICK_CHECK) is None


def _build(folder: Path) -> None:
    started = time.perf_counter()
    make_venv(folder, interpreter_site_dirs())
    _step([str(python_in(folder)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
          "pip install " + " ".join(REQUIREMENTS))
    problem = _run_check(folder, FULL_CHECK)
    if problem:
        raise TritonEnvUnavailable(f"the built environment {folder} does not work: {problem}")
    record = {"requirements": list(REQUIREMENTS), "python": sys.version, "build_s": round(time.perf_counter() - started, 1)}
    (folder / MARKER).write_text(json.dumps(record))  # last: a build cut short leaves no marker and is redone


def _step(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TritonEnvUnavailable(f"{what} took over {BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise TritonEnvUnavailable(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")


def _run_check(folder: Path, code: str) -> str | None:
    """None when ``code`` runs in the environment's interpreter, else the reason it did not."""
    if not python_in(folder).exists():
        return f"{python_in(folder)} is missing"
    try:
        done = subprocess.run([str(python_in(folder)), "-c", code], capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT_S, cwd=folder)
    except subprocess.TimeoutExpired:
        return f"the import check took over {CHECK_TIMEOUT_S} s"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["no output"])[-1]
    return None


def unavailable(reason: str) -> None:
    """Skip here, fail in CI: CI has the network the build needs, so a failure there is a real one."""
    if in_ci():
        pytest.fail(f"PyTriton's environment cannot be built in CI: {reason}", pytrace=False)
    pytest.skip(f"PyTriton's environment is not available: {reason}")


@pytest.fixture(scope="session")
def pytriton_python() -> Path:
    """The interpreter of PyTriton's environment (built on first use, then cached across runs)."""
    pytest.importorskip("filelock")
    try:
        return ensure_env()
    except TritonEnvUnavailable as exc:
        unavailable(str(exc))
