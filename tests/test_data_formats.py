"""Bring your own data: record JSONL, JSONL with a text field, CSV/TSV, Parquet, plain text, a list of
strings or a pandas Series. Every row gets exactly one outcome; a bad row is an error outcome with its
line or row number and a reason, and the rest goes on."""

import csv
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.cli_run import run_cli
from tuning import preset
from tuning.inputs.readers import detect_format, load_texts, parse_line, read_inputs
from tuning.inputs.records import RecordError
from tuning.offline.pipeline import Pipeline

from .helpers import TinyModel

GOOD = ["a red kettle that whistles", "refund for order 1234, please", "café crème 咖啡 ☕", "router drops wifi at night"]


def _write_jsonl_text(path: Path, field: str = "text") -> dict[int, str]:
    lines = [json.dumps({field: GOOD[0]}), json.dumps({field: GOOD[1], "id": "q2"}), "{broken",
             json.dumps({"other": "no text here"}), json.dumps({field: "   "}), json.dumps({field: 7}),
             json.dumps({field: GOOD[2]}), json.dumps({field: GOOD[3]})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {3: "bad JSON", 4: f"missing field '{field}'", 5: f"field '{field}' is empty", 6: f"field '{field}' must be a string"}


def _write_csv(path: Path, delimiter: str = ",") -> dict[int, str]:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow(["id", "review", "stars"])
        w.writerow(["1", GOOD[0], "5"])
        w.writerow(["2", "", "1"])  # empty text
        w.writerow(["3", GOOD[1] + "\nsecond line, quoted", "4"])  # a quoted multi-line field is one row
        w.writerow(["4", "too", "many", "fields"])
        w.writerow(["5", GOOD[2], "3"])
        w.writerow(["6", GOOD[3], "2"])
    return {2: "empty text in column 'review'", 4: "expected 3 fields"}


def _write_parquet(path: Path) -> dict[int, str]:
    frame = pd.DataFrame({"id": [1, 2, 3, 4, 5, 6], "review": [GOOD[0], None, GOOD[1], "  ", GOOD[2], GOOD[3]]})
    frame.to_parquet(path)
    return {2: "missing value in column 'review'", 4: "empty text in column 'review'"}


def _write_text(path: Path) -> dict[int, str]:
    path.write_bytes(b"\n".join([GOOD[0].encode(), b"", GOOD[1].encode(), b"caf\xe9 latin-1", GOOD[2].encode(),
                                 GOOD[3].encode()]) + b"\n")
    return {2: "empty line", 4: "invalid UTF-8"}


FORMATS = {
    "jsonl-text": ("texts.jsonl", _write_jsonl_text, {}),
    "jsonl-custom-field": ("texts.jsonl", lambda p: _write_jsonl_text(p, "query"), {"text_field": "query"}),
    "csv": ("reviews.csv", _write_csv, {"text_column": "review"}),
    "tsv": ("reviews.tsv", lambda p: _write_csv(p, "\t"), {"text_column": "review"}),
    "parquet": ("reviews.parquet", _write_parquet, {"text_column": "review"}),
    "text": ("requests.txt", _write_text, {}),
}


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_gives_one_outcome_per_row_with_numbered_errors(name, tmp_path):
    filename, write, kwargs = FORMATS[name]
    path = tmp_path / filename
    bad = write(path)
    result = Pipeline(preset("baseline", batch_size=4), model=TinyModel()).run(path, **kwargs)  # 2 loader workers parse
    rows = len(result.requests)
    assert rows == result.ok + result.errors and result.ok == 4, result.summary()["error_reasons"]
    errors = {r.index: r.reason for r in result.requests if r.outcome == "error"}
    assert sorted(errors) == sorted(bad), errors
    for index, needle in bad.items():
        assert needle in errors[index], (index, errors[index])


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_feeds_the_load_inputs_and_texts(name, tmp_path):
    filename, write, kwargs = FORMATS[name]
    path = tmp_path / filename
    write(path)
    inputs = read_inputs(path, **kwargs)
    assert [i for i, _ in inputs] == list(range(1, len(inputs) + 1))
    assert len(load_texts(path, **kwargs)) == 4
    assert len(read_inputs(path, limit=2, **kwargs)) == 2


def test_limit_counts_rows(tmp_path):
    path = tmp_path / "r.csv"
    _write_csv(path)
    result = Pipeline(preset("tuned", dtype="fp32"), model=TinyModel()).run(path, limit=3, text_column="review")
    assert len(result.requests) == 3 and result.ok == 2


def test_a_text_line_without_the_record_schema_is_a_text():
    assert parse_line(b'{"text": "hello there"}', 1) == "hello there"
    assert parse_line(b'{"id": "r1", "text": "hello"}', 1) == "hello"
    err = parse_line(b'{"title": "a record missing fields"}', 3)  # has record keys: validated as a record
    assert isinstance(err, RecordError) and "missing field" in err.reason and err.line == 3
    assert parse_line(b'{"q": "x"}', 1, text_field="q") == "x"


def test_demo_records_still_parse_as_records(shipped_lines):
    from tuning.inputs.records import Record

    assert all(isinstance(parse_line(raw, i), Record) for i, raw in enumerate(shipped_lines[:50], 1))


@pytest.mark.parametrize("values", [
    ["one text", None, "", "two text", float("nan")],
    pd.Series(["one text", None, "", "two text", float("nan")], index=[10, 20, 30, 40, 50]),
])
def test_run_accepts_a_list_of_strings_or_a_series(values):
    result = Pipeline(preset("tuned", batch_size=2, dtype="fp32"), model=TinyModel()).run(values)
    assert result.ok == 2 and result.errors == 3 and len(result.requests) == 5
    errors = {r.index: r.reason for r in result.requests if r.outcome == "error"}
    assert errors == {2: "missing value", 3: "empty text", 5: "missing value"}


@pytest.mark.parametrize("path,kwargs,needle", [
    ("data.xlsx", {}, "--format"),
    ("data.csv", {"text_column": "nope"}, "--text-column 'nope'"),
    ("data.csv", {}, "--text-column"),
    ("data.csv", {"text_field": "review"}, "--text-column"),
    ("data.jsonl", {"text_column": "review"}, "--text-field"),
])
def test_bad_data_options_name_the_value_and_the_fix(tmp_path, path, kwargs, needle):
    target = tmp_path / path
    if target.suffix == ".csv":
        _write_csv(target)
    elif target.suffix == ".jsonl":
        _write_jsonl_text(target)
    else:
        target.write_text("x")
    with pytest.raises(ValueError, match=needle.replace("-", r"\-").replace("'", "'")):
        read_inputs(target, **kwargs)


def test_detect_format_by_extension_or_flag():
    assert [detect_format(p) for p in ("a.jsonl", "a.ndjson", "a.csv", "a.tsv", "a.parquet", "a.txt")] == \
        ["jsonl", "jsonl", "csv", "tsv", "parquet", "text"]
    assert detect_format("a.log", "text") == "text"
    with pytest.raises(ValueError, match="format='xml'"):
        detect_format("a.txt", "xml")


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "r.parquet"
    _write_parquet(path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ModuleNotFoundError, match="pip install pyarrow"):
        read_inputs(path, text_column="review")


@pytest.mark.parametrize("name", ["jsonl-text", "csv", "parquet", "text"])
def test_cli_run_takes_each_format(name, tmp_path):
    filename, write, kwargs = FORMATS[name]
    path = tmp_path / filename
    write(path)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]
    out = run_cli("run", "--preset", "tuned", "--data", str(path), *flags,
                  "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] == 4 and summary["ok"] + summary["errors"] == summary["requests"]


def test_cli_bad_text_column_exits_2_with_one_line(tmp_path, capfd):
    path = tmp_path / "r.csv"
    _write_csv(path)
    out = run_cli("run", "--data", str(path), "--text-column", "body", capfd=capfd)
    assert out.returncode == 2 and "--text-column 'body'" in out.stderr and "review" in out.stderr, out.stderr
