"""PyTriton's environment (tests/triton_env.py) sees the packages of the interpreter that runs the tests,
whether that interpreter is the system's or a venv's (the README's commands are usually run in a venv)."""

import subprocess
import sys

from tests import triton_env


def _in_env(folder, code: str) -> str:
    done = subprocess.run([str(triton_env.python_in(folder)), "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=folder)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_env_imports_this_interpreters_packages_from_the_same_files(tmp_path):
    folder = tmp_path / "env"
    triton_env.make_venv(folder, triton_env.interpreter_site_dirs())
    code = "import psutil, pytest, tuning; print(psutil.__file__, pytest.__file__, tuning.__file__)"
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert _in_env(folder, code) == here.stdout.strip()


def test_linked_site_runs_its_own_pth_files_and_comes_after_the_envs_own(tmp_path):
    linked, editable, folder = tmp_path / "linked", tmp_path / "editable", tmp_path / "env"
    linked.mkdir()
    editable.mkdir()
    (linked / "shadowed60.py").write_text("WHERE = 'linked'\n")
    (editable / "editable60.py").write_text("WHERE = 'editable'\n")
    (linked / "editable60.pth").write_text(f"{editable}\n")  # what an editable install leaves in a site
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    triton_env.link_site(folder, [str(linked)])
    (triton_env._own_site_packages(folder) / "shadowed60.py").write_text("WHERE = 'own'\n")

    assert _in_env(folder, "import shadowed60, editable60; print(shadowed60.WHERE, editable60.WHERE)") == "own editable"
