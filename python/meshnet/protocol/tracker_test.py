"""Tracker message conversion: native types mirror every proto message, and round-trip."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.protocol import tracker
from meshnet.protocol.errors import ProtocolError
from meshnet.tracker.v1 import tracker_pb2 as pb
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId
from meshnet.wire.seam import AuditTicket, Fingerprints, ProtocolVersion, RouteSession, RouteTicket
from meshnet.wire.status import Status, StatusCode

NODE = tt.NodeInfo(NodeId("node-a"), "127.0.0.1:7001", tt.BackendKind.GGUF, "smollm2-135m-instruct", "llama",
                   Fingerprints("sha256:aa", "sha256:bb"), "sha256:cc", tt.LayerRange(0, 10),
                   tt.Capacity(8, 8192, 1 << 30, 2048), 30, b"k" * 32, "-----BEGIN CERTIFICATE-----\n...")
SESSION = RouteSession(SessionId("s-1"), 4)
OK = Status(StatusCode.OK)

SAMPLES = [
    tt.RegisterRequest(ProtocolVersion(1, 0), NODE),
    tt.RegisterReply(OK, tt.Admission.DARK, "architecture qwen3 is not certified", 5000),
    tt.HeartbeatRequest(NodeId("node-a"), tt.Load(2, 1, 0.5, 100, 8192, 120.5, 300.25, 1 << 28)),
    tt.HeartbeatReply(OK, 5000, 3),
    tt.DrainRequest(NodeId("node-a")),
    tt.DrainReply(OK),
    tt.DeregisterRequest(NodeId("node-a")),
    tt.DeregisterReply(OK),
    tt.CoverageRequest("smollm2-135m-instruct", 64),
    tt.CoverageReply(OK, 30, (tt.LayerCoverage(0, (NodeId("node-a"),), 3),), (tt.LayerRange(10, 30),), (NODE,),
                     (NodeId("node-q"),), (), 4, 3),
    tt.OpenRouteRequest("smollm2-135m-instruct", "client-1", 256, (NodeId("node-b"),)),
    tt.RouteReply(OK, SESSION, (tt.Hop(NODE, tt.LayerRange(0, 10), RouteTicket(b"body", b"s" * 64)),), (), 60000),
    tt.RouteReply(Status(StatusCode.UNAVAILABLE, "layers 10..30 are not covered", True), None, (),
                  (tt.LayerRange(10, 30),)),
    tt.ReportFailureRequest(SESSION, NodeId("node-b"), Status(StatusCode.UNAVAILABLE, "stream lost", True, "node-b")),
    tt.WorkReport(NodeId("node-a"), (tt.WorkEntry(SESSION, 128, 64),), 77),
    tt.WorkReply(OK),
    tt.CloseRouteRequest(SESSION),
    tt.CloseRouteRequest(SESSION, tt.Delivery(12, 64)),
    tt.CloseRouteReply(OK),
    tt.RenewRouteRequest(SESSION),
    tt.RenewRouteReply(OK, 60000),
    tt.TrackerKeyRequest(),
    tt.TrackerKeyReply(OK, b"t" * 32),
    tt.RedeemInviteRequest("0a1b2c3d4e5f", b"s" * 32),
    tt.RedeemInviteReply(OK, "node", "token"),
    tt.AssignRequest(8 << 30, 100 << 30, "cpu"),
    tt.AssignReply(OK, "smol", tt.LayerRange(0, 10), "smol.layers-0-10.gguf", "uncovered"),
    tt.TakeAuditRequest("sha256:" + "a" * 64),
    tt.TakeAuditReply(OK, tt.AuditJob(7, SESSION, "smollm2-135m-instruct", (tt.Hop(NODE, tt.LayerRange(0, 10)),),
                                      (AuditTicket(b"audit body", b"a" * 64),),
                                      Fingerprints("sha256:a", "sha256:r"), "f32")),
    tt.TakeAuditRequest("sha256:" + "a" * 64, ("cpu", "vulkan")),
    tt.TakeAuditReply(OK, tt.AuditJob(7, SESSION, "smollm2-135m-instruct", (tt.Hop(NODE, tt.LayerRange(0, 10)),),
                                      (AuditTicket(b"audit body", b"a" * 64),),
                                      Fingerprints("sha256:a", "sha256:r"), "f32",
                                      (tt.HopRecipe("vulkan", "sha256:v", "quantized"),))),
    tt.TakeAuditReply(Status(StatusCode.NOT_FOUND, "no audit pending")),
    tt.ReportAuditRequest(7, False, "node-a", 48, '{"findings": []}'),
    tt.ReportAuditRequest(7, False, "node-a", 48, '{}', (tt.SignedCommitments(b"body", b"s" * 64),)),
    tt.ReportAuditReply(OK),
]


def test_every_proto_message_has_a_native_twin_with_the_same_fields():
    for name, descriptor in pb.DESCRIPTOR.message_types_by_name.items():
        native = tracker.MESSAGE_TYPES[name]
        assert {f.name for f in dataclasses.fields(native)} == set(descriptor.fields_by_name), name


def test_samples_cover_every_top_level_message():
    requests_and_replies = {m.input_type.name for m in pb.DESCRIPTOR.services_by_name["Tracker"].methods}
    requests_and_replies |= {m.output_type.name for m in pb.DESCRIPTOR.services_by_name["Tracker"].methods}
    assert requests_and_replies <= {type(s).__name__ for s in SAMPLES}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(sample):
    data = tracker.encode(sample)
    assert tracker.decode(type(sample), data) == sample
    assert tracker.encode(tracker.decode(type(sample), data)) == data


def test_bad_input_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        tracker.decode(tt.RegisterRequest, b"\x12\xff")
    raw = pb.RegisterReply(admission=9).SerializeToString()
    with pytest.raises(ProtocolError, match="unknown Admission 9"):
        tracker.decode(tt.RegisterReply, raw)
