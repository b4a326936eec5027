"""The tracker protocol's edge: meshnet.tracker.v1 protobuf <-> native types (meshnet.wire.tracker).

Conversion is generic: native dataclass fields carry the proto field names; sub-messages map
through the registry below (absent -> None), repeated fields become tuples, enums become the
native IntEnums (an unknown number is a ProtocolError). Encoding is deterministic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from meshnet.protocol.errors import invalid
from meshnet.shard.v1 import shard_pb2
from meshnet.tracker.v1 import tracker_pb2 as pb
from meshnet.wire import seam as seam_types
from meshnet.wire import tracker as tt
from meshnet.wire.status import Status, StatusCode

_NATIVE: dict[str, type] = {
    shard_pb2.ProtocolVersion.DESCRIPTOR.full_name: seam_types.ProtocolVersion,
    shard_pb2.Fingerprints.DESCRIPTOR.full_name: seam_types.Fingerprints,
    shard_pb2.RouteSession.DESCRIPTOR.full_name: seam_types.RouteSession,
    shard_pb2.Status.DESCRIPTOR.full_name: Status,
    shard_pb2.RouteTicket.DESCRIPTOR.full_name: seam_types.RouteTicket,
    shard_pb2.AuditTicket.DESCRIPTOR.full_name: seam_types.AuditTicket,
}
for _name in pb.DESCRIPTOR.message_types_by_name:
    _NATIVE[f"meshnet.tracker.v1.{_name}"] = getattr(tt, _name)
_PROTO = {cls: getattr(pb, cls.__name__) for name, cls in _NATIVE.items() if name.startswith("meshnet.tracker.v1.")}
_PROTO.update({seam_types.ProtocolVersion: shard_pb2.ProtocolVersion, seam_types.Fingerprints: shard_pb2.Fingerprints,
               seam_types.RouteSession: shard_pb2.RouteSession, Status: shard_pb2.Status,
               seam_types.RouteTicket: shard_pb2.RouteTicket, seam_types.AuditTicket: shard_pb2.AuditTicket})
_ENUMS = {
    "meshnet.tracker.v1.BackendKind": tt.BackendKind,
    "meshnet.tracker.v1.Admission": tt.Admission,
    "meshnet.shard.v1.StatusCode": StatusCode,
}
MESSAGE_TYPES = {cls.__name__: cls for name, cls in _NATIVE.items() if name.startswith("meshnet.tracker.v1.")}


def _value_in(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return from_proto(value)
    if field.enum_type is not None:
        try:
            return _ENUMS[field.enum_type.full_name](value)
        except ValueError:
            raise invalid(f"unknown {field.enum_type.name} {value}") from None
    return value


def from_proto(message: Message) -> Any:
    cls = _NATIVE[message.DESCRIPTOR.full_name]
    kwargs = {}
    for f in dataclasses.fields(cls):
        field = message.DESCRIPTOR.fields_by_name[f.name]
        value = getattr(message, f.name)
        if field.is_repeated:
            kwargs[f.name] = tuple(_value_in(field, v) for v in value)
        elif field.message_type is not None:
            kwargs[f.name] = from_proto(value) if message.HasField(f.name) else None
        else:
            kwargs[f.name] = _value_in(field, value)
    return cls(**kwargs)


def _fill(value: Any, message: Message) -> None:
    for f in dataclasses.fields(value):
        field = message.DESCRIPTOR.fields_by_name[f.name]
        item = getattr(value, f.name)
        if field.is_repeated:
            target = getattr(message, f.name)
            for element in item:
                if field.message_type is not None:
                    _fill(element, target.add())
                else:
                    target.append(int(element) if field.enum_type is not None else element)
        elif field.message_type is not None:
            if item is not None:
                sub = getattr(message, f.name)
                sub.SetInParent()
                _fill(item, sub)
        else:
            setattr(message, f.name, int(item) if field.enum_type is not None else item)


def to_proto(value: Any) -> Message:
    message = _PROTO[type(value)]()
    _fill(value, message)
    return message


def encode(value: Any) -> bytes:
    return to_proto(value).SerializeToString(deterministic=True)


def decode(cls: type, data: bytes) -> Any:
    message = _PROTO[cls]()
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise invalid(f"undecodable {cls.__name__}: {err}") from err
    return from_proto(message)
