"""Replicas: the nodes no primary route took, each given a range of a planned route (water-filling).

Called by the planner after every model's primary route is fixed; the ranges ("slots") are
those routes' stages, so a replica's range meets its neighbours at the same boundaries and any
holder of one range can follow any holder of the range before it (GGUF ranges chain only at
exact boundaries), and a range whose holder leaves is still served by its replicas.

The rule (a heuristic, Petals' "least-served window" over fixed ranges): nodes are taken from
the smallest memory to the largest (the most constrained first, so a large node is not spent
where a small one would do), ties by id; each goes to the slot it fits (its largest device holds
the range's weights and KV) that has the fewest holders, preferring one whose layers it has on
disk, then the lower slot index. A slot takes at most its cap: in a round of routes, the
holders that complete routes (`fillable_routes`), so nodes that could not complete one are kept
for the next round's routes, whose ranges suit them; in the last pass, 1 + `replicas` (failover
spares). So every planned range gains holders evenly and each model gets as many routes as the
free memory allows.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from meshnet.placement.capacity import FleetTable
from meshnet.placement.fleet import GIB, ModelShape


@dataclasses.dataclass(frozen=True)
class Slot:
    model: ModelShape  # the model of the planned route
    start: int  # the stage's layers [start, end)
    end: int
    need_bytes: int  # weights (with embeddings or head where the stage has them) plus reserved KV


@dataclasses.dataclass(frozen=True)
class Placed:
    node: int  # table index of the node
    slot: int  # index of the slot it holds
    row: int  # table row (device) that runs it


def slots_of(model: ModelShape, ranges: Sequence[tuple[int, int]], kv_tokens: int) -> list[Slot]:
    return [Slot(model, a, b, model.memory_bytes(a, b, kv_tokens)) for a, b in ranges]


def fillable_routes(memory: np.ndarray, needs: Sequence[float]) -> int:
    """How many routes of these stage ranges nodes with `memory` (ascending) can fill, one node
    per stage: a node that holds a range holds every smaller one, so R routes fit iff for each k
    at least k * R nodes hold the k-th largest range (Hall's condition for nested sets)."""
    holders = [len(memory) - int(np.searchsorted(memory, need)) for need in sorted(needs, reverse=True)]
    return min(count // k for k, count in enumerate(holders, start=1))


def water_fill(table: FleetTable, slots: Sequence[Slot], holders: np.ndarray, caps: np.ndarray, free: Sequence[int],
               per_byte: dict[str, np.ndarray]) -> tuple[list[Placed], dict[int, str]]:
    """Replica placements for the `free` node indices, and a reason for each node left out.
    `holders` (updated in place) and `caps`: per slot, its holders now and the most it may have.
    `per_byte`: per model name, the table's seconds per weight byte per row."""
    if not slots:
        return [], {n: "no model has a planned route to replicate" for n in free}
    need = np.asarray([s.need_bytes for s in slots], dtype=np.float64)
    node_memory = table.node_memory()
    starts = np.searchsorted(table.row_node, np.arange(len(table.nodes) + 1))
    placed, left_out = [], {}
    for n in sorted(free, key=lambda n: (node_memory[n], table.nodes[n].node_id)):
        fits = need <= node_memory[n]
        if not fits.any():
            smallest = float(need.min())
            left_out[n] = (f"no planned range fits: its largest device offers {node_memory[n] / GIB:.2f} GiB, "
                           f"the smallest range needs {smallest / GIB:.2f} GiB with its KV")
            continue
        open_slots = fits & (holders < caps)
        if not open_slots.any():
            left_out[n] = "spare: every range it fits already has the holders wanted (targets.replicas)"
            continue
        slot = _choose(table, n, slots, np.where(open_slots, holders, np.iinfo(np.int64).max))
        rows = np.arange(starts[n], starts[n + 1])
        rows = rows[table.memory[rows] >= need[slot]]
        row = int(rows[np.argmin(per_byte[slots[slot].model.name][rows])])
        holders[slot] += 1
        placed.append(Placed(n, slot, row))
    return placed, left_out


def _choose(table: FleetTable, n: int, slots: Sequence[Slot], key: np.ndarray) -> int:
    """The slot with the fewest holders; among those, one whose layers the node has on disk."""
    node = table.nodes[n]
    if not node.parts:
        return int(np.argmin(key))
    fewest = np.flatnonzero(key == key.min())
    for slot in fewest:
        s = slots[int(slot)]
        if node.bytes_on_disk(s.model, s.start, s.end) == s.model.weight_bytes(s.start, s.end):
            return int(slot)
    return int(fewest[0])
