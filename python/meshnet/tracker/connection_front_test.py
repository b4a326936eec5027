"""Issue 55, finding 4: one unauthenticated peer kept 1,500 idle connections open on the tracker's
gRPC port, and new nodes and clients timed out. A real tracker (its ConnectionFront in front of
the grpc.aio server) on loopback; the attackers' connections come from other loopback addresses
(127.0.0.0/8 is all local on Linux), gRPC clients among them through `FromAddress`, a forwarder
that connects from a chosen source address. Beside every attack a node registers and heartbeats
and a client reads Coverage, from 127.0.0.1, and must be answered at once."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from meshnet.identity.keys import Identity
from meshnet.peers import ConnectionCaps
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.socket_checks import closed_by_server
from meshnet.tracker.connection_front import split_listen
from meshnet.tracker.grpc_fixtures import ANSWERED_WITHIN_S, Attack, honest_calls, refusals, tracker  # noqa: F401
from meshnet.tracker.grpc_server import ServerLimits

CAPS = ConnectionCaps(max_connections=32, max_per_peer=8, max_per_prefix=16, reserved_per_prefix=4, overflow=8)


def held_from(source: str, address: str, n: int) -> list[socket.socket]:
    """`n` silent TCP connections to `address` from `source` (an address of 127.0.0.0/8)."""
    host, port = address.rsplit(":", 1)
    held = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        s.connect((host, int(port)))
        held.append(s)
    return held


def held_open(connections: list[socket.socket]) -> bool:
    """Whether every connection is still open a moment later (nothing sent, nothing received)."""
    for s in connections:
        s.settimeout(0.05)
        try:
            if s.recv(1) == b"":
                return False
        except socket.timeout:
            continue
        except ConnectionResetError:
            return False
    return True


class FromAddress:
    """A loopback forwarder: every connection to `address` is joined to `target` from `source`,
    so a gRPC client (which cannot pick its source address) reaches the tracker as `source`."""

    def __init__(self, source: str, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._source, self._target = source, (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            outbound = socket.socket()
            outbound.bind((self._source, 0))
            try:
                outbound.connect(self._target)
            except OSError:
                inbound.close()
                outbound.close()
                continue
            self._sockets += [inbound, outbound]
            for a, b in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pass, args=(a, b), daemon=True).start()

    @staticmethod
    def _pass(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for s in self._sockets:
            s.close()


def coverage_code(address: str, tokens: dict) -> grpc.StatusCode:
    try:
        with TrackerClient(address, tokens["client"], Identity.generate(), timeout=3) as client:
            client.coverage("smol")
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


@pytest.mark.parametrize("tracker", [ServerLimits(connections=CAPS)], indirect=True)
def test_a_peer_past_its_connections_is_closed_at_accept_and_others_are_served(tracker):
    """8 silent connections from 127.0.1.1 are kept; the 9th and 10th are closed before a byte is
    read, and a gRPC client from that address gets UNAVAILABLE, while a node and a client from
    127.0.0.1 are served."""
    address, tokens, _ = tracker
    held = held_from("127.0.1.1", address, CAPS.max_per_peer)
    extra = held_from("127.0.1.1", address, 2)
    forwarder = FromAddress("127.0.1.1", address)
    try:
        assert all(closed_by_server(s, 2.0) for s in extra)
        assert coverage_code(forwarder.address, tokens) == grpc.StatusCode.UNAVAILABLE
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
        assert held_open(held)
    finally:
        forwarder.close()
        for s in held + extra:
            s.close()
    again = FromAddress("127.0.1.1", address)  # the peer's connections closed: it is served again
    try:
        deadline = time.monotonic() + 5  # once the front has seen them close
        while (code := coverage_code(again.address, tokens)) != grpc.StatusCode.OK and time.monotonic() < deadline:
            time.sleep(0.2)
        assert code == grpc.StatusCode.OK
    finally:
        again.close()


@pytest.mark.parametrize("tracker", [ServerLimits(connections=CAPS)], indirect=True)
def test_addresses_of_one_prefix_share_its_cap(tracker):
    """Four addresses of 127.0.1.0/24 at 4 connections each fill the prefix's 16: a fifth address
    of that /24 is closed at accept; a node and a client from another /24 are served."""
    address, tokens, _ = tracker
    held = [s for i in range(1, 5) for s in held_from(f"127.0.1.{i}", address, 4)]
    extra = held_from("127.0.1.5", address, 1)
    try:
        assert closed_by_server(extra[0], 2.0)
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
        assert held_open(held)
    finally:
        for s in held + extra:
            s.close()


@pytest.mark.parametrize("tracker", [ServerLimits(connections=CAPS)], indirect=True)
def test_a_full_port_keeps_a_share_for_a_prefix_that_holds_none(tracker):
    """Eight /24s at 4 connections each fill all 32: one more from them is closed at accept, yet a
    gRPC client from a /24 that holds no connection is served (its reserved share)."""
    address, tokens, _ = tracker
    held = [s for i in range(1, 9) for s in held_from(f"127.1.{i}.1", address, 4)]
    extra = held_from("127.1.1.2", address, 1)
    forwarder = FromAddress("127.2.0.1", address)
    try:
        assert closed_by_server(extra[0], 2.0)
        assert coverage_code(forwarder.address, tokens) == grpc.StatusCode.OK
        assert held_open(held)
    finally:
        forwarder.close()
        for s in held + extra:
            s.close()


@pytest.mark.parametrize("tracker", [ServerLimits(max_calls_per_peer=2, message_timeout=5.0)], indirect=True)
def test_calls_are_counted_for_the_address_that_connected_not_the_front(tracker):
    """gRPC sees every connection from 127.0.0.1 (the front's); the calls' caps still count the
    peer that connected: two calls from 127.0.1.9 that never send their message fill its share, a
    third from it is refused RESOURCE_EXHAUSTED naming 127.0.1.9, and 127.0.0.1 is served."""
    address, tokens, metrics = tracker
    forwarder = FromAddress("127.0.1.9", address)
    attack = Attack(forwarder.address, "Coverage", 2, tokens["client"])
    try:
        time.sleep(0.5)  # both calls in progress
        with pytest.raises(grpc.RpcError) as refused:
            with TrackerClient(forwarder.address, tokens["client"], Identity.generate(), timeout=3) as client:
                client.coverage("smol")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 calls in progress from 127.0.1.9" in refused.value.details()
        assert refusals(metrics, "Coverage", "RESOURCE_EXHAUSTED") == 1
        assert honest_calls(address, tokens) < ANSWERED_WITHIN_S
    finally:
        attack.stop()
        forwarder.close()


def test_listen_addresses():
    assert split_listen("127.0.0.1:7700") == ("127.0.0.1", 7700)
    assert split_listen("[::1]:0") == ("::1", 0)
    assert split_listen("[::]:7700") == (None, 7700)  # both families, as gRPC's dual-stack '[::]'
    assert split_listen(":7700") == (None, 7700)
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_listen("localhost")
