import json
import os
from pathlib import Path

import pytest

# Under pytest-xdist each worker is given one core's worth of torch threads (torch reads OMP_NUM_THREADS when it
# is imported, and tuning.base.machine.usable_cores() counts it): two workers of two intra-op threads each on a
# 2-core machine kept four spinning threads on two cores, and the model-bound tests ran several times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from tuning.base.assets import DEFAULT_DATA  # noqa: E402  (after the thread count torch reads on import)

# For the whole run: the Rust tokenizer stays single-threaded in this process, so a
# DataLoader worker forked later cannot inherit its thread pool mid-use (HF tokenizers' fork deadlock). Without it,
# `pytest tests` alone hung in test_tokenizer_threads_are_turned_off_in_workers_only[true].
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def no_sweeps_read_before(monkeypatch):
    """Reading sweep files leaves what they recorded in ``tuning.sim.calibrate`` (the sweeping host's dispatch,
    the card's memory and name), which a later ``calibrate()`` in the same process uses before its own
    measurement: a calibration test that ran after a sweep-reading one fitted a launch cost of 0 instead of
    7 us. Each test starts with none read."""
    import sys

    calibrate = sys.modules.get("tuning.sim.calibrate")
    if calibrate is not None:
        for name in ("LAST_DEVICE_MEMORY", "LAST_DEVICE_NAME", "LAST_HOST_DISPATCH", "LAST_HOST_DISPATCH_KIND"):
            monkeypatch.setattr(calibrate, name, None)


@pytest.fixture(scope="session")
def shipped_lines() -> list[bytes]:
    return DEFAULT_DATA.read_bytes().splitlines()


@pytest.fixture
def messy_file(tmp_path: Path, shipped_lines) -> Path:
    """20 good lines with one of each kind of malformed line mixed in."""
    good = shipped_lines[:20]
    record = json.loads(good[0])
    bad = [
        b"{not json",
        json.dumps({k: v for k, v in record.items() if k != "body"}).encode(),
        json.dumps({**record, "attributes": ["a", "b"]}).encode(),
        json.dumps({**record, "title": "  ", "body": ""}).encode(),
        b'{"id": "x", "title": "caf\xe9"}',  # latin-1 byte: invalid UTF-8
        b"",
        b"[1, 2, 3]",
    ]
    lines = good[:5] + bad[:4] + good[5:12] + bad[4:] + good[12:]
    path = tmp_path / "messy.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="session")
def notebook_runs(request):
    """Each notebook executed once per run, on first request, in whichever xdist worker asks first
    (tests/notebook_runs.py, tests/once.py)."""
    from tests.notebook_runs import Runs
    from tests.once import run_id

    return Runs(run_id(request.config))


@pytest.fixture(scope="session")
def quick_investigation(request, tmp_path_factory):
    """One ``investigate --quick --json`` on a tiny slice, once per run (tests/investigation_run.py): its exit code,
    stdout and output folder, read by the investigate tests and the browser's report test."""
    from tests.investigation_run import quick_investigation as make
    from tests.once import once, run_id, shared_folder

    folder = shared_folder(tmp_path_factory) / "investigation"
    code, stdout, out = once("investigate", run_id(request.config), folder, lambda: make(folder))
    return code, stdout, Path(out)


def pytest_collection_modifyitems(config, items):
    """The slow tests first (stable order otherwise): with two workers, a long test started last would run alone
    at the end while the other worker idles; started first, the short ones fill the other worker around it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    """Each tier's test time against its budget at the end of a run (tests/tiers.py), summed where the reports
    meet: the xdist controller, or the one process without xdist."""
    if not hasattr(config, "workerinput"):
        from tests.tiers import TierClock

        config.pluginmanager.register(TierClock(), "tier-clock")
