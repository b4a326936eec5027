"""Peer addresses and the networks they are counted in, for the caps every network surface keeps
per peer and per prefix (the tracker's gRPC server, the HTTP surfaces).

One host commonly owns a whole IPv6 /64 (2^64 addresses) and a provider's customer a run of
IPv4 addresses, so a cap per address alone falls to whoever has a few addresses (issue 55,
findings 3 and 10). No I/O: the counts below are kept by whoever accepts the connections.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
from typing import Optional

IPV4_PREFIX = 24
IPV6_PREFIX = 64


def grpc_peer_host(peer: str) -> str:
    """The address in gRPC's peer string: 'ipv4:1.2.3.4:5678' -> '1.2.3.4', 'ipv6:[::1]:5678' ->
    '::1'; anything else as it is."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return peer


def peer_prefix(address: str) -> str:
    """The network an IP address counts in: '1.2.3.4' -> '1.2.3.0/24', '2001:db8::1' ->
    '2001:db8::/64' (an IPv4-mapped IPv6 address counts as its IPv4); anything else as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = IPV4_PREFIX if ip.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


@dataclasses.dataclass(frozen=True)
class ConnectionCaps:
    """How many connections a surface keeps open, counted at accept, before anything is read."""

    max_connections: int = 512  # open connections from all peers (keep it under the fd limit)
    max_per_peer: int = 32  # open connections from one IP address
    max_per_prefix: int = 128  # open connections from one /24 (IPv4) or /64 (IPv6)
    reserved_per_prefix: int = 4  # connections a prefix may open even when max_connections are open
    overflow: int = 64  # how many more than max_connections the reserved shares may open in all

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_per_peer, self.max_per_prefix) < 1 \
                or min(self.reserved_per_prefix, self.overflow) < 0:
            raise ValueError(f"connection caps must be positive: {self}")


@dataclasses.dataclass
class ConnectionCounts:
    """The connections a surface holds, per peer, per prefix and in all, and what it refused (read
    by tests and metrics). One thread only (the accepting event loop's)."""

    open: int = 0
    per_peer: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    per_prefix: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    refused_peer: int = 0  # closed at accept: the peer was at max_per_peer
    refused_prefix: int = 0  # closed at accept: the peer's prefix was at max_per_prefix
    refused_total: int = 0  # closed at accept: the surface was full, past the prefix's reserved share
    timed_out: int = 0  # closed for not completing a request in time (HTTP surfaces)

    def admit(self, caps: ConnectionCaps, peer: str) -> Optional[str]:
        """Counts a connection from `peer`; None when it may stay, else why it must be closed now
        (it stays counted either way: `release` it when it is closed). A prefix holding fewer than
        `reserved_per_prefix` may still connect past `max_connections`, up to `overflow` more in
        all, so that peers with many prefixes cannot shut out one they do not hold."""
        prefix = peer_prefix(peer)
        self.open += 1
        self.per_peer[peer] += 1
        self.per_prefix[prefix] += 1
        if self.per_peer[peer] > caps.max_per_peer:
            self.refused_peer += 1
            return f"{caps.max_per_peer} connections open from {peer}"
        if self.per_prefix[prefix] > caps.max_per_prefix:
            self.refused_prefix += 1
            return f"{caps.max_per_prefix} connections open from {prefix}"
        if self.open > caps.max_connections and (self.per_prefix[prefix] > caps.reserved_per_prefix
                                                 or self.open > caps.max_connections + caps.overflow):
            self.refused_total += 1
            return f"{caps.max_connections} connections open"
        return None

    def release(self, peer: str) -> None:
        """A connection `admit` counted is closed."""
        self.open -= 1
        for counter, key in ((self.per_peer, peer), (self.per_prefix, peer_prefix(peer))):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
