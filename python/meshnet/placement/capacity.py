"""How many layers of one model each candidate node can take under a bottleneck: the arrays
the chain search (chain.py) counts with.

A `Pool` is one model against a set of candidate nodes, one row per (node, device). A stage on
row r holding x layers takes `hop[r] + x * layer_seconds[r]` seconds per token, plus
`head_seconds[r]` if it is the last stage (the output head is read once per token), and needs
`x * layer_memory`, plus the embeddings if it is the first stage and the head if it is the last,
bytes on that device, where `layer_memory` is a layer's weights plus the KV cells the targets
reserve. The embeddings cost memory only (a token's row is looked up, not read whole). Layers are
counted as the model's largest (bytes and KV), so a count that fits fits whichever layers it is
given: the counts are exact for a model whose decoder layers are all alike (every dense Llama-
or Qwen-style model), conservative otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from meshnet.placement.fleet import GIB, ModelShape, NodeOffer

_ROUNDING = 1e-9  # a stage time computed as hop + x * seconds must count as x layers, not x - 1


@dataclasses.dataclass(frozen=True, eq=False)
class FleetTable:
    """Every node's devices as numpy rows, built once per plan so that each model's pool is a
    slice (no per-node Python work per model)."""

    nodes: tuple[NodeOffer, ...]  # all nodes, sorted by id: their index is the tie-break
    row_node: np.ndarray  # node index of each row, ascending
    row_device: np.ndarray  # device index (into the node's devices) of each row
    seconds_per_gib: np.ndarray  # per row: the device's measured seconds per GiB of weights
    memory: np.ndarray  # per row: the device's memory budget (bytes)
    rtt: np.ndarray  # per row: its node's default round trip
    bandwidth: np.ndarray  # per row: its node's default bandwidth
    per_model: dict[str, tuple[np.ndarray, np.ndarray]]  # model -> (rows, seconds per layer) measured for it

    def seconds_per_byte(self, model: ModelShape) -> np.ndarray:
        """Per row, decode seconds per weight byte of `model` (its own figure where measured)."""
        per_byte = self.seconds_per_gib / GIB
        measured = self.per_model.get(model.name)
        if measured is not None:
            per_byte = per_byte.copy()
            per_byte[measured[0]] = measured[1] / (sum(model.layer_bytes) / model.n_layer)
        return per_byte

    def node_memory(self) -> np.ndarray:
        """Per node, its largest device's budget."""
        largest = np.zeros(len(self.nodes))
        np.maximum.at(largest, self.row_node, self.memory)
        return largest


def fleet_table(nodes: Sequence[NodeOffer]) -> FleetTable:
    """The rows of `nodes`, which must be sorted by id."""
    row_node, row_device, per_gib, memory, rtt, bandwidth = [], [], [], [], [], []
    per_model: dict[str, tuple[list[int], list[float]]] = {}
    for index, node in enumerate(nodes):
        for device_index, device in enumerate(node.devices):
            for name, seconds in device.seconds_per_layer:
                rows, values = per_model.setdefault(name, ([], []))
                rows.append(len(row_node))
                values.append(seconds)
            row_node.append(index)
            row_device.append(device_index)
            per_gib.append(device.seconds_per_gib)
            memory.append(device.memory_bytes)
            rtt.append(node.rtt_seconds)
            bandwidth.append(node.bytes_per_second)
    return FleetTable(
        nodes=tuple(nodes), row_node=np.asarray(row_node, dtype=np.int64),
        row_device=np.asarray(row_device, dtype=np.int64), seconds_per_gib=np.asarray(per_gib, dtype=np.float64),
        memory=np.asarray(memory, dtype=np.float64), rtt=np.asarray(rtt, dtype=np.float64),
        bandwidth=np.asarray(bandwidth, dtype=np.float64),
        per_model={name: (np.asarray(rows, dtype=np.int64), np.asarray(values, dtype=np.float64))
                   for name, (rows, values) in per_model.items()})


@dataclasses.dataclass(frozen=True, eq=False)
class Pool:
    model: ModelShape  # the model being placed
    nodes: tuple[NodeOffer, ...]  # candidate nodes; their index is the tie-break (ascending id)
    row_node: np.ndarray  # node index (into `nodes`) of each row, ascending
    row_device: np.ndarray  # device index (into the node's devices) of each row
    layer_seconds: np.ndarray  # per row: decode seconds of one (largest) layer
    hop: np.ndarray  # per row: its node's default hop seconds (round trip + activation transfer)
    head_seconds: np.ndarray  # per row: decode seconds of the output head
    memory: np.ndarray  # per row: the device's budget (bytes)
    mid_memory_layers: np.ndarray  # per row: layers its memory holds as a middle stage
    first_memory_layers: np.ndarray  # per row: ... as the first stage (embeddings beside them)
    last_memory_layers: np.ndarray  # per row: ... as the last stage (head beside them)
    only_memory_layers: np.ndarray  # per row: ... as the only stage (embeddings and head beside them)
    layer_memory: int  # bytes one (largest) layer needs: weights plus reserved KV
    kv_tokens: int  # KV cells reserved per stage
    uniform: bool  # every decoder layer has the same bytes and KV (counts are then exact)
    node_starts: np.ndarray  # first row of each node
    row_preference: np.ndarray  # per row: its rank by (layer seconds, device index): the tie-break among a node's rows

    @property
    def n_layer(self) -> int:
        return self.model.n_layer


def build_pool(table: FleetTable, model: ModelShape, node_indices: Sequence[int], kv_tokens: int) -> Pool:
    """The pool of the table's nodes `node_indices` (ascending) for `model`, with `kv_tokens`
    KV cells reserved at every stage."""
    chosen = np.asarray(node_indices, dtype=np.int64)
    rows = np.flatnonzero(np.isin(table.row_node, chosen))
    largest = max(model.layer_bytes)
    layer_memory = largest + kv_tokens * max(model.kv_bytes_per_token)
    per_byte = table.seconds_per_byte(model)[rows]
    budget = table.memory[rows]

    def layers(extra: int) -> np.ndarray:
        return np.clip(np.floor((budget - extra) / layer_memory), 0, model.n_layer).astype(np.int64)

    return Pool(
        model=model, nodes=tuple(table.nodes[i] for i in chosen),
        row_node=np.searchsorted(chosen, table.row_node[rows]), row_device=table.row_device[rows],
        layer_seconds=per_byte * largest, hop=table.rtt[rows] + model.activation_bytes / table.bandwidth[rows],
        head_seconds=per_byte * model.output_bytes, memory=budget, mid_memory_layers=layers(0),
        first_memory_layers=layers(model.embedding_bytes), last_memory_layers=layers(model.output_bytes),
        only_memory_layers=layers(model.output_bytes + model.embedding_bytes),
        layer_memory=layer_memory, kv_tokens=kv_tokens,
        uniform=len(set(model.layer_bytes)) == 1 and len(set(model.kv_bytes_per_token)) == 1,
        node_starts=np.searchsorted(table.row_node[rows], chosen),
        row_preference=np.argsort(np.lexsort((table.row_device[rows], per_byte)), kind="stable"))


def row_layers(pool: Pool, bottleneck: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the most layers it can hold within `bottleneck` seconds as a middle, first, last
    and only stage (0 where it cannot hold one)."""
    if math.isinf(bottleneck):
        return pool.mid_memory_layers, pool.first_memory_layers, pool.last_memory_layers, pool.only_memory_layers
    by_time = np.maximum(np.floor((bottleneck - pool.hop) / pool.layer_seconds + _ROUNDING), 0)
    by_time_last = np.maximum(np.floor((bottleneck - pool.hop - pool.head_seconds) / pool.layer_seconds + _ROUNDING), 0)
    return (np.minimum(by_time, pool.mid_memory_layers).astype(np.int64),
            np.minimum(by_time, pool.first_memory_layers).astype(np.int64),
            np.minimum(by_time_last, pool.last_memory_layers).astype(np.int64),
            np.minimum(by_time_last, pool.only_memory_layers).astype(np.int64))


def node_layers(pool: Pool, per_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the most layers any of its rows holds, and the row that holds them (ties: the
    faster row, then the lower device index)."""
    if len(pool.row_node) == len(pool.nodes):
        return per_row, np.arange(len(per_row))
    score = per_row * len(per_row) + (len(per_row) - 1 - pool.row_preference)  # more layers, then preferred
    best = np.maximum.reduceat(score, pool.node_starts)
    rows = np.flatnonzero(score == best[pool.row_node])
    return per_row[rows], rows


def stage_seconds(pool: Pool, row: int, start: int, end: int, last: bool) -> float:
    """Predicted seconds per token of row `row` holding [start, end), its default hop included,
    with the model's real layer bytes."""
    model = pool.model
    node = pool.nodes[int(pool.row_node[row])]
    per_byte = node.devices[int(pool.row_device[row])].seconds_per_byte(model)
    compute = per_byte * (sum(model.layer_bytes[start:end]) + (model.output_bytes if last else 0))
    return compute + float(pool.hop[row])


def candidate_bottlenecks(pool: Pool) -> np.ndarray:
    """Every stage time a chain's slowest stage can take (ascending, unique): the exact search
    space of the bottleneck."""
    counts = np.arange(1, pool.n_layer + 1, dtype=np.float64)
    mid = pool.hop[:, None] + pool.layer_seconds[:, None] * counts[None, :]
    fits_mid = counts[None, :] <= pool.mid_memory_layers[:, None]
    last = mid + pool.head_seconds[:, None]
    fits_last = counts[None, :] <= pool.last_memory_layers[:, None]
    return np.unique(np.concatenate([mid[fits_mid], last[fits_last]]))
