"""The tiers' clock (tests/tiers.py): each test's time in its tier, the tiers against their budgets."""

from types import SimpleNamespace

import pytest

from tests import tiers


@pytest.mark.parametrize("marks, tier", [
    (set(), "fast"), ({"slow"}, "slow"), ({"slow", "thirdparty"}, "thirdparty"), ({"browser", "thirdparty"}, "browser"),
    ({"notebooks", "slow"}, "notebooks"), ({"test_x", "tests/test_a.py"}, "fast"),
])
def test_a_test_s_tier_is_its_first_mark_in_the_readme_s_order(marks, tier):
    assert tiers.tier_of(marks) == tier


class Terminal:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def test_a_tier_over_its_budget_is_named_with_its_slowest_tests(monkeypatch, tmp_path):
    monkeypatch.setattr(tiers, "BUDGETS_S", {"fast": 10.0, "slow": 100.0})
    monkeypatch.setattr(tiers, "ARTIFACT", tmp_path / "tiers.json")
    clock = tiers.TierClock()
    for nodeid, marks, when, seconds in [("a", {}, "setup", 1.0), ("a", {}, "call", 6.0), ("b", {}, "call", 5.0),
                                         ("c", {"slow": 1}, "call", 40.0)]:
        clock.pytest_runtest_logreport(SimpleNamespace(keywords={nodeid: 1, **marks}, nodeid=nodeid, when=when,
                                                       duration=seconds))
    fast, slow = clock.rows()
    assert (fast["seconds"], fast["tests"], fast["over"]) == (12.0, 2, True)
    assert [s["test"] for s in fast["slowest"]] == ["a", "b"] and not slow["over"]
    term = Terminal()
    clock.pytest_terminal_summary(term)
    assert any("fast" in line and "OVER BUDGET by 2 s" in line for line in term.lines)
    assert any(line.strip().endswith("7.0 s  a") for line in term.lines)
    assert not any("slow" in line and "OVER" in line for line in term.lines)
    assert (tmp_path / "tiers.json").exists()


def test_the_readme_s_budgets_are_the_clock_s():
    """tests/README.md's table states the budgets the clock prints against: one place decides, the other says it."""
    from pathlib import Path

    table = (Path(__file__).parent / "README.md").read_text().split("## Tiers and their budgets", 1)[1]
    rows = {cells[1].strip(): cells[-2].strip() for line in table.splitlines()
            if line.startswith("| ") and len(cells := line.split("|")) > 4}
    assert {tier: rows[tier] for tier in tiers.BUDGETS_S} == {t: f"{b:.0f} s" for t, b in tiers.BUDGETS_S.items()}
    assert rows["all"].startswith(f"{sum(tiers.BUDGETS_S.values()):,.0f} s")


def test_a_report_s_marks_survive_the_trip_from_an_xdist_worker():
    """The clock sums on the controller, from reports the workers send as JSON: their keywords must come along."""
    from _pytest.reports import TestReport

    sent = TestReport("tests/test_x.py::test_y", ("tests/test_x.py", 1, "test_y"), {"slow": 1, "test_y": 1},
                      "passed", None, "call", duration=2.5)
    received = TestReport._from_json(sent._to_json())
    clock = tiers.TierClock()
    clock.pytest_runtest_logreport(received)
    assert dict(clock.seconds) == {"slow": 2.5}
