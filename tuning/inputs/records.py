"""The request record and its error outcome, and the record -> text formatter: the floor every input module stands on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

RECORD_FIELDS: dict[str, type] = {"id": str, "title": str, "category": str, "attributes": dict, "body": str}


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


def format_record(record: Record) -> str:
    """The text the model sees for a record: title, category, attributes, then the body."""
    attrs = "; ".join(f"{k}: {v}" for k, v in record.attributes.items())
    return f"{record.title}. Category: {record.category}. {attrs}. {record.body}"


TextFormatter = Callable[[Record], str]
