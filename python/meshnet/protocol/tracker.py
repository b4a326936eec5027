"""The tracker protocol's edge: meshnet.tracker.v1 protobuf <-> native types (meshnet.wire.tracker).

Conversion is generic (protocol/descriptors.py): native dataclass fields carry the proto field
names; sub-messages map through the registry below (absent -> None), repeated fields become
tuples, enums become the native IntEnums (an unknown number is a ProtocolError). Encoding is
deterministic.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshnet.protocol.descriptors import DescriptorCodec
from meshnet.shard.v1 import shard_pb2
from meshnet.tracker.v1 import tracker_pb2 as pb
from meshnet.wire import seam as seam_types
from meshnet.wire import tracker as tt
from meshnet.wire.status import Status, StatusCode

# The seam's messages that tracker messages carry, then every tracker message.
_NATIVES: dict[type, type] = {
    shard_pb2.ProtocolVersion: seam_types.ProtocolVersion,
    shard_pb2.Fingerprints: seam_types.Fingerprints,
    shard_pb2.RouteSession: seam_types.RouteSession,
    shard_pb2.Status: Status,
    shard_pb2.RouteTicket: seam_types.RouteTicket,
    shard_pb2.AuditTicket: seam_types.AuditTicket,
}
_NATIVES.update({getattr(pb, name): getattr(tt, name) for name in pb.DESCRIPTOR.message_types_by_name})
_CODEC = DescriptorCodec(_NATIVES, {
    "meshnet.tracker.v1.BackendKind": tt.BackendKind,
    "meshnet.tracker.v1.Admission": tt.Admission,
    "meshnet.shard.v1.StatusCode": StatusCode,
})
MESSAGE_TYPES = {name: getattr(tt, name) for name in pb.DESCRIPTOR.message_types_by_name}


def from_proto(message: Message) -> Any:
    return _CODEC.from_proto(message)


def to_proto(value: Any) -> Message:
    return _CODEC.to_proto(value)


def encode(value: Any) -> bytes:
    return _CODEC.encode(value)


def decode(cls: type, data: bytes) -> Any:
    return _CODEC.decode(cls, data)
