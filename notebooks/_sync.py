"""Write each notebook ``NN-name.ipynb`` from its jupytext percent script ``NN-name.py``.

    python notebooks/_sync.py            # every pair
    python notebooks/_sync.py 02 04      # only those

The percent script is the source of truth: real code, linted and runnable (``python notebooks/NN-name.py``).
Edit it, then run this; or edit the notebook in Jupyter with jupytext installed (the pair is declared in
each script's header, ``formats: ipynb,py:percent``), which saves the script too, then run this. A notebook
edited without jupytext: ``jupytext --sync notebooks/NN-name.ipynb`` first (the newer file updates the
other), then this.

Why not ``jupytext --to ipynb`` alone: the script holds no cell ids, so each conversion gives every cell
a new random one (nbformat's default; ``--sync`` keeps the ids of the cells it can match, new cells still
get random ones). Here the ids are the cells' positions, ``NN-ii``, so the same script always gives the
same bytes and the test that the pairs are in sync (tests/test_notebooks_clean.py) compares bytes. The
notebook is written without outputs or execution counts, kernelspec ``python3`` (from the script's header).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    return sorted(HERE.glob("[0-9][0-9]-*.py"))


def notebook(script: Path):
    """The notebook of a percent script, its cells numbered ``NN-ii``."""
    nb = jupytext.read(script, fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        cell.id = f"{script.name[:2]}-{i:02d}"
    return nb


def notebook_text(script: Path) -> str:
    """The .ipynb file's exact text for a percent script (ending in a newline, as ``jupytext.write`` writes it)."""
    return jupytext.writes(notebook(script), fmt="ipynb").rstrip("\n") + "\n"


def main(argv: list[str]) -> None:
    for script in scripts():
        if argv and not any(script.name.startswith(a) for a in argv):
            continue
        path, text = script.with_suffix(".ipynb"), notebook_text(script)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main(sys.argv[1:])
