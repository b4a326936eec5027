"""Shard server over real gRPC on loopback with a fake engine (named as such, test only): tickets,
epoch fencing, stream binding, bounded inputs, Results authorization, idempotent steps, release,
stream loss and the idle deadline. Each refusal asserts its exact code and that an honest
session beside it still gets exactly its tokens. (Over 400 lines: one case per refusal of the
hop contract, on one fixture.)"""

from __future__ import annotations

import dataclasses
import queue
import time
import tracemalloc
from types import SimpleNamespace
from typing import Optional

import grpc
import numpy as np
import pytest
import torch

from meshnet.identity import tickets
from meshnet.identity.keys import Identity
from meshnet.identity.requests import SUPERVISOR_METADATA
from meshnet.identity.certificates import node_certificate
from meshnet.identity.tls import pinned_channel
from meshnet.protocol import bundle, seam, tensors
from meshnet.protocol.errors import ProtocolError
from meshnet.reference.server import HIDDEN, ShardServer, serve
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire.status import StatusCode

TRACKER = Identity.generate()
CLIENT = Identity.generate()
SUPERVISOR = "supervisor-token-of-this-test"
N_LAYER, N_EMBD, VOCAB = 4, 4, 16


class FakeEngine:
    """Test fake of ReferenceEngine. The first shard turns token ids into hidden rows that hold
    the id; the last shard's logits favour (last id + 1) % VOCAB. A chain of them equals one."""

    def __init__(self, layers: tuple[int, int] = (0, N_LAYER), max_sessions: int = 4) -> None:
        self.shard = SimpleNamespace(start=layers[0], end=layers[1], first=layers[0] == 0, last=layers[1] == N_LAYER,
                                     config=SimpleNamespace(hidden_size=N_EMBD))
        self.max_sessions, self.max_kv_tokens = max_sessions, 1000
        self.sessions: dict = {}
        self.steps = 0

    def step(self, key, position, token_ids=None, hidden=None, from_layer=None, deadline=None):
        if deadline is not None and time.monotonic() > deadline:
            raise ProtocolError(StatusCode.DEADLINE_EXCEEDED, "budget spent", retryable=True)
        ids = token_ids.tolist() if token_ids is not None else [int(h) for h in hidden[:, 0].tolist()]
        self.steps += 1
        self.sessions[key] = position + len(ids)
        if not self.shard.last:
            return torch.tensor(ids, dtype=torch.float32)[:, None].repeat(1, N_EMBD), self.sessions[key]
        logits = torch.zeros(VOCAB)
        logits[(ids[-1] + 1) % VOCAB] = 1.0
        return logits, self.sessions[key]

    def release(self, key):
        return self.sessions.pop(key, None) is not None

    def stats(self):
        return len(self.sessions), sum(self.sessions.values())


@dataclasses.dataclass
class Node:
    engine: FakeEngine
    shard: ShardServer
    server: grpc.Server
    address: str
    stub: shard_pb2_grpc.ShardStub
    node_id: str
    certificate: str = ""

    def health(self) -> shard_pb2.HealthReply:
        return self.stub.Health(shard_pb2.HealthRequest())


def start_node(node_id: str, layers=(0, N_LAYER), tls: bool = False, **options) -> Node:
    engine = FakeEngine(layers)
    cert = node_certificate() if tls else None
    shard = ShardServer(engine, node_id, tracker_key=TRACKER.public_key, insecure=not tls,
                        supervisor_token=SUPERVISOR, **options)
    server, port = serve(shard, "127.0.0.1:0", cert, max_workers=32)
    address = f"127.0.0.1:{port}"
    channel = pinned_channel(address, cert[0] if cert else None)
    return Node(engine, shard, server, address, shard_pb2_grpc.ShardStub(channel), node_id,
                cert[0].decode() if cert else "")


@pytest.fixture
def nodes():
    started: list[Node] = []

    def make(*args, **kwargs) -> Node:
        started.append(start_node(*args, **kwargs))
        return started[-1]

    yield make
    for node in started:
        node.server.stop(None)


def ticket(session: t.RouteSession, node: Node, *, node_id: Optional[str] = None, layers=None, downstream=None,
           expires_in_ms: int = 60_000, tracker: Identity = TRACKER) -> t.RouteTicket:
    start, end = layers or (node.shard.layers)
    body = t.TicketBody(session.session_id, session.epoch, node_id or node.node_id, t.ShardRange(start, end, start),
                        downstream_node_id=downstream.node_id if downstream else "",
                        downstream_address=downstream.address if downstream else "",
                        downstream_tls_certificate=downstream.certificate if downstream else "",
                        client_public_key=CLIENT.public_key, client_principal=CLIENT.principal,
                        expires_unix_ms=tickets.now_ms() + expires_in_ms)
    return tickets.issue(tracker, body)


def results(node: Node, session: t.RouteSession, route_ticket=None, signer: Identity = CLIENT, signature=None):
    route_ticket = route_ticket if route_ticket is not None else ticket(session, node)
    signature = signature if signature is not None else tickets.results_signature(signer, route_ticket)
    request = t.ResultsRequest(seam.PROTOCOL_VERSION, session, route_ticket, signature)
    return node.stub.Results(seam.to_proto(request))


def token_of(result_stream) -> int:
    return seam.from_proto(next(result_stream)).tokens[0].token_id


class Stream:
    def __init__(self, node: Node) -> None:
        self.frames: queue.Queue = queue.Queue()
        self.call = node.stub.Seam(iter(self.frames.get, None))

    def send(self, frame: t.SeamFrame) -> t.SeamReply:
        self.frames.put(seam.to_proto(frame))
        return seam.from_proto(next(self.call))

    def close(self) -> None:
        self.frames.put(None)


def frame(session, step, phase=t.Phase.PREFILL, start=0, tokens=(3,), hidden=False, **fields) -> t.SeamFrame:
    if not hidden:
        return t.SeamFrame(seam.PROTOCOL_VERSION, session, phase, step, span=t.TokenSpan(start, len(tokens)),
                           token_ids=tuple(tokens), **fields)
    rows = np.repeat(np.array(tokens, dtype=np.float32)[:, None], N_EMBD, axis=1)
    fragment = bundle.encode_bundle([tensors.from_numpy(HIDDEN, rows)], step)[0]
    return t.SeamFrame(seam.PROTOCOL_VERSION, session, phase, step, span=t.TokenSpan(start, len(tokens)),
                       fragment=fragment, **fields)


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


class Honest:
    """The route's own client on `node`: prefill (1, 2, 3) before a refusal, then decode and
    release after it; its tokens must be exactly 4 and 5."""

    def __init__(self, node: Node, session=t.RouteSession("honest", 1), hidden: bool = False) -> None:
        self.node, self.session, self.hidden = node, session, hidden
        self.ticket = ticket(session, node)
        self.results = results(node, session, self.ticket)
        self.stream = Stream(node)
        reply = self.stream.send(frame(session, 1, tokens=(1, 2, 3), hidden=hidden, ticket=self.ticket))
        assert reply.status.ok and reply.cache.length == 3
        self.tokens = [token_of(self.results)]

    def finish(self) -> None:
        reply = self.stream.send(frame(self.session, 2, t.Phase.DECODE, 3, (self.tokens[-1],), hidden=self.hidden))
        assert reply.status.ok and reply.cache.length == 4
        self.tokens.append(token_of(self.results))
        assert self.tokens == [4, 5]
        assert self.stream.send(frame(self.session, 3, t.Phase.RELEASE)).status.ok
        assert seam.from_proto(next(self.results)).finish_reason == t.FinishReason.UNSPECIFIED  # the close
        self.stream.close()


def test_steps_results_replay_and_fencing(nodes):
    node = nodes("n-a")
    engine = node.engine
    s1 = t.RouteSession("s", 1)
    tokens1 = results(node, s1)
    stream = Stream(node)
    assert stream.send(frame(s1, 1, tokens=(1, 2, 3), ticket=ticket(s1, node))).cache.length == 3
    assert token_of(tokens1) == 4
    replay = stream.send(frame(s1, 1, tokens=(1, 2, 3)))
    assert replay.replayed and replay.cache.length == 3 and engine.steps == 1  # answered, not recomputed
    assert stream.send(frame(s1, 2, t.Phase.DECODE, 3, (4,))).cache.length == 4  # bound: no ticket needed
    for intruder in ((), ((SUPERVISOR_METADATA, "guess"),)):  # only the node's supervisor takes the counters
        with pytest.raises(grpc.RpcError) as err:
            node.stub.TakeWork(shard_pb2.TakeWorkRequest(), metadata=intruder)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    supervisor = ((SUPERVISOR_METADATA, SUPERVISOR),)
    work = node.stub.TakeWork(shard_pb2.TakeWorkRequest(), metadata=supervisor)
    assert [(w.session.session_id, w.session.epoch, w.prefill_tokens, w.decode_tokens) for w in work.work] == \
        [("s", 1, 3, 1)]  # the replayed step is not counted twice
    assert not node.stub.TakeWork(shard_pb2.TakeWorkRequest(), metadata=supervisor).work  # taken means reset
    assert stream.send(frame(s1, 1, tokens=(9,))).status.code == StatusCode.INVALID_ARGUMENT  # older step
    s2 = t.RouteSession("s", 2)
    newer = Stream(node)
    assert newer.send(frame(s2, 1, ticket=ticket(s2, node))).status.ok
    fenced = stream.send(frame(s1, 3, t.Phase.DECODE, 4, (5,)))
    assert fenced.status.code == StatusCode.STALE_EPOCH and fenced.status.hop == "n-a"
    wait_until(lambda: ("s", 1) not in engine.sessions)  # the fenced epoch's KV is freed
    assert node.health().fence_entries == 1
    assert newer.send(frame(s2, 2, t.Phase.RELEASE)).status.ok
    wait_until(lambda: engine.stats()[0] == 0)
    stream.close()
    newer.close()


def test_a_failed_first_step_frees_the_session(nodes):
    node = nodes("n-a")
    x = t.RouteSession("x", 1)
    stream = Stream(node)
    bad = stream.send(t.SeamFrame(seam.PROTOCOL_VERSION, x, t.Phase.PREFILL, 1, span=t.TokenSpan(0, 2), token_ids=(1,),
                                  ticket=ticket(x, node)))  # 1 token for a span of 2
    assert bad.status.code == StatusCode.INVALID_ARGUMENT
    assert node.shard.session_records() == 0  # freed at once, not at stream loss or idle reap
    assert stream.send(frame(x, 1, ticket=ticket(x, node))).status.ok  # the retry gets a fresh slot
    stream.close()
    wait_until(lambda: node.engine.stats()[0] == 0)


def test_stream_loss_and_idle_deadline_free_sessions(nodes):
    node = nodes("n-a", idle_seconds=0.6)
    a, b = t.RouteSession("a", 1), t.RouteSession("b", 1)
    lost = Stream(node)
    assert lost.send(frame(a, 1, ticket=ticket(a, node))).status.ok
    lost.close()
    wait_until(lambda: ("a", 1) not in node.engine.sessions)
    idle = Stream(node)
    assert idle.send(frame(b, 1, ticket=ticket(b, node))).status.ok
    assert node.engine.stats()[0] == 1
    wait_until(lambda: node.engine.stats()[0] == 0, timeout=3.0)  # idle_seconds = 0.6
    idle.close()


S = t.RouteSession("probe", 1)
FORGER = Identity.generate()
# (name, frame built from the node, expected code): each is sent on a fresh stream.
SEAM_REFUSALS = [
    ("no ticket", lambda n: frame(S, 1), StatusCode.UNAUTHENTICATED),
    ("forged signature", lambda n: frame(S, 1, ticket=ticket(S, n, tracker=FORGER)), StatusCode.UNAUTHENTICATED),
    ("body swapped under a signature", lambda n: frame(S, 1, ticket=t.RouteTicket(
        ticket(S, n).body, ticket(t.RouteSession("other", 1), n).signature)), StatusCode.UNAUTHENTICATED),
    ("ticket for another session", lambda n: frame(S, 1, ticket=ticket(t.RouteSession("other", 1), n)),
     StatusCode.PERMISSION_DENIED),
    ("ticket for another epoch", lambda n: frame(S, 1, ticket=ticket(t.RouteSession("probe", 2), n)),
     StatusCode.PERMISSION_DENIED),
    ("ticket for another node", lambda n: frame(S, 1, ticket=ticket(S, n, node_id="n-other")),
     StatusCode.PERMISSION_DENIED),
    ("ticket for another range", lambda n: frame(S, 1, ticket=ticket(S, n, layers=(0, 3))),
     StatusCode.PERMISSION_DENIED),
    ("expired ticket", lambda n: frame(S, 1, ticket=ticket(S, n, expires_in_ms=-1000)), StatusCode.PERMISSION_DENIED),
    ("the honest session's newest epoch without a valid ticket",
     lambda n: frame(t.RouteSession("honest", 2**64 - 1), 1, ticket=ticket(t.RouteSession("honest", 2**64 - 1), n,
                                                                            tracker=FORGER)),
     StatusCode.UNAUTHENTICATED),
    ("foreign RELEASE without a ticket", lambda n: frame(t.RouteSession("honest", 1), 9, t.Phase.RELEASE),
     StatusCode.UNAUTHENTICATED),
    ("foreign RELEASE with a valid ticket", lambda n: frame(t.RouteSession("honest", 1), 9, t.Phase.RELEASE,
                                                            ticket=ticket(t.RouteSession("honest", 1), n)),
     StatusCode.PERMISSION_DENIED),
    ("foreign CANCEL with a valid ticket", lambda n: frame(t.RouteSession("honest", 1), 9, t.Phase.CANCEL,
                                                           ticket=ticket(t.RouteSession("honest", 1), n)),
     StatusCode.PERMISSION_DENIED),
    ("foreign DECODE with a valid ticket", lambda n: frame(t.RouteSession("honest", 1), 2, t.Phase.DECODE, 3, (4,),
                                                           ticket=ticket(t.RouteSession("honest", 1), n)),
     StatusCode.PERMISSION_DENIED),
    ("session id over 64 bytes", lambda n: frame(t.RouteSession("x" * 65, 1), 1), StatusCode.INVALID_ARGUMENT),
    ("a downstream at the last hop", lambda n: frame(S, 1, ticket=ticket(S, n), downstream=(
        t.DownstreamHop("n-next", "127.0.0.1:1", None),)), StatusCode.PERMISSION_DENIED),
]


@pytest.mark.parametrize("build, code", [c[1:] for c in SEAM_REFUSALS], ids=[c[0] for c in SEAM_REFUSALS])
def test_seam_refusals_change_nothing(nodes, build, code):
    node = nodes("n-a")
    honest = Honest(node)
    fences = node.health().fence_entries
    probe = Stream(node)
    reply = probe.send(build(node))
    assert reply.status.code == code and reply.status.hop == "n-a"
    assert node.shard.session_records() == 1 and node.health().fence_entries == fences
    assert node.engine.steps == 1
    honest.finish()
    probe.close()


def test_release_of_an_unknown_session_with_a_valid_ticket_creates_nothing_but_its_fence(nodes):
    node = nodes("n-a")
    stream = Stream(node)
    assert stream.send(frame(S, 1, t.Phase.RELEASE, ticket=ticket(S, node))).status.ok
    assert node.shard.session_records() == 0 and node.health().fence_entries == 1


def test_a_stream_without_a_valid_ticket_is_ended_after_the_grace(nodes):
    node = nodes("n-a", auth_grace_seconds=0.5)
    silent = Stream(node)
    refused = Stream(node)
    assert refused.send(frame(S, 1)).status.code == StatusCode.UNAUTHENTICATED
    admitted = Stream(node)
    assert admitted.send(frame(S, 1, ticket=ticket(S, node))).status.ok
    for stream in (silent, refused):
        with pytest.raises(grpc.RpcError) as err:
            next(stream.call)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    time.sleep(0.6)
    assert admitted.send(frame(S, 2, t.Phase.DECODE, 1, (4,))).status.ok  # still open past the grace
    admitted.close()


@pytest.fixture
def hidden_hop(nodes):
    """A last hop that takes hidden states (layers [2, 4)), with an honest session on it."""
    node = nodes("n-b", layers=(2, N_LAYER))
    return node, Honest(node, hidden=True)


def _announcing(size: int, count: int) -> t.TensorFragment:
    spec = t.TensorSpec(HIDDEN, t.DType.F32, (1, size // 4), t.ByteOrder.LITTLE, 0, size, 0)
    header = t.BundleHeader((spec,), t.Compression.NONE, size, size)
    return t.TensorFragment(1, 0, count, header, bytes(1 << 20))


def _hidden_frame(node: Node, rows: np.ndarray, compression=t.Compression.NONE) -> t.SeamFrame:
    fragment = bundle.encode_bundle([tensors.from_numpy(HIDDEN, rows)], 1, compression=compression)[0]
    return t.SeamFrame(seam.PROTOCOL_VERSION, S, t.Phase.PREFILL, 1, span=t.TokenSpan(0, rows.shape[0]),
                       fragment=fragment, ticket=ticket(S, node))


HIDDEN_REFUSALS = [
    ("NaN activations", lambda n: _hidden_frame(n, np.array([[1, np.nan, 0, 0]], np.float32)),
     StatusCode.INVALID_ARGUMENT),
    ("Inf activations", lambda n: _hidden_frame(n, np.array([[1, 0, -np.inf, 0]], np.float32)),
     StatusCode.INVALID_ARGUMENT),
    ("zlib while compression is off", lambda n: _hidden_frame(n, np.ones((1, N_EMBD), np.float32),
                                                              t.Compression.ZLIB), StatusCode.INVALID_ARGUMENT),
    ("256 MiB announced for one token", lambda n: t.SeamFrame(
        seam.PROTOCOL_VERSION, S, t.Phase.PREFILL, 1, span=t.TokenSpan(0, 1), fragment=_announcing(256 << 20, 256),
        ticket=ticket(S, n)), StatusCode.RESOURCE_EXHAUSTED),
    ("wrong activation shape", lambda n: _hidden_frame(n, np.ones((2, N_EMBD // 2), np.float32)),
     StatusCode.INVALID_ARGUMENT),
]


@pytest.mark.parametrize("build, code", [c[1:] for c in HIDDEN_REFUSALS], ids=[c[0] for c in HIDDEN_REFUSALS])
def test_bad_activations_are_refused(hidden_hop, build, code):
    node, honest = hidden_hop
    probe = Stream(node)
    message = build(node)
    tracemalloc.start()
    try:
        reply = probe.send(message)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reply.status.code == code
    assert peak < 32 << 20  # nothing near the announced size was allocated
    assert node.shard.session_records() == 1 and node.engine.steps == 1
    honest.finish()
    probe.close()


def test_hello_advertises_zlib_only_when_enabled(nodes):
    hello = seam.to_proto(t.HelloRequest((seam.PROTOCOL_VERSION,), ("compression.zlib", "logprobs")))
    assert seam.from_proto(nodes("n-a").stub.Hello(hello)).features == ("logprobs",)
    assert seam.from_proto(nodes("n-b", compression=True).stub.Hello(hello)).features == ("compression.zlib", "logprobs")


def test_zlib_bundles_are_accepted_when_enabled(nodes):
    node = nodes("n-b", layers=(2, N_LAYER), compression=True)
    tokens = results(node, S)
    probe = Stream(node)
    assert probe.send(_hidden_frame(node, np.full((1, N_EMBD), 7, np.float32), t.Compression.ZLIB)).status.ok
    assert token_of(tokens) == 8
    probe.close()


def _rpc_code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        next(call)
    return err.value.code()


RESULTS_REFUSALS = [
    ("no ticket", lambda n: n.stub.Results(seam.to_proto(t.ResultsRequest(seam.PROTOCOL_VERSION, S))),
     grpc.StatusCode.UNAUTHENTICATED),
    ("forged ticket", lambda n: results(n, S, ticket(S, n, tracker=FORGER)), grpc.StatusCode.UNAUTHENTICATED),
    ("ticket for another node", lambda n: results(n, S, ticket(S, n, node_id="n-other")),
     grpc.StatusCode.PERMISSION_DENIED),
    ("expired ticket", lambda n: results(n, S, ticket(S, n, expires_in_ms=-1000)), grpc.StatusCode.PERMISSION_DENIED),
    ("no client signature", lambda n: results(n, S, signature=b""), grpc.StatusCode.PERMISSION_DENIED),
    ("another key's signature", lambda n: results(n, S, signer=FORGER), grpc.StatusCode.PERMISSION_DENIED),
    ("a second reader", lambda n: results(n, t.RouteSession("honest", 1)), grpc.StatusCode.ALREADY_EXISTS),
]


@pytest.mark.parametrize("build, code", [c[1:] for c in RESULTS_REFUSALS], ids=[c[0] for c in RESULTS_REFUSALS])
def test_results_refusals(nodes, build, code):
    node = nodes("n-a")
    honest = Honest(node)
    assert _rpc_code(build(node)) == code
    assert node.health().results_readers == 1
    honest.finish()


def test_unread_results_are_dropped_after_the_grace(nodes):
    node = nodes("n-a", results_grace_seconds=0.3, idle_seconds=2.0)
    stream = Stream(node)
    assert stream.send(frame(S, 1, ticket=ticket(S, node))).status.ok
    assert stream.send(frame(S, 2, t.Phase.RELEASE)).status.ok
    assert len(node.shard.results) == 1  # tokens and the close wait for a reader...
    wait_until(lambda: len(node.shard.results) == 0, timeout=3.0)  # ...for the grace only
    stream.close()


@pytest.fixture
def chain(nodes):
    """Two TLS hops: n-first [0, 2) forwards to n-last [2, 4)."""
    return nodes("n-first", layers=(0, 2), tls=True), nodes("n-last", layers=(2, N_LAYER), tls=True)


def _route(first: Node, last: Node, session: t.RouteSession, downstream_address: Optional[str] = None):
    ticket_last = ticket(session, last)
    hop = t.DownstreamHop(last.node_id, downstream_address or last.address, t.ShardRange(2, N_LAYER, 2), ticket_last)
    return ticket(session, first, downstream=last), ticket_last, hop


def test_a_hop_forwards_only_to_the_ticket_s_downstream(chain):
    """The hop dials the node its ticket names with the ticket the frame carries for it; what a
    1.0 sender's entry says about where to dial does not count."""
    first, last = chain
    h = t.RouteSession("honest", 1)
    ticket_first, ticket_last, hop = _route(first, last, h)
    tokens = results(last, h, ticket_last)
    upstream = Stream(first)
    reply = upstream.send(frame(h, 1, tokens=(1, 2, 3), ticket=ticket_first, downstream=(hop,)))
    assert reply.status.ok
    assert token_of(tokens) == 4  # over TLS, pinned to the ticket's certificate
    frames_at_last = last.health().seam_frames_in

    # Refusals first: nothing is run, dialled or sent.
    probe = Stream(first)
    no_downstream = probe.send(frame(S, 1, ticket=ticket(S, first), downstream=(hop,)))
    assert no_downstream.status.code == StatusCode.PERMISSION_DENIED  # a last-hop ticket on a middle hop
    unticketed = probe.send(frame(S, 1, ticket=ticket(S, first, downstream=last),
                                  downstream=(t.DownstreamHop("", "", None),)))
    assert unticketed.status.code == StatusCode.INVALID_ARGUMENT  # no ticket to present to the next hop
    assert first.shard.session_records() == 1 and first.engine.steps == 1
    assert last.health().seam_frames_in == frames_at_last
    # A 1.0 entry naming another address (seam minor 1, ADR 0021): the hop dials the ticket's node.
    ticket_probe, _, stray = _route(first, last, S, downstream_address="127.0.0.1:9")
    redirected = probe.send(frame(S, 1, ticket=ticket_probe, downstream=(stray,)))
    assert redirected.status.ok
    wait_until(lambda: last.health().seam_frames_in > frames_at_last)  # it reached n-last
    assert probe.send(frame(S, 2, t.Phase.RELEASE)).status.ok

    assert upstream.send(frame(h, 2, t.Phase.DECODE, 3, (4,))).status.ok
    assert token_of(tokens) == 5
    assert upstream.send(frame(h, 3, t.Phase.RELEASE)).status.ok
    wait_until(lambda: last.engine.stats()[0] == 0)  # the release travelled on
    upstream.close()
    probe.close()
