"""Input data: the record schema, and every file format a user brings, read so that a bad line or row
is an outcome (an error with its number and reason), never a crash.

Formats (by extension, or named with ``format=``/``--format``):

* ``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``): one JSON object per line. A line with the record
  schema (``title``, ``category``, ``attributes``, ``body``) is a :class:`Record`; any other line is
  a text, taken from its ``text`` field (or the field named by ``text_field``/``--text-field``);
* ``csv`` / ``tsv``: a header row, then one request per row, the text in the column named by
  ``text_column``/``--text-column`` (default: ``text``, or the only column). Rows count from 1 after
  the header; a quoted field may span lines;
* ``parquet``: the same, with pyarrow;
* ``text`` (``.txt``): one request per line.

Line and row numbers are 1-based; they are the index of each request's outcome.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from tuning.base.assets import DEFAULT_DATA
from tuning.inputs.records import RECORD_FIELDS, Record, RecordError

_RECORD_KEYS = frozenset(RECORD_FIELDS) - {"id"}  # a JSONL line with any of these is validated as a record
DEFAULT_TEXT_FIELD = "text"
DEFAULT_TEXT_COLUMN = "text"
FORMATS = ("jsonl", "csv", "tsv", "parquet", "text")
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
               ".parquet": "parquet", ".pq": "parquet", ".txt": "text", ".text": "text"}
PARQUET_HINT = "reading Parquet needs pyarrow: pip install pyarrow (or save the data as CSV or JSONL)"


def parse_line(raw: bytes, line: int, text_field: str | None = None) -> Record | RecordError | str:
    """Decode and validate one JSONL line. Never raises: bad input becomes a :class:`RecordError`.

    ``text_field=None``: a line with the record schema is a :class:`Record`, any other line a text
    (``str``) from its ``text`` field; ``text_field='name'``: every line is a text from that field.
    """
    text = parse_text_line(raw, line)  # bad UTF-8 and blank lines are the same errors in every format
    if isinstance(text, RecordError):
        return text
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return RecordError(line, f"bad JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return RecordError(line, f"expected a JSON object, got {type(obj).__name__}")
    rid = obj.get("id") if isinstance(obj.get("id"), str) else None
    if text_field is not None or not _RECORD_KEYS & obj.keys():
        return _text_field(obj, text_field, line, rid)
    for name, kind in RECORD_FIELDS.items():
        if name not in obj:
            return RecordError(line, f"missing field '{name}'", rid)
        if not isinstance(obj[name], kind):
            return RecordError(line, f"field '{name}' must be {kind.__name__}, got {type(obj[name]).__name__}", rid)
    bad_attr = next((k for k, v in obj["attributes"].items()
                     if not isinstance(v, (str, int, float)) or isinstance(v, bool)), None)
    if bad_attr is not None:
        return RecordError(line, f"attribute '{bad_attr}' must be a string or number", rid)
    if not obj["title"].strip() and not obj["body"].strip():
        return RecordError(line, "empty text: both 'title' and 'body' are blank", rid)
    attributes = {str(k): str(v) for k, v in obj["attributes"].items()}
    return Record(obj["id"], obj["title"], obj["category"], attributes, obj["body"], line)


def _text_field(obj: dict, text_field: str | None, line: int, rid: str | None) -> str | RecordError:
    name = text_field or DEFAULT_TEXT_FIELD
    if name not in obj:
        if text_field is None:
            return RecordError(line, f"missing field '{name}' (a line without the record schema id, title, category, "
                                     "attributes, body needs a text field; name yours with --text-field)", rid)
        return RecordError(line, f"missing field '{name}'", rid)
    value = obj[name]
    if not isinstance(value, str):
        return RecordError(line, f"field '{name}' must be a string, got {type(value).__name__}", rid)
    if not value.strip():
        return RecordError(line, f"field '{name}' is empty", rid)
    return value


def parse_text_line(raw: bytes, line: int) -> str | RecordError:
    """One line of a plain-text file: the request's text, or an error (bad UTF-8, a blank line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RecordError(line, f"invalid UTF-8 at byte {exc.start}: {exc.reason}")
    if not text.strip():
        return RecordError(line, "empty line")
    return text


def detect_format(path: str | Path, format: str | None = None) -> str:
    """The format of a data file: ``format`` if given, else from its extension."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format={format!r} is not allowed; allowed: {' | '.join(FORMATS)}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise ValueError(f"cannot tell the format of {str(path)!r} from its extension {suffix or '(none)'!r}; name it "
                         f"with --format {' | '.join(FORMATS)} (known extensions: {', '.join(_EXTENSIONS)})")
    return _EXTENSIONS[suffix]


def line_parser(path: str | Path, text_field: str | None = None, text_column: str | None = None,
                format: str | None = None) -> Callable[[bytes, int], Any] | None:
    """How a line-based file's lines become inputs: None for JSONL read as it comes (records or ``text``
    lines, parsed in the pipeline's read stage), a parser otherwise; a ValueError for a table format
    (read with :func:`read_table`) or options that do not fit the format."""
    fmt = detect_format(path, format)
    _check_options(fmt, text_field, text_column)
    if fmt == "jsonl":
        return None if text_field is None else partial(parse_line, text_field=text_field)
    if fmt == "text":
        return parse_text_line
    raise ValueError(f"{str(path)!r} is a {fmt} table, not a line format: read it with read_table()")


def _check_options(fmt: str, text_field: str | None, text_column: str | None) -> None:
    if text_column is not None and fmt not in ("csv", "tsv", "parquet"):
        raise ValueError(f"--text-column {text_column!r} applies to CSV, TSV and Parquet files, not {fmt}"
                         + ("; for JSONL name the field with --text-field" if fmt == "jsonl" else ""))
    if text_field is not None and fmt != "jsonl":
        raise ValueError(f"--text-field {text_field!r} applies to JSONL files, not {fmt}"
                         + ("; for a table name the column with --text-column" if fmt != "text" else ""))


def _pick_column(columns: Sequence[str], text_column: str | None, path: Path) -> str:
    listed = ", ".join(map(repr, columns)) or "(none)"
    if text_column is not None:
        if text_column not in columns:
            raise ValueError(f"--text-column {text_column!r}: no such column in {str(path)!r}; its columns: {listed}")
        return text_column
    if DEFAULT_TEXT_COLUMN in columns:
        return DEFAULT_TEXT_COLUMN
    if len(columns) == 1:
        return columns[0]
    raise ValueError(f"{str(path)!r} has no {DEFAULT_TEXT_COLUMN!r} column; name the text column with --text-column "
                     f"(its columns: {listed})")


def _cell(value: Any, row: int, column: str) -> str | RecordError:
    """One table cell as a request: its text, or an error naming what is wrong with it."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return RecordError(row, f"invalid UTF-8 in column '{column}' at byte {exc.start}")
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
        return RecordError(row, f"missing value in column '{column}'")
    if not isinstance(value, str):
        return RecordError(row, f"column '{column}' holds {type(value).__name__}, expected text")
    if any("\udc80" <= ch <= "\udcff" for ch in value):  # surrogateescape: bytes that were not UTF-8
        return RecordError(row, f"invalid UTF-8 in column '{column}'")
    if not value.strip():
        return RecordError(row, f"empty text in column '{column}'")
    return value


def read_table(path: str | Path, text_column: str | None = None, limit: int | None = None,
               format: str | None = None) -> list[str | RecordError]:
    """The text column of a CSV, TSV or Parquet file: one text or :class:`RecordError` per row."""
    import csv

    check_limit(limit)
    path = require_file(path)
    fmt = detect_format(path, format)
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ModuleNotFoundError(PARQUET_HINT) from None
        column = _pick_column(pq.ParquetFile(path).schema_arrow.names, text_column, path)
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
        return [_cell(v, row, column) for row, v in enumerate(values[:limit], start=1)]
    if fmt not in ("csv", "tsv"):
        raise ValueError(f"{str(path)!r} is {fmt}, not a table; read_table reads csv | tsv | parquet")
    out: list[str | RecordError] = []
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t" if fmt == "tsv" else ",")
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{str(path)!r} is empty: a {fmt.upper()} file needs a header row naming its columns")
        column = _pick_column(header, text_column, path)
        at = header.index(column)
        row = 0
        while limit is None or row < limit:
            row += 1
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                out.append(RecordError(row, f"malformed {fmt.upper()} row: {exc}"))
                continue
            if not fields:
                out.append(RecordError(row, "empty row"))
            elif len(fields) != len(header):
                out.append(RecordError(row, f"expected {len(header)} fields as in the header, got {len(fields)}"))
            else:
                out.append(_cell(fields[at], row, column))
    return out


def inputs_from_values(values: Any) -> list[Any]:
    """In-memory inputs (a list of strings, a pandas Series, ...) as the pipeline takes them: a blank or
    missing value becomes a :class:`RecordError` at its position (1-based); texts, records and JSONL
    lines (bytes) pass through."""
    from_series = hasattr(values, "tolist") and not isinstance(values, (list, tuple))
    out: list[Any] = []
    for position, value in enumerate(values.tolist() if from_series else values, start=1):
        if isinstance(value, (Record, RecordError, bytes, bytearray)):
            out.append(value)
        elif value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
            out.append(RecordError(position, "missing value"))
        elif isinstance(value, str):
            out.append(value if value.strip() else RecordError(position, "empty text"))
        else:
            out.append(RecordError(position, f"unsupported input type {type(value).__name__}; give texts (str), "
                                             "records or JSONL lines (bytes)"))
    return out


def read_inputs(path: str | Path | None = None, limit: int | None = None, text_field: str | None = None,
                text_column: str | None = None, format: str | None = None) -> list[tuple[int, Any]]:
    """``(line or row number, input)`` for every line or row of a data file in any supported format.

    An input is what the pipeline and the server take: the raw bytes of a JSONL line (parsed in the
    read stage), a text, or a :class:`RecordError` for a row that cannot be a request.
    """
    path = path if path is not None else DEFAULT_DATA
    check_limit(limit)
    fmt = detect_format(path, format)
    _check_options(fmt, text_field, text_column)
    if fmt in ("csv", "tsv", "parquet"):
        return list(enumerate(read_table(path, text_column, limit, fmt), start=1))
    parse = line_parser(path, text_field, text_column, fmt)
    lines = iter_lines(path, limit)
    return list(lines) if parse is None else [(n, parse(raw, n)) for n, raw in lines]


def check_limit(limit: int | None) -> None:
    """``limit`` must be a positive integer or None (all lines)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be a positive integer (or None for all lines)")


def require_file(path: str | Path) -> Path:
    """``path`` as a Path, or a FileNotFoundError that says how to pass another file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist; pass --data PATH to a JSONL file")
    return path


def iter_lines(path: str | Path, limit: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw bytes)`` per line, 1-based, without the line break."""
    with require_file(path).open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if limit is not None and number > limit:
                return
            yield number, raw.rstrip(b"\r\n")


def read_lines(path: str | Path = DEFAULT_DATA, limit: int | None = None) -> list[tuple[int, bytes]]:
    """All raw lines of a JSONL file (parsing happens later, in the 'read' stage of each request)."""
    check_limit(limit)
    return list(iter_lines(path, limit))


def read_records(path: str | Path = DEFAULT_DATA, limit: int | None = None) -> list[Record | RecordError]:
    """Parse a whole JSONL file: one :class:`Record` or :class:`RecordError` per line."""
    return [parse_line(raw, number) for number, raw in read_lines(path, limit)]


def load_texts(path: str | Path = DEFAULT_DATA, limit: int | None = None, text_field: str | None = None,
               text_column: str | None = None, format: str | None = None,
               formatter: Callable[[Record], str] | None = None) -> list[str]:
    """The model-input texts of the valid inputs of a file in any supported format (records formatted
    by ``formatter``, default :func:`tuning.inputs.records.format_record`)."""
    from tuning.inputs.records import format_record

    formatter = formatter or format_record
    out = []
    for n, raw in read_inputs(path, limit, text_field, text_column, format):
        item = parse_line(raw, n) if isinstance(raw, bytes) else raw
        if isinstance(item, Record):
            out.append(formatter(item))
        elif isinstance(item, str):
            out.append(item)
    return out
