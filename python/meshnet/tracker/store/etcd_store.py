"""The tracker's shared state on etcd: several trackers, one cluster (issue 20, ADR 0011).

`EtcdStore` keeps the TrackerStore contract (state_store.py) for every tracker on one etcd
cluster. Key layout under `prefix` (default /meshnet/default/; values are JSON, store_codec.py):

    nodes/<node id>       the node record           on the node's etcd lease (TTL = node lease)
    loads/<node id>       its load, last heartbeat  on the same lease
    sessions/<session id> the route session record  on the session's own lease (TTL = route lease)
    strikes/<node id>     {"strikes": n}            no lease: strikes are never forgotten
    bans/<node id>        {"strikes": n}            on a lease of the ban's length
    quarantine/<node id>  {}                        no lease

How it maps: a node lease is an etcd lease (register grants one and revokes the one it replaced;
heartbeat is a keepalive plus a put of loads/); expiry is etcd's, so every tracker loses the node
at once. A route session's epoch is advanced by a transaction that compares the record's
mod_revision with the one read: of two trackers advancing one session from the same epoch, one
transaction commits and the other re-reads and finds a newer epoch, so no (session, epoch) is
issued twice; creation compares create_revision with 0. Coverage and capacity come from a local
cache of the whole prefix fed by a watch (etcd_client.PrefixWatch), resynced when the watch
fails; decisions about an epoch never use the cache, they read etcd. After its own write a
tracker waits (up to OWN_WRITE_WAIT_S) until its cache holds that revision, so it reads its own
writes; other trackers' writes reach it one watch event later.

Thread model: the Registry calls in from many request threads at once (route choice and
failure reports under its lock, the rest without it); the cache is read and written under
`_cache_lock` (the watch thread writes it), and etcd orders concurrent writes
(compare-and-swap). Known limits: etcd extends every lease by its TTL when the leader changes (a
node that died just before lives that much longer); a write retried after a lost answer is
recognized by its writer token (sessions) but a close or strike retried so is not (a close may
answer NOT_FOUND, a strike may count twice).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

from meshnet.process import log
from meshnet.tracker.store import etcd_client as ec
from meshnet.tracker.store import store_codec as codec
from meshnet.tracker.store.state_store import NodeRecord, SessionRecord, StoreError, ban_seconds, check_advance
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId

DEFAULT_PREFIX = "/meshnet/default/"
OWN_WRITE_WAIT_S = 2.0
MAX_KEY_PART = 256
KINDS = ("nodes", "loads", "sessions", "strikes", "bans", "quarantine")
CAS_ATTEMPTS = 16  # a compare lost to a write that changed nothing this caller checks is retried


def _ttl(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def _key_part(text: str) -> str:
    if not text or len(text) > MAX_KEY_PART or not text.isprintable() or "/" in text or not text.isascii():
        raise ValueError(f"{text[:40]!r} cannot be part of an etcd key")
    return text


class EtcdStore:
    def __init__(self, endpoints: Sequence[str], prefix: str = DEFAULT_PREFIX, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 client: Optional[ec.EtcdClient] = None, tls: Optional[ec.EtcdTls] = None) -> None:
        """`tls`: https and a client certificate to etcd (ec.EtcdTls); None: plain http."""
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"etcd prefix {prefix!r} must start and end with '/'")
        self._client = client or ec.EtcdClient(endpoints, tls=tls)
        self._prefix = prefix.encode()
        self._clock, self._wall = clock, wall
        self._cache_lock = threading.Lock()
        self._nodes: dict[NodeId, NodeRecord] = {}
        self._node_leases: dict[NodeId, int] = {}
        self._loads: dict[NodeId, tuple[tt.Load, float]] = {}
        self._sessions: dict[SessionId, SessionRecord] = {}
        self._banned: set[NodeId] = set()
        self._quarantined: set[NodeId] = set()
        self._watch = ec.PrefixWatch(self._client, self._prefix, self._reset, self._apply)

    # ---- keys and time -------------------------------------------------------------------------

    def _key(self, kind: str, name: str) -> bytes:
        return self._prefix + f"{kind}/{_key_part(name)}".encode()

    def _to_wall(self, value: float) -> float:
        return self._wall() - (self._clock() - value)

    def _from_wall(self, unix: float) -> float:
        return self._clock() - (self._wall() - unix)

    def _written(self, revision: int) -> None:
        if not self._watch.wait_for(revision, OWN_WRITE_WAIT_S):
            log("etcd_cache_behind", revision=revision, cached=self._watch.revision)

    # ---- nodes --------------------------------------------------------------------------------

    def put_node(self, record: NodeRecord, lease_seconds: float) -> None:
        node_id = record.info.node_id
        lease = self._client.grant(_ttl(lease_seconds))
        reply = self._client.txn([], [
            ec.put(self._key("nodes", node_id), codec.node_value(record), lease, prev_kv=True),
            ec.put(self._key("loads", node_id), codec.load_value(record.load, record.last_heartbeat, self._to_wall),
                   lease)])
        replaced = reply["responses"][0]["response_put"].get("prev_kv")
        if replaced and int(replaced.get("lease", 0)) not in (0, lease):
            self._client.revoke(int(replaced["lease"]))  # the registration it replaced; the keys are on `lease` now
        self._written(reply["revision"])

    def refresh_node(self, node_id: NodeId, lease_seconds: float, load: Optional[tt.Load]) -> bool:
        with self._cache_lock:
            lease = self._node_leases.get(node_id)
            cached_load = self._loads.get(node_id, (tt.Load(), 0.0))[0]
        for attempt in range(2):  # the cache may name a lease a newer registration replaced
            if lease is None or attempt:
                kv = self._client.get(self._key("nodes", node_id))
                if kv is None or kv["lease"] == lease:
                    return False
                lease = kv["lease"]
            if self._client.keepalive(lease) <= 0:
                continue
            value = codec.load_value(cached_load if load is None else load, self._clock(), self._to_wall)
            try:
                reply = self._client.txn([ec.compare(self._key("nodes", node_id), "LEASE", lease)],
                                         [ec.put(self._key("loads", node_id), value, lease)])
            except ec.EtcdError as err:
                if ec.lease_gone(err):
                    continue
                raise
            if reply["succeeded"]:
                self._written(reply["revision"])
                return True
        return False

    def drain_node(self, node_id: NodeId) -> bool:
        key = self._key("nodes", node_id)
        for _ in range(CAS_ATTEMPTS):
            kv = self._client.get(key)
            if kv is None:
                return False
            record = codec.node_record(codec.load(kv["value"]))
            value = codec.node_value(dataclasses.replace(record, draining=True))
            swapped = self._swap(key, kv, value)
            if swapped is not None:
                return swapped
        raise StoreError(f"draining {node_id} lost {CAS_ATTEMPTS} compare-and-swaps in a row")

    def _swap(self, key: str, kv: dict, value: str) -> Optional[bool]:
        """Puts `value` at `key`, on kv's lease, if the key is still at kv's mod_revision: True when
        written, None when another write came first (read again), False when the lease is gone."""
        try:
            reply = self._client.txn([ec.compare(key, "MOD", kv["mod_revision"])], [ec.put(key, value, kv["lease"])])
        except ec.EtcdError as err:
            if ec.lease_gone(err):
                return False
            raise
        if not reply["succeeded"]:
            return None
        self._written(reply["revision"])
        return True

    def remove_node(self, node_id: NodeId) -> bool:
        reply = self._client.txn([], [ec.delete(self._key("nodes", node_id)), ec.delete(self._key("loads", node_id))])
        removed = reply["responses"][0]["response_delete_range"].get("prev_kvs", [])
        for kv in removed:
            if int(kv.get("lease", 0)):
                self._client.revoke(int(kv["lease"]))
        self._written(reply["revision"])
        return bool(removed)

    def nodes(self) -> list[NodeRecord]:
        with self._cache_lock:
            return list(self._nodes.values())

    # ---- route sessions ----------------------------------------------------------------------

    def _session_kv(self, session_id: SessionId) -> Optional[tuple[dict, SessionRecord, str]]:
        """(kv, record, writer token) read from etcd, or None."""
        kv = self._client.get(self._key("sessions", session_id))
        if kv is None:
            return None
        value = codec.load(kv["value"])
        return kv, codec.session_record(value, self._from_wall), str(value.get("writer", ""))

    def create_session(self, session_id: SessionId, record: SessionRecord, lease_seconds: float) -> bool:
        key, writer = self._key("sessions", session_id), uuid.uuid4().hex
        value = codec.session_value(dataclasses.replace(record, lease_until=self._clock() + lease_seconds), writer,
                                    self._to_wall)
        lease = self._client.grant(_ttl(lease_seconds))
        reply = self._client.txn([ec.compare(key, "CREATE", 0)], [ec.put(key, value, lease)])
        if not reply["succeeded"]:
            found = self._session_kv(session_id)
            if found is None or found[2] != writer:  # not this write, answered late and retried
                self._client.revoke(lease)
                return False
        self._written(reply["revision"])
        return True

    def session(self, session_id: SessionId) -> Optional[SessionRecord]:
        found = self._session_kv(session_id)
        return found[1] if found else None

    def advance_session(self, session_id: SessionId, seen_epoch: int, record: SessionRecord,
                        lease_seconds: float) -> Optional[SessionRecord]:
        check_advance(seen_epoch, record)
        key, writer = self._key("sessions", session_id), uuid.uuid4().hex
        for _ in range(CAS_ATTEMPTS):
            found = self._session_kv(session_id)
            if found is None:
                return None
            kv, current, stored_writer = found
            if current.epoch != seen_epoch:  # ours, answered late (a retried write): as etcd holds it
                return current if current.epoch == record.epoch and stored_writer == writer else None
            if self._client.keepalive(kv["lease"]) <= 0:
                return None
            stored = dataclasses.replace(record, lease_until=self._clock() + lease_seconds)
            swapped = self._swap(key, kv, codec.session_value(stored, writer, self._to_wall))
            if swapped is not None:
                return stored if swapped else None
        raise StoreError(f"advancing route session {session_id} lost {CAS_ATTEMPTS} compare-and-swaps in a row")

    def renew_session(self, session_id: SessionId, epoch: int, lease_seconds: float) -> bool:
        found = self._session_kv(session_id)
        if found is None or found[1].epoch != epoch:
            return False
        return self._client.keepalive(found[0]["lease"]) > 0

    def close_session(self, session_id: SessionId, epoch: int, opener: bytes) -> Optional[SessionRecord]:
        """A read and a compare-and-delete: the session's lease, with no key left on it, is left to
        run out (at most one route lease) rather than revoked, a request fewer per route."""
        key = self._key("sessions", session_id)
        for _ in range(CAS_ATTEMPTS):
            found = self._session_kv(session_id)
            if found is None or found[1].epoch != epoch or found[1].client_key != opener:
                return None
            kv, record, _ = found
            reply = self._client.txn([ec.compare(key, "MOD", kv["mod_revision"])], [ec.delete(key)])
            if reply["succeeded"]:
                self._written(reply["revision"])
                return record
        raise StoreError(f"closing route session {session_id} lost {CAS_ATTEMPTS} compare-and-swaps in a row")

    def sessions(self) -> list[tuple[SessionId, SessionRecord]]:
        with self._cache_lock:
            return list(self._sessions.items())

    # ---- bans and quarantine -----------------------------------------------------------------

    def strike(self, node_id: NodeId, base_seconds: float, max_seconds: float) -> None:
        key, ban_key = self._key("strikes", node_id), self._key("bans", node_id)
        lease = 0
        for _ in range(CAS_ATTEMPTS):
            kv = self._client.get(key)
            strikes = (int(codec.load(kv["value"])["strikes"]) if kv else 0) + 1
            seconds = ban_seconds(strikes, base_seconds, max_seconds)
            value = codec.dump({"strikes": strikes}, "strikes")
            writes = [ec.put(key, value)]
            if seconds > 0:
                lease = lease or self._client.grant(_ttl(seconds))
                writes.append(ec.put(ban_key, value, lease, prev_kv=True))
            guard = ec.compare(key, "MOD", kv["mod_revision"]) if kv else ec.compare(key, "CREATE", 0)
            reply = self._client.txn([guard], writes)
            if reply["succeeded"]:
                replaced = reply["responses"][-1]["response_put"].get("prev_kv") if seconds > 0 else None
                if replaced and int(replaced.get("lease", 0)) not in (0, lease):
                    self._client.revoke(int(replaced["lease"]))
                self._written(reply["revision"])
                return
        raise StoreError(f"striking {node_id} lost {CAS_ATTEMPTS} compare-and-swaps in a row")

    def banned(self) -> frozenset[NodeId]:
        with self._cache_lock:
            return frozenset(self._banned)

    def quarantine(self, node_id: NodeId) -> None:
        reply = self._client.txn([], [ec.put(self._key("quarantine", node_id), codec.dump({}, "quarantine"))])
        self._written(reply["revision"])

    def release(self, node_id: NodeId) -> None:
        reply = self._client.txn([], [ec.delete(self._key("quarantine", node_id))])
        self._written(reply["revision"])

    def quarantined(self) -> frozenset[NodeId]:
        with self._cache_lock:
            return frozenset(self._quarantined)

    def sync(self, timeout_s: float = OWN_WRITE_WAIT_S) -> bool:
        """Waits until the cache holds every write made anywhere before this call (tests; a
        tracker that must see another's writes now)."""
        reply = self._client.txn([], [ec.put(self._prefix + b"sync", b"")])  # a write the watch must see
        return self._watch.wait_for(reply["revision"], timeout_s)

    @property
    def resyncs(self) -> int:
        return self._watch.resyncs

    def close(self) -> None:
        self._watch.stop()

    # ---- the cache (watch thread) ------------------------------------------------------------

    def _reset(self, kvs: list[dict], revision: int) -> None:
        with self._cache_lock:
            for table in (self._nodes, self._node_leases, self._loads, self._sessions, self._banned, self._quarantined):
                table.clear()
            for kv in kvs:
                self._put(kv)

    def _apply(self, events: list[dict], revision: int) -> None:
        with self._cache_lock:
            for event in events:
                if event["type"] == "DELETE":
                    self._delete(event["kv"]["key"])
                else:
                    self._put(event["kv"])

    def _split(self, key: bytes) -> tuple[str, str]:
        kind, _, name = key[len(self._prefix):].decode(errors="replace").partition("/")
        return kind, name

    def _put(self, kv: dict) -> None:
        """Cache lock held."""
        kind, name = self._split(kv["key"])
        if kind not in KINDS:
            return  # the sync key, or a newer tracker's kind
        try:
            value = codec.load(kv["value"])
            if kind == "nodes":
                node_id = NodeId(name)
                self._node_leases[node_id] = kv["lease"]
                self._nodes[node_id] = self._joined(codec.node_record(value), node_id)
            elif kind == "loads":
                node_id = NodeId(name)
                self._loads[node_id] = codec.load_of(value, self._from_wall)
                if node_id in self._nodes:
                    self._nodes[node_id] = self._joined(self._nodes[node_id], node_id)
            elif kind == "sessions":
                self._sessions[SessionId(name)] = codec.session_record(value, self._from_wall)
            elif kind == "bans":
                self._banned.add(NodeId(name))
            elif kind == "quarantine":
                self._quarantined.add(NodeId(name))
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
            log("etcd_value_skipped", key=kv["key"].decode(errors="replace")[:200], error=repr(err)[:200])

    def _joined(self, record: NodeRecord, node_id: NodeId) -> NodeRecord:
        load_, heartbeat = self._loads.get(node_id, (record.load, record.last_heartbeat))
        return dataclasses.replace(record, load=load_, last_heartbeat=heartbeat)

    def _delete(self, key: bytes) -> None:
        """Cache lock held."""
        kind, name = self._split(key)
        if kind == "nodes":
            self._nodes.pop(NodeId(name), None)
            self._node_leases.pop(NodeId(name), None)
        elif kind == "loads":
            self._loads.pop(NodeId(name), None)
        elif kind == "sessions":
            self._sessions.pop(SessionId(name), None)
        elif kind == "bans":
            self._banned.discard(NodeId(name))
        elif kind == "quarantine":
            self._quarantined.discard(NodeId(name))
