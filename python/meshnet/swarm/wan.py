"""A small WAN on one machine: K network namespaces joined by veth pairs to a bridge.

Node i runs in namespace `mnwan{i}` at 10.77.0.{i+2}; the tracker and the client stay in the
root namespace at 10.77.0.1 on the bridge. Every packet a node sends leaves through its veth,
whose qdisc imposes the link: `tc netem delay D rate R` when the kernel has sch_netem, else
`tc tbf rate R` (rate only; the delay cannot be applied and the lane says so). So a hop from
node to node costs one delay, as does a result on its way back to the client (rate 0: no qdisc,
the links are as fast as the kernel's veth). `cut(i)` sets node i's link down (its packets are
dropped, its connections hang rather than close) and `restore(i)` sets it up again. Needs root
and iproute2; `WanLink.unavailable()` says why it cannot run, or None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

from meshnet.swarm import netns

SUBNET = "10.77.0"
BRIDGE = "mnwanbr"


class WanLink(netns.Namespaces):
    def __init__(self, nodes: int, delay_ms: float, rate_mbit: float) -> None:
        self.nodes, self.delay_ms, self.rate_mbit = nodes, delay_ms, rate_mbit
        self.namespaces = [f"mnwan{i}" for i in range(nodes)]
        self.applied: dict = {}
        self.notes: list[str] = []

    @staticmethod
    def unavailable() -> Optional[str]:
        if os.geteuid() != 0:
            return "not root: network namespaces and tc need root (run the bench as root for the WAN lane)"
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return f"`{tool}` (iproute2) is not installed"
        return None

    @property
    def host(self) -> str:
        return f"{SUBNET}.1"

    def node_host(self, i: int) -> str:
        return f"{SUBNET}.{i + 2}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i]]

    def _setup(self) -> None:
        netns.add_bridge(BRIDGE, f"{self.host}/24")
        netem = True
        for i, ns in enumerate(self.namespaces):
            inner = f"mnwanp{i}"
            netns.add_host(ns, f"mnwanv{i}", inner, f"{self.node_host(i)}/24", BRIDGE)
            if self.rate_mbit:
                netem = netem and self._shape(ns, inner)
        if not self.rate_mbit:
            self.applied = {"delay_ms": 0, "rate_mbit": None, "qdisc": None}
            return
        self.applied = {"delay_ms": self.delay_ms if netem else None, "rate_mbit": self.rate_mbit,
                        "qdisc": "netem" if netem else "tbf"}
        if not netem:
            self.notes.append(f"tc netem is not available in this kernel ({os.uname().release}); the links ran "
                              f"at {self.rate_mbit:g} Mbit/s (tbf) with no added delay")

    def _shape(self, ns: str, dev: str) -> bool:
        """netem delay + rate on the node's egress; falls back to tbf. True when netem applied."""
        rate = f"{self.rate_mbit:g}mbit"
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"]
        proc = subprocess.run(tc + ["netem", "delay", f"{self.delay_ms:g}ms", "rate", rate], capture_output=True,
                              text=True)
        if proc.returncode == 0:
            return True
        subprocess.run(tc + ["tbf", "rate", rate, "burst", "64kb", "latency", "400ms"], check=True,
                       capture_output=True, text=True)
        return False

    def cut(self, i: int) -> None:
        """Node i's link goes down: nothing in or out until restore(i)."""
        netns.ip("link", "set", f"mnwanv{i}", "down")

    def restore(self, i: int) -> None:
        netns.ip("link", "set", f"mnwanv{i}", "up")

    def teardown(self) -> None:
        for i, ns in enumerate(self.namespaces):
            netns.remove_host(ns, f"mnwanv{i}")
        netns.ip("link", "del", BRIDGE, check=False)
