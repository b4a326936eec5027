"""Structured status shared by the seam and tracker protocols and every role.

Invariant: `Status.ok` is True exactly for StatusCode.OK; every other status has a message.
"""

from __future__ import annotations

import dataclasses
import enum


class StatusCode(enum.IntEnum):
    """Mirrors meshnet.shard.v1.StatusCode (same numbers)."""

    UNSPECIFIED = 0
    OK = 1
    INVALID_ARGUMENT = 2
    VERSION_MISMATCH = 3
    STALE_EPOCH = 4
    FINGERPRINT_MISMATCH = 5
    CHECKSUM_MISMATCH = 6
    RESOURCE_EXHAUSTED = 7
    DEADLINE_EXCEEDED = 8
    CANCELLED = 9
    NOT_FOUND = 10
    CACHE_MISMATCH = 11
    UNAVAILABLE = 12
    INTERNAL = 13
    UNAUTHENTICATED = 14  # no route ticket, or a signature that does not verify
    PERMISSION_DENIED = 15  # a valid ticket that does not admit this request


@dataclasses.dataclass(frozen=True)
class Status:
    code: StatusCode  # what went wrong (OK when nothing did)
    message: str = ""  # for humans; required unless OK
    retryable: bool = False  # whether the same request may succeed if retried
    hop: str = ""  # node id of the failing hop ("" = the peer that answered)

    @property
    def ok(self) -> bool:
        return self.code == StatusCode.OK


OK = Status(StatusCode.OK)
