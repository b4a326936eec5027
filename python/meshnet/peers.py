"""Peer addresses and the networks they are counted in, for the caps every network surface keeps
per peer and per prefix (the tracker's gRPC server, the HTTP surfaces).

One host commonly owns a whole IPv6 /64 (2^64 addresses) and a provider's customer a run of
IPv4 addresses, so a cap per address alone falls to whoever has a few addresses (issue 55,
findings 3 and 10). Pure functions, no I/O.
"""

from __future__ import annotations

import ipaddress

IPV4_PREFIX = 24
IPV6_PREFIX = 64


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
