"""The TrackerStore contract (state_store.py), run against the embedded store and against the etcd
store on a real 3-member cluster (skipped, with the reason, where etcd cannot start). Time: the
embedded store runs on a fake clock moved by `elapse`; the etcd store on real time, whose leases
never expire early but may expire up to ~1.5 s late (etcd checks leases every 500 ms), so an
expiry is awaited with `expires`. A successful advance returns the record a reader then gets
(issue 34)."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker.store.etcd_cluster import cluster_or_skip
from meshnet.tracker.store.state_store import EmbeddedStore, NodeRecord, SessionRecord
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId
from meshnet.wire.seam import Fingerprints

ETCD_LATE_S = 3.0  # how long past its TTL an etcd lease may still be seen


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A store plus the way time passes for it."""

    def __init__(self, store, clock=None) -> None:
        self.store, self._clock = store, clock

    def now(self) -> float:
        return self._clock() if self._clock else time.monotonic()

    def elapse(self, seconds: float) -> None:
        if self._clock:
            self._clock.now += seconds
        else:
            time.sleep(seconds)

    def expires(self, gone, seconds: float) -> None:
        """After `seconds`, `gone()` must hold (on etcd: within ETCD_LATE_S more)."""
        self.elapse(seconds)
        deadline = time.monotonic() + (0 if self._clock else ETCD_LATE_S)
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone()


@pytest.fixture(scope="module")
def etcd():
    cluster = cluster_or_skip()
    yield cluster
    cluster.teardown()


@pytest.fixture(params=["embedded", "etcd"])
def harness(request):
    if request.param == "embedded":
        clock = FakeClock()
        yield Harness(EmbeddedStore(clock), clock)
        return
    from meshnet.tracker.store.etcd_store import EtcdStore

    cluster = request.getfixturevalue("etcd")
    store = EtcdStore(cluster.endpoints, f"/test-{uuid.uuid4().hex[:8]}/")
    yield Harness(store)
    store.close()


def node(name: str = "a", start: int = 0, end: int = 30) -> NodeRecord:
    key = Identity.generate()
    info = tt.NodeInfo(key.node_id, f"10.0.0.{len(name)}:7000", tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "sha256:range", tt.LayerRange(start, end),
                       tt.Capacity(4, 4096, 1 << 30, 2048), 30, key.public_key, "-----BEGIN CERTIFICATE-----\n",
                       "10.0.0.9:7700", 1.5, tt.Device("vulkan0", "llvmpipe", 2 << 30, 1 << 30))
    return NodeRecord(info, tt.Admission.ROUTABLE, "")


def session(h: Harness, epoch: int = 1, hops=()) -> SessionRecord:
    return SessionRecord("smol", epoch, tuple(hops), 512, frozenset({NodeId("n-avoided")}), b"\x01" * 32, "key:alice",
                         h.now())


def same_session(got: SessionRecord, want: SessionRecord) -> bool:
    """Equal but for times (the etcd store keeps wall-clock times, read back within a moment)."""
    return (dataclasses.replace(got, opened_at=0.0, lease_until=0.0)
            == dataclasses.replace(want, opened_at=0.0, lease_until=0.0)
            and abs(got.opened_at - want.opened_at) < 1.0)


def test_a_node_lives_while_its_lease_does(harness):
    store, record = harness.store, node()
    node_id = record.info.node_id
    store.put_node(record, 2)
    assert [n.info for n in store.nodes()] == [record.info]
    for _ in range(3):  # heartbeats keep it past its first lease
        harness.elapse(1)
        assert store.refresh_node(node_id, 2, tt.Load(active_sessions=3, decode_tokens_per_second=41.5))
    (live,) = store.nodes()
    assert live.load == tt.Load(active_sessions=3, decode_tokens_per_second=41.5)
    assert abs(live.last_heartbeat - harness.now()) < 1.0
    assert store.refresh_node(node_id, 2, None) and store.nodes()[0].load.active_sessions == 3  # load kept
    harness.expires(lambda: not store.nodes(), 2.1)
    assert not store.refresh_node(node_id, 2, None) and not store.drain_node(node_id)


def test_records_written_before_devices_read_back_without_one():
    from meshnet.tracker.store import store_codec

    record = node()
    value = store_codec.load(store_codec.node_value(record))
    del value["info"]["device"]  # as a tracker before ADR 0014 wrote it
    assert store_codec.node_record(value).info == dataclasses.replace(record.info, device=None)


def test_drain_remove_and_register_again(harness):
    store, a, b = harness.store, node("a"), node("bb", 10, 30)
    store.put_node(a, 30)
    store.put_node(b, 30)
    assert store.drain_node(a.info.node_id)
    states = {n.info.node_id: n.draining for n in store.nodes()}
    assert states == {a.info.node_id: True, b.info.node_id: False}
    store.put_node(a, 30)  # registering again starts afresh: not draining
    assert not {n.info.node_id: n for n in store.nodes()}[a.info.node_id].draining
    assert store.remove_node(a.info.node_id) and not store.remove_node(a.info.node_id)
    assert [n.info.node_id for n in store.nodes()] == [b.info.node_id]
    unknown = NodeId("n" + "0" * 40)
    assert not store.refresh_node(unknown, 30, None) and not store.drain_node(unknown)


def test_a_session_is_created_once_and_its_epoch_advances_once_per_epoch(harness):
    store, sid = harness.store, SessionId(f"rs-{uuid.uuid4().hex}")
    hop = tt.Hop(node().info, tt.LayerRange(0, 30))
    first = session(harness, hops=[hop])
    assert store.create_session(sid, first, 30)
    assert not store.create_session(sid, session(harness), 30)
    assert same_session(store.session(sid), first)
    second = dataclasses.replace(first, epoch=2, hops=())
    assert store.advance_session(sid, 1, second, 30)
    assert not store.advance_session(sid, 1, second, 30)  # epoch 2 was handed out once
    with pytest.raises(ValueError):
        store.advance_session(sid, 2, dataclasses.replace(first, epoch=4), 30)
    assert store.session(sid).epoch == 2 and store.session(sid).hops == ()
    assert [s for s, _ in store.sessions()] == [sid]
    assert not store.renew_session(sid, 1, 30) and store.renew_session(sid, 2, 30)
    opener = first.client_key
    assert store.close_session(sid, 1, opener) is None  # a stale epoch closes nothing
    assert store.close_session(sid, 2, b"\x02" * 32) is None and store.session(sid).epoch == 2  # nor another key
    closed = store.close_session(sid, 2, opener)
    assert closed is not None and closed.epoch == 2
    assert store.session(sid) is None and store.sessions() == [] and store.close_session(sid, 2, opener) is None
    assert not store.advance_session(sid, 2, dataclasses.replace(first, epoch=3), 30)


def test_an_advance_returns_the_record_as_stored(harness):
    """Issue 34: the registry tickets a failover from what advance_session returns instead of
    reading the session back; it is the record a reader now gets, its new lease included."""
    store, sid = harness.store, SessionId(f"rs-{uuid.uuid4().hex}")
    assert store.create_session(sid, session(harness), 30)
    harness.elapse(1)
    stored = store.advance_session(sid, 1, dataclasses.replace(session(harness, epoch=2), expected_tokens=640), 30)
    read = store.session(sid)
    assert stored is not None and same_session(stored, read) and stored.expected_tokens == 640
    assert abs(stored.lease_until - (harness.now() + 30)) < 1.0 and abs(stored.lease_until - read.lease_until) < 1.0
    assert store.advance_session(sid, 1, session(harness, epoch=2), 30) is None  # a stale epoch: nothing stored


def test_a_session_lives_while_its_lease_does(harness):
    store, sid = harness.store, SessionId(f"rs-{uuid.uuid4().hex}")
    assert store.create_session(sid, session(harness), 2)
    harness.elapse(1)
    assert store.renew_session(sid, 1, 2)
    harness.elapse(1)
    assert store.advance_session(sid, 1, session(harness, epoch=2), 2)  # an advance renews too
    harness.elapse(1)
    assert store.session(sid) is not None
    harness.expires(lambda: store.session(sid) is None and store.sessions() == [], 2)
    assert not store.renew_session(sid, 2, 2) and not store.advance_session(sid, 2, session(harness, epoch=3), 2)


def test_concurrent_advances_hand_out_each_epoch_once(harness):
    store, sid = harness.store, SessionId(f"rs-{uuid.uuid4().hex}")
    assert store.create_session(sid, session(harness), 60)
    won: list[int] = []
    errors: list[BaseException] = []

    def advance() -> None:
        try:
            for _ in range(10):
                seen = store.session(sid).epoch
                if store.advance_session(sid, seen, session(harness, epoch=seen + 1), 60):
                    won.append(seen + 1)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=advance) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(won) == list(range(2, 2 + len(won))) and len(won) >= 10
    assert store.session(sid).epoch == 1 + len(won)


def test_strikes_ban_for_doubling_times_and_are_not_forgotten(harness):
    store, culprit = harness.store, NodeId("n" + "1" * 40)
    store.strike(culprit, 2, 8)
    assert store.banned() == {culprit}
    harness.expires(lambda: culprit not in store.banned(), 2)
    store.strike(culprit, 2, 8)  # the second strike bans for 4 s
    harness.elapse(2.5)
    assert store.banned() == {culprit}
    harness.expires(lambda: not store.banned(), 1.5)


def test_quarantine_only_grows(harness):
    store = harness.store
    assert store.quarantined() == frozenset()
    store.quarantine(NodeId("n-cheat"))
    store.quarantine(NodeId("n-cheat"))
    store.quarantine(NodeId("n-other"))
    assert store.quarantined() == {"n-cheat", "n-other"}
