"""The chaos soak's fault scheduler: one fault at a time on a live swarm, each undone after a
while, never taking the last live replica of a layer range.

Faults: `kill9_node` (a node and its worker killed; launched again after 5-15 s), `sigstop_worker`
(a worker hangs for 3-10 s, then SIGCONT), `tracker_restart` (kill -9 of the tracker, and of the
relay it hosts; started again on its ports after 0-2 s), `link_cut` (every TCP packet to or from
a node's shard port dropped for 3-10 s, by an nftables rule on the output hook, which loopback
traffic crosses both ways: open streams stall, as on a cut cable, rather than reset; needs root
and nft, else the kind is left out and logged). Every fault is logged as an event with its start
and end (monotonic time), for the soak's timeline. `close()` removes the nftables table.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import threading
import time
from typing import Optional

import psutil

from meshnet.process import log
from meshnet.swarm.local import LocalSwarm, NodeProcess

KINDS = ("kill9_node", "sigstop_worker", "tracker_restart", "link_cut")
NFT_TABLE = "meshnet_soak"  # the link cuts' nftables table (inet family), removed by close()


@dataclasses.dataclass
class FaultEvent:
    kind: str
    target: str  # node name, or "tracker"
    started: float  # monotonic
    ended: Optional[float] = None  # when it was undone (None: still on)


def worker_of(node: NodeProcess) -> Optional[psutil.Process]:
    """The native worker under `node`'s process (None while it has none)."""
    try:
        children = psutil.Process(node.proc.pid).children(recursive=True)
        return next((c for c in children if os.path.basename(c.exe()) == "worker"), None)
    except (psutil.Error, AttributeError):
        return None


def _nft(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nft", *args], capture_output=True, text=True, timeout=10)


class LinkCutter:
    """Drops a TCP port's packets on this host's output hook (loopback included) until restored."""

    def __init__(self) -> None:
        try:
            made = [_nft("add", "table", "inet", NFT_TABLE),
                    _nft("add", "chain", "inet", NFT_TABLE, "out", "{ type filter hook output priority 0 ; }")]
        except (OSError, subprocess.TimeoutExpired) as err:
            self.problem = repr(err)
        else:
            self.problem = "; ".join(p.stderr.strip() for p in made if p.returncode != 0)

    def cut(self, port: int) -> None:
        for direction in ("dport", "sport"):
            done = _nft("add", "rule", "inet", NFT_TABLE, "out", "tcp", direction, str(port), "drop")
            if done.returncode != 0:
                raise RuntimeError(f"nft: {done.stderr.strip()}")

    def restore(self) -> None:
        _nft("flush", "chain", "inet", NFT_TABLE, "out")

    def close(self) -> None:
        _nft("delete", "table", "inet", NFT_TABLE)


class Faults:
    def __init__(self, swarm: LocalSwarm, rng: random.Random) -> None:
        self.swarm, self.rng = swarm, rng
        self.events: list[FaultEvent] = []
        self._busy: set[str] = set()  # node names under a fault now
        self._lock = threading.Lock()
        self._undo: list[threading.Thread] = []
        self._links = LinkCutter()
        self.kinds = KINDS if not self._links.problem else tuple(k for k in KINDS if k != "link_cut")
        if self._links.problem:
            log("soak_link_cut_unavailable", reason=self._links.problem)

    def _alive(self, name: str) -> bool:
        node = self.swarm.nodes[self.swarm.ids[name]]
        return node.proc is not None and node.proc.poll() is None and name not in self._busy

    def _victim(self) -> Optional[NodeProcess]:
        """A live node whose range keeps another live replica."""
        with self._lock:
            names = sorted(self.swarm.ids)
            spare = [n for n in names if self._alive(n) and sum(
                self._alive(m) and self.swarm.nodes[self.swarm.ids[m]].layers == self.swarm.nodes[
                    self.swarm.ids[n]].layers for m in names) >= 2]
            if not spare:
                return None
            name = self.rng.choice(spare)
            self._busy.add(name)
            return self.swarm.nodes[self.swarm.ids[name]]

    def under_fault(self, node_id: str) -> bool:
        """Whether the node with `node_id` is killed or stopped by a fault now."""
        with self._lock:
            return any(self.swarm.ids.get(name) == node_id for name in self._busy)

    def inject(self) -> Optional[FaultEvent]:
        kind = self.rng.choice(self.kinds)
        if kind == "tracker_restart":
            event = FaultEvent(kind, "tracker", time.monotonic())
            self.swarm.tracker.kill()
            self._later(self.rng.uniform(0.0, 2.0), event, self.swarm.tracker.restart)
        else:
            node = self._victim()
            if node is None:
                return None
            event = FaultEvent(kind, node.name, time.monotonic())
            if kind == "kill9_node":
                node.kill()
                self._later(self.rng.uniform(5.0, 15.0), event, lambda: node.launch().wait_ready(timeout=120),
                            node.name)
            elif kind == "link_cut":
                self._links.cut(node.port)
                self._later(self.rng.uniform(3.0, 10.0), event, self._links.restore, node.name)
            else:
                worker = worker_of(node)
                if worker is None:
                    with self._lock:
                        self._busy.discard(node.name)
                    return None
                worker.send_signal(signal.SIGSTOP)
                self._later(self.rng.uniform(3.0, 10.0), event, lambda: worker.send_signal(signal.SIGCONT), node.name)
        self.events.append(event)
        log("soak_fault", kind=event.kind, target=event.target)
        return event

    def _later(self, delay: float, event: FaultEvent, undo, name: str = "") -> None:
        def run() -> None:
            time.sleep(delay)
            try:
                undo()
            except Exception as err:  # a fault that cannot be undone is reported, not hidden
                log("soak_undo_failed", kind=event.kind, target=event.target, error=repr(err))
            event.ended = time.monotonic()
            with self._lock:
                self._busy.discard(name)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._undo.append(thread)

    def settle(self, timeout: float = 180.0) -> None:
        """Waits for every fault to be undone."""
        deadline = time.monotonic() + timeout
        for thread in self._undo:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Removes what the faults left on the host (the link cuts' nftables table)."""
        self._links.restore()
        self._links.close()
