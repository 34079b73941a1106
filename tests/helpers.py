"""Small stand-ins shared by the serving tests."""

import os
import time

import pytest
import torch


class TinyModel(torch.nn.Module):
    """A fast stand-in model: embeds the token count; optional delay and failure on chosen calls."""

    def __init__(self, delay_s: float = 0.0, fail_on_calls: tuple[int, ...] = ()):
        super().__init__()
        self.proj = torch.nn.Linear(1, 8)
        self.delay_s = delay_s
        self.fail_on_calls = set(fail_on_calls)
        self.calls = 0

    def forward(self, ids, mask):
        self.calls += 1
        if self.calls in self.fail_on_calls:
            raise RuntimeError(f"injected failure on call {self.calls}")
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.nn.functional.normalize(self.proj(mask.float().sum(1, keepdim=True)), dim=1)


def running_with(markers: list[str]) -> list[str]:
    """The command lines (cut to 160 characters) of live processes whose command line holds one of ``markers``:
    what a test or bench that started servers checks was left behind (a zombie is dead: it only waits to be
    reaped, so it does not count)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmd for m in markers):
            found.append(cmd[:160])
    return found


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, as .ci/run sets it): there, what the test extra installs is present."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def installed_by_test_extra(module: str):
    """``module`` imported, for a package that ``pip install -e '.[test]'`` installs (tests/test_helpers.py checks
    each name passed here against the extra's requirements). Missing, it skips the test on a machine set up by
    hand, and fails it in CI, where a skip would hide that the extra no longer installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"{module} is missing in CI ({exc}); pip install -e '.[test]' installs it", pytrace=False)
        pytest.skip(f"{module} is not installed ({exc}): pip install -e '.[test]'", allow_module_level=True)


def investigate_on(monkeypatch, tmp_path, measure, *extra, target_ms: float):
    """``python -m tuning investigate --quick`` through ``cli.main`` on a simulated ``measure`` (a world of
    tests.worlds), screening the tokenizer and precision only: the exit code, stdout, stderr and the output
    folder."""
    import contextlib
    import io

    from tuning import cli
    from tuning.experiments import investigate as inv_module

    class Closing:
        def __call__(self, knobs, **kw):
            return measure(knobs, **kw)

        def close(self):
            pass
    original = inv_module.run_ladder

    def run(*a, **k):
        k.update(factors=("tokenizer", "precision"), lengths=[12, 20, 31], accuracy=lambda d: {"bf16": 0.99999})
        return original(*a, **k)
    monkeypatch.setattr(inv_module, "run_ladder", run)
    monkeypatch.setattr(inv_module, "measure_for", lambda *a, **k: Closing())
    out = tmp_path / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["investigate", "--quick", "--limit", "20", "--device", "cpu", "--what-if", "none",
                         "--target-p99-ms", str(target_ms), "--out", str(out), *extra])
    return code, stdout.getvalue(), stderr.getvalue(), out


def short_tune_windows(monkeypatch) -> None:
    """``tune --quick`` with target windows of 400 arrivals or 4 s and holds of the claim of 6 s judged on 100
    arrivals at least: for tests of process handling and resume on real services, not of the engine's statistics
    (bench/keep_rule.py measures those, bench/hold_claims.py the holds)."""
    import dataclasses

    from tuning.experiments import defaults, tune, verify
    from tuning.experiments.engine import EngineSettings

    monkeypatch.setattr(defaults, "VERIFY_S_QUICK", 6.0)
    monkeypatch.setattr(verify, "MIN_JUDGED", 100)

    quick = tune.TuneSettings.quick()
    short = dataclasses.replace(quick, engine=dataclasses.replace(quick.engine, target_outcomes=400, target_max_s=4.0))
    monkeypatch.setattr(tune.TuneSettings, "quick", classmethod(lambda cls: short))
    assert isinstance(short.engine, EngineSettings)
