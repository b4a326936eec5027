"""The typed shard client against real in-process gRPC servers on loopback: a fake servicer
written here in protobuf (what a C++ worker would answer), and the native service adapter
(shard_service) around a fake handler. Conversions are exact, streams carry native types both
ways, and failures raise what the raw stub raised (grpc.RpcError with its code) or ProtocolError."""

from __future__ import annotations

import dataclasses
import threading
from concurrent import futures

import grpc
import pytest

from meshnet.identity.certificates import node_certificate
from meshnet.identity.requests import SUPERVISOR_METADATA
from meshnet.identity.tls import bind, pinned_channel
from meshnet.protocol import commitments, seam, shard_service
from meshnet.protocol.errors import ProtocolError
from meshnet.protocol.shard_client import ShardClient
from meshnet.shard.v1 import shard_pb2 as pb
from meshnet.shard.v1 import shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.ids import SessionId
from meshnet.wire.status import Status, StatusCode

SUPERVISOR = "supervisor-token"
SESSION = t.RouteSession(SessionId("s-1"), 2)
OK = pb.Status(code=pb.STATUS_CODE_OK)

# Every field of HealthReply set to a value of its own (step_times and status too).
FULL_HEALTH = pb.HealthReply(
    status=pb.Status(code=pb.STATUS_CODE_UNAVAILABLE, message="draining", retryable=True, hop="n-1"),
    active_sessions=2, queue_depth=3, kv_cells_used=4, kv_cells_total=5, batches=6, mean_batch_rows=7.5,
    max_batch_sessions=8, compute_us=9, seam_frames_in=10, seam_bytes_in=11, fence_entries=12, results_readers=13,
    drafted_tokens=14, accepted_drafts=15, rewound_rows=16, device="vulkan0", device_description="llvmpipe",
    device_memory_used=19, device_memory_free=20, device_memory_total=21,
    step_times=pb.StepTimes(steps=22, admit_us=23, wait_us=24, after_us=25, send_us=26, reply_us=27, queue_us=28,
                            engine_us=29))


class FakeShard(shard_pb2_grpc.ShardServicer):
    """A fake shard service in protobuf: canned Health (or one that hangs until released),
    TakeWork for the supervisor only, a Seam that answers each frame, Results for a signed
    request only, and Commitments about the ticket's session."""

    def __init__(self) -> None:
        self.health = FULL_HEALTH
        self.release = threading.Event()
        self.hang = False

    def Health(self, request, context):  # noqa: N802
        if self.hang:
            self.release.wait(10)
        return self.health

    def TakeWork(self, request, context):  # noqa: N802
        if dict(context.invocation_metadata()).get(SUPERVISOR_METADATA) != SUPERVISOR:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "supervisor only")
        return pb.TakeWorkReply(work=[pb.SessionWork(session=pb.RouteSession(session_id="s-1", epoch=2),
                                                     prefill_tokens=5, decode_tokens=7),
                                      pb.SessionWork(session=pb.RouteSession(session_id="s-2", epoch=1),
                                                     decode_tokens=1)])

    def Seam(self, request_iterator, context):  # noqa: N802
        for frame in request_iterator:
            yield pb.SeamReply(version=frame.version, session=frame.session, step=frame.step, credits=frame.step + 2,
                               cache=pb.CacheState(length=frame.span.start + frame.span.count), status=OK)

    def Results(self, request, context):  # noqa: N802
        if not request.client_signature:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unsigned results request")
        yield pb.ResultFrame(version=request.version, session=request.session, step=1,
                             tokens=[pb.SampledToken(token_id=42, position=5, logprob=-0.5)], status=OK)
        yield pb.ResultFrame(version=request.version, session=request.session, step=2,
                             finish_reason=pb.FINISH_REASON_STOP, status=OK)

    def Commitments(self, request, context):  # noqa: N802
        audit = pb.AuditBody.FromString(request.ticket.body)
        body = pb.CommitmentsBody(node_id=audit.node_id, session_id=audit.session_id, epoch=audit.epoch,
                                  layer_start=10, layer_end=20, k=2, start=request.start, count=request.count,
                                  input_indices=b"\x01\x00\x02\x00", input_values=b"\x00\x3c\x00\x40",
                                  temperature=0.5, constrained=True)
        return pb.CommitmentsReply(status=OK, body=body.SerializeToString(), signature=b"signed")


def _serve(register, tls=None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    register(server)
    port = bind(server, "127.0.0.1:0", tls)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def fake():
    shard = FakeShard()
    server, address = _serve(lambda s: shard_pb2_grpc.add_ShardServicer_to_server(shard, s))
    with ShardClient.dial(address, None) as client:
        yield shard, client, address
    shard.release.set()
    server.stop(None)


def _frame(step: int, start: int, count: int) -> t.SeamFrame:
    return t.SeamFrame(seam.PROTOCOL_VERSION, SESSION, t.Phase.PREFILL if step == 1 else t.Phase.DECODE, step,
                       span=t.TokenSpan(start, count), token_ids=tuple(range(count)))


def test_health_reads_every_field_of_the_reply(fake):
    _, client, _ = fake
    health = client.health(timeout=5)
    assert health == t.Health(Status(StatusCode.UNAVAILABLE, "draining", True, "n-1"), 2, 3, 4, 5, 6, 7.5, 8, 9, 10,
                              11, 12, 13, 14, 15, 16, "vulkan0", "llvmpipe", 19, 20, 21,
                              t.StepTimes(22, 23, 24, 25, 26, 27, 28, 29))
    # The native type has exactly the reply's fields: one added to the proto fails here.
    assert [f.name for f in dataclasses.fields(t.Health)] == [f.name for f in pb.HealthReply.DESCRIPTOR.fields]
    assert [f.name for f in dataclasses.fields(t.StepTimes)] == [f.name for f in pb.StepTimes.DESCRIPTOR.fields]


def test_health_leaves_absent_messages_none(fake):
    shard, client, _ = fake
    shard.health = pb.HealthReply(active_sessions=1)
    assert client.health(timeout=5) == t.Health(active_sessions=1)


def test_health_with_a_status_code_this_peer_does_not_know_is_still_an_answer(fake):
    # A newer worker's status code must not fail a node's heartbeat, its /metrics or the bench.
    shard, client, _ = fake
    shard.health = pb.HealthReply(status=pb.Status(code=99, message="new", hop="n1"), active_sessions=2)
    health = client.health(timeout=5)
    assert health.status == Status(StatusCode.UNSPECIFIED, "status code 99 unknown to this peer: new", False, "n1")
    assert health.active_sessions == 2
    client.ping(timeout=5)


def test_health_past_its_timeout_raises_deadline_exceeded(fake):
    shard, client, _ = fake
    shard.hang = True
    for call in (client.health, client.ping):
        with pytest.raises(grpc.RpcError) as caught:
            call(timeout=0.2)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_unreachable_shard_raises_unavailable():
    with ShardClient.dial("127.0.0.1:1", None) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.health(timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_take_work_answers_the_supervisor_only(fake):
    _, client, _ = fake
    with pytest.raises(grpc.RpcError) as caught:
        client.take_work("someone-else", timeout=5)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert client.take_work(SUPERVISOR, timeout=5) == (
        tt.WorkEntry(SESSION, 5, 7), tt.WorkEntry(t.RouteSession(SessionId("s-2"), 1), 0, 1))


def test_seam_stream_sends_and_reads_native_frames_until_ended(fake):
    _, client, _ = fake
    stream = client.seam(max_queued=4)
    replies = iter(stream)
    stream.send(_frame(1, 0, 3), timeout=5)
    first = next(replies)
    assert first == t.SeamReply(seam.PROTOCOL_VERSION, SESSION, 1, 3, t.CacheState(3), Status(StatusCode.OK))
    stream.send(_frame(2, 3, 1), timeout=5)
    assert next(replies).cache == t.CacheState(4)
    stream.end(timeout=1)
    assert list(replies) == []  # the server ended the stream after ours


def test_a_cancelled_seam_stream_raises_cancelled_to_its_reader(fake):
    _, client, _ = fake
    stream = client.seam(max_queued=4)
    replies = iter(stream)
    stream.send(_frame(1, 0, 1))
    next(replies)
    stream.cancel()
    with pytest.raises(grpc.RpcError) as caught:
        next(replies)
    assert caught.value.code() == grpc.StatusCode.CANCELLED


def test_results_stream_reads_native_frames_and_raises_the_refusal(fake):
    _, client, _ = fake
    request = t.ResultsRequest(seam.PROTOCOL_VERSION, SESSION, t.RouteTicket(b"body", b"sig"), b"client-signature")
    frames = list(client.results(request))
    assert [f.tokens for f in frames] == [(t.SampledToken(42, 5, -0.5),), ()]
    assert frames[-1].finish_reason == t.FinishReason.STOP and frames[-1].session == SESSION
    with pytest.raises(grpc.RpcError) as caught:
        list(client.results(dataclasses.replace(request, client_signature=b"")))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_commitments_come_back_as_signed_and_decode_natively(fake):
    _, client, _ = fake
    ticket = t.AuditTicket(seam.encode_audit_body("s-1", 2, "n-1", 123), b"tracker-signature")
    assert seam.decode_audit_body(ticket.body) == t.AuditBody(SessionId("s-1"), 2, "n-1", 123)
    signed = client.commitments(ticket, start=4, count=2, timeout=5)
    assert signed.signature == b"signed"
    assert commitments.decode_body(signed.body) == t.CommitmentsBody(
        "n-1", SessionId("s-1"), 2, 10, 20, 2, 4, 2, input_indices=b"\x01\x00\x02\x00",
        input_values=b"\x00\x3c\x00\x40", temperature=0.5, constrained=True)
    with pytest.raises(ProtocolError):
        commitments.decode_body(b"\xff\xff")


def test_dial_trusts_only_the_pinned_certificate():
    cert, key = node_certificate()
    other, _ = node_certificate()
    shard = FakeShard()
    server, address = _serve(lambda s: shard_pb2_grpc.add_ShardServicer_to_server(shard, s), (cert, key))
    try:
        with ShardClient.dial(address, cert) as client:
            assert client.health(timeout=5).active_sessions == 2
        with ShardClient.dial(address, other) as client:
            with pytest.raises(grpc.RpcError) as caught:
                client.ping(timeout=2)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)


def test_a_client_over_a_callers_channel_leaves_it_open(fake):
    _, _, address = fake
    channel = pinned_channel(address, None)
    with ShardClient(channel) as client:
        client.ping(timeout=5)
    ShardClient(channel).ping(timeout=5)  # still usable
    channel.close()


# ---- the native service adapter ------------------------------------------------------------

class FakeHandler:
    """A fake Python shard in native types, mounted with shard_service.add_to_server."""

    def __init__(self, health: t.Health) -> None:
        self.health_reply = health
        self.sizes: list[int] = []
        self.closed = threading.Event()

    def hello(self, request, context):
        return seam.negotiate(request, "fake")

    def health(self, context):
        return self.health_reply

    def take_work(self, context):
        return (tt.WorkEntry(SESSION, 5, 7),)

    def seam_stream(self, frames, context):
        try:
            for received in frames:
                self.sizes.append(received.size)
                try:
                    frame = received.decode()
                except ProtocolError as err:
                    yield t.SeamReply(seam.PROTOCOL_VERSION, None, 0, status=err.status)
                    continue
                yield t.SeamReply(seam.PROTOCOL_VERSION, frame.session, frame.step, 8, None, Status(StatusCode.OK))
        finally:
            self.closed.set()

    def results_stream(self, request, context):
        yield t.ResultFrame(seam.PROTOCOL_VERSION, request.session, 1, (t.SampledToken(7, 0),))


@pytest.fixture
def adapted():
    health = t.Health(Status(StatusCode.OK), active_sessions=1, mean_batch_rows=2.5, rewound_rows=3,
                      device_memory_used=4, step_times=t.StepTimes(steps=1, engine_us=9))
    handler = FakeHandler(health)
    server, address = _serve(lambda s: shard_service.add_to_server(s, handler))
    with ShardClient.dial(address, None) as client:
        yield handler, client, address
    server.stop(None)


def test_the_adapter_serves_native_health_and_work_unchanged(adapted):
    handler, client, _ = adapted
    assert client.health(timeout=5) == handler.health_reply
    handler.health_reply = t.Health()
    assert client.health(timeout=5) == t.Health()  # absent status and step times stay absent
    assert client.take_work(SUPERVISOR, timeout=5) == (tt.WorkEntry(SESSION, 5, 7),)


def test_the_adapter_hands_frames_over_undecoded_and_streams_replies(adapted):
    handler, client, address = adapted
    frame = _frame(1, 0, 2)
    stream = client.seam(max_queued=4)
    replies = iter(stream)
    stream.send(frame)
    assert next(replies) == t.SeamReply(seam.PROTOCOL_VERSION, SESSION, 1, 8, None, Status(StatusCode.OK))
    assert handler.sizes == [len(seam.encode(frame))]
    with pinned_channel(address, None) as channel:  # a frame no native type can say: an unknown phase
        raw = shard_pb2_grpc.ShardStub(channel).Seam(iter([pb.SeamFrame(phase=99)]))
        (reply,) = [seam.from_proto(r) for r in raw]
    assert reply.status.code == StatusCode.INVALID_ARGUMENT and "phase" in reply.status.message
    stream.end(timeout=1)
    assert list(replies) == []
    assert handler.closed.wait(5)


def test_the_adapter_streams_results_and_leaves_commitments_unimplemented(adapted):
    _, client, _ = adapted
    request = t.ResultsRequest(seam.PROTOCOL_VERSION, SESSION)
    assert [f.tokens for f in client.results(request)] == [(t.SampledToken(7, 0),)]
    with pytest.raises(grpc.RpcError) as caught:
        client.commitments(t.AuditTicket(b"", b""), 0, 1, timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
