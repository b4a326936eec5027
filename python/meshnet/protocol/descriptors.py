"""Protobuf messages <-> native frozen dataclasses, driven by the message descriptors.

A native class mirrors one message: its dataclass fields carry the proto field names. Each
field converts by what the descriptor says it is: a sub-message maps through the registry
(absent -> None), a repeated field becomes a tuple, an enum becomes the registered native
IntEnum (an unknown number is a ProtocolError), a singular bytes field also takes a bytearray
or memoryview. Encoding is deterministic, so equal native values give equal bytes.

The tracker protocol converts with one of these (protocol/tracker.py). The seam keeps its
hand-written codec for the reason in protocol/seam.py's docstring; //python:codec_bench measures
the two side by side on the seam's messages.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from meshnet.protocol.errors import invalid, parsed

# How one field converts: its name, repeated or not, and what it holds.
_SCALAR, _BYTES, _ENUM, _MESSAGE = range(4)


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    repeated: bool
    kind: int
    enum: Any  # the native IntEnum of an enum field, else None


class DescriptorCodec:
    """Converts the messages of `natives` (protobuf class -> native dataclass) both ways.

    Every field of each native class must exist, by name, in its message (checked here, so a
    renamed field fails at import); `enums` maps each enum's full proto name to its native IntEnum.
    """

    def __init__(self, natives: Mapping[type, type], enums: Mapping[str, type[enum.IntEnum]]) -> None:
        self._native = {proto.DESCRIPTOR.full_name: native for proto, native in natives.items()}
        self._proto = {native: proto for proto, native in natives.items()}
        self._fields: dict[type, tuple[_Field, ...]] = {}
        for proto, native in natives.items():
            self._fields[native] = tuple(self._plan(proto.DESCRIPTOR, field.name, enums)
                                         for field in dataclasses.fields(native))

    @staticmethod
    def _plan(descriptor: Any, name: str, enums: Mapping[str, type[enum.IntEnum]]) -> _Field:
        field = descriptor.fields_by_name.get(name)
        if field is None:
            raise TypeError(f"{descriptor.full_name} has no field {name!r}")
        if field.message_type is not None:
            return _Field(name, field.is_repeated, _MESSAGE, None)
        if field.enum_type is not None:
            return _Field(name, field.is_repeated, _ENUM, enums[field.enum_type.full_name])
        return _Field(name, field.is_repeated, _BYTES if field.type == FieldDescriptor.TYPE_BYTES else _SCALAR, None)

    @property
    def message_types(self) -> dict[str, type]:
        """Native classes by name."""
        return {native.__name__: native for native in self._proto}

    def from_proto(self, message: Message) -> Any:
        native = self._native[message.DESCRIPTOR.full_name]
        values = {}
        for field in self._fields[native]:
            value = getattr(message, field.name)
            if field.kind == _MESSAGE:
                if field.repeated:
                    values[field.name] = tuple(self.from_proto(item) for item in value)
                else:
                    values[field.name] = self.from_proto(value) if message.HasField(field.name) else None
            elif field.kind == _ENUM:
                values[field.name] = (tuple(self._enum(field, item) for item in value) if field.repeated
                                      else self._enum(field, value))
            else:
                values[field.name] = tuple(value) if field.repeated else value
        return native(**values)

    @staticmethod
    def _enum(field: _Field, value: int) -> Any:
        try:
            return field.enum(value)
        except ValueError:
            raise invalid(f"unknown {field.enum.__name__} {value}") from None

    def fill(self, value: Any, message: Message) -> None:
        """Writes the native `value` into the empty `message` of its type."""
        for field in self._fields[type(value)]:
            item = getattr(value, field.name)
            if field.kind == _MESSAGE:
                if field.repeated:
                    target = getattr(message, field.name)
                    for element in item:
                        self.fill(element, target.add())
                elif item is not None:
                    sub = getattr(message, field.name)
                    sub.SetInParent()
                    self.fill(item, sub)
            elif field.repeated:
                getattr(message, field.name).extend([int(x) for x in item] if field.kind == _ENUM else item)
            elif field.kind == _ENUM:
                setattr(message, field.name, int(item))
            elif field.kind == _BYTES:
                setattr(message, field.name, bytes(item) if isinstance(item, (bytearray, memoryview)) else item)
            else:
                setattr(message, field.name, item)

    def to_proto(self, value: Any) -> Message:
        message = self._proto[type(value)]()
        self.fill(value, message)
        return message

    def encode(self, value: Any) -> bytes:
        return self.to_proto(value).SerializeToString(deterministic=True)

    def decode(self, native: type, data: bytes) -> Any:
        return self.from_proto(parsed(self._proto[native](), data, native.__name__))
