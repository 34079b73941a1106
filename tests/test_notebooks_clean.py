"""The notebooks as committed: each ``notebooks/NN-name.ipynb`` in step with its jupytext percent script
``NN-name.py`` (the source of truth), no outputs, no execution counts, kernelspec python3, stable cell
ids, the house style's skeleton, only the package's public face imported, asserts that state facts
(never one run's speed), and scripts that ruff finds clean."""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.ipynb"))
SCRIPTS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.py"))
ALLOWED_IMPORTS = {"os", "tuning", "tuning.viz", "tuning.widgets"}
# What a measured speed is called in the notebooks: an assert on one of these compares one noisy run.
TIMING_NAMES = {"throughput_rps", "throughput", "qps", "qps_ratio", "gain", "gains", "speedup", "seconds",
                "per_batch_ms", "per_sample_ms", "p50_ms", "p99_ms", "ms", "model_busy", "device_busy"}
RUFF = [sys.executable, "-m", "ruff", "check", "--force-exclude"]  # the project's rules (pyproject.toml), these files named


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _sync_module():
    spec = importlib.util.spec_from_file_location("notebooks_sync", NOTEBOOK_DIR / "_sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fix(path: Path) -> str:
    return f"run: jupytext --sync notebooks/{path.stem}.py && python notebooks/_sync.py {path.name[:2]}"


def test_seven_notebooks_in_the_investigations_order():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


def test_every_notebook_has_its_percent_script():
    assert [p.stem for p in SCRIPTS] == [p.stem for p in NOTEBOOKS], "each notebooks/NN-name.ipynb pairs with NN-name.py"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_is_a_percent_script_paired_with_its_notebook(script):
    text = script.read_text(encoding="utf-8")
    header = text.split("\n# ---\n", 1)[0]
    assert text.startswith("# ---\n# jupyter:\n") and "formats: ipynb,py:percent" in header, (
        f"{script.name}: the jupytext header must pair it: jupytext --set-formats ipynb,py:percent notebooks/{script.name}")
    assert re.search(r"^# %% tags=\[\"parameters\"\]$", text, re.M), f"{script.name}: no `# %% tags=[\"parameters\"]` cell"
    assert "\n# %% [markdown]\n" in text and not re.search(r"^\s*[!%]", text, re.M), (
        f"{script.name}: no IPython-only syntax (! or %magic) in a script that runs as plain Python")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_in_sync_with_its_script(script):
    """The committed .ipynb is exactly what notebooks/_sync.py writes from the .py: same cells (type,
    source, tags), ids ``NN-ii``, no outputs, and byte for byte the same file."""
    sync = _sync_module()
    path = script.with_suffix(".ipynb")
    expected, committed = sync.notebook(script), _load(path)
    assert len(committed["cells"]) == len(expected.cells), (
        f"{path.name} has {len(committed['cells'])} cells, {script.name} {len(expected.cells)}; {_fix(path)}")
    for i, (want, got) in enumerate(zip(expected.cells, committed["cells"])):
        where = f"{path.name} cell {i} ({got.get('id')})"
        assert got["cell_type"] == want.cell_type, f"{where} is {got['cell_type']}, not {want.cell_type}; {_fix(path)}"
        assert _source(got) == want.source, f"{where} differs from {script.name}; {_fix(path)}"
        assert got.get("metadata", {}).get("tags", []) == want.metadata.get("tags", []), f"{where}: tags differ; {_fix(path)}"
        assert got.get("id") == want.id, f"{where}: the id should be {want.id} (stable ids); run: python notebooks/_sync.py"
    assert path.read_text(encoding="utf-8") == sync.notebook_text(script), (
        f"{path.name} is not what notebooks/_sync.py writes from {script.name} (metadata, outputs?); {_fix(path)}")


def test_sync_is_deterministic():
    """Regenerating a notebook from its script twice gives the same bytes (cell ids are positions, not random)."""
    sync = _sync_module()
    for script in SCRIPTS:
        assert sync.notebook_text(script) == sync.notebook_text(script)


def test_scripts_are_ruff_clean():
    files = [str(p.relative_to(ROOT)) for p in SCRIPTS] + ["notebooks/_sync.py"]
    done = subprocess.run(RUFF + files, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check notebooks/*.py\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_the_python3_kernel(path):
    nb = _load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in _code(nb):
        assert cell.get("outputs") == [], f"{path.name}: a cell has outputs; {_fix(path)}"
        assert cell.get("execution_count") is None, f"{path.name}: a cell has an execution count; {_fix(path)}"
    assert path.read_text(encoding="utf-8").endswith("\n")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_house_style_skeleton(path):
    nb = _load(path)
    cells, code = nb["cells"], _code(nb)
    assert cells[0]["cell_type"] == "markdown" and "**Question.**" in _source(cells[0])
    assert "viz.setup_notebook()" in _source(code[0]), "the first code cell sets up offline plotly"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and "DEVICE =" in _source(tagged[0]) and "TUNING_QUICK" in _source(tagged[0])
    assert 'os.environ.get("TUNING_DEVICE", "sim")' in _source(tagged[0])  # "auto" means the CPU without CUDA
    steps = [int(m) for c in cells if c["cell_type"] == "markdown" for m in re.findall(r"^## Step (\d+)", _source(c), re.M)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3
    assert any("assert " in _source(c) for c in code), "cells that state a fact assert it"
    last = _source(cells[-1])
    assert "## Takeaways" in last and "**Next:**" in last
    number = int(path.name[:2])
    if number < 7:
        assert f"({number + 1:02d}-" in last, "links to the next notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_asserts_state_facts_not_one_runs_speed(path):
    """An assert states an invariant (counts, shares, ids, cosines); a measured speed is printed with its
    context instead, since one run on a busy machine can go either way."""
    for cell in _code(_load(path)):
        for node in ast.walk(ast.parse(_source(cell))):
            if not isinstance(node, ast.Assert):
                continue
            used = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            used |= {n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            timing = used & TIMING_NAMES
            assert not timing, (f"{path.name}: `assert {ast.unparse(node.test)}` compares a measured speed ({timing}); "
                                "print it with its spread instead")


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


def test_the_docs_list_every_notebook_and_the_readme_points_there():
    """The front page stays short: the notebooks' table lives in docs/notebooks.md, which README links."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"`{path.stem}`" in page, f"docs/notebooks.md does not list {path.stem}"
    assert "docs/notebooks.md" in readme and "jupyter lab notebooks/" in readme
