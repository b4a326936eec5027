"""A hop's signed commitments (docs/adr/0008-verified-outputs.md): what the node signs them
under, which (session, epoch, node) a signed body is about (the tracker checks a refutation's
proof with these before it records a verdict), and the whole body as the verifier reads it."""

from __future__ import annotations


from meshnet.protocol.errors import parsed
from meshnet.shard.v1 import shard_pb2
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId

COMMITMENTS_DOMAIN = b"meshnet-commitments-v1\0"  # what a node's signature covers: this, then the body


def _parse(body: bytes) -> shard_pb2.CommitmentsBody:
    return parsed(shard_pb2.CommitmentsBody(), body, "CommitmentsBody")


def subject(body: bytes) -> tuple[str, int, str]:
    """(session id, epoch, node id) of a serialized CommitmentsBody; ProtocolError if it is not one."""
    message = _parse(body)
    return message.session_id, message.epoch, message.node_id


def decode_body(body: bytes) -> t.CommitmentsBody:
    """A serialized CommitmentsBody (check its signature first); ProtocolError if it is not one."""
    m = _parse(body)
    return t.CommitmentsBody(
        node_id=m.node_id, session_id=SessionId(m.session_id), epoch=m.epoch, layer_start=m.layer_start,
        layer_end=m.layer_end, k=m.k, start=m.start, count=m.count, input_tokens=m.input_tokens,
        input_indices=m.input_indices, input_values=m.input_values, output_indices=m.output_indices,
        output_values=m.output_values, sampled_tokens=m.sampled_tokens, sampled_logits=m.sampled_logits,
        temperature=m.temperature, constrained=m.constrained)
