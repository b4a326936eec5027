"""etcd's v3 JSON gateway for the etcd tracker store: failover across members, and a watched prefix.

`EtcdClient` wraps etcd3gw (one `Etcd3Client` per member, since etcd3gw talks to one endpoint):
a request that cannot connect, times out, or finds the member without a leader is sent to the
next member, round after round, until `deadline_s`; then StoreUnavailable. A retried write may
have been applied once already, which is why the store's compare-and-swap writes carry a writer
token (etcd_store.py). A request etcd refuses is not retried: EtcdError. Keys and values are
bytes; revisions and lease ids are ints.

`PrefixWatch` keeps a caller's cache of one prefix current: a thread lists the prefix at revision
R (`on_reset`), then watches it from R + 1 (`on_events`), resuming where it stopped when a quiet
stream times out, and listing again (a resync) when the watch fails or etcd compacted past it.
`wait_for(revision)` lets a writer read its own write from the cache. Thread model: one watch
thread calls the callbacks; everyone else only calls wait_for and stop.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import requests
import urllib3
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from etcd3gw.utils import _increment_last_byte

from meshnet.process import log
from meshnet.tracker.store.state_store import StoreError, StoreUnavailable

REQUEST_TIMEOUT_S = 2.0  # one request to one member
DEADLINE_S = 10.0  # all members, all rounds (an election after losing the leader takes ~1-3 s)
WATCH_READ_TIMEOUT_S = 30.0  # a stream quiet this long (no event, no progress note) is reopened
T = TypeVar("T")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    return _increment_last_byte(prefix).encode()


def kv_of(raw: dict) -> dict:
    """A gateway KeyValue with bytes key/value and int revisions/lease."""
    return {"key": unb64(raw["key"]), "value": unb64(raw.get("value", "")), "lease": int(raw.get("lease", 0)),
            "mod_revision": int(raw.get("mod_revision", 0)), "create_revision": int(raw.get("create_revision", 0))}


class EtcdError(StoreError):
    """etcd answered and refused the request (`detail`: its message), e.g. a lease that is gone."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"etcd refused the request: {detail[:300]}")
        self.detail = detail


def lease_gone(err: EtcdError) -> bool:
    return "lease not found" in err.detail


def parse_endpoints(text: str) -> list[str]:
    """"host:port,host:port" -> ["host:port", ...]; ValueError naming a malformed entry."""
    endpoints = [e.strip() for e in text.split(",") if e.strip()]
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    if not endpoints:
        raise ValueError("no etcd endpoints given")
    return endpoints


@dataclasses.dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd's client URLs, both ways: `ca` signed the members' certificates (checked, host
    name included), and `cert`/`key` are this tracker's client certificate, which members started
    with --client-cert-auth and --trusted-ca-file accept only when that CA signed it."""

    ca: Path
    cert: Path
    key: Path

    def check(self) -> None:
        """ValueError naming a file that cannot be read."""
        for what, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if not os.access(path, os.R_OK) or not Path(path).is_file():
                raise ValueError(f"etcd TLS {what} {path} is not a readable file")


def etcd_session(tls: Optional[EtcdTls]) -> requests.Session:
    """A requests session for etcd: not from the environment (REQUESTS_CA_BUNDLE would replace the
    cluster's CA, and an HTTP proxy would see the tracker's state), with `tls` when given."""
    session = requests.Session()
    session.trust_env = False
    if tls is not None:
        session.verify = str(tls.ca)
        session.cert = (str(tls.cert), str(tls.key))
    return session


class EtcdClient:
    """Thread-safe (each call picks the member it starts with; requests sessions are per member).
    `tls`: https with a client certificate (EtcdTls); None: plain http (a trusted network only)."""

    def __init__(self, endpoints: Sequence[str], request_timeout_s: float = REQUEST_TIMEOUT_S,
                 deadline_s: float = DEADLINE_S, tls: Optional[EtcdTls] = None) -> None:
        self.endpoints = list(endpoints)
        self.tls = tls
        if tls is not None:
            tls.check()
        self._members = []
        for endpoint in self.endpoints:
            host, _, port = endpoint.rpartition(":")
            self._members.append(Etcd3Client(host.strip("[]"), int(port), "https" if tls else "http",
                                             api_path="/v3/", timeout=request_timeout_s, session=etcd_session(tls)))
        self._current = 0
        self._deadline_s = deadline_s

    def call(self, fn: Callable[[Etcd3Client], T]) -> T:
        """fn(member client), on the current member, then the next ones while they fail to answer."""
        deadline = time.monotonic() + self._deadline_s
        rounds = 0
        while True:
            for _ in range(len(self._members)):
                index = self._current
                try:
                    return fn(self._members[index])
                except (ConnectionFailedError, ConnectionTimeoutError) as err:
                    last = f"{self.endpoints[index]}: {type(err).__name__} {err.detail_text or err}"[:300]
                    self.skip(index)
                except Etcd3Exception as err:
                    raise EtcdError(err.detail_text or str(err) or type(err).__name__) from None
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"no etcd member answered within {self._deadline_s:g} s; last: {last}")
            rounds += 1
            time.sleep(min(0.5, 0.05 * 2 ** rounds))

    def member(self) -> tuple[int, Etcd3Client]:
        """The member requests go to now (the watch opens its stream there)."""
        index = self._current
        return index, self._members[index]

    def skip(self, index: int) -> None:
        """Moves past member `index` (it failed someone) unless another caller already did."""
        if self._current == index:
            self._current = (index + 1) % len(self._members)

    def post(self, path: str, body: dict) -> dict:
        return self.call(lambda c: c.post(c.get_url(path), data=json.dumps(body)))

    def get(self, key: bytes) -> Optional[dict]:
        """The key's KeyValue (see kv_of), read linearizably, or None."""
        kvs = self.post("/kv/range", {"key": b64(key)}).get("kvs", [])
        return kv_of(kvs[0]) if kvs else None

    def get_prefix(self, prefix: bytes) -> tuple[list[dict], int]:
        """Every KeyValue under `prefix`, and the revision they were read at."""
        reply = self.post("/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        return [kv_of(kv) for kv in reply.get("kvs", [])], int(reply["header"]["revision"])

    def txn(self, compare: list[dict], success: list[dict], failure: Sequence[dict] = ()) -> dict:
        """The gateway's TxnResponse; `succeeded` is set (absent on the wire when false)."""
        reply = self.post("/kv/txn", {"compare": compare, "success": success, "failure": list(failure)})
        reply["succeeded"] = bool(reply.get("succeeded", False))
        reply["revision"] = int(reply["header"]["revision"])
        return reply

    def grant(self, ttl_s: int) -> int:
        return int(self.post("/lease/grant", {"TTL": ttl_s, "ID": 0})["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's TTL after the refresh; <= 0 when it is gone."""
        return int(self.post("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        """Revokes the lease (its keys go with it); a lease already gone is no error."""
        try:
            self.post("/kv/lease/revoke", {"ID": lease})
        except EtcdError as err:
            if not lease_gone(err):
                raise


# ---- transaction pieces (the gateway's JSON for etcdserverpb messages) --------------------------

def put(key: bytes, value: bytes, lease: int = 0, prev_kv: bool = False) -> dict:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = lease
    if prev_kv:
        request["prev_kv"] = True
    return {"request_put": request}


def delete(key: bytes) -> dict:
    return {"request_delete_range": {"key": b64(key), "prev_kv": True}}


def compare(key: bytes, target: str, value: int, result: str = "EQUAL") -> dict:
    """target: CREATE (create_revision), MOD (mod_revision), VERSION or LEASE."""
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version", "LEASE": "lease"}[target]
    return {"key": b64(key), "result": result, "target": target, field: value}


class PrefixWatch:
    """Feeds on_reset(kvs, revision) and on_events(events, revision) from a watch on `prefix`.
    Events are the gateway's, with kv decoded by kv_of and "type" "PUT" or "DELETE". The first
    listing happens in the constructor (so the cache is whole before the first request), the
    rest on the watch thread."""

    def __init__(self, client: EtcdClient, prefix: bytes, on_reset: Callable[[list[dict], int], None],
                 on_events: Callable[[list[dict], int], None], read_timeout_s: float = WATCH_READ_TIMEOUT_S) -> None:
        self._client, self._prefix = client, prefix
        self._on_reset, self._on_events = on_reset, on_events
        self._read_timeout_s = read_timeout_s
        self._revision = 0  # everything under the prefix up to here is in the cache
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._response: Optional[requests.Response] = None
        self._session = etcd_session(client.tls)  # the stream's own connection, apart from the requests' pools
        self.resyncs = 0  # listings after the first (tests and logs)
        self._watching = 0  # the member whose stream is open (or was last)
        self._resync()
        self._thread = threading.Thread(target=self._run, name="etcd-watch", daemon=True)
        self._thread.start()

    @property
    def revision(self) -> int:
        with self._changed:
            return self._revision

    def wait_for(self, revision: int, timeout_s: float) -> bool:
        """True once the cache holds everything up to `revision`; False after `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(lambda: self._revision >= revision, timeout_s)

    def stop(self) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            try:  # wakes the watch thread's blocked read (closing the response alone does not)
                with socket.fromfd(response.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError, ValueError):
                pass  # already closed
            response.close()
        self._thread.join(timeout=5)
        self._session.close()

    def _advance(self, revision: int) -> None:
        with self._changed:
            self._revision = max(self._revision, revision)
            self._changed.notify_all()

    def _resync(self) -> None:
        kvs, revision = self._client.get_prefix(self._prefix)
        self._on_reset(kvs, revision)
        with self._changed:
            self._revision = revision
            self._changed.notify_all()

    def _run(self) -> None:
        resync = False
        while not self._stopping.is_set():
            try:
                if resync:
                    self.resyncs += 1
                    self._resync()
                    resync = False
                resync = self._stream()
            except Exception as err:  # noqa: BLE001 - the cache must outlive any one failure; stop() lands here too
                if self._stopping.is_set():
                    return
                if _read_timeout(err):
                    continue  # a quiet stream: reopen it from where it stopped
                log("etcd_watch_failed", member=self._watching, error=repr(err)[:300], resync=True)
                self._client.skip(self._watching)
                resync = True
                self._stopping.wait(0.5)

    def _stream(self) -> bool:
        """Watches from the cache's revision + 1 until the stream ends; True when a resync is needed."""
        self._watching, member = self._client.member()
        create = {"key": b64(self._prefix), "range_end": b64(prefix_end(self._prefix)),
                  "start_revision": self.revision + 1, "progress_notify": True}
        self._response = self._session.post(member.get_url("/watch"), json={"create_request": create}, stream=True,
                                            timeout=(REQUEST_TIMEOUT_S, self._read_timeout_s))
        with self._response as response:
            if response.status_code != 200:
                raise ValueError(f"watch refused: HTTP {response.status_code}")
            for line in response.iter_lines():
                if self._stopping.is_set():
                    return False
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if "error" in chunk:
                    raise ValueError(f"watch error: {chunk['error']}")
                result = chunk["result"]
                if result.get("canceled"):
                    log("etcd_watch_canceled", compact_revision=result.get("compact_revision"),
                        reason=result.get("cancel_reason", ""))
                    return True
                if result.get("created"):
                    continue  # its header is the current revision, not what this watch has seen
                revision = int(result["header"]["revision"])
                events = [{"type": e.get("type", "PUT"), "kv": kv_of(e["kv"])} for e in result.get("events", [])]
                if events:
                    self._on_events(events, revision)
                self._advance(revision)
        raise requests.exceptions.ConnectionError("the watch stream ended")


def _read_timeout(err: Exception) -> bool:
    """A stream that stayed quiet past its read timeout (requests wraps urllib3's error in a
    ConnectionError while streaming, in a ReadTimeout otherwise)."""
    if isinstance(err, requests.exceptions.ReadTimeout):
        return True
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in err.args)
