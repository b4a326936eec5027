"""One route for one model over a pool of candidate nodes: which nodes, in what order, holding
how many layers, so that the slowest stage is as fast as it can be.

Called by the planner (planner.py) once per model, on the nodes no other model's route took.

The search. For a bottleneck T, each node can hold at most mid(T) layers as a middle stage (its
time `hop + k * layer` and its memory within bounds), first(T) <= mid(T) as the first stage
(the embeddings share its memory) and last(T) as the last (which also reads the head). Decoder
layers being alike, which layers a stage holds does not change its time or memory, so a chain
of at most S stages within T exists iff one node holds the whole model within T, or there are
a last node g, a first node f != g and at most S - 2 other nodes M with
last(g) + first(f) + sum(mid over M) >= n_layer. For a fixed g and j = S - 1 non-last stages,
the best (f, M) is either the j largest mid (g excluded) with f the one among them that loses
least to the embeddings, or the j - 1 largest with f the best first among the rest: a sort, prefix
sums and running minima and maxima, for every g at once. Every count is non-decreasing in T, so
the test is monotone, and a binary search over every stage time a chain can have
(`candidate_bottlenecks`) finds the least T exactly: `min_bottleneck`. The order of the middle
stages does not change any time under that model.

Exact: the least bottleneck for at most S stages, over every subset and order of the pool's
nodes, every device of each node and every cut, when the model's decoder layers are alike
(`Chain.exact`; tested against brute force). For unlike layers, conservative (every layer counted
as the largest): a chain that fits, not always the best. Pairwise link figures are not used here
(each node's default hop); routes are re-timed with them afterwards.

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
every set of nodes (a heuristic). Given a `FleetShare` (the planner always gives one), the key is
instead the estimated tokens/s of every route the free nodes could fill with the chain's ranges:
the count is exact (Hall's condition for nested memory needs), the speed is a guess (each such
route taken as fast as this one). With one route wanted that is the least max(D, m * T) again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from meshnet.placement.capacity import Pool, candidate_bottlenecks, node_layers, row_layers, stage_seconds
from meshnet.placement.replicas import fillable_routes


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
    rows: list[int]  # chosen rows in stage order: the first, the middle ones, the last
    caps: list[int]  # most layers each may take within the bottleneck


@dataclasses.dataclass(frozen=True, eq=False)
class _Counts:
    """Per-node counts at one bottleneck, nodes ranked by middle count (most first, then the
    faster, the nearer, the lower id)."""

    order: np.ndarray  # node index at each rank
    rank: np.ndarray  # rank of each node
    mid: np.ndarray  # per rank: layers as a middle stage
    loss: np.ndarray  # per rank: layers lost as the first stage (inf if it cannot be first)
    first: np.ndarray  # per rank: layers as the first stage (-inf if it cannot be first)
    last: np.ndarray  # per node: layers as the last stage
    prefix: np.ndarray  # prefix[k]: sum of the k largest middle counts
    least_loss: np.ndarray  # least_loss[k]: the least loss over ranks < k
    best_first: np.ndarray  # best_first[k]: the most first-stage layers over ranks >= k
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]  # per node: the row it uses as middle, first, last


def _counts(pool: Pool, mid_rows: np.ndarray, first_rows: np.ndarray, last_rows: np.ndarray) -> _Counts:
    mid, mid_row = node_layers(pool, mid_rows)
    first, first_row = node_layers(pool, first_rows)
    last, last_row = node_layers(pool, last_rows)
    index = np.arange(len(mid))
    order = np.lexsort((index, pool.hop[mid_row], pool.layer_seconds[mid_row], -mid))
    rank = np.empty(len(mid), dtype=np.int64)
    rank[order] = index
    ranked_first = first[order].astype(np.float64)
    can_be_first = ranked_first >= 1
    loss = np.where(can_be_first, mid[order] - ranked_first, np.inf)
    as_first = np.where(can_be_first, ranked_first, -np.inf)
    best_first = _before(np.maximum.accumulate(as_first[::-1])[::-1], -np.inf)
    return _Counts(order, rank, mid[order], loss, as_first, last, _after(0, np.cumsum(mid[order])),
                   _after(np.inf, np.minimum.accumulate(loss)), best_first, (mid_row, first_row, last_row))


def _after(value: float, array: np.ndarray) -> np.ndarray:
    return np.concatenate(([value], array))


def _before(array: np.ndarray, value: float) -> np.ndarray:
    return np.concatenate((array, [value]))


def _totals(c: _Counts, j: int) -> np.ndarray:
    """For each node g as the last stage, the most layers a chain with j other stages holds
    (-inf where g cannot be last)."""
    n = len(c.order)
    r = c.rank
    inner = r < j  # g is among the j largest middle counts
    # f among the j largest (g excluded): their sum less the least loss among them.
    tail_loss = _before(np.minimum.accumulate(c.loss[: j + 1][::-1])[::-1], np.inf)  # over ranks k..j
    loss_without_g = np.where(inner, np.minimum(c.least_loss[r], tail_loss[np.minimum(r + 1, j + 1)]), c.least_loss[j])
    top_j = np.where(inner, c.prefix[min(j + 1, n)] - c.mid[r], c.prefix[j])
    a = top_j - loss_without_g
    # f outside the j - 1 largest (g excluded): their sum plus the best first count among the rest.
    from_j = _after(-np.inf, np.maximum.accumulate(c.first[j - 1:]))  # over ranks j-1 .. k-1, at k - (j - 1)
    outside = r >= j - 1
    best_first = np.where(outside, np.maximum(from_j[np.maximum(r - (j - 1), 0)], c.best_first[np.minimum(r + 1, n)]),
                          c.best_first[j])
    top_j1 = np.where(outside, c.prefix[j - 1], c.prefix[j] - c.mid[r])
    b = top_j1 + best_first
    return np.where(c.last >= 1, c.last + np.maximum(a, b), -np.inf)


def _layout(pool: Pool, bottleneck: float, max_stages: int) -> Optional[_Layout]:
    """The fewest-stage chain (at most `max_stages`) within `bottleneck`, or None."""
    n_layer = pool.n_layer
    mid_rows, first_rows, last_rows, only_rows = row_layers(pool, bottleneck)
    only, only_row = node_layers(pool, only_rows)
    single = np.flatnonzero(only >= n_layer)
    if len(single):
        times = pool.hop[only_row[single]] + pool.layer_seconds[only_row[single]] * n_layer
        pick = single[np.lexsort((single, times))[0]]
        return _Layout([int(only_row[pick])], [n_layer])
    n = len(only)
    most = min(max_stages - 1, n - 1)
    if most < 1 or n_layer < 2:
        return None
    c = _counts(pool, mid_rows, first_rows, last_rows)
    if _totals(c, most).max() < n_layer:
        return None
    low, high = 1, most  # the fewest other stages that reach n_layer
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _totals(c, middle).max() >= n_layer else (middle + 1, high)
    return _build(pool, c, low)


def _build(pool: Pool, c: _Counts, j: int) -> _Layout:
    """The chain with j stages besides the last: its last node (the fastest of those that reach,
    then the nearest, then the lowest id), first node and middle nodes."""
    totals = _totals(c, j)
    mid_row, first_row, last_row = c.rows
    reaching = np.flatnonzero(totals >= pool.n_layer)
    g = int(reaching[np.lexsort((reaching, pool.hop[last_row[reaching]], pool.layer_seconds[last_row[reaching]]))[0]])
    ranked = [int(k) for k in range(len(c.order)) if k != c.rank[g]]
    inside = ranked[:j]
    a = sum(c.mid[k] for k in inside) - min(c.loss[k] for k in inside)
    rest = ranked[j - 1:]
    b = sum(c.mid[k] for k in ranked[: j - 1]) + max(c.first[k] for k in rest)
    if a >= b:
        f = min(inside, key=lambda k: (c.loss[k], k))
        middles = [k for k in inside if k != f]
    else:
        f = max(rest, key=lambda k: (c.first[k], -k))
        middles = ranked[: j - 1]
    middles = sorted((int(c.order[k]) for k in middles if c.mid[k] >= 1))
    first = int(c.order[f])
    rows = [int(first_row[first])] + [int(mid_row[m]) for m in middles] + [int(last_row[g])]
    caps = [int(c.first[f])] + [int(c.mid[c.rank[m]]) for m in middles] + [int(c.last[g])]
    return _Layout(rows, caps)


def _allocate(pool: Pool, layout: _Layout) -> Optional[Chain]:
    """Layers per stage: one each, then the fastest filled first up to its count."""
    rows, caps = layout.rows, layout.caps
    counts = [1] * len(rows)
    spare = pool.n_layer - len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (pool.layer_seconds[rows[i]], i)):
        take = max(0, min(spare, caps[i] - 1))
        counts[i] += take
        spare -= take
    if spare or min(caps) < 1:
        return None
    times, start = [], 0
    for i, (row, count) in enumerate(zip(rows, counts)):
        times.append(stage_seconds(pool, row, start, start + count, last=i == len(rows) - 1))
        start += count
    return Chain(tuple(rows), tuple(counts), max(times), sum(times), pool.uniform)


def most_layers(pool: Pool) -> int:
    """The most layers one chain of the pool can hold, memory being the only limit."""
    mid_rows, first_rows, last_rows, only_rows = row_layers(pool, math.inf)
    single = int(only_rows.max()) if len(only_rows) else 0
    if len(pool.nodes) < 2:
        return single
    c = _counts(pool, mid_rows, first_rows, last_rows)
    chained = _totals(c, len(pool.nodes) - 1).max()
    return int(min(pool.n_layer, max(single, chained if np.isfinite(chained) else 0)))


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


@dataclasses.dataclass(frozen=True, eq=False)
class FleetShare:
    """What the rest of the fleet could add to a route's stage ranges (the planner's estimate of
    replicas when it picks a stage count)."""

    memory: np.ndarray  # largest-device memory of each free node (the chain's own included), ascending
    share: int  # free nodes the model may expect to use (its fair share of the free nodes)
    most_routes: float  # routes wanted at most (1 + replicas, or infinity)

    def routes(self, needs: list[int], stages: int) -> float:
        """Routes the fleet could fill with these stage ranges (`fillable_routes`), no more than
        the share divided among the stages, nor the routes wanted."""
        return float(min(self.most_routes, self.share // stages, fillable_routes(self.memory, needs)))


def best_chain(pool: Pool, sessions: int, fleet: Optional[FleetShare] = None) -> Optional[Chain]:
    """The chain with the least per-stream time per token max(D, sessions * T) among the
    least-bottleneck chains of each stage count (module docstring); with `fleet`, the one whose
    stage ranges give the most estimated tokens/s over the routes the fleet could form with
    them (routes x sessions / max(D, sessions * T); ties as without). None if the pool's memory
    cannot hold the model."""
    n = len(pool.nodes)
    fewest = chain_at(pool, math.inf, n)
    if fewest is None:
        return None
    candidates = candidate_bottlenecks(pool)
    overall = min_bottleneck(pool, n, candidates)
    widest = None if overall is None else chain_at(pool, overall, n)
    if widest is None:
        return None
    floor_index = int(np.searchsorted(candidates, overall))
    hops = np.sort(pool.hop)
    least_compute = float(np.min(pool.layer_seconds)) * pool.n_layer
    best, best_key = None, None
    high = len(candidates)
    for stages in range(len(fewest.rows), len(widest.rows) + 1):
        least_time = max(float(np.sum(hops[:stages])) + least_compute, sessions * overall)
        if best_key is not None and _bound(fleet, stages, sessions, least_time) >= best_key[0]:
            break  # no chain of this many stages or more can beat the best so far
        bottleneck = min_bottleneck(pool, stages, candidates, floor_index, high)
        if bottleneck is None:
            continue
        high = int(np.searchsorted(candidates, bottleneck)) + 1
        chain = chain_at(pool, bottleneck, stages)
        if chain is None:
            continue
        per_token = max(chain.decode_seconds, sessions * chain.bottleneck_seconds)
        first = per_token if fleet is None else -_estimate(pool, chain, fleet, sessions, per_token)
        key = (first, per_token, chain.bottleneck_seconds, len(chain.rows), chain.rows)
        if best_key is None or key < best_key:
            best, best_key = chain, key
    return best


def _estimate(pool: Pool, chain: Chain, fleet: FleetShare, sessions: int, per_token: float) -> float:
    needs = [pool.model.memory_bytes(a, b, pool.kv_tokens) for a, b in chain.ranges()]
    return max(1.0, fleet.routes(needs, len(chain.rows))) * sessions / per_token


def _bound(fleet: Optional[FleetShare], stages: int, sessions: int, least_time: float) -> float:
    """A lower bound on the first key of any chain of `stages` or more stages."""
    if fleet is None:
        return least_time
    return -max(1.0, float(min(fleet.most_routes, fleet.share // stages))) * sessions / least_time
