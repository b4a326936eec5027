"""Test-only: the schemas and documents json_grammar's tests share (json_grammar_test reads the
grammars with the Python recognizer, json_grammar_llama_test with llama.cpp's own parser): an
OpenAI strict schema with valid and invalid documents, a pydantic model with $defs, recursion,
Optional fields, a tuple, Literal and formats, with valid and invalid texts, awkward property
names, and the shapes of hostile schemas."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from typing import Literal, Optional

from pydantic import BaseModel, Field

def forms(doc) -> list[str]:
    return [json.dumps(doc, ensure_ascii=False, separators=(",", ":")), json.dumps(doc, ensure_ascii=False),
            json.dumps(doc, ensure_ascii=False, indent=2)]


STRICT = {  # as OpenAI strict mode sends it: every property required, no extras anywhere
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "who"},
        "priority": {"type": "string", "enum": ["low", "medium", "high"]},
        "due": {"type": ["string", "null"], "format": "date"},
        "steps": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["title", "minutes", "done"],
            "properties": {"title": {"type": "string"}, "minutes": {"type": "integer"}, "done": {"type": "boolean"}}}},
        "owner": {"type": "object", "additionalProperties": False, "required": ["id", "score"],
                  "properties": {"id": {"type": "string", "format": "uuid"}, "score": {"type": "number"}}},
    },
    "required": ["name", "priority", "due", "steps", "owner"],
    "additionalProperties": False,
}


OWNER = {"id": "0f8fad5b-d9cb-469f-a165-70867728950e", "score": -12.5e3}


STRICT_VALID = [
    {"name": "Zoë \"Z\" \\ ☕\n", "priority": "high", "due": "2025-03-14", "steps": [], "owner": OWNER},
    {"name": "", "priority": "low", "due": None,
     "steps": [{"title": "a", "minutes": 5, "done": False}, {"title": "b", "minutes": -0, "done": True},
               {"title": "c", "minutes": 120, "done": True}], "owner": {"id": OWNER["id"].upper(), "score": 0}},
]


STEP = {"title": "a", "minutes": 5, "done": False}


STRICT_INVALID = [
    ("missing required key", {k: v for k, v in STRICT_VALID[0].items() if k != "due"}),
    ("wrong type", {**STRICT_VALID[0], "priority": 3}),
    ("extra key", {**STRICT_VALID[0], "extra": 1}),
    ("extra key nested", {**STRICT_VALID[0], "owner": {**OWNER, "x": 1}}),
    ("enum value outside", {**STRICT_VALID[0], "priority": "urgent"}),
    ("too long array", {**STRICT_VALID[0], "steps": [STEP] * 4}),
    ("float for integer", {**STRICT_VALID[0], "steps": [{**STEP, "minutes": 5.5}]}),
    ("bad date", {**STRICT_VALID[0], "due": "2025-13-01"}),
    ("bad uuid", {**STRICT_VALID[0], "owner": {**OWNER, "id": "0f8fad5b-d9cb-469f-a165"}}),
    ("order changed", {"priority": "high", **STRICT_VALID[0]}),
]


class Kind(str, enum.Enum):
    BUG = "bug"
    FEATURE = "feature"


class Person(BaseModel):
    name: str
    email: Optional[str] = None


class Comment(BaseModel):
    author: Person
    text: str = Field(max_length=20)
    replies: list["Comment"] = []


class Ticket(BaseModel):
    id: uuid.UUID
    kind: Kind
    title: str = Field(min_length=1, max_length=40)
    opened: datetime.datetime
    due: Optional[datetime.date] = None
    at: Optional[datetime.time] = None
    labels: list[str] = Field(default_factory=list, max_length=3)
    assignee: Optional[Person] = None
    comments: list[Comment] = []
    status: Literal["open", "closed"] = "open"
    point: Optional[tuple[int, float]] = None
    score: float = 0


UTC = datetime.timezone.utc


MINUS_5 = datetime.timezone(datetime.timedelta(hours=-5))


TICKETS = [
    Ticket(id=uuid.UUID(int=7), kind=Kind.BUG, title="Crash \"on\" start ☕",
           opened=datetime.datetime(2025, 3, 14, 9, 30, tzinfo=UTC)),
    Ticket(id=uuid.UUID(int=1 << 100), kind=Kind.FEATURE, title="x" * 40,
           opened=datetime.datetime(2025, 12, 31, 23, 59, 59, 250000, tzinfo=MINUS_5),
           due=datetime.date(2026, 1, 2), at=datetime.time(8, 0, tzinfo=UTC), labels=["a", "b\\c", ""],
           assignee=Person(name="李雷", email="li@example.com"), status="closed", point=(-3, 2.5e-7), score=1e300,
           comments=[Comment(author=Person(name="a"), text="top", replies=[
               Comment(author=Person(name="b"), text="nested", replies=[Comment(author=Person(name="c"), text="")])])]),
]


def ticket_variants() -> list[str]:
    """The models as pydantic writes them, their json.dumps forms, fields left out, one extra member."""
    texts = [ticket.model_dump_json() for ticket in TICKETS]
    texts += [text for ticket in TICKETS for text in forms(ticket.model_dump(mode="json"))]
    texts += [json.dumps(ticket.model_dump(mode="json", exclude_defaults=True)) for ticket in TICKETS]
    texts.append(TICKETS[0].model_dump_json()[:-1] + ', "note": {"any": [1, null]}}')
    return texts


def ticket_invalid() -> list[tuple[str, str]]:
    good = TICKETS[1].model_dump(mode="json")
    cases = [
        ("missing required", {k: v for k, v in good.items() if k != "kind"}),
        ("enum outside", {**good, "kind": "chore"}),
        ("too short string", {**good, "title": ""}),
        ("too long string", {**good, "title": "x" * 41}),
        ("too many labels", {**good, "labels": ["a"] * 4}),
        ("naive date-time", {**good, "opened": "2025-03-14T09:30:00"}),
        ("date for date-time", {**good, "opened": "2025-03-14"}),
        ("number for uuid", {**good, "id": 7}),
        ("tuple too short", {**good, "point": [1]}),
        ("tuple too long", {**good, "point": [1, 2.0, 3]}),
        ("float in integer slot", {**good, "point": [1.5, 2]}),
        ("nested reply too long", {**good, "comments": [{"author": {"name": "a"}, "text": "t" * 21}]}),
        ("nested missing author", {**good, "comments": [{"text": "t"}]}),
        ("null for required", {**good, "title": None}),
    ]
    texts = [(label, text) for label, doc in cases for text in forms(doc)]
    compact = TICKETS[0].model_dump_json()
    for label, old, new in [("leading zero", '"score":0.0', '"score":01'), ("bad escape", '"Crash', '"Cr\\ash'),
                            ("unterminated string", '☕"', "☕"), ("trailing comma", '0.0}', '0.0,}'),
                            ("control character", "Crash ", "Crash\t"),
                            ("single quotes", '"kind":"bug"', "'kind':'bug'")]:
        assert old in compact, label
        texts.append((label, compact.replace(old, new)))
    return texts + [("leading space", " " + compact), ("trailing space", compact + " ")]


NAMES = ['quote"d', "back\\slash", "naïve", "😀 emoji", "new\nline", "tab\t", "ctrl\x01", "del\x7f", "[x-y]",
         "#h|(a)", "a::=b", ""]


def nested(levels: int, leaf) -> dict:
    schema = leaf
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def fan_out(levels: int) -> dict:
    """Each definition refers to the next twice: inlined, 2**levels copies."""
    defs = {f"D{n}": {"type": "object", "additionalProperties": False, "required": ["l", "r"],
                      "properties": {"l": {"$ref": f"#/$defs/D{n + 1}"}, "r": {"$ref": f"#/$defs/D{n + 1}"}}}
            for n in range(levels)}
    defs[f"D{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/D0"}


def fan_in(levels: int) -> dict:
    """D(n) is D(n+1) or E(n+1), E(n) is D(n) or null: the ways down D0 double per level."""
    defs = {f"D{n}": {"anyOf": [{"$ref": f"#/$defs/D{n + 1}"}, {"$ref": f"#/$defs/E{n + 1}"}]} for n in range(levels)}
    defs.update({f"E{n}": {"anyOf": [{"$ref": f"#/$defs/D{n}"}, {"type": "null"}]} for n in range(1, levels + 1)})
    defs[f"D{levels}"] = {"type": "integer"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs}


def deep_list(levels: int) -> dict:
    value: list = []
    for _ in range(levels):
        value = [value]
    return {"enum": value}
