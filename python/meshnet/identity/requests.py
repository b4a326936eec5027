"""Signed tracker requests (ADR 0003): who is calling, proven per call with their Ed25519 key.

The caller (TrackerClient) attaches its public key, the time and a signature over the method,
the time and the request's bytes, plus its role's bearer token. The tracker's service checks
them before it handles the request. Invariant: a request verifies only for the exact method and
bytes it was signed for, within MAX_SKEW_MS of the tracker's clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Iterable, Optional

from meshnet.identity.keys import Identity, verify

KEY_METADATA = "x-meshnet-key"
TIME_METADATA = "x-meshnet-time"
SIGNATURE_METADATA = "x-meshnet-signature"
TOKEN_METADATA = "authorization"
RPC_DOMAIN = b"meshnet-rpc-v1\0"
MAX_SKEW_MS = 120_000
# A shard's TakeWork (its ledger counters) answers only its own node: the node makes a random
# token at start, hands it to the shard (the worker reads it from this environment variable,
# never argv) and sends it in this metadata.
SUPERVISOR_METADATA = "x-meshnet-supervisor"
SUPERVISOR_ENV = "MESHNET_SUPERVISOR_TOKEN"


class RequestAuthError(Exception):
    """The request's signature metadata is missing, stale or wrong."""


def _message(method: str, unix_ms: int, request_bytes: bytes) -> bytes:
    return RPC_DOMAIN + method.encode() + b"\0" + str(unix_ms).encode() + b"\0" + hashlib.sha256(request_bytes).digest()


def sign_request(identity: Identity, token: str, method: str, request_bytes: bytes,
                 unix_ms: Optional[int] = None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that proves `identity` sent these bytes to `method` now."""
    unix_ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    signature = identity.sign(_message(method, unix_ms, request_bytes))
    return ((TOKEN_METADATA, f"Bearer {token}"), (KEY_METADATA, base64.b64encode(identity.public_key).decode()),
            (TIME_METADATA, str(unix_ms)), (SIGNATURE_METADATA, base64.b64encode(signature).decode()))


def verify_request(metadata: Iterable[tuple[str, str]], method: str, request_bytes: bytes,
                   now_ms: Optional[int] = None) -> bytes:
    """The caller's public key, or RequestAuthError."""
    fields = {k: v for k, v in metadata}
    try:
        key = base64.b64decode(fields[KEY_METADATA], validate=True)
        unix_ms = int(fields[TIME_METADATA])
        signature = base64.b64decode(fields[SIGNATURE_METADATA], validate=True)
    except (KeyError, ValueError) as err:
        raise RequestAuthError(f"request signature metadata missing or malformed: {err}") from None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now_ms - unix_ms) > MAX_SKEW_MS:
        raise RequestAuthError(f"request time is {abs(now_ms - unix_ms)} ms off the tracker's clock")
    if not verify(key, signature, _message(method, unix_ms, request_bytes)):
        raise RequestAuthError("request signature does not verify")
    return key


def is_supervisor(metadata: Iterable[tuple[str, str]], token: str) -> bool:
    """True when the call carries the shard's supervisor token (never when none is set)."""
    given = dict(metadata).get(SUPERVISOR_METADATA, "")
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def bearer_token(metadata: Iterable[tuple[str, str]]) -> str:
    value = dict(metadata).get(TOKEN_METADATA, "")
    return value[len("Bearer "):] if value.startswith("Bearer ") else ""
