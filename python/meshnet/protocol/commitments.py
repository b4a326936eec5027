"""A hop's signed commitments (docs/adr/0008-verified-outputs.md), as far as anyone but the
verifier reads them: what the node signs them under, and which (session, epoch, node) a signed
body is about. The tracker checks a refutation's proof with these before it records a verdict."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from meshnet.protocol.errors import invalid
from meshnet.shard.v1 import shard_pb2

COMMITMENTS_DOMAIN = b"meshnet-commitments-v1\0"  # what a node's signature covers: this, then the body


def subject(body: bytes) -> tuple[str, int, str]:
    """(session id, epoch, node id) of a serialized CommitmentsBody; ProtocolError if it is not one."""
    try:
        parsed = shard_pb2.CommitmentsBody.FromString(body)
    except DecodeError:
        raise invalid("the commitments body does not parse") from None
    return parsed.session_id, parsed.epoch, parsed.node_id
