"""ProtocolError: a structured Status raised by the codecs, never a bare crash."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from meshnet.wire.status import Status, StatusCode

M = TypeVar("M", bound=Message)


class ProtocolError(Exception):
    """Raised for bad input on the wire; `status` is what the peer is told."""

    def __init__(self, code: StatusCode, message: str, *, retryable: bool = False, hop: str = "") -> None:
        super().__init__(f"{code.name}: {message}")
        self.status = Status(code, message, retryable, hop)

    @property
    def code(self) -> StatusCode:
        return self.status.code


def invalid(message: str) -> ProtocolError:
    return ProtocolError(StatusCode.INVALID_ARGUMENT, message)


def parsed(message: M, data: bytes, what: str) -> M:
    """`message` filled from `data`, or ProtocolError (INVALID_ARGUMENT) naming `what`: bytes
    from the network that do not parse are the sender's fault, never a crash here."""
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise invalid(f"undecodable {what}: {err}") from err
    return message


def exhausted(message: str) -> ProtocolError:
    return ProtocolError(StatusCode.RESOURCE_EXHAUSTED, message)
