"""Hosts as network namespaces on one machine: the pieces the bench's WAN lanes (wan.py) and the
multi-host tests (tests/multihost/topology.py) both build from. Needs root and iproute2."""

from __future__ import annotations

import subprocess


class Namespaces:
    """A set of namespaces built on entry (after clearing leftovers of an interrupted run) and
    removed on exit, also when building them fails. Subclasses define _setup and teardown."""

    def _setup(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.teardown()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def add_bridge(bridge: str, address: str) -> None:
    """A bridge with `address` (CIDR) in the root namespace, up."""
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", address, "dev", bridge)
    ip("link", "set", bridge, "up")


def add_host(namespace: str, outer: str, inner: str, address: str, bridge: str) -> None:
    """Namespace `namespace` joined to `bridge` by the veth pair outer (on the bridge) / inner (in
    the namespace, with `address` in CIDR form); both ends and the namespace's loopback up."""
    ip("netns", "add", namespace)
    ip("link", "add", outer, "type", "veth", "peer", "name", inner)
    ip("link", "set", inner, "netns", namespace)
    ip("link", "set", outer, "master", bridge)
    ip("link", "set", outer, "up")
    ip("-n", namespace, "addr", "add", address, "dev", inner)
    ip("-n", namespace, "link", "set", inner, "up")
    ip("-n", namespace, "link", "set", "lo", "up")


def remove_host(namespace: str, outer: str) -> None:
    """Undoes add_host (nothing if it is not there)."""
    ip("link", "del", outer, check=False)
    ip("netns", "del", namespace, check=False)
