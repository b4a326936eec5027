"""Lanes measured in rounds: with `--rounds N` every lane runs N times, the rounds one after
another (lane A, lane B, ..., then A, B, ... again), and each lane's figures are the median
over its rounds. Called by `lanes.run_group`.

Why: this machine's speed drifts by a third within minutes (the same 8-row decode step took 87
and 138 ms in runs ten minutes apart, docs/evidence/seam/), and lanes run one after another, so
a ratio between two lanes measured once carries that drift. Interleaved rounds put every lane
into each period of the drift; the median drops the period that was slow for one lane only.

Invariant: a merged lane has the fields its rounds have, each figure the median of the rounds
that measured it (an integer figure, such as a count of steps, the lower of the two middle values
when the rounds are even, so that it stays an integer); counts of what went wrong (failures, errors) are summed or pooled, high-water
marks (peak RSS, queue depth) are maxima, and every round's cells stay in `round_cells`.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any, Optional, Sequence

from meshnet.bench.schema import Cell, Lane

# Cell fields that name the workload, not a measurement.
KEYS = ("prompt_tokens", "concurrency", "new_tokens")
SUMMED = ("failures", "drafted_tokens", "accepted_drafts")
MAXED = ("max_queue_depth", "max_live_sessions", "max_kv_cells", "max_batch_sessions", "peak_rss_bytes")
MINIMUM = ("tokens_identical",)  # 1 only if every round had it


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _merge_value(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(_number(v) for v in present):
        if key in SUMMED:
            return sum(present)
        if key in MAXED:
            return max(present)
        if key in MINIMUM:
            return min(present)
        if all(isinstance(v, int) for v in present):  # a count stays a count: the lower middle round's
            return statistics.median_low(present)
        return statistics.median(present)
    if all(isinstance(v, dict) for v in present):
        return merge_records(present)
    if key == "errors":
        return list(dict.fromkeys(e for v in present for e in v))[:5]
    if key == "hop_stages" and all(isinstance(v, list) for v in present):
        hops = min(len(v) for v in present)
        return [merge_records([v[i] for v in present]) for i in range(hops)]
    return present[0]


def merge_records(records: Sequence[dict]) -> dict:
    """One record whose every field merges that field of `records` (see the module doc)."""
    merged: dict = {}
    for record in records:
        for key in record:
            merged.setdefault(key, None)
    for key in merged:
        if key in KEYS:
            merged[key] = records[0].get(key)
        else:
            merged[key] = _merge_value(key, [r.get(key) for r in records])
    return merged


def _cell_key(cell: Cell) -> tuple:
    return tuple(cell.get(k) for k in KEYS)


def merge_cells(rounds: Sequence[Sequence[Cell]]) -> list[Cell]:
    """Cells of the first round, in its order, each merged with the same workload's cells of the
    other rounds (a workload missing from a round is merged from the rounds that have it)."""
    merged = []
    for cell in rounds[0]:
        same = [c for cells in rounds for c in cells if _cell_key(c) == _cell_key(cell)]
        merged.append(merge_records(same))
    return merged


def merge_rounds(runs: Sequence[Lane]) -> Lane:
    """One lane from its rounds. Rounds that could not run are left out and named in the notes;
    the lane is unavailable only when no round ran."""
    ran = [r for r in runs if r.get("available")]
    if len(runs) == 1:
        return runs[0]
    if not ran:
        return runs[0]
    lane: Lane = copy.deepcopy(ran[0])
    lane["cells"] = merge_cells([r.get("cells", []) for r in ran])
    lane["round_cells"] = [r.get("cells", []) for r in ran]
    if any("figures" in r for r in ran):
        lane["figures"] = merge_records([r.get("figures", {}) for r in ran])
    peaks = [r["peak_rss_bytes"] for r in ran if _number(r.get("peak_rss_bytes"))]
    if peaks:
        lane["peak_rss_bytes"] = max(peaks)
    nodes = _merged_nodes(ran)
    if nodes is not None:
        lane["nodes"] = nodes
    lane["duration_s"] = round(sum(r.get("duration_s", 0) for r in runs), 1)
    notes = list(lane.get("notes", []))
    notes.append(f"figures: median of {len(ran)} interleaved rounds (each round's cells in round_cells)")
    for i, r in enumerate(runs):
        if not r.get("available"):
            notes.append(f"round {i + 1} did not run: {r.get('reason')}")
    lane["notes"] = notes
    return lane


def _merged_nodes(ran: Sequence[Lane]) -> Optional[list]:
    """Each node's peak RSS is its highest over the rounds (nodes matched by position: every
    round builds the same swarm shape)."""
    lists = [r["nodes"] for r in ran if r.get("nodes")]
    if not lists or any(len(n) != len(lists[0]) for n in lists):
        return lists[0] if lists else None
    merged = copy.deepcopy(lists[0])
    for i, node in enumerate(merged):
        peaks = [n[i].get("peak_rss_bytes") for n in lists if _number(n[i].get("peak_rss_bytes"))]
        if peaks:
            node["peak_rss_bytes"] = max(peaks)
    return merged
