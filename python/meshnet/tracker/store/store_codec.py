"""JSON values of the etcd tracker store (etcd_store.py): node records, node loads, route sessions.

Pure functions. Every value carries `"v": VERSION`; a reader refuses (ValueError) a value of
another version or shape rather than guess, and the store skips such a key with a log line. Times
are on the registry's clock in records and wall-clock seconds in values (trackers' monotonic
clocks mean nothing to each other): `to_wall`/`from_wall` convert. Encoded values are bounded by
MAX_VALUE_BYTES (RecordTooLarge past it), well inside etcd's default 1.5 MiB request limit.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Optional

from meshnet.tracker.store.state_store import NodeRecord, RecordTooLarge, SessionRecord
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints

VERSION = 1
MAX_VALUE_BYTES = 512 * 1024

Convert = Callable[[float], float]


def dump(value: dict, what: str) -> bytes:
    data = json.dumps({"v": VERSION, **value}, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_VALUE_BYTES:
        raise RecordTooLarge(f"{what} is {len(data)} bytes encoded, over the store's {MAX_VALUE_BYTES}-byte limit")
    return data


def load(data: bytes) -> dict:
    value = json.loads(data)
    if not isinstance(value, dict) or value.get("v") != VERSION:
        raise ValueError(f"not a version-{VERSION} store value")
    return value


# ---- node records (key nodes/<id>) and loads (key loads/<id>) ---------------------------------

def node_value(record: NodeRecord) -> bytes:
    return dump({"info": _info(record.info), "admission": int(record.admission), "reason": record.reason,
                 "draining": record.draining}, f"node {record.info.node_id}")


def node_record(value: dict) -> NodeRecord:
    """The record from its nodes/ value, with no load yet (the loads/ value brings it)."""
    return NodeRecord(_node_info(value["info"]), tt.Admission(int(value["admission"])), str(value["reason"]),
                      bool(value["draining"]))


def load_of(value: dict, from_wall: Convert) -> tuple[tt.Load, float]:
    """(load, last heartbeat on the registry's clock) from a loads/ value."""
    return tt.Load(**value["load"]), from_wall(float(value["heartbeat"]))


def load_value(load_: tt.Load, heartbeat: float, to_wall: Convert) -> bytes:
    """A node's telemetry is its own word: a non-finite figure is stored as 0 (JSON has no NaN)."""
    fields = {f: getattr(load_, f) for f in tt.Load.__dataclass_fields__}
    fields = {f: v if math.isfinite(v) else 0 for f, v in fields.items()}
    return dump({"load": fields, "heartbeat": to_wall(heartbeat)}, "load")


# ---- route sessions (key sessions/<id>) -------------------------------------------------------

def session_value(record: SessionRecord, writer: str, to_wall: Convert) -> bytes:
    """`writer`: a token unique to this write, so that a writer whose answer was lost can tell
    whether its write is the one stored."""
    hops = [{"node": _info(h.node), "layers": [h.layers.start, h.layers.end]} for h in record.hops]
    return dump({"model": record.model, "epoch": record.epoch, "hops": hops, "expected_tokens": record.expected_tokens,
                 "avoid": sorted(record.avoid), "client_key": record.client_key.hex(), "client_id": record.client_id,
                 "opened": to_wall(record.opened_at), "lease_until": to_wall(record.lease_until), "writer": writer},
                f"route session at epoch {record.epoch}")


def session_record(value: dict, from_wall: Convert) -> SessionRecord:
    hops = tuple(tt.Hop(_node_info(h["node"]), tt.LayerRange(*map(int, h["layers"]))) for h in value["hops"])
    return SessionRecord(str(value["model"]), int(value["epoch"]), hops, int(value["expected_tokens"]),
                         frozenset(NodeId(n) for n in value["avoid"]), bytes.fromhex(value["client_key"]),
                         str(value["client_id"]), from_wall(float(value["opened"])),
                         from_wall(float(value["lease_until"])))


# ---- node info ----------------------------------------------------------------------------------

def _info(info: Optional[tt.NodeInfo]) -> dict[str, Any]:
    if info is None:
        raise ValueError("a stored node needs its info")
    fp, layers, cap = info.fingerprints, info.layers, info.capacity
    return {"node_id": info.node_id, "address": info.address, "backend": int(info.backend), "model": info.model,
            "architecture": info.architecture,
            "fingerprints": [fp.model_artifact, fp.runtime_recipe] if fp else None,
            "range_fingerprint": info.range_fingerprint, "layers": [layers.start, layers.end] if layers else None,
            "capacity": [cap.max_sessions, cap.kv_tokens, cap.memory_bytes, cap.max_session_tokens] if cap else None,
            "n_layer": info.n_layer, "public_key": info.public_key.hex(), "tls_certificate": info.tls_certificate,
            "relay": info.relay, "relay_rtt_ms": info.relay_rtt_ms,
            "device": dataclasses.astuple(info.device) if info.device else None}


def _node_info(v: dict[str, Any]) -> tt.NodeInfo:
    fp, layers, cap = v["fingerprints"], v["layers"], v["capacity"]
    return tt.NodeInfo(NodeId(v["node_id"]), str(v["address"]), tt.BackendKind(int(v["backend"])), str(v["model"]),
                       str(v["architecture"]), Fingerprints(*map(str, fp)) if fp else None,
                       str(v["range_fingerprint"]), tt.LayerRange(*map(int, layers)) if layers else None,
                       tt.Capacity(*map(int, cap)) if cap else None, int(v["n_layer"]),
                       bytes.fromhex(v["public_key"]), str(v["tls_certificate"]), str(v["relay"]),
                       float(v["relay_rtt_ms"]), _device(v.get("device")))  # absent in records before ADR 0014


def _device(v: Optional[list]) -> Optional[tt.Device]:
    return tt.Device(str(v[0]), str(v[1]), int(v[2]), int(v[3])) if v else None
