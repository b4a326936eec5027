"""Seam message conversion: every message round-trips, versions are checked, Hello negotiates."""

from __future__ import annotations

import numpy as np
import pytest

from meshnet.protocol import bundle, seam, tensors
from meshnet.protocol.errors import ProtocolError
from meshnet.shard.v1 import shard_pb2 as pb
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId
from meshnet.wire.status import Status, StatusCode

V1 = seam.PROTOCOL_VERSION
SESSION = t.RouteSession(SessionId("sess-1"), 3)


def _fragment():
    (f,) = bundle.encode_bundle([tensors.from_numpy("hidden_states", np.ones((2, 4), np.float32))], 11)
    return f


MESSAGES = [
    t.SeamFrame(V1, SESSION, t.Phase.PREFILL, 1, "w-1", t.Fingerprints("sha256:aa", "sha256:bb"), t.ShardRange(0, 10, 0),
                t.TokenSpan(0, 2), (1, 2), t.CacheState(0), 2500, t.SamplingParams(0.75, 40, 0.875, 42, 64, (2,), 3, 'root ::= "{" [0-9]+ "}"', (7, 0, 49151)), _fragment(),
                (t.DownstreamHop("node-b", "127.0.0.1:7002", t.ShardRange(10, 20, 12)), t.DownstreamHop("node-c", "h:1", None))),
    t.SeamFrame(V1, SESSION, t.Phase.RELEASE, 9),
    t.SeamFrame(V1, SESSION, t.Phase.DECODE, 2, expected_cache=t.CacheState(0)),  # present but empty
    t.SeamReply(V1, SESSION, 4, 8, t.CacheState(17), Status(StatusCode.OK)),
    t.SeamReply(V1, SESSION, 4, 0, None, Status(StatusCode.STALE_EPOCH, "epoch 3 < 4", True, "node-b"), True),
    t.ResultFrame(V1, SESSION, 5, (t.SampledToken(42, 17, -0.25, (t.TokenLogprob(42, -0.25), t.TokenLogprob(7, -2.5))),),
                  t.FinishReason.LENGTH, Status(StatusCode.OK)),
    t.ResultsRequest(V1, SESSION),
    t.HelloRequest((t.ProtocolVersion(1, 0), t.ProtocolVersion(2, 1)), ("compression.zlib",), "client-1"),
    t.HelloReply(V1, ("compression.zlib",), "node-a", Status(StatusCode.OK)),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    data = seam.encode(message)
    assert seam.decode(type(message), data) == message
    assert seam.encode(seam.decode(type(message), data)) == data


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_the_descriptor_driven_form_gives_the_same_bytes_and_values(message):
    described = seam.descriptor_codec()
    data = seam.encode(message)
    assert described.encode(message) == data
    assert described.decode(type(message), data) == message


def test_absent_and_empty_submessages_differ():
    empty = seam.encode(t.SeamFrame(V1, SESSION, t.Phase.DECODE, 2, expected_cache=t.CacheState(0)))
    absent = seam.encode(t.SeamFrame(V1, SESSION, t.Phase.DECODE, 2))
    assert empty != absent
    assert seam.decode_seam_frame(absent).expected_cache is None


def test_version_checks():
    frame = t.SeamFrame(t.ProtocolVersion(2, 0), SESSION, t.Phase.DECODE, 1)
    with pytest.raises(ProtocolError) as err:
        seam.decode_seam_frame(seam.encode(frame))
    assert err.value.code == StatusCode.VERSION_MISMATCH
    with pytest.raises(ProtocolError) as err:
        seam.decode_seam_frame(seam.encode(t.SeamFrame(None, SESSION, t.Phase.DECODE, 1)))
    assert err.value.code == StatusCode.INVALID_ARGUMENT
    newer_minor = seam.decode_seam_frame(seam.encode(t.SeamFrame(t.ProtocolVersion(1, 7), SESSION, t.Phase.DECODE, 1)))
    assert newer_minor.version.minor == 7


def test_unknown_fields_of_a_newer_minor_are_ignored():
    data = seam.encode(t.SeamFrame(V1, SESSION, t.Phase.DECODE, 1)) + bytes([0xF8, 0x06, 0x01])  # field 111 = 1
    assert seam.decode_seam_frame(data).step == 1


def test_garbage_and_unknown_enums_are_invalid_argument():
    with pytest.raises(ProtocolError) as err:
        seam.decode_seam_frame(b"\xff\xff\xff")
    assert err.value.code == StatusCode.INVALID_ARGUMENT
    raw = pb.SeamFrame(phase=77, version=pb.ProtocolVersion(major=1)).SerializeToString()
    with pytest.raises(ProtocolError, match="unknown phase 77"):
        seam.decode_seam_frame(raw)


def test_negotiate():
    reply = seam.negotiate(t.HelloRequest((t.ProtocolVersion(1, 3),), ("compression.zlib", "x"), "c"), "node")
    assert reply.status.ok and reply.chosen_version == V1 and reply.features == ("compression.zlib",)
    refused = seam.negotiate(t.HelloRequest((t.ProtocolVersion(2, 0),)), "node")
    assert refused.status.code == StatusCode.VERSION_MISMATCH and refused.chosen_version is None
    assert "2.0" in refused.status.message
