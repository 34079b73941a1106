import json
import re

import numpy as np
import pytest

from tuning.inputs.readers import parse_line, read_records
from tuning.inputs.records import Record, RecordError


def test_shipped_records_are_long_tailed_and_varied(shipped_lines):
    records = [json.loads(line) for line in shipped_lines]
    assert len(records) >= 2000
    words = np.array([len(r["body"].split()) for r in records])
    assert 20 <= np.median(words) <= 40
    assert np.percentile(words, 99) > 200
    texts = [r["title"] + r["body"] for r in records]
    assert any(re.search(r"[\u4e00-\u9fff]", t) for t in texts), "some CJK"
    assert any(re.search(r"[éèüñøå]", t, re.I) for t in texts), "some accents"
    assert any(re.search(r"[\U0001F300-\U0001FAFF]", t) for t in texts), "some emoji"
    assert len({r["id"] for r in records}) == len(records)


def test_generator_is_seeded(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "data" / "make_records.py"
    out = tmp_path / "r.jsonl"
    subprocess.run([sys.executable, str(script), "--n", "2400", "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == script.with_name("records.jsonl").read_bytes()


@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "bad JSON"),
    (b"", "empty line"),
    (b"[1]", "expected a JSON object"),
    (b'{"id": "a", "title": "t", "category": "c", "attributes": {}}', "missing field 'body'"),
    (b'{"id": "a", "title": "t", "category": "c", "attributes": [], "body": "b"}', "field 'attributes' must be dict"),
    (b'{"id": 7, "title": "t", "category": "c", "attributes": {}, "body": "b"}', "field 'id' must be str"),
    (b'{"id": "a", "title": " ", "category": "c", "attributes": {}, "body": ""}', "empty text"),
    (b'{"id": "a", "title": "t", "category": "c", "attributes": {"k": [1]}, "body": "b"}', "attribute 'k'"),
    (b'{"id": "a", "title": "caf\xe9"}', "invalid UTF-8"),
])
def test_bad_lines_become_errors_with_reason(raw, needle):
    out = parse_line(raw, 7)
    assert isinstance(out, RecordError) and out.line == 7 and needle in out.reason


def test_every_line_gets_one_outcome(messy_file):
    out = read_records(messy_file)
    assert len(out) == len(messy_file.read_bytes().splitlines())
    errors = [o for o in out if isinstance(o, RecordError)]
    assert len(errors) == 7 and [e.line for e in errors] == [6, 7, 8, 9, 17, 18, 19]
    assert all(isinstance(o, Record) for o in out if not isinstance(o, RecordError))


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data"):
        read_records(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="limit=0"):
        read_records(limit=0)


def test_demo_records_are_one_file_shipped_in_the_package():
    from pathlib import Path

    from tuning.base.assets import DEFAULT_DATA

    root = Path(__file__).resolve().parent.parent
    assert DEFAULT_DATA.parent == root / "tuning" / "assets", "package data, found from any directory"
    linked = root / "data" / "records.jsonl"  # a link in the source tree; a copy where links are not supported
    assert linked.resolve() == DEFAULT_DATA or linked.read_bytes() == DEFAULT_DATA.read_bytes()
