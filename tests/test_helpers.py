"""tests/helpers.py: CI fails, never skips, on a package the test extra installs."""

import importlib.metadata as md
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import installed_by_test_extra

TESTS = Path(__file__).resolve().parent


def test_a_missing_package_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_60 is missing in CI"):
        installed_by_test_extra("no_such_module_60")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no_such_module_60 is not installed"):
        installed_by_test_extra("no_such_module_60")
    assert installed_by_test_extra("json").dumps([]) == "[]"


def _test_extra_closure() -> set[str]:
    """Every distribution ``pip install -e '.[test]'`` installs: the project's requirements with the test extra,
    and theirs (with the extras they name), as installed here."""
    seen: set[str] = set()
    todo = [(req, "test") for req in md.requires("tuning") or []]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        todo += [(r, e) for r in requires for e in (sorted(req.extras) or [""])]
    return seen


def test_each_package_asked_for_as_installed_by_the_extra_is_installed_by_it():
    asked = sorted({name for path in TESTS.glob("test_*.py")
                    for name in re.findall(r'installed_by_test_extra\("([\w.]+)"\)', path.read_text())} -
                   {"no_such_module_60", "json"})
    assert asked, "no test asks for a package through installed_by_test_extra"
    closure = _test_extra_closure()
    owners = md.packages_distributions()
    for module in asked:
        installed_by_test_extra(module)
        dists = {canonicalize_name(d) for d in owners.get(module.split(".")[0], [])}
        assert dists & closure, f"{module} ({sorted(dists)}) is not installed by pip install -e '.[test]'"
