"""Several tracker processes of one swarm (replicated trackers, ADR 0011), for tests and benches.

Each tracker is a real `python -m meshnet.tracker.main` (a TrackerProcess in its own directory),
all on one etcd cluster under one prefix, sharing role tokens, TLS certificate and the swarm
ticket key, and writing one shared ledger when `ledger_url` names one (PostgreSQL). The set
stands where LocalSwarm takes its tracker (`control_plane=`): `address` lists every tracker, so
nodes and clients fail over between them (TrackerClient). Invariant: stop() ends every tracker
it started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.swarm.local import TrackerProcess


class ReplicatedTrackers:
    def __init__(self, workdir: Path, models: list[dict], *, trackers: int, etcd: Sequence[str], etcd_prefix: str,
                 ledger_url: Optional[str] = None, lease_seconds: float = 3.0, host: str = "127.0.0.1",
                 insecure: bool = False, ban_seconds: float = 30.0, max_ban_seconds: float = 300.0,
                 http: bool = False, audit_rate: Optional[float] = None) -> None:
        """`etcd`: every member's client address; `ledger_url`: the shared PostgreSQL ledger
        (without it each tracker keeps its own SQLite file)."""
        if trackers < 1:
            raise ValueError("at least one tracker")
        shared = ["--etcd", ",".join(etcd), "--etcd-prefix", etcd_prefix]
        self.trackers: list[TrackerProcess] = []
        for i in range(trackers):
            directory = workdir / f"tracker-{i}"
            directory.mkdir(parents=True, exist_ok=True)
            self.trackers.append(TrackerProcess(
                directory, models, lease_seconds=lease_seconds, host=host, insecure=insecure,
                ban_seconds=ban_seconds, max_ban_seconds=max_ban_seconds, http=http, audit_rate=audit_rate,
                extra_args=shared, peer=self.trackers[0] if self.trackers else None, ledger_url=ledger_url))
        first = self.trackers[0]
        self.insecure, self.tls, self.ca = first.insecure, first.tls, first.ca
        self.roles, self.token_files, self.ticket_key = first.roles, first.token_files, first.ticket_key

    @property
    def address(self) -> str:
        """Every tracker, comma-separated (what --tracker takes)."""
        return ",".join(t.address for t in self.trackers)

    def ticket_public_key(self) -> bytes:
        return Identity.load_or_create(self.ticket_key).public_key

    def client(self, role: str = "client", identity: Optional[Identity] = None, timeout: float = 10.0) -> TrackerClient:
        """A tracker client over every tracker, with `role`'s token and `identity` (fresh by default)."""
        return TrackerClient(self.address, self.roles[role], identity or Identity.generate(), tracker_ca=self.ca,
                             timeout=timeout)

    def start(self) -> "ReplicatedTrackers":
        for tracker in self.trackers:
            tracker.start()
        return self

    def stop(self) -> None:
        for tracker in self.trackers:
            tracker.stop()
