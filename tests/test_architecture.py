"""The architecture is code that CI reads: the rooms' import contracts (import-linter), lint (ruff), no import
circle, no private name imported across modules, and only the faces and the one config at the top level."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tuning"
TOP_LEVEL = {"__init__.py", "__main__.py", "knobs.py", "viz.py", "widgets.py"}


def _tool(name: str) -> list[str]:
    exe = shutil.which(name) or str(Path(sys.executable).with_name(name))
    assert Path(exe).exists(), f"{name} is missing: pip install -e '.[test]'"
    return [exe]


def test_import_contracts_hold():
    run = subprocess.run(_tool("lint-imports") + ["--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_ruff_is_clean():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def _cycles(graph) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan), i.e. import circles."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def test_no_import_circle_even_for_type_hints():
    graph = grimp.build_graph("tuning")  # TYPE_CHECKING imports included: a circle for the reader all the same
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for m in ("p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b"]]


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "tuning"):
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_imported_across_modules():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(path)]
    assert found == [], "make these public (or keep them in one module): " + "; ".join(found)


def test_private_import_check_fails_on_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tuning.experiments.ladder import _secret\nfrom tuning.base import clock as _clock\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _private_imports(bad) == ["bad.py:1 tuning.experiments.ladder._secret"]
    finally:
        ROOT = saved


def test_only_the_faces_and_the_one_config_at_the_top_level():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL


@pytest.mark.parametrize("room", sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
def test_every_room_says_what_it_is_for(room):
    doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc) > 40, f"tuning/{room}/__init__.py needs a docstring saying what the room holds"
