"""peer_prefix: the networks per-prefix caps count in; ConnectionCounts: the caps at accept."""

import pytest

from meshnet.peers import ConnectionCaps, ConnectionCounts, grpc_peer_host, peer_prefix


def test_peer_prefixes():
    assert peer_prefix("10.1.2.3") == "10.1.2.0/24"
    assert peer_prefix("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert peer_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert peer_prefix("unix:/tmp/sock") == "unix:/tmp/sock"
    assert peer_prefix("") == ""


def test_grpc_peer_hosts():
    assert grpc_peer_host("ipv4:10.1.2.3:5678") == "10.1.2.3"
    assert grpc_peer_host("ipv6:[::1]:5678") == "::1"
    assert grpc_peer_host("unix:/tmp/sock") == "unix:/tmp/sock"


def test_connections_are_capped_per_peer_per_prefix_and_in_all_with_a_share_kept_per_prefix():
    caps = ConnectionCaps(max_connections=6, max_per_peer=2, max_per_prefix=3, reserved_per_prefix=1, overflow=2)
    counts = ConnectionCounts()
    assert [counts.admit(caps, "10.0.0.1") for _ in range(2)] == [None, None]
    assert counts.admit(caps, "10.0.0.1") == "2 connections open from 10.0.0.1"
    counts.release("10.0.0.1")  # a refused connection is released like any other
    assert counts.admit(caps, "10.0.0.2") is None
    assert counts.admit(caps, "10.0.0.3") == "3 connections open from 10.0.0.0/24"
    counts.release("10.0.0.3")
    assert [counts.admit(caps, f"10.0.{i}.1") for i in (1, 1, 2)] == [None, None, None]  # 6 open: full
    assert counts.admit(caps, "10.0.2.2") == "6 connections open"  # its /24 already holds one
    counts.release("10.0.2.2")
    assert [counts.admit(caps, f"10.9.{i}.1") for i in (1, 2)] == [None, None]  # reserved shares, overflow 2
    assert counts.admit(caps, "10.9.3.1") == "6 connections open"  # past the overflow
    assert (counts.refused_peer, counts.refused_prefix, counts.refused_total) == (1, 1, 2)
    for peer in ("10.9.3.1", "10.9.1.1", "10.9.2.1", "10.0.2.1", "10.0.1.1", "10.0.1.1", "10.0.0.2", "10.0.0.1",
                 "10.0.0.1"):
        counts.release(peer)
    assert (counts.open, counts.per_peer, counts.per_prefix) == (0, {}, {})


@pytest.mark.parametrize("field", ["max_connections", "max_per_peer", "max_per_prefix"])
def test_caps_must_be_positive(field):
    with pytest.raises(ValueError, match="must be positive"):
        ConnectionCaps(**{field: 0})
