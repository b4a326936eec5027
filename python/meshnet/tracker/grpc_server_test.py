"""Issue 35, finding 2: calls that never send their message no longer freeze the tracker. A real
tracker (grpc_server.py) on loopback; the attacks are raw gRPC calls whose request stream never
yields, which is what a unary call whose message never arrives looks like on the wire; beside
them a node registers and heartbeats and a client asks for Coverage, and must be answered."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from meshnet.identity import certificates
from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.identity.roles import new_role_tokens
from meshnet.tracker.grpc_fixtures import (MODEL, ANSWERED_WITHIN_S, Attack, honest_calls, refusals,  # noqa: F401
                                           tracker)
from meshnet.tracker.grpc_server import NODE_METHODS, Refused, ServerLimits, _Gate
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.registry import Registry
from meshnet.tracker.service import serve


def test_calls_without_a_token_are_refused_before_their_message(tracker):
    """64 token-less calls that never send their message, on one connection, end at once:
    refused UNAUTHENTICATED by the tracker, or, past the 32 streams a connection may hold before
    the client has read the server's HTTP/2 settings, refused by HTTP/2 (REFUSED_STREAM, which
    the client reports as UNAVAILABLE)."""
    address, tokens, metrics = tracker
    attack = Attack(address, "Coverage", 64)
    try:
        outcomes = attack.outcomes(timeout=ANSWERED_WITHIN_S)
        assert set(outcomes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}, outcomes
        unauthenticated = outcomes.count(grpc.StatusCode.UNAUTHENTICATED)
        assert unauthenticated >= ServerLimits().max_streams_per_connection
        assert refusals(metrics, "Coverage", "UNAUTHENTICATED") == unauthenticated
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
    finally:
        attack.stop()


def test_calls_waiting_for_their_message_hold_no_thread(tracker):
    """48 calls with the client token that never send their message: 3 times the old server's
    16 threads. Heartbeats and Coverage are still answered."""
    address, tokens, _ = tracker
    attack = Attack(address, "OpenRoute", 48, tokens["client"])
    try:
        time.sleep(0.5)  # every attacking call is in
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
        assert not any(f.done() for f in attack.futures)  # they are still waiting
    finally:
        attack.stop()


@pytest.mark.parametrize("tracker", [ServerLimits(max_calls_per_peer=8, message_timeout=1.0)], indirect=True)
def test_a_peer_past_its_share_is_refused_and_waiting_calls_are_cut_at_the_deadline(tracker):
    address, tokens, metrics = tracker
    attack = Attack(address, "Coverage", 8, tokens["client"])
    try:
        time.sleep(0.3)
        with TrackerClient(address, tokens["client"], Identity.generate(), timeout=ANSWERED_WITHIN_S) as client:
            with pytest.raises(grpc.RpcError) as refused:
                client.coverage("smol")
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert attack.outcomes(timeout=3.0) == [grpc.StatusCode.DEADLINE_EXCEEDED] * 8
        assert refusals(metrics, "Coverage", "DEADLINE_EXCEEDED") == 8
        assert refusals(metrics, "Coverage", "RESOURCE_EXHAUSTED") == 1
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
    finally:
        attack.stop()


def test_a_public_method_is_answered_without_waiting_for_its_message(tracker):
    """Issue 55, finding 3: TrackerKey needs no role, and each token-less call waited 10 s for its
    message, so about 17 addresses filled the tracker's 1,024 calls. Now 1,116 such calls that
    never send their message, from one address, are answered at once, and honest calls beside.
    Each connection carries fewer calls than its stream limit: more would queue in the client, and a
    queued call can race the server's count of streams still closing (REFUSED_STREAM, UNAVAILABLE)."""
    address, tokens, _ = tracker
    per_connection = ServerLimits().max_streams_per_connection - 1
    attacks = [Attack(address, "TrackerKey", per_connection) for _ in range(36)]
    try:
        for attack in attacks:
            assert attack.outcomes(timeout=ANSWERED_WITHIN_S) == [grpc.StatusCode.OK] * per_connection
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
    finally:
        for attack in attacks:
            attack.stop()


class FakeContext:
    """A unit-test fake of grpc.aio's ServicerContext: a peer address, and a request message
    that arrives only when `arrive` is set (never, for an attacker's call)."""

    def __init__(self, peer: str, arrive: bool = False) -> None:
        self._peer, self.arrived = peer, asyncio.Event()
        if arrive:
            self.arrived.set()

    def peer(self) -> str:
        return self._peer

    async def read(self):
        await self.arrived.wait()
        return "request"

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Refused(code, message)


def test_waiting_calls_are_capped_per_prefix_and_in_all_and_nodes_keep_their_own():
    """Issue 55, finding 3, at the gate (a fake context per call: many source addresses cannot be
    had on loopback): token holders' calls that never send their message, from 16 /24s and from
    32 addresses of one IPv6 /64, fill only the waiting caps; past them a call is refused
    RESOURCE_EXHAUSTED at once, while a node's heartbeat and a client whose message arrives are
    still served."""
    limits = ServerLimits(max_waiting=16, max_waiting_per_prefix=4, message_timeout=30.0)
    refused: list[Refused] = []
    gate = _Gate({}, lambda token: None, lambda method, why, at: refused.append(why), limits)

    async def served(request, context) -> str:
        return "served"

    async def scenario() -> None:
        stalled = [asyncio.ensure_future(gate._bounded("OpenRoute", served, None, FakeContext(f"10.0.{i}.{j}")))
                   for i in range(16) for j in range(2)]
        stalled += [asyncio.ensure_future(gate._bounded("OpenRoute", served, None, FakeContext(f"2001:db8::{i:x}")))
                    for i in range(1, 33)]
        await asyncio.sleep(0.1)
        waiting = [f for f in stalled if not f.done()]
        assert len(waiting) == 16  # the total cap; the /64 got at most 4 of them
        v6 = [f for f in stalled[32:] if not f.done()]
        assert len(v6) <= 4
        assert all(isinstance(f.exception(), Refused) and f.exception().code == grpc.StatusCode.RESOURCE_EXHAUSTED
                   for f in stalled if f.done())
        node_method = sorted(NODE_METHODS)[0]
        heartbeat = await asyncio.wait_for(gate._bounded(node_method, served, None, FakeContext("10.9.9.9", True)), 1)
        assert heartbeat == "served"
        # A client whose message arrives is served as soon as a waiting slot is free.
        with pytest.raises(Refused) as busy:
            await gate._bounded("Coverage", served, None, FakeContext("10.8.8.8", True))
        assert busy.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "waiting for their message" in busy.value.message
        for f in waiting:
            f.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert await gate._bounded("Coverage", served, None, FakeContext("10.8.8.8", True)) == "served"

    asyncio.run(scenario())


def test_node_methods_keep_their_reserve_of_calls_in_progress():
    limits = ServerLimits(max_calls=8, node_reserve=4, max_calls_per_peer=64, message_timeout=30.0)
    gate = _Gate({}, lambda token: None, lambda method, why, at: None, limits)
    hold = asyncio.Event()

    async def slow(request, context) -> str:
        await hold.wait()
        return "served"

    async def scenario() -> None:
        clients = [asyncio.ensure_future(gate._bounded("Coverage", slow, None, FakeContext(f"10.{i}.0.1", True)))
                   for i in range(6)]
        await asyncio.sleep(0.1)
        refused = [f for f in clients if f.done()]
        assert len(refused) == 2 and all(f.exception().code == grpc.StatusCode.RESOURCE_EXHAUSTED for f in refused)
        nodes = [asyncio.ensure_future(gate._bounded(sorted(NODE_METHODS)[0], slow, None,
                                                     FakeContext(f"10.{i}.1.1", True))) for i in range(4)]
        await asyncio.sleep(0.1)
        assert not any(f.done() for f in nodes)  # all four in progress, none refused
        hold.set()
        assert await asyncio.gather(*nodes) == ["served"] * 4

    asyncio.run(scenario())


def test_a_connection_that_never_finishes_its_handshake_is_closed(tmp_path):
    """Issue 55, finding 4 (in part): a peer's connections that start a TLS handshake and never
    finish it were kept for gRPC's default 120 s; the tracker now closes them after
    handshake_timeout, and serves a node beside them."""
    limits = ServerLimits(handshake_timeout=1.0)
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30), ledger, "127.0.0.1:0", tokens, Identity.generate(),
                         tls=certificates.self_signed("tracker", ["localhost"], ["127.0.0.1"]), limits=limits)
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(32)]
    try:
        for s in held:
            s.sendall(b"\x16")  # one byte of a ClientHello, then nothing
        started = time.monotonic()
        for s in held:
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        assert time.monotonic() - started < limits.handshake_timeout + 2.0
    finally:
        for s in held:
            s.close()
        server.stop(grace=0).wait()
        ledger.close()


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # and empty SETTINGS
GOAWAY = 0x7


def goaway_or_close(s: socket.socket) -> str:
    """Reads HTTP/2 frames until the server sends GOAWAY ('goaway') or closes ('closed')."""
    buffer = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return "closed"
        if not chunk:
            return "closed"
        buffer += chunk
        while len(buffer) >= 9:
            length, kind = int.from_bytes(buffer[:3], "big"), buffer[3]
            if kind == GOAWAY:
                return "goaway"
            if len(buffer) < 9 + length:
                break
            buffer = buffer[9 + length:]


@pytest.mark.parametrize("tracker", [ServerLimits(connection_idle=1.0)], indirect=True)
def test_idle_connections_are_closed_and_a_node_is_served_beside_them(tracker):
    """Issue 55, finding 4 (in part): one peer held 1,500 idle connections open for good (nothing
    closed an idle HTTP/2 connection); the tracker now ends a connection with no call in progress
    after connection_idle (GOAWAY), and serves a node and a client beside them."""
    address, tokens, _ = tracker
    host, port = address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(32)]
    try:
        for s in held:
            s.sendall(HTTP2_PREFACE)
        started = time.monotonic()
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
        assert {goaway_or_close(s) for s in held} <= {"goaway", "closed"}
        assert time.monotonic() - started < 1.0 + 5.0  # connection_idle, and grpc's idle timer's slack
    finally:
        for s in held:
            s.close()
