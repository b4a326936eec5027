"""Hosts on one machine: one network namespace per host, joined by veth pairs to a bridge.

Each host `name` gets namespace `mh-<name>` and address 10.79.0.<n>/24 on bridge `mhbr`; the
root namespace (where the test itself runs, as an operator) is 10.79.0.1 on the bridge. A host
made with `nat=True` takes no inbound connections, as behind a NAT: its nftables input chain
drops every new connection that is not from its own loopback, and accepts only the replies to
connections it opened (conntrack established/related). Needs root, iproute2 and nftables;
`unavailable()` says why it cannot run, or None. Everything is removed on exit (and leftovers of
an interrupted run on entry).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Optional

from meshnet.swarm import netns

SUBNET = "10.79.0"
BRIDGE = "mhbr"
NAT_RULES = """
table inet meshnet_nat {
  chain input {
    type filter hook input priority filter; policy drop;
    iif "lo" accept
    ct state established,related accept
  }
}
"""


class Host:
    def __init__(self, name: str, index: int, nat: bool) -> None:
        self.name, self.nat = name, nat
        self.namespace = f"mh-{name}"
        self.ip = f"{SUBNET}.{index}"
        self.veth = f"mhv{index}"

    @property
    def prefix(self) -> list[str]:
        """Runs a command on this host."""
        return ["ip", "netns", "exec", self.namespace]


class Topology(netns.Namespaces):
    def __init__(self, hosts: dict[str, bool]) -> None:
        """`hosts`: name -> behind NAT (no inbound connections)."""
        self.hosts = {name: Host(name, i + 2, nat) for i, (name, nat) in enumerate(hosts.items())}
        self.operator_ip = f"{SUBNET}.1"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @staticmethod
    def unavailable() -> Optional[str]:
        if os.geteuid() != 0:
            return "not root: network namespaces, veth pairs and nftables need root"
        for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
            if shutil.which(tool) is None:
                return f"`{tool}` is not installed (Debian package {package}; tools/bazel installs it)"
        return None

    def _setup(self) -> None:
        netns.add_bridge(BRIDGE, f"{self.operator_ip}/24")
        for host in self.hosts.values():
            netns.add_host(host.namespace, host.veth, f"{host.veth}p", f"{host.ip}/24", BRIDGE)
            if host.nat:
                subprocess.run([*host.prefix, "nft", "-f", "-"], input=NAT_RULES, text=True, check=True,
                               capture_output=True)

    def teardown(self) -> None:
        for host in self.hosts.values():
            netns.remove_host(host.namespace, host.veth)
        netns.ip("link", "del", BRIDGE, check=False)

    def connects(self, source: str, address: str, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from host `source` to host:port opens."""
        host, port = address.rsplit(":", 1)
        code = (f"import socket; socket.create_connection(({host!r}, {int(port)}), timeout={timeout}).close()")
        return subprocess.run([*self.hosts[source].prefix, "python3", "-c", code], capture_output=True,
                              timeout=timeout + 10).returncode == 0

    def rtt_ms(self, source: str, target_ip: str, count: int = 10) -> dict:
        """ICMP round trips from host `source` to `target_ip` (ping from iputils when present,
        else TCP-less: reported as unavailable)."""
        if shutil.which("ping") is None:
            return {"unavailable": "ping (iputils-ping) is not installed"}
        proc = subprocess.run([*self.hosts[source].prefix, "ping", "-n", "-q", "-c", str(count), "-i", "0.05",
                               target_ip], capture_output=True, text=True, timeout=60)
        found = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", proc.stdout)
        if proc.returncode != 0 or not found:
            return {"unavailable": (proc.stdout + proc.stderr).strip()[-200:]}
        low, mean, high, _ = (float(x) for x in found.groups())
        return {"min_ms": low, "mean_ms": mean, "max_ms": high, "count": count, "measured_at": time.time()}
