"""What a joining node should serve (issue 50, item 4): the tracker decides, never the node's
flags. Until the placement planner (issue 51) replaces it, the rule is the simplest that fills
uncovered ranges first:

- candidates are the parts of every published model the registry serves whose bytes fit both
  the memory the node offers and its free disk (a part's file size stands for its weights; the
  KV cache is sized by the node afterwards, in what is left);
- each is scored by how many nodes serve its range now (routable nodes, every one of whose
  layers it covers counts) plus those assigned it and still fetching; the fewest wins, then
  the larger part (the node's memory is not wasted on a small one), then model and first layer;
- an assignment is kept for its node while it fetches (`hold_seconds`), so nodes joining at
  once spread over the ranges, and a node asking again (a restart mid-fetch) gets the same part.

Every node's last decision (what it offered, what it was given and why, or why nothing) is kept
for the operator (`decisions`: /status.json's "joining", the doctor command), at most
MAX_DECISIONS nodes, the oldest forgotten first. Pure decisions over what the caller passes, and
two tables under one lock.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable, Mapping, Optional

from meshnet.weights.manifest import Manifest, Part
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.status import Status, StatusCode

HOLD_SECONDS = 3600.0  # a node has this long to fetch its part and register before its assignment lapses
MAX_DECISIONS = 1024  # nodes whose last decision is kept for the operator
MAX_REFUSED_PARTS = 64  # parts a node may say it cannot hold, in one request


@dataclasses.dataclass(frozen=True)
class JoinDecision:
    node_id: str
    at: float  # Unix time of the decision
    memory_bytes: int  # what the node offered: the memory it measured (or its cap)
    disk_free_bytes: int  # and its free disk
    device: str
    model: str  # "" when nothing was assigned
    layers: Optional[tuple[int, int]]
    part: str
    reason: str  # why this part, or why none
    fetching: bool = False  # assigned and not registered yet (filled in when read)


def human_bytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


class Assignments:
    def __init__(self, hold_seconds: float = HOLD_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold, self._clock = hold_seconds, clock
        self._held: dict[NodeId, tuple[str, Part, float]] = {}  # node -> (model, part, until)
        self._decisions: collections.OrderedDict[NodeId, JoinDecision] = collections.OrderedDict()
        self._lock = threading.Lock()

    def assign(self, node: NodeId, offer: tt.AssignRequest, published: Mapping[str, Manifest],
               served: Callable[[str, int, int], int]) -> tt.AssignReply:
        """The part `node` should fetch and serve; `served(model, start, end)` counts the routable
        nodes that serve every layer of [start, end)."""
        reply = self._decide(node, offer, published, served)
        layers = (reply.layers.start, reply.layers.end) if reply.layers else None
        decision = JoinDecision(node, time.time(), offer.memory_bytes, offer.disk_free_bytes, offer.device[:64],
                                reply.model, layers, reply.part_file,
                                reply.reason or (reply.status.message if reply.status else ""))
        with self._lock:
            self._decisions.pop(node, None)
            self._decisions[node] = decision
            while len(self._decisions) > MAX_DECISIONS:
                self._decisions.popitem(last=False)
        return reply

    def decisions(self) -> list[JoinDecision]:
        """Each node's last decision, by node id; `fetching` while its assignment is held."""
        now = self._clock()
        with self._lock:
            held = {n for n, (_, _, until) in self._held.items() if until > now}
            return [dataclasses.replace(d, fetching=d.node_id in held and d.layers is not None)
                    for _, d in sorted(self._decisions.items())]

    def _decide(self, node: NodeId, offer: tt.AssignRequest, published: Mapping[str, Manifest],
                served: Callable[[str, int, int], int]) -> tt.AssignReply:
        now = self._clock()
        with self._lock:
            self._held = {n: held for n, held in self._held.items() if held[2] > now}
            refused = set(offer.refused_parts[:MAX_REFUSED_PARTS])
            if node in self._held and self._held[node][1].file in refused:
                del self._held[node]  # it fetched it and cannot hold it: something else
            if node in self._held:
                model, part, _ = self._held[node]
                self._held[node] = (model, part, now + self._hold)
                return self._reply(model, part, "the part this node was assigned before (still fetching)")
            fits = [(model, part) for model, manifest in sorted(published.items()) for part in manifest.parts
                    if part.size <= offer.memory_bytes and part.size <= offer.disk_free_bytes
                    and part.file not in refused]
            if not fits:
                return tt.AssignReply(Status(StatusCode.NOT_FOUND, self._why_none(offer, published, refused)))
            fetching: dict[tuple[str, int, int], int] = {}
            for model, part, _ in self._held.values():
                fetching[(model, part.start, part.end)] = fetching.get((model, part.start, part.end), 0) + 1

            def load(candidate: tuple[str, Part]) -> tuple[int, int, str, int]:
                model, part = candidate
                nodes = served(model, part.start, part.end) + fetching.get((model, part.start, part.end), 0)
                return nodes, -part.size, model, part.start

            model, part = min(fits, key=load)
            nodes = load((model, part))[0]
            self._held[node] = (model, part, now + self._hold)
        why = "uncovered" if nodes == 0 else f"the least served part that fits ({nodes} nodes serve or fetch it)"
        return self._reply(model, part, why)

    def release(self, node: NodeId) -> None:
        """The node registered (or left): its assignment is no longer held."""
        with self._lock:
            self._held.pop(node, None)

    @staticmethod
    def _reply(model: str, part: Part, reason: str) -> tt.AssignReply:
        return tt.AssignReply(Status(StatusCode.OK), model, tt.LayerRange(part.start, part.end), part.file, reason)

    @staticmethod
    def _why_none(offer: tt.AssignRequest, published: Mapping[str, Manifest], refused: set[str]) -> str:
        parts = [p for manifest in published.values() for p in manifest.parts]
        if not parts:
            return "this tracker publishes no model (//python:publish)"
        if refused and all(p.file in refused or p.size > offer.memory_bytes for p in parts):
            return (f"out of memory: this node measured it cannot hold {', '.join(sorted(refused))}, and no other "
                    f"published part fits its {human_bytes(offer.memory_bytes)}")
        smallest = min(p.size for p in parts)
        return (f"out of memory or disk: the smallest published part needs {human_bytes(smallest)}; this node offers "
                f"{human_bytes(offer.memory_bytes)} of memory and {human_bytes(offer.disk_free_bytes)} of disk")


def served_by(coverage: Callable[[str], tt.CoverageReply]) -> Callable[[str, int, int], int]:
    """`served(model, start, end)` from the registry's coverage map: the fewest routable nodes
    on any layer of the range."""
    def served(model: str, start: int, end: int) -> int:
        reply = coverage(model)
        counts = [layer.replicas for layer in reply.layers if start <= layer.layer < end]
        return min(counts) if counts else 0
    return served
