"""Test support for the placement room (tests only; nothing in the library imports it): small
fleets to build by hand or draw with hypothesis, and a brute-force chain search to check the
planner's exactness against.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

from hypothesis import strategies as st

from meshnet.placement.fleet import DeviceOffer, ModelShape, NodeId, NodeOffer, Targets

MODEL = "m"
MIB = 1 << 20


def model(n_layer: int, layer_mib: int = 100, kv_bytes: int = 0, embedding_mib: int = 0, output_mib: int = 0,
          activation_bytes: int = 0, name: str = MODEL) -> ModelShape:
    """A model of `n_layer` alike layers of `layer_mib` MiB."""
    return ModelShape(name, (layer_mib * MIB,) * n_layer, (kv_bytes,) * n_layer, activation_bytes,
                      embedding_mib * MIB, output_mib * MIB)


def node(name: str, seconds_per_layer: float, memory_mib: int, rtt: float = 0.0, bandwidth: float = 1e9,
         fetch: float = 100 * MIB, extra_devices: Sequence[tuple[str, float, int]] = (), model_name: str = MODEL,
         parts=()) -> NodeOffer:
    """A node whose first device runs a layer of `model_name` in `seconds_per_layer`; extra
    devices are (backend, seconds per layer, memory MiB)."""
    devices = [DeviceOffer("cpu", memory_mib * MIB, 1.0, ((model_name, seconds_per_layer),))]
    devices += [DeviceOffer(b, m * MIB, 1.0, ((model_name, s),)) for b, s, m in extra_devices]
    return NodeOffer(NodeId(name), tuple(devices), rtt, bandwidth, fetch, parts=tuple(parts))


@st.composite
def small_fleets(draw, max_nodes: int = 4, max_layers: int = 6, max_devices: int = 2, kv: bool = True):
    """(model, nodes, targets): alike layers, a few nodes with one or two devices, speeds and
    memories from small sets so that ties happen."""
    n_layer = draw(st.integers(1, max_layers))
    shape = model(n_layer, layer_mib=100, kv_bytes=draw(st.sampled_from([0, 1024])) if kv else 0,
                  embedding_mib=draw(st.sampled_from([0, 30, 150])), output_mib=draw(st.sampled_from([0, 50, 100])),
                  activation_bytes=draw(st.sampled_from([0, 8192])))
    count = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(count):
        devices = [(backend, draw(st.sampled_from([0.01, 0.02, 0.04, 0.1])),
                    draw(st.sampled_from([90, 150, 250, 400, 700])))
                   for backend in ("cpu", "cuda")[: draw(st.integers(1, max_devices))]]
        backend, seconds, memory = devices[0]
        nodes.append(node(f"n{i}", seconds, memory, rtt=draw(st.sampled_from([0.0, 0.005, 0.02])),
                          bandwidth=draw(st.sampled_from([1e6, 1e9])), extra_devices=devices[1:]))
    targets = Targets(kv_tokens_per_session=draw(st.sampled_from([0, 512])), sessions=draw(st.integers(1, 6)),
                      replicas=draw(st.sampled_from([None, 0, 1])))
    return shape, nodes, targets


def stage_time(shape: ModelShape, node_: NodeOffer, device: DeviceOffer, start: int, end: int) -> float:
    weights = sum(shape.layer_bytes[start:end]) + (shape.output_bytes if end == shape.n_layer else 0)
    return device.seconds_per_byte(shape) * weights + node_.hop_seconds(shape.activation_bytes)


def brute_force(shape: ModelShape, nodes: Sequence[NodeOffer], kv_tokens: int,
                max_stages: int) -> Optional[float]:
    """The least bottleneck over every chain of at most `max_stages` distinct nodes (every order,
    every device, every cut) whose stages fit their devices' memory; None if there is none."""
    best = math.inf
    n = shape.n_layer
    for k in range(1, min(max_stages, len(nodes), n) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0,) + cuts + (n,)
            ranges = list(zip(bounds[:-1], bounds[1:]))
            needs = [shape.memory_bytes(a, b, kv_tokens) for a, b in ranges]
            for order in itertools.permutations(nodes, k):
                worst = 0.0
                for node_, (a, b), need in zip(order, ranges, needs):
                    times = [stage_time(shape, node_, d, a, b) for d in node_.devices if d.memory_bytes >= need]
                    worst = max(worst, min(times, default=math.inf))
                best = min(best, worst)
    return None if math.isinf(best) else best


def chain_fits(shape: ModelShape, nodes: Sequence[NodeOffer], kv_tokens: int, stages) -> bool:
    """Whether every (node, backend, start, end) stage fits its device's memory."""
    by_id = {n.node_id: n for n in nodes}
    for node_id, backend, start, end in stages:
        device = next(d for d in by_id[node_id].devices if d.backend == backend)
        if shape.memory_bytes(start, end, kv_tokens) > device.memory_bytes:
            return False
    return True
