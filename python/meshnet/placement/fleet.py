"""The planner's inputs: a model's shape, what each node offers, and what the swarm wants.

Pure values (frozen dataclasses), checked on construction: a bad figure (negative, NaN,
infinite where a finite one is needed, an empty model) raises ValueError naming the field, so
the planner itself never sees one. Callers (the tracker, the simulator, tests) build these from
measured figures; nothing here measures or reads anything.

Units: bytes, seconds, bytes per second. A node's speed for a model is measured decode seconds
per layer of that model on one of its devices (`DeviceOffer.seconds_per_layer`); where a device
has no figure for a model, its seconds per GiB of layer weights (`seconds_per_gib`, measured on
any model: decode reads every weight once per token, so time follows bytes) stand in, scaled by
the model's layer bytes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NewType, Optional

# A registered node's id (the same NewType as meshnet.wire.ids.NodeId, not imported: this room
# imports no other meshnet package).
NodeId = NewType("NodeId", str)
GIB = 1 << 30


def _finite(name: str, value: float, minimum: float = 0.0, strict: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {value!r}")


def _count(name: str, value: int, minimum: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str  # the model's name: the key of per-model speeds and of parts on disk
    layer_bytes: tuple[int, ...]  # weight bytes of each decoder layer, in order (at least one)
    kv_bytes_per_token: tuple[int, ...]  # K and V bytes one token takes in each layer's cache
    activation_bytes: int  # one token's hidden state as it crosses a hop
    embedding_bytes: int = 0  # token embeddings, held by the stage with layer 0 (memory only)
    output_bytes: int = 0  # output norm and head, held and read per token by the last stage

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model name must not be empty")
        if not self.layer_bytes:
            raise ValueError(f"model {self.name}: layer_bytes must name at least one layer")
        if len(self.kv_bytes_per_token) != len(self.layer_bytes):
            raise ValueError(f"model {self.name}: kv_bytes_per_token has {len(self.kv_bytes_per_token)} "
                             f"entries for {len(self.layer_bytes)} layers")
        for i, (weights, kv) in enumerate(zip(self.layer_bytes, self.kv_bytes_per_token)):
            _count(f"model {self.name}: layer_bytes[{i}]", weights, 1)
            _count(f"model {self.name}: kv_bytes_per_token[{i}]", kv)
        _count(f"model {self.name}: activation_bytes", self.activation_bytes)
        _count(f"model {self.name}: embedding_bytes", self.embedding_bytes)
        _count(f"model {self.name}: output_bytes", self.output_bytes)

    @property
    def n_layer(self) -> int:
        return len(self.layer_bytes)

    def weight_bytes(self, start: int, end: int) -> int:
        """Weights a stage holding [start, end) loads: its layers, plus the embeddings at the
        first stage and the head at the last."""
        extra = (self.embedding_bytes if start == 0 else 0) + (self.output_bytes if end == self.n_layer else 0)
        return sum(self.layer_bytes[start:end]) + extra

    def memory_bytes(self, start: int, end: int, kv_tokens: int) -> int:
        """Weights plus a KV cache of `kv_tokens` cells over [start, end)."""
        return self.weight_bytes(start, end) + kv_tokens * sum(self.kv_bytes_per_token[start:end])

    def total_bytes(self) -> int:
        return self.weight_bytes(0, self.n_layer)


@dataclasses.dataclass(frozen=True)
class DeviceOffer:
    backend: str  # compute backend the device runs ("cpu", "cuda", "metal", "vulkan")
    memory_bytes: int  # memory the node offers on this device for weights and KV
    seconds_per_gib: float  # measured decode seconds per GiB of layer weights (any model)
    seconds_per_layer: tuple[tuple[str, float], ...] = ()  # measured decode seconds per layer, by model name

    def __post_init__(self) -> None:
        if not self.backend:
            raise ValueError("device backend must not be empty")
        _count(f"device {self.backend}: memory_bytes", self.memory_bytes)
        _finite(f"device {self.backend}: seconds_per_gib", self.seconds_per_gib, strict=True)
        names = [name for name, _ in self.seconds_per_layer]
        if len(set(names)) != len(names):
            raise ValueError(f"device {self.backend}: seconds_per_layer names a model twice")
        for name, seconds in self.seconds_per_layer:
            _finite(f"device {self.backend}: seconds_per_layer[{name!r}]", seconds, strict=True)

    def seconds_per_byte(self, model: ModelShape) -> float:
        """Decode seconds per weight byte of `model`: its own measurement where there is one."""
        for name, seconds in self.seconds_per_layer:
            if name == model.name:
                return seconds / (sum(model.layer_bytes) / model.n_layer)
        return self.seconds_per_gib / GIB


@dataclasses.dataclass(frozen=True)
class LinkOffer:
    peer: NodeId  # the node at the other end
    rtt_seconds: float  # measured round trip to it
    bytes_per_second: float  # measured bandwidth to it

    def __post_init__(self) -> None:
        _finite(f"link to {self.peer}: rtt_seconds", self.rtt_seconds)
        _finite(f"link to {self.peer}: bytes_per_second", self.bytes_per_second, strict=True)


@dataclasses.dataclass(frozen=True)
class Part:
    model: str  # model name
    start: int  # layers [start, end) of it on the node's disk
    end: int

    def __post_init__(self) -> None:
        _count(f"part of {self.model}: start", self.start)
        if not isinstance(self.end, int) or self.end <= self.start:
            raise ValueError(f"part of {self.model}: end must exceed start, got [{self.start}, {self.end})")


@dataclasses.dataclass(frozen=True)
class NodeOffer:
    node_id: NodeId  # the node's registered id (ties in the plan break on it)
    devices: tuple[DeviceOffer, ...]  # its devices; a stage runs on one of them
    rtt_seconds: float  # measured round trip to a typical peer (hops with no pairwise figure)
    bytes_per_second: float  # measured bandwidth to a typical peer
    fetch_bytes_per_second: float  # measured rate at which it fetches weights from peers
    links: tuple[LinkOffer, ...] = ()  # measured figures to particular peers, overriding the defaults
    parts: tuple[Part, ...] = ()  # layer ranges already on its disk

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id must not be empty")
        if not self.devices:
            raise ValueError(f"node {self.node_id}: offers no device")
        _finite(f"node {self.node_id}: rtt_seconds", self.rtt_seconds)
        _finite(f"node {self.node_id}: bytes_per_second", self.bytes_per_second, strict=True)
        _finite(f"node {self.node_id}: fetch_bytes_per_second", self.fetch_bytes_per_second, strict=True)
        backends = [device.backend for device in self.devices]
        if len(set(backends)) != len(backends):
            raise ValueError(f"node {self.node_id}: two devices share a backend name (an assignment names its "
                             "device by it)")
        peers = [link.peer for link in self.links]
        if len(set(peers)) != len(peers):
            raise ValueError(f"node {self.node_id}: links name a peer twice")

    def hop_seconds(self, activation_bytes: int, peer: Optional[NodeId] = None) -> float:
        """One token's hop out of this node: a round trip plus the activation's transfer."""
        for link in self.links:
            if link.peer == peer:
                return link.rtt_seconds + activation_bytes / link.bytes_per_second
        return self.rtt_seconds + activation_bytes / self.bytes_per_second

    def bytes_on_disk(self, model: ModelShape, start: int, end: int) -> int:
        """Weight bytes of [start, end) of `model` (layers, embeddings, head) its parts hold."""
        held = set()
        for part in self.parts:
            if part.model == model.name:
                held.update(range(max(part.start, start), min(part.end, end)))
        total = sum(model.layer_bytes[i] for i in held)
        if 0 in held and start == 0:
            total += model.embedding_bytes
        if model.n_layer - 1 in held and end == model.n_layer:
            total += model.output_bytes
        return total


@dataclasses.dataclass(frozen=True)
class Targets:
    kv_tokens_per_session: int  # KV cells each session may fill
    sessions: int = 1  # concurrent sessions a route carries: every stage reserves KV for them
    replicas: Optional[int] = None  # holders wanted per range beyond the first (None: every node that fits)

    def __post_init__(self) -> None:
        _count("kv_tokens_per_session", self.kv_tokens_per_session)
        _count("sessions", self.sessions, 1)
        if self.replicas is not None:
            _count("replicas", self.replicas)

    @property
    def kv_tokens(self) -> int:
        """KV cells each stage reserves."""
        return self.kv_tokens_per_session * self.sessions


def check_fleet(models: tuple[ModelShape, ...], nodes: tuple[NodeOffer, ...]) -> None:
    """ValueError for duplicate model names or node ids; the values check themselves."""
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("two models share a name")
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("two nodes share an id")
    for model in models:
        if not isinstance(model, ModelShape):
            raise ValueError(f"not a ModelShape: {model!r}")
    for node in nodes:
        if not isinstance(node, NodeOffer):
            raise ValueError(f"not a NodeOffer: {node!r}")
