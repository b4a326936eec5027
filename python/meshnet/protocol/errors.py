"""ProtocolError: a structured Status raised by the codecs, never a bare crash."""

from __future__ import annotations

from meshnet.wire.status import Status, StatusCode


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


def exhausted(message: str) -> ProtocolError:
    return ProtocolError(StatusCode.RESOURCE_EXHAUSTED, message)
