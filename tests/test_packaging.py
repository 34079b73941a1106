import re
import shlex
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _names(specs):
    return {re.split(r"[<>=!~ \[]", s.strip(), maxsplit=1)[0].lower() for s in specs}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"] + project["optional-dependencies"]["test"])
    pip_lines = [line.strip()[2:] for line in (ROOT / "environment.yml").read_text().splitlines()
                 if line.strip().startswith("- ") and line.startswith("      ")]
    listed = _names(p for p in pip_lines if not p.startswith("-e"))
    assert declared == listed, f"only in pyproject: {declared - listed}; only in environment.yml: {listed - declared}"
    specs = {s.replace(" ", "") for s in project["dependencies"] + project["optional-dependencies"]["test"]}
    assert specs == {p.replace(" ", "") for p in pip_lines if not p.startswith("-e")}


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    first = [line for line in blocks[0].splitlines() if line.strip() and not line.startswith("#")]
    assert len(first) == 2, first
    test_command = first[1].split("&&")[-1].strip()
    assert _runs(test_command, (ROOT / ".ci" / "run").read_text()), test_command


def _runs(command: str, script: str) -> bool:
    """Whether a line of the shell ``script`` is ``command`` (with its words as the shell splits them), not a
    comment that mentions it."""
    wanted = shlex.split(command)
    return any(shlex.split(line, comments=True) == wanted for line in script.splitlines())


def test_a_commented_out_command_is_not_run():
    assert _runs("python -m pytest -q", "set -e\n  python -m pytest -q  # the README's\n")
    assert not _runs("python -m pytest -q", "# python -m pytest -q\necho skipped\n")
    assert not _runs("python -m pytest -q", "echo 'python -m pytest -q'\n")


def test_package_imports_without_plotly_or_widgets():
    import subprocess
    import sys

    code = ("import sys, tuning, tuning.offline.pipeline, tuning.runtime.model, tuning.runtime.engine; "
            "bad = [m for m in ('plotly', 'ipywidgets') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
