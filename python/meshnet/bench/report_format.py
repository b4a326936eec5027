"""What the bench's report and plots share: formatting of values (n/a for what was not
measured), markdown tables, and reading lanes and cells out of a results dict."""

from __future__ import annotations

import math
from typing import Any

from meshnet.bench.measure import find_cell

MIB = 1 << 20
GIB = 1 << 30
NA = "n/a"
SHORT_PROMPT = 128

def as_number(value: Any) -> float | None:
    """The value as a float, or None when it is missing, not a number, a bool or NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if math.isnan(value):
        return None
    return float(value)


def fmt(value: Any, digits: int = 1) -> str:
    number = as_number(value)
    return NA if number is None else f"{number:.{digits}f}"


def fmt_int(value: Any) -> str:
    number = as_number(value)
    return NA if number is None else str(int(number))


def mib(value: Any) -> float | None:
    number = as_number(value)
    return None if number is None else number / MIB


def text(value: Any) -> str:
    return NA if value is None or value == "" else str(value)


def escape(text: str) -> str:
    """Keeps free text from breaking a markdown table row."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(escape(cell) for cell in row) + " |")
    return lines


# ---- lanes and cells ----


def lane_group(group: dict | None) -> dict[str, dict]:
    if not isinstance(group, dict):
        return {}
    return group.get("lanes") or {}


def available_lanes(lanes: dict[str, dict]) -> dict[str, dict]:
    return {name: lane for name, lane in lanes.items() if lane.get("available", True)}


def unavailable_lanes(lanes: dict[str, dict]) -> dict[str, dict]:
    return {name: lane for name, lane in lanes.items() if not lane.get("available", True)}


def lane_label(name: str, lane: dict) -> str:
    return lane.get("label") or name


def cells(lane: dict) -> list[dict]:
    return lane.get("cells") or []


def metric(lane: dict, prompt: int, concurrency: int, key: str) -> float | None:
    return as_number(find_cell(lane, prompt, concurrency).get(key))


def process_rss_bytes(lane: dict) -> float | None:
    """Sum of the processes' peak RSS; the lane's own peak_rss_bytes when it lists no processes."""
    values = [as_number(p.get("peak_rss_bytes")) for p in lane.get("processes") or []]
    values = [v for v in values if v is not None]
    if values:
        return sum(values)
    return as_number(lane.get("peak_rss_bytes"))
