"""The README is a front page and the docs build: ``mkdocs build --strict`` (a broken link or anchor fails), the
generated pages (``docs/cli.md``, ``docs/benchmarks.md``) equal a fresh generation, and the README keeps its
limits (issue 51): under 250 lines, no paragraph over 100 words, and in its first 60 lines the demo command, the
test command CI runs, a command for your own service with its page, and how long the demo takes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

DEMO = "python -m tuning investigate --quick"
TEST_COMMAND = "pip install torch==2.13.0 -e '.[test]' && python -m pytest -q"  # .ci/run runs this; keep it exact
OWN_SERVICE = ("python -m tuning investigate --url", "python -m tuning investigate --server", "--cmd",
               "python -m tuning watch --url")
MAX_LINES = 250
MAX_WORDS = 100
FRONT = 60


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prose(lines: list[str]) -> list[list[str]]:
    """The README's paragraphs: blocks of text between blank lines, outside code fences, headings and tables; a
    list item is a paragraph of its own."""
    paragraphs: list[list[str]] = []
    current: list[str] = []
    fence = False

    def close() -> None:
        nonlocal current
        if current:
            paragraphs.append(current)
        current = []

    for line in lines:
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fence = not fence
            continue
        if fence or stripped.startswith(("#", "|", "![")):
            close()
            continue
        if not stripped:
            close()
            continue
        if re.match(r"^\s*([-*]|\d+\.)\s", line):
            close()
        current.append(stripped)
    close()
    return paragraphs


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc both make it (lower case, punctuation dropped, spaces -> -)."""
    text = re.sub(r"[`*_]{1,2}(?=\w)|(?<=\w)[`*]{1,2}", "", heading.strip().lower())
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s+", "-", text.strip())


def test_readme_is_short_and_its_paragraphs_are_short():
    lines = README.read_text().splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines; keep it under {MAX_LINES} (the rest: docs/)"
    long = [(len(" ".join(p).split()), p[0][:70]) for p in _prose(lines) if len(" ".join(p).split()) > MAX_WORDS]
    assert not long, f"README paragraphs over {MAX_WORDS} words: {long}"


def test_readme_first_lines_hold_the_demo_the_tests_your_service_and_the_run_time():
    front = "\n".join(README.read_text().splitlines()[:FRONT])
    assert DEMO in front
    assert TEST_COMMAND in front, "the README's test command is what .ci/run runs; keep it exactly"
    assert any(command in front for command in OWN_SERVICE), "a command for your own service"
    assert "docs/your-service.md" in front
    assert re.search(r"\d+(-\d+)? ?(minutes|min|s)\b", front) and re.search(r"\d+-core", front), \
        "how long the demo takes, and on which machine"


def test_readme_keeps_two_set_up_commands():
    installs = [line for line in README.read_text().splitlines() if line.startswith("pip install")]
    assert installs == ["pip install torch==2.13.0 -e . && python -m tuning investigate --quick", TEST_COMMAND]


def test_readme_figures_are_links():
    """A measured figure (a number with a unit of time, rate or size, or a percentage) sits in a paragraph that
    links to where it is recorded."""
    unit = r"\b\d[\d,.]*(-\d[\d,.]*)?\s?(ms|us|s|seconds|minutes|req/s|texts/s|qps|MB|GB|x)\b|\d%"
    for paragraph in _prose(README.read_text().splitlines()):
        text = re.sub(r"`[^`]*`", "", " ".join(paragraph))
        if re.search(unit, text):
            assert re.search(r"\]\((docs|bench)/", text), f"a figure without a link to its result: {text[:120]}"


def test_readme_links_resolve():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor and path.endswith(".md"):
            headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", (ROOT / path).read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"README links to {target}: no such heading"


def test_the_report_screenshot_is_small():
    image = DOCS / "img" / "report.png"
    assert image.is_file() and image.stat().st_size < 400_000


def test_the_cli_reference_is_generated_from_the_parser():
    assert (DOCS / "cli.md").read_text() == _script("gen_cli").render(), \
        "docs/cli.md is out of date: run python docs/gen_cli.py"


def test_the_benchmarks_page_is_generated_from_the_results():
    assert (DOCS / "benchmarks.md").read_text() == _script("gen_benchmarks").render(), \
        "docs/benchmarks.md is out of date: run python docs/gen_benchmarks.py"


def test_every_result_says_its_machine_and_simulated_ones_say_so():
    gen = _script("gen_benchmarks")
    page = (DOCS / "benchmarks.md").read_text()
    for path in gen.result_files():
        name = gen.name_of(path)
        section = page.split(f"\n### {name}\n", 1)[1].split("\n### ", 1)[0]
        assert "\nmachine: " in section, name
        doc = gen.load(path)
        if gen.machine_of(doc) is None:
            assert "machine: not recorded" in section, name
        if doc.get("simulated") is True or "SIMULATED" in str(doc.get("what", "")):
            label = next(line for line in section.splitlines() if line.startswith("`bench/results/"))
            assert "Figures: " in label and "**SIMULATED**" in label.split("Figures: ", 1)[1], name


def test_the_machine_block_is_read_in_every_form_the_benches_wrote():
    gen = _script("gen_benchmarks")
    canonical = {"cpu": {"model": "Some CPU", "flags": {"avx2": True, "amx_bf16": False}, "native_bf16": False},
                 "cores_logical": 4, "torch_intra_op_threads": 4, "gpu": None, "torch": "2.13.0+cpu"}
    assert gen.machine_text(gen.machine_of({"machine": canonical})) == \
        "machine: Some CPU (avx2; no native bf16); 4 cores; torch threads: 4; no GPU; torch 2.13.0+cpu"
    old = gen.machine_of({"machine": {"python": "3.11.7", "torch": "t", "cpus": 2, "torch_threads": 2, "cuda": None}})
    assert old["cores_logical"] == 2 and old["torch_intra_op_threads"] == 2 and old["gpu"] is None
    host = gen.machine_of({"host": {"cpus": 2, "machine": "x86_64", "python": "3.11.7", "torch": "t"}})
    assert host["cores_logical"] == 2 and host["cpu"] == {"arch": "x86_64"}
    env = gen.machine_of({"env": {"device": "cuda", "name": "NVIDIA H200", "cuda": "13.0", "torch": "t"}})
    assert gen.machine_text(env) == "machine: CPU not recorded; GPU NVIDIA H200 (CUDA 13.0); torch t"
    assert gen.machine_text(gen.machine_of({"what": "an old result"})) == "machine: not recorded"


def test_mkdocs_build_strict(tmp_path):
    """The site builds with --strict: a page missing from the nav's files, a broken link or a missing anchor fails."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs-material is not installed (it is in the test extra)")
        pytest.skip("mkdocs-material is not installed (pip install mkdocs-material)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
