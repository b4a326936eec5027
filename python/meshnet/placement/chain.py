"""One route for one model over a pool of candidate nodes: which nodes, in what order, holding
how many layers, so that the slowest stage is as fast as it can be.

Called by the planner (planner.py) once per model, on the nodes no other model's route took.

The search. For a bottleneck T, each node can hold at most k(T) layers as a middle stage (its
time `hop + k * layer` and its memory within bounds) and at most k_last(T) as the last stage
(which also reads the head). Decoder layers being alike, which layers a stage holds does not
change its time or memory, so a chain of at most S stages within T exists iff one node holds
the whole model within T, or some node g and at most S - 1 others satisfy
k_last(g) + (sum of their k) >= n_layer; for a fixed g the best others are the S - 1 largest k,
so the test is a sort and a prefix sum. Every k is non-decreasing in T, so the test is monotone
and a binary search over every stage time a chain can have (`candidate_bottlenecks`) finds the
least T exactly: `min_bottleneck`. The order of the middle stages does not matter under that
model; the chain puts first a stage with room for the embeddings (memory only).

Exact: the bottleneck for at most S stages, over every subset and order of the pool's nodes,
every device of each node, and every cut, when the model's decoder layers are alike and some
stage of the chain has room for the embeddings beside its layers (`Chain.exact`). Otherwise
conservative (layers counted as the largest; embeddings charged to every stage): a feasible
chain, not always the best. Pairwise link figures are not used here (each node's default hop);
routes are re-timed with them afterwards.

Which chain (`best_chain`). A route carrying m = `sessions` streams gives each stream a token
every max(D, m * T) seconds, where D is one token's trip through every stage (the sum of stage
times) and T the slowest stage. More stages lower T (a slow node takes few layers) but add hops
to D. For each stage count S from the fewest that memory allows to the fewest that reach the
least T overall, the chain of least T with at most S stages is built (the fewest stages reaching
it; among those the nodes with the most room, then the fastest; layers filled fastest first),
and the one with the least max(D, m * T) is kept (ties: lower T, then fewer stages). With one
stream (m = 1) that favours few fast stages; with many it is the min-max chain. A node left out
of the chosen chain would have made that per-token time worse, or was not needed. The choice
among stage counts is exact for those chains; D is minimised for the chosen nodes, not over
every set of nodes (a heuristic).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from meshnet.placement.capacity import (Pool, candidate_bottlenecks, charge_embedding_everywhere, node_layers, row_layers,
                                        stage_seconds)


@dataclasses.dataclass(frozen=True)
class Chain:
    rows: tuple[int, ...]  # each stage's pool row (node and device), in layer order
    layers: tuple[int, ...]  # layers each stage holds, in order; they sum to n_layer
    bottleneck_seconds: float  # the slowest stage, real layer bytes
    decode_seconds: float  # the sum of stage times: one token through the chain
    exact: bool  # the bottleneck is the least any chain of at most this many stages has

    def ranges(self) -> list[tuple[int, int]]:
        bounds = np.cumsum((0,) + self.layers)
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclasses.dataclass(frozen=True)
class _Layout:
    rows: list[int]  # chosen rows: middle stages (unordered), then the last
    caps: list[int]  # most layers each may take within the bottleneck


def _node_keys(pool: Pool, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return pool.layer_seconds[rows], pool.hop[rows]


def _layout(pool: Pool, bottleneck: float, max_stages: int) -> Optional[_Layout]:
    """The fewest-stage chain (at most `max_stages`) within `bottleneck`, or None."""
    n_layer = pool.n_layer
    mid_rows_layers, last_rows_layers, only_rows_layers = row_layers(pool, bottleneck)
    only, only_row = node_layers(pool, only_rows_layers)
    single = np.flatnonzero(only >= n_layer)
    if len(single):
        times = pool.hop[only_row[single]] + pool.layer_seconds[only_row[single]] * n_layer
        pick = single[np.lexsort((single, times))[0]]
        return _Layout([int(only_row[pick])], [n_layer])
    n = len(only)
    if max_stages < 2 or n < 2 or n_layer < 2:
        return None
    mid, mid_row = node_layers(pool, mid_rows_layers)
    last, last_row = node_layers(pool, last_rows_layers)
    seconds, hop = _node_keys(pool, mid_row)
    index = np.arange(n)
    order = np.lexsort((index, hop, seconds, -mid))  # most room first, then fastest, then id
    prefix = np.r_[0, np.cumsum(mid[order])]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = index
    # Fewest middle stages j >= 1 for each candidate last node g: the least j whose top j
    # (g excluded) plus last[g] reach n_layer.
    need = n_layer - last
    j = np.searchsorted(prefix, need, side="left")
    shifted = np.searchsorted(prefix, need + mid, side="left") - 1
    j = np.where(rank < j, shifted, j)
    j = np.maximum(j, 1)
    others_with_room = np.count_nonzero(mid >= 1) - (mid >= 1)
    usable = (last >= 1) & (j <= min(max_stages - 1, n - 1)) & (j <= others_with_room)
    usable &= _reaches(prefix, rank, mid, last, j, n_layer)
    candidates = np.flatnonzero(usable)
    if not len(candidates):
        return None
    last_seconds, last_hop = _node_keys(pool, last_row[candidates])
    g = int(candidates[np.lexsort((candidates, last_hop, last_seconds, j[candidates]))[0]])
    mids = [int(m) for m in order[: int(j[g]) + 1] if m != g][: int(j[g])]
    return _Layout([int(mid_row[m]) for m in mids] + [int(last_row[g])],
                   [int(mid[m]) for m in mids] + [int(last[g])])


def _reaches(prefix: np.ndarray, rank: np.ndarray, mid: np.ndarray, last: np.ndarray, j: np.ndarray,
             n_layer: int) -> np.ndarray:
    """Whether last[g] plus the top j[g] middle counts (g excluded) reach n_layer."""
    n = len(mid)
    top = np.where(rank < j, prefix[np.minimum(j + 1, n)] - mid, prefix[np.minimum(j, n)])
    return (last + top >= n_layer) & (j <= n - 1)


def _allocate(pool: Pool, layout: _Layout) -> Optional[Chain]:
    """Layers per stage (one each, then the fastest filled first), the embeddings' stage first;
    None if no middle stage has room for the embeddings."""
    n_layer = pool.n_layer
    rows, caps = layout.rows, layout.caps
    counts = [1] * len(rows)
    spare = n_layer - len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (pool.layer_seconds[rows[i]], i)):
        take = min(spare, caps[i] - 1)
        counts[i] += take
        spare -= take
    if spare:
        return None
    if len(rows) > 1:
        first = _embedding_stage(pool, rows[:-1], counts[:-1])
        if first is None:
            return None
        middle = [i for i in range(len(rows) - 1) if i != first]
        middle.sort(key=lambda i: int(pool.row_node[rows[i]]))
        stage_order = [first] + middle + [len(rows) - 1]
        rows = [rows[i] for i in stage_order]
        counts = [counts[i] for i in stage_order]
    return _timed(pool, rows, counts)


def _embedding_stage(pool: Pool, rows: list[int], counts: list[int]) -> Optional[int]:
    """The middle stage with the most memory to spare once it holds the embeddings, or None."""
    best, best_spare = None, -1.0
    for i, (row, count) in enumerate(zip(rows, counts)):
        spare = float(pool.memory[row]) - count * pool.layer_memory - pool.model.embedding_bytes
        if spare >= 0 and spare > best_spare:
            best, best_spare = i, spare
    return best


def _timed(pool: Pool, rows: list[int], counts: list[int]) -> Chain:
    times, start = [], 0
    for i, (row, count) in enumerate(zip(rows, counts)):
        times.append(stage_seconds(pool, row, start, start + count, last=i == len(rows) - 1))
        start += count
    exact = pool.uniform and not pool.embedding_everywhere
    return Chain(tuple(rows), tuple(counts), max(times), sum(times), exact)


def chain_at(pool: Pool, bottleneck: float, max_stages: int) -> Optional[Chain]:
    """The chain the search builds within `bottleneck` with at most `max_stages` stages."""
    layout = _layout(pool, bottleneck, max_stages)
    return None if layout is None else _allocate(pool, layout)


def min_bottleneck(pool: Pool, max_stages: int, candidates: Optional[np.ndarray] = None,
                   low: int = 0, high: Optional[int] = None) -> Optional[float]:
    """The least bottleneck (seconds) of any chain of at most `max_stages` stages, searched
    among candidates[low:high]; None if none is feasible."""
    candidates = candidate_bottlenecks(pool) if candidates is None else candidates
    high = len(candidates) if high is None else high
    if high <= low or _layout(pool, float(candidates[high - 1]), max_stages) is None:
        return None
    while low < high - 1:
        middle = (low + high - 1) // 2
        if _layout(pool, float(candidates[middle]), max_stages) is None:
            low = middle + 1
        else:
            high = middle + 1
    return float(candidates[low])


def best_chain(pool: Pool, sessions: int) -> Optional[Chain]:
    """The chain with the least per-stream time per token max(D, sessions * T) among the
    least-bottleneck chains of each stage count (module docstring); None if the pool's memory
    cannot hold the model. Falls back to charging the embeddings to every stage when the
    counted chain has no stage with room for them."""
    chain = _best_chain(pool, sessions)
    if chain is None and not pool.embedding_everywhere and pool.model.embedding_bytes:
        return _best_chain(charge_embedding_everywhere(pool), sessions)
    return chain


def _best_chain(pool: Pool, sessions: int) -> Optional[Chain]:
    n = len(pool.nodes)
    fewest = chain_at(pool, math.inf, n)
    if fewest is None:
        return None
    candidates = candidate_bottlenecks(pool)
    overall = min_bottleneck(pool, n, candidates)
    if overall is None:
        return None
    widest = chain_at(pool, overall, n)
    if widest is None:
        return None
    floor_index = int(np.searchsorted(candidates, overall))
    hops = np.sort(pool.hop)
    least_compute = float(np.min(pool.layer_seconds)) * pool.n_layer
    best, best_key = None, None
    high = len(candidates)
    for stages in range(len(fewest.rows), len(widest.rows) + 1):
        if best_key is not None and float(np.sum(hops[:stages])) + least_compute >= best_key[0]:
            break  # every chain of this many stages takes longer per token than the best so far
        bottleneck = min_bottleneck(pool, stages, candidates, floor_index, high)
        if bottleneck is None:
            continue
        high = int(np.searchsorted(candidates, bottleneck)) + 1
        chain = chain_at(pool, bottleneck, stages)
        if chain is None:
            continue
        key = (max(chain.decode_seconds, sessions * chain.bottleneck_seconds), chain.bottleneck_seconds,
               len(chain.rows), chain.rows)
        if best_key is None or key < best_key:
            best, best_key = chain, key
    return best
