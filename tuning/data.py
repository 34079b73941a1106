"""Record schema and line-by-line JSONL reading where a bad line is an outcome, not a crash."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

# The demo records ship inside the package (so every command works from any directory after a
# non-editable install); data/records.jsonl in the source tree is a link to this file.
DEFAULT_DATA = Path(__file__).resolve().parent / "assets" / "records.jsonl"

_FIELDS: dict[str, type] = {"id": str, "title": str, "category": str, "attributes": dict, "body": str}


@dataclass(frozen=True)
class Record:
    """One structured-text request: a product listing or support ticket."""

    id: str
    title: str
    category: str
    attributes: dict[str, str] = field(hash=False)
    body: str
    line: int = 0


@dataclass(frozen=True)
class RecordError:
    """A line that could not become a :class:`Record`; it still gets an (error) outcome."""

    line: int
    reason: str
    id: str | None = None


def parse_line(raw: bytes, line: int) -> Record | RecordError:
    """Decode and validate one JSONL line. Never raises: bad input becomes a :class:`RecordError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RecordError(line, f"invalid UTF-8 at byte {exc.start}: {exc.reason}")
    if not text.strip():
        return RecordError(line, "empty line")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return RecordError(line, f"bad JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return RecordError(line, f"expected a JSON object, got {type(obj).__name__}")
    rid = obj.get("id") if isinstance(obj.get("id"), str) else None
    for name, kind in _FIELDS.items():
        if name not in obj:
            return RecordError(line, f"missing field '{name}'", rid)
        if not isinstance(obj[name], kind):
            return RecordError(line, f"field '{name}' must be {kind.__name__}, got {type(obj[name]).__name__}", rid)
    bad_attr = next((k for k, v in obj["attributes"].items() if not isinstance(v, (str, int, float)) or isinstance(v, bool)), None)
    if bad_attr is not None:
        return RecordError(line, f"attribute '{bad_attr}' must be a string or number", rid)
    if not obj["title"].strip() and not obj["body"].strip():
        return RecordError(line, "empty text: both 'title' and 'body' are blank", rid)
    attributes = {str(k): str(v) for k, v in obj["attributes"].items()}
    return Record(obj["id"], obj["title"], obj["category"], attributes, obj["body"], line)


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


def load_texts(path: str | Path = DEFAULT_DATA, limit: int | None = None) -> list[str]:
    """The model-input texts of the valid records of a file (for benchmarks and peers)."""
    from .preprocess import format_record

    return [format_record(r) for r in read_records(path, limit) if isinstance(r, Record)]
