"""The notebooks as committed: no outputs, no execution counts, kernelspec python3, the house
style's skeleton, only the package's public face imported, and in step with notebooks/_build.py."""

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
ALLOWED_IMPORTS = {"os", "tuning", "tuning.viz", "tuning.widgets"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_seven_notebooks_in_the_investigations_order():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_the_python3_kernel(path):
    nb = _load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in _code(nb):
        assert cell.get("outputs") == [], f"{path.name}: a cell has outputs; rebuild with python notebooks/_build.py"
        assert cell.get("execution_count") is None, f"{path.name}: a cell has an execution count"
    assert path.read_text(encoding="utf-8").endswith("\n")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_house_style_skeleton(path):
    nb = _load(path)
    cells, code = nb["cells"], _code(nb)
    assert cells[0]["cell_type"] == "markdown" and "**Question.**" in _source(cells[0])
    assert "viz.setup_notebook()" in _source(code[0]), "the first code cell sets up offline plotly"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and "DEVICE =" in _source(tagged[0]) and "TUNING_QUICK" in _source(tagged[0])
    steps = [int(m) for c in cells if c["cell_type"] == "markdown" for m in re.findall(r"^## Step (\d+)", _source(c), re.M)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3
    assert any("assert " in _source(c) for c in code), "cells that state a fact assert it"
    last = _source(cells[-1])
    assert "## Takeaways" in last and "**Next:**" in last
    number = int(path.name[:2])
    if number < 6:
        assert f"({number + 1:02d}-" in last, "links to the next notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_imports_only_the_public_face(path):
    for cell in _code(_load(path)):
        for node in ast.walk(ast.parse(_source(cell))):
            if isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {f"{node.module}.{a.name}" if node.module == "tuning" else node.module for a in node.names}
            else:
                continue
            assert names <= ALLOWED_IMPORTS, f"{path.name} imports {names - ALLOWED_IMPORTS}"


def test_notebooks_match_their_generator():
    spec = importlib.util.spec_from_file_location("nb_build", ROOT / "notebooks" / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    import nbformat

    for name, cells in build.NOTEBOOKS.items():
        committed = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert committed == build.build(name, cells), f"{name}.ipynb differs from notebooks/_build.py: rebuild it"


def test_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README does not list {path.name}"
    assert "jupyter lab notebooks/" in readme
