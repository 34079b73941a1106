"""The test tiers of ``tests/README.md`` and their budgets, checked on every run.

A test's tier comes from its marks, in the order the README's selections exclude them: browser, notebooks,
thirdparty, slow, else fast. A tier's time is the test time its tests took in this run (setup, call and teardown,
summed over the xdist workers), the figure a run can measure for each tier whatever runs beside it; the whole
run's wall time is pytest's own last line. At the end of a run the terminal lists each tier's time against its
budget and names the tiers over it, with their slowest tests.

Why printed and not failed: a timed assertion fails on a loaded machine and passes on a fast one, so a budget
enforced as a test failure depends on the scheduler; the tests of this package never do (tests/README.md).
The run's figures are written to ``test-artifacts/tiers.json`` for a CI step or a person to read.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# seconds of test time a tier may take in one run of the whole suite on the CI kind of machine (2 cores, so two
# xdist workers): together 1,560 s, about 13 minutes of pytest, so that `.ci/run` with its install stays in 15
BUDGETS_S = {"fast": 330.0, "notebooks": 210.0, "browser": 210.0, "thirdparty": 390.0, "slow": 420.0}
ORDER = ("browser", "notebooks", "thirdparty", "slow")  # the first mark a test carries names its tier
SLOWEST = 3  # tests named under a tier over its budget
ARTIFACT = Path(__file__).resolve().parents[1] / "test-artifacts" / "tiers.json"


def tier_of(marks: set[str]) -> str:
    """The tier a test with these marks (keywords) is in."""
    return next((name for name in ORDER if name in marks), "fast")


class TierClock:
    """A pytest plugin that sums each test's time into its tier (on the xdist controller, from the reports the
    workers send) and prints the tiers against their budgets at the end."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @property
    def seconds(self) -> dict[str, float]:
        """Each tier's test time so far."""
        return {tier: sum(times.values()) for tier, times in self.tests.items()}

    def pytest_runtest_logreport(self, report) -> None:
        self.tests[tier_of(set(report.keywords))][report.nodeid] += report.duration

    def rows(self) -> list[dict]:
        """Each tier's time, budget and slowest tests."""
        out, seconds = [], self.seconds
        for tier, budget in BUDGETS_S.items():
            spent = seconds.get(tier, 0.0)
            slowest = sorted(self.tests.get(tier, {}).items(), key=lambda kv: -kv[1])[:SLOWEST]
            out.append({"tier": tier, "seconds": round(spent, 1), "budget_s": budget, "over": spent > budget,
                        "tests": len(self.tests.get(tier, {})),
                        "slowest": [{"test": t, "seconds": round(s, 1)} for t, s in slowest]})
        return out

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        rows = self.rows()
        terminalreporter.section("test time by tier (budgets: tests/tiers.py)")
        for r in rows:
            if not r["tests"]:
                continue
            flag = f"  OVER BUDGET by {r['seconds'] - r['budget_s']:.0f} s" if r["over"] else ""
            terminalreporter.write_line(f"{r['tier']:<11} {r['tests']:>5} tests {r['seconds']:>8.1f} s of "
                                        f"{r['budget_s']:.0f} s{flag}")
            if r["over"]:
                for s in r["slowest"]:
                    terminalreporter.write_line(f"            {s['seconds']:>8.1f} s  {s['test']}")
        ARTIFACT.parent.mkdir(exist_ok=True)
        ARTIFACT.write_text(json.dumps(rows, indent=1) + "\n")
