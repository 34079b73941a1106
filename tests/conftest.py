import json
import os
from pathlib import Path

import pytest

from tuning.base.assets import DEFAULT_DATA

# For the whole run: the Rust tokenizer stays single-threaded in this process, so a
# DataLoader worker forked later cannot inherit its thread pool mid-use (HF tokenizers' fork deadlock). Without it,
# `pytest tests` alone hung in test_tokenizer_threads_are_turned_off_in_workers_only[true].
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
def notebook_runs():
    """Each notebook executed once per session, on first request (tests/notebook_runs.py)."""
    from tests.notebook_runs import Runs

    return Runs()
