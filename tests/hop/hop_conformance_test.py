"""The hop contract, once, against both implementations (issue 12; ADR 0003).

Every case runs against the native worker (cpp/worker) and the reference shard
(meshnet.reference), each a real process serving half of the bundled SmolLM2 over pinned TLS,
with tickets signed by a test tracker key. An honest session is prefilled before each attack
and decoded after it: it must produce exactly the tokens it produces alone, and both hops must
hold no session and no KV cell afterwards. Each refusal asserts its exact status. The same
chain also checks that a step's budget (budget_ms) is enforced by both (issue 13).
"""

from __future__ import annotations

import os
import queue
import socket
import time
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest

from meshnet.identity import tickets, tls
from meshnet.identity.keys import Identity
from meshnet.protocol import bundle, seam, tensors
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire.status import StatusCode
from hop_backends import Chain, HonestSession, Stream, V, control, prefill, wait_idle

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"])
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"])
N_LAYER, CUT, N_EMBD = 30, 15, 576
PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is" in SmolLM2's vocabulary
TOKENS = 6
THREAD_CAP = 128  # a hop under 600 streams stays below this many threads


@pytest.fixture(scope="module", params=["gguf", "reference"])
def chain(request, tmp_path_factory):
    c = Chain(request.param, GGUF, CUT, N_LAYER, tmp_path_factory.mktemp(request.param), worker_binary=WORKER)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def solo(chain):
    tokens = HonestSession(chain, "rs-solo", PROMPT, TOKENS).finish()
    assert len(tokens) == TOKENS
    return tokens


def rs(session_id: str, epoch: int = 1) -> t.RouteSession:
    return t.RouteSession(session_id, epoch)


def code(reply: t.SeamReply) -> StatusCode:
    return reply.status.code


def hidden_frame(chain: Chain, session: t.RouteSession, fragment: t.TensorFragment) -> t.SeamFrame:
    b = chain.b
    return t.SeamFrame(V, session, t.Phase.PREFILL, 1, range=t.ShardRange(b.layers[0], b.layers[1], b.layers[0]),
                       span=t.TokenSpan(0, 1), expected_cache=t.CacheState(0), sampling=t.SamplingParams(),
                       fragment=fragment, ticket=chain.ticket(b, session))


def hidden_fragment(values: np.ndarray) -> t.TensorFragment:
    return bundle.encode_bundle([tensors.from_numpy("hidden_states", values.astype(np.float32))], 1)[0]


# ---- the cases: each gets the chain and the honest session in flight -----------------------

def no_ticket(chain, honest):
    s = Stream(chain.a.channel)
    assert code(s.ask(prefill(chain, rs("rs-no-ticket"), PROMPT, ticket=None))) == StatusCode.UNAUTHENTICATED
    s.close()


def forged_signature(chain, honest):
    s = Stream(chain.a.channel)
    forged = chain.ticket(chain.a, rs("rs-forged"), signer=Identity.generate())
    assert code(s.ask(prefill(chain, rs("rs-forged"), PROMPT, ticket=forged))) == StatusCode.UNAUTHENTICATED
    tampered = t.RouteTicket(chain.ticket(chain.a, rs("rs-forged")).body, bytes(64))
    assert code(s.ask(prefill(chain, rs("rs-forged"), PROMPT, ticket=tampered))) == StatusCode.UNAUTHENTICATED
    s.close()


def ticket_for_another_session(chain, honest):
    s = Stream(chain.a.channel)
    other = chain.ticket(chain.a, rs("rs-someone-else"))
    assert code(s.ask(prefill(chain, rs("rs-mine"), PROMPT, ticket=other))) == StatusCode.PERMISSION_DENIED
    s.close()


def ticket_for_another_node(chain, honest):
    s = Stream(chain.a.channel)
    for_b = chain.ticket(chain.b, rs("rs-node"))
    assert code(s.ask(prefill(chain, rs("rs-node"), PROMPT, ticket=for_b))) == StatusCode.PERMISSION_DENIED
    s.close()


def ticket_for_another_epoch(chain, honest):
    s = Stream(chain.a.channel)
    epoch1 = chain.ticket(chain.a, rs("rs-epoch", 1))
    assert code(s.ask(prefill(chain, rs("rs-epoch", 2), PROMPT, ticket=epoch1))) == StatusCode.PERMISSION_DENIED
    s.close()


def ticket_for_another_range(chain, honest):
    s = Stream(chain.a.channel)
    wider = chain.ticket(chain.a, rs("rs-range"), range=t.ShardRange(0, CUT + 1, 0))
    assert code(s.ask(prefill(chain, rs("rs-range"), PROMPT, ticket=wider))) == StatusCode.PERMISSION_DENIED
    s.close()


def expired_ticket(chain, honest):
    s = Stream(chain.a.channel)
    old = chain.ticket(chain.a, rs("rs-expired"), expires_unix_ms=tickets.now_ms() - 1000)
    assert code(s.ask(prefill(chain, rs("rs-expired"), PROMPT, ticket=old))) == StatusCode.PERMISSION_DENIED
    s.close()


def second_results_reader(chain, honest):
    time.sleep(0.5)  # the honest session's own Results stream is registered by now
    ticket_b = chain.ticket(chain.b, honest.session)
    stub = shard_pb2_grpc.ShardStub(chain.b.channel)
    for signer, expected in ((Identity.generate(), grpc.StatusCode.PERMISSION_DENIED),
                             (chain.client, grpc.StatusCode.ALREADY_EXISTS)):
        request = t.ResultsRequest(V, honest.session, ticket_b, tickets.results_signature(signer, ticket_b))
        with pytest.raises(grpc.RpcError) as err:
            next(iter(stub.Results(seam.to_proto(request), timeout=10)))
        assert err.value.code() == expected
    unsigned = t.ResultsRequest(V, honest.session, ticket_b, b"")
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.Results(seam.to_proto(unsigned), timeout=10)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    no_ticket = t.ResultsRequest(V, honest.session)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.Results(seam.to_proto(no_ticket), timeout=10)))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def foreign_release_and_cancel(chain, honest):
    s = Stream(chain.a.channel)
    valid = chain.ticket(chain.a, honest.session)  # even the session's own ticket, from another stream
    for phase in (t.Phase.RELEASE, t.Phase.CANCEL):
        assert code(s.ask(control(honest.session, phase))) == StatusCode.UNAUTHENTICATED
        assert code(s.ask(control(honest.session, phase, valid))) == StatusCode.PERMISSION_DENIED
    s.close()


def maximum_epoch(chain, honest):
    s = Stream(chain.a.channel)
    top = rs(honest.session.session_id, (1 << 64) - 1)
    assert code(s.ask(prefill(chain, top, PROMPT, ticket=None))) == StatusCode.UNAUTHENTICATED
    forged = chain.ticket(chain.a, top, signer=Identity.generate())
    assert code(s.ask(control(top, t.Phase.RELEASE, forged))) == StatusCode.UNAUTHENTICATED
    s.close()


def newer_epoch_fences_the_older(chain, honest):
    """The tracker moved a session on (failover): the newer epoch's valid ticket, even on a
    RELEASE from another stream, fences the older epoch, which is STALE_EPOCH from then on."""
    s1, s2, s3 = (Stream(chain.a.channel) for _ in range(3))
    old, new = rs("rs-moved", 1), rs("rs-moved", 2)
    assert code(s1.ask(prefill(chain, old, PROMPT))) == StatusCode.OK
    assert code(s2.ask(control(new, t.Phase.RELEASE, chain.ticket(chain.a, new)))) == StatusCode.OK
    assert code(s3.ask(prefill(chain, old, PROMPT))) == StatusCode.STALE_EPOCH  # its own valid ticket
    decode = t.SeamFrame(V, old, t.Phase.DECODE, 2, span=t.TokenSpan(len(PROMPT), 1), token_ids=(PROMPT[0],),
                         expected_cache=t.CacheState(len(PROMPT)))
    assert code(s1.ask(decode)) == StatusCode.STALE_EPOCH  # and its own stream is told so
    for s in (s1, s2, s3):
        s.close()


def ten_thousand_session_ids(chain, honest):
    hop = chain.a
    s = Stream(hop.channel)

    def flood(prefix: str, n: int) -> None:
        for i in range(n):
            s.send(control(rs(f"{prefix}-{i:05d}", 1 + i), t.Phase.RELEASE))
        for _ in range(n):
            assert code(s.read()) == StatusCode.UNAUTHENTICATED

    flood("warm", 1000)
    before, fences = hop.rss(), hop.health().fence_entries
    flood("flood", 10_000)
    huge = "x" * (512 << 10)
    for _ in range(100):
        assert code(s.ask(control(rs(huge), t.Phase.RELEASE))) == StatusCode.INVALID_ARGUMENT
    grown = hop.rss() - before
    assert grown < 16 << 20, f"RSS grew by {grown / 2**20:.1f} MiB"
    assert hop.health().fence_entries == fences  # nothing unauthenticated reached the fence map
    s.close()


def announced_256_mib(chain, honest):
    hop = chain.b
    before = hop.peak_rss()
    spec = t.TensorSpec("hidden_states", t.DType.F32, (1, 64 << 20), t.ByteOrder.LITTLE, 0, 256 << 20, 0)
    header = t.BundleHeader((spec,), t.Compression.NONE, 256 << 20, 256 << 20)
    fragment = t.TensorFragment(1, 0, 1, header, b"\0" * 4096)
    s = Stream(hop.channel)
    assert code(s.ask(hidden_frame(chain, rs("rs-256mib"), fragment))) == StatusCode.RESOURCE_EXHAUSTED
    s.close()
    assert hop.peak_rss() - before < 64 << 20


def compression_bomb(chain, honest):
    payload = b"\0" * (256 << 20)
    wire = zlib.compress(payload, 9)  # ~256 KiB that inflates to 256 MiB
    spec = t.TensorSpec("hidden_states", t.DType.F32, (1, N_EMBD), t.ByteOrder.LITTLE, 0, 4 * N_EMBD,
                        zlib.crc32(payload[:4 * N_EMBD]))
    header = t.BundleHeader((spec,), t.Compression.ZLIB, 4 * N_EMBD, len(wire))
    fragment = t.TensorFragment(1, 0, 1, header, wire)
    before = chain.b.peak_rss()
    s = Stream(chain.b.channel)
    assert code(s.ask(hidden_frame(chain, rs("rs-bomb"), fragment))) == StatusCode.INVALID_ARGUMENT
    s.close()
    assert chain.b.peak_rss() - before < 64 << 20


def six_hundred_streams(chain, honest):
    hop = chain.a
    attacker = tls.pinned_channel(hop.address, hop.cert)  # one connection, as one attacker opens
    streams = [Stream(attacker) for _ in range(600)]
    time.sleep(2.0)
    assert hop.alive() and hop.threads() < THREAD_CAP, hop.threads()
    assert hop.health().status.code == StatusCode.OK  # over another connection
    for s in streams:
        s.close()
    attacker.close()


def silent_streams_from_two_connections(chain, honest):
    """Issue 55, finding 5: 40 streams over 2 connections that never send a frame took the native
    worker's whole thread quota; Health answered RESOURCE_EXHAUSTED and the node's hang detection
    killed its own worker. Now the worker refuses the streams past its caps on streams without a
    ticket (12 from one peer of 16 in all, for 64 threads) at once, RESOURCE_EXHAUSTED, and cuts
    the rest at its first-frame deadline (2 s); Health is answered throughout."""
    if chain.a.backend != "gguf":
        pytest.skip("the caps on streams without a ticket and the first-frame deadline are the native worker's")
    hop = chain.a
    connections = [tls.pinned_channel(hop.address, hop.cert) for _ in range(2)]
    started = time.monotonic()
    streams = [Stream(connections[i % 2]) for i in range(40)]
    while any(s.error is None for s in streams) and time.monotonic() - started < 10:
        assert hop.health().status.code == StatusCode.OK  # over the harness's own connection
        time.sleep(0.2)
    ended = time.monotonic() - started
    codes = [s.error.code() if s.error is not None else None for s in streams]
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 28, codes
    assert codes.count(grpc.StatusCode.CANCELLED) == 12, codes
    assert ended < 5.0, ended  # the 2 s deadline, and the reaper's period
    for s in streams:
        s.close()
    for c in connections:
        c.close()


def half_open_handshakes(chain, honest):
    """Issue 55, finding 11 (the worker's half): a connection that sends one byte of a TLS
    handshake and no more was held by the worker for gRPC's default 120 s (through a relay, 64 of
    them cut a node off for 40 s). The native worker now closes it after --handshake_timeout_ms
    (5 s); Health is answered meanwhile."""
    if chain.a.backend != "gguf":
        pytest.skip("the handshake deadline is the native worker's flag")
    host, port = chain.a.address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(16)]
    started = time.monotonic()
    for s in held:
        s.sendall(b"\x16")
    assert chain.a.health().status.code == StatusCode.OK
    for s in held:
        try:
            assert s.recv(1) == b""  # closed by the worker
        except ConnectionResetError:
            pass
    assert time.monotonic() - started < 8.0
    for s in held:
        s.close()


def downstream_from_the_ticket_only(chain, honest):
    """Seam minor 1 (ADR 0021): a hop dials the node its ticket names. A sender naming another
    address (a 1.0 entry) does not redirect it: the step runs through B and the trap sees no
    connection. An entry without the next hop's ticket is refused."""
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(4)
    trap.settimeout(1.5)
    session = rs("rs-redirect")
    frame = prefill(chain, session, PROMPT, downstream=chain.downstream(session, f"127.0.0.1:{trap.getsockname()[1]}"))
    s = Stream(chain.a.channel)
    assert code(s.ask(frame)) == StatusCode.OK  # run here and forwarded to B, the ticket's node
    with pytest.raises(socket.timeout):
        trap.accept()  # the sender's address was never dialled
    assert code(s.ask(control(session, t.Phase.RELEASE))) == StatusCode.OK
    no_ticket = prefill(chain, rs("rs-no-next-ticket"), PROMPT, downstream=(t.DownstreamHop("", "", None),))
    assert code(s.ask(no_ticket)) == StatusCode.INVALID_ARGUMENT
    trap.close()
    s.close()


def nan_activations(chain, honest):
    s = Stream(chain.b.channel)
    for bad in (np.nan, np.inf, -np.inf):
        values = np.zeros((1, N_EMBD), dtype=np.float32)
        values[0, 7] = bad
        reply = s.ask(hidden_frame(chain, rs(f"rs-nonfinite-{bad}"), hidden_fragment(values)))
        assert code(reply) == StatusCode.INVALID_ARGUMENT
    s.close()


def plaintext_connection(chain, honest):
    with grpc.insecure_channel(chain.a.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


CASES = [no_ticket, forged_signature, ticket_for_another_session, ticket_for_another_node, ticket_for_another_epoch,
         ticket_for_another_range, expired_ticket, second_results_reader, foreign_release_and_cancel, maximum_epoch,
         newer_epoch_fences_the_older, ten_thousand_session_ids, announced_256_mib, compression_bomb,
         six_hundred_streams, silent_streams_from_two_connections, half_open_handshakes, downstream_from_the_ticket_only,
         nan_activations, plaintext_connection]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_refusal_leaves_an_honest_session_unharmed(chain, solo, case):
    honest = HonestSession(chain, f"rs-honest-{case.__name__}"[:64], PROMPT, TOKENS)
    try:
        case(chain, honest)
        assert honest.finish() == solo
    except BaseException:
        honest.close()  # a failed case must not leave its session behind for the next one
        raise
    assert wait_idle(chain) == [(0, 0), (0, 0)]


def test_a_valid_ticket_opens_exactly_its_session(chain, solo):
    """The positive control: the same frames with a proper ticket succeed (so the refusals
    above are about the ticket), and the session then lives on its stream alone."""
    s = Stream(chain.a.channel)
    session = rs("rs-control")
    reply = s.ask(prefill(chain, session, PROMPT))
    assert code(reply) == StatusCode.OK and reply.cache == t.CacheState(len(PROMPT))
    assert code(s.ask(control(session, t.Phase.RELEASE))) == StatusCode.OK
    s.close()
    assert wait_idle(chain) == [(0, 0), (0, 0)]
    with pytest.raises(queue.Empty):
        s.replies.get(timeout=0.2)


# ---- deadlines (issue 13) -------------------------------------------------------------------

def test_a_step_whose_budget_runs_out_behind_a_long_prefill_is_deadline_exceeded(chain, solo):
    """budget_ms is enforced where a step waits for the engine: a 1 ms step queued behind
    another session's long prefill is DEADLINE_EXCEEDED and holds nothing; the long prefill is
    unharmed; the same step with a budget it can meet succeeds."""
    long_stream, late_stream = Stream(chain.a.channel), Stream(chain.a.channel)
    long_session, late = rs("rs-long-prefill"), rs("rs-late")
    long_stream.send(prefill(chain, long_session, (PROMPT * 100)[:480]))
    time.sleep(0.1)  # the long prefill has the engine by now (it takes seconds on one thread)
    assert long_stream.replies.empty(), "the long prefill finished too soon to queue anything behind it"
    assert code(late_stream.ask(prefill(chain, late, PROMPT, budget_ms=1), timeout=120)) == \
        StatusCode.DEADLINE_EXCEEDED
    reply = long_stream.read(timeout=120)
    assert code(reply) == StatusCode.OK and reply.cache == t.CacheState(480)
    on_time = late_stream.ask(prefill(chain, late, PROMPT, budget_ms=60_000), timeout=120)
    assert code(on_time) == StatusCode.OK and on_time.cache == t.CacheState(len(PROMPT))
    for stream, session in ((long_stream, long_session), (late_stream, late)):
        assert code(stream.ask(control(session, t.Phase.RELEASE))) == StatusCode.OK
        stream.close()
    assert wait_idle(chain) == [(0, 0), (0, 0)]
