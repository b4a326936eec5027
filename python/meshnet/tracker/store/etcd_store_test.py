"""Two trackers (two Registry instances, each with its own EtcdStore) on one real 3-member etcd
cluster: epochs never issued twice and stale epochs refused on both, a node registered through
one routable through the other, lease expiry seen by both, the key layout and its bounds, and the
service going on while one etcd member of three is killed, which rejoins on restart. Skipped,
with the reason, where etcd cannot start."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.store import etcd_client as ec
from meshnet.tracker.store import store_codec
from meshnet.tracker.store.etcd_cluster import cluster_or_skip
from meshnet.tracker.store.etcd_store import EtcdStore
from meshnet.tracker.store.state_store import RecordTooLarge, SessionRecord, StoreUnavailable
from meshnet.wire import tracker as tt
from meshnet.wire.ids import SessionId
from meshnet.wire.seam import Fingerprints, RouteSession
from meshnet.wire.status import StatusCode

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")
CLIENT = Identity.generate()


@pytest.fixture(scope="module")
def etcd():
    cluster = cluster_or_skip()
    yield cluster
    cluster.teardown()


@pytest.fixture
def trackers(etcd, request):
    """(tracker A, tracker B, prefix): two registries sharing one fresh prefix."""
    prefix = f"/meshnet/test-{uuid.uuid4().hex[:8]}/"
    options = getattr(request, "param", {})
    made = [Registry([MODEL], store=EtcdStore(etcd.endpoints, prefix), **options) for _ in range(2)]
    yield made[0], made[1], prefix
    for registry in made:
        registry.close()


def node_info(key: Identity, start: int = 0, end: int = 30, sessions: int = 64) -> tt.NodeInfo:
    return tt.NodeInfo(key.node_id, f"127.0.0.1:{7000 + start}", tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "sha256:range", tt.LayerRange(start, end),
                       tt.Capacity(sessions, 1 << 20, 1 << 30), 30, key.public_key, "")


def register(registry: Registry, key: Identity, start: int = 0, end: int = 30) -> None:
    reply = registry.register(node_info(key, start, end), key.public_key)
    assert reply.status.ok and reply.admission == tt.Admission.ROUTABLE


def synced(*registries: Registry) -> None:
    """Each tracker's cache holds every write made before (what a watch event brings a moment later)."""
    for registry in registries:
        assert registry._store.sync()


def eventually(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_a_node_registered_through_one_tracker_is_routed_and_renewed_through_the_other(trackers):
    a, b, _ = trackers
    first, second = Identity.generate(), Identity.generate()
    register(a, first, 0, 12)
    register(b, second, 12, 30)
    synced(a, b)
    for tracker in (a, b):
        route = tracker.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
        assert route.status.ok, route.status
        assert [(h.node.node_id, h.layers.start) for h in route.hops] == [(first.node_id, 0), (second.node_id, 12)]
        assert tracker.close_route(route.session, CLIENT.public_key).ok
    assert b.heartbeat(first.node_id, tt.Load(active_sessions=2), first.public_key).status.ok
    synced(a)
    (seen,) = [n for n in a.snapshot().nodes if n.node_id == first.node_id]
    assert seen.load.active_sessions == 2 and seen.heartbeat_age_s < 2.0
    assert b.drain(first.node_id, first.public_key).ok
    synced(a)
    assert a.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key).status.code == StatusCode.UNAVAILABLE
    assert a.deregister(second.node_id, second.public_key).ok
    assert b.deregister(second.node_id, second.public_key).code == StatusCode.NOT_FOUND


def test_concurrent_failovers_through_both_trackers_never_issue_an_epoch_twice(trackers):
    a, b, _ = trackers
    for _ in range(2):
        register(a, Identity.generate())
    synced(a, b)
    opened = a.open_route(tt.OpenRouteRequest("smol", client_id="key:alice"), CLIENT.public_key)
    assert opened.status.ok
    sid = opened.session.session_id
    issued: list[tuple[str, int]] = []
    stale: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def fail_over(tracker: Registry) -> None:
        try:
            epoch = 1
            for _ in range(15):  # a failure report with no culprit: a new epoch, no ban
                reply = tracker.report_failure(tt.ReportFailureRequest(RouteSession(sid, epoch), ""), CLIENT.public_key)
                with lock:
                    if reply.status.ok:
                        issued.append((reply.session.session_id, reply.session.epoch))
                    else:
                        assert reply.status.code == StatusCode.STALE_EPOCH, reply.status
                        stale.append(epoch)
                epoch = reply.session.epoch  # the epoch it was given, or the one it was told is current
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=fail_over, args=(t,)) for t in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    epochs = sorted(e for _, e in issued)
    assert len(epochs) == len(set(epochs)), "an epoch was issued twice"
    assert epochs == list(range(2, 2 + len(epochs))) and stale, (epochs, stale)
    print(f"{len(epochs)} epochs issued, {len(stale)} reports refused as stale")
    last = RouteSession(sid, epochs[-1])
    for tracker in (a, b):  # every older epoch is fenced on both trackers
        old = RouteSession(sid, 1)
        assert tracker.report_failure(tt.ReportFailureRequest(old, ""), CLIENT.public_key).status.code == \
            StatusCode.STALE_EPOCH
        assert tracker.renew_route(old, CLIENT.public_key).status.code == StatusCode.STALE_EPOCH
        assert tracker.close_route(old, CLIENT.public_key).code == StatusCode.STALE_EPOCH
        assert tracker.client_id(last) == "key:alice"
        assert tracker.renew_route(last, CLIENT.public_key).status.ok
    assert b.close_route(last, CLIENT.public_key).ok
    assert a.renew_route(last, CLIENT.public_key).status.code == StatusCode.NOT_FOUND


@pytest.mark.parametrize("trackers", [{"lease_seconds": 1, "route_lease_seconds": 2}], indirect=True)
def test_leases_expire_on_both_trackers(trackers):
    a, b, _ = trackers
    key = Identity.generate()
    register(a, key)
    synced(b)
    route = b.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
    assert route.status.ok and [n.node_id for n in b.coverage("smol").nodes] == [key.node_id]
    # Nobody heartbeats or renews: etcd expires the node's lease and the route's, for everyone.
    eventually(lambda: not a.coverage("smol").nodes and not b.coverage("smol").nodes)
    for tracker in (a, b):
        assert tracker.heartbeat(key.node_id, None, key.public_key).status.code == StatusCode.NOT_FOUND
    eventually(lambda: a.renew_route(route.session, CLIENT.public_key).status.code == StatusCode.NOT_FOUND)
    assert b.snapshot().route_count == 0


def test_the_key_layout_leases_and_bounds(trackers, etcd):
    a, _, prefix = trackers
    key = Identity.generate()
    register(a, key)
    client = ec.EtcdClient(etcd.endpoints)
    kvs, _ = client.get_prefix(prefix.encode())
    names = sorted(kv["key"].decode()[len(prefix):] for kv in kvs)
    assert names == [f"loads/{key.node_id}", f"nodes/{key.node_id}"]
    (lease,) = {kv["lease"] for kv in kvs}  # the node's record and its load share the node's lease
    assert 0 < int(client.post("/kv/lease/timetolive", {"ID": lease})["TTL"]) <= 10  # the registry's lease
    # Registering again moves the node to a new lease and revokes the old one.
    register(a, key)
    assert int(client.post("/kv/lease/timetolive", {"ID": lease}).get("TTL", -1)) == -1
    # A value past the bound is refused before it reaches etcd.
    huge = tt.Hop(dataclasses.replace(node_info(key), tls_certificate="x" * 8192), tt.LayerRange(0, 30))
    big = SessionRecord("smol", 1, (huge,) * 100, 1, frozenset(), b"k", "", 0.0)
    with pytest.raises(RecordTooLarge):
        a._store.create_session(SessionId("rs-big"), big, 60)
    assert store_codec.MAX_VALUE_BYTES < 1_500_000  # inside etcd's default request limit


def test_the_service_goes_on_while_one_etcd_member_of_three_is_down(etcd):
    victim = etcd.leader()  # the leader, and the member both trackers talk to and watch first
    endpoints = etcd.endpoints[victim:] + etcd.endpoints[:victim]
    prefix = f"/meshnet/test-{uuid.uuid4().hex[:8]}/"
    a, b = (Registry([MODEL], store=EtcdStore(endpoints, prefix)) for _ in range(2))
    first, second = Identity.generate(), Identity.generate()
    try:
        register(a, first)
        started = time.monotonic()
        etcd.kill(victim)
        try:
            register(a, second)  # waits out the election, on another member
            failover_s = time.monotonic() - started
            assert a.heartbeat(first.node_id, None, first.public_key).status.ok
            synced(a, b)
            route = b.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
            assert route.status.ok, route.status
            moved = a.report_failure(tt.ReportFailureRequest(route.session, route.hops[0].node.node_id),
                                     CLIENT.public_key)
            assert moved.status.ok and moved.session.epoch == 2
            assert b.close_route(moved.session, CLIENT.public_key).ok
            eventually(lambda: a._store.resyncs >= 1 and b._store.resyncs >= 1)  # their watches moved on
        finally:
            etcd.start(victim)
        etcd.wait_healthy([victim])
        # The restarted member has caught up: a tracker that knows only it sees both nodes.
        alone = EtcdStore([etcd.endpoints[victim]], prefix)
        try:
            eventually(lambda: {n.info.node_id for n in alone.nodes()} == {first.node_id, second.node_id})
        finally:
            alone.close()
        assert a.heartbeat(second.node_id, None, second.public_key).status.ok
        print(f"registration with the leader killed took {failover_s:.2f} s")
    finally:
        a.close()
        b.close()


def test_on_tls_etcd_only_trackers_with_a_certificate_of_its_ca_get_in():
    # etcd with --client-cert-auth: a tracker with the cluster CA's client certificate routes; one
    # without a certificate, one with another CA's, and one speaking plain http are refused at the
    # handshake (StoreUnavailable once every member refused), and the honest tracker beside them
    # carries on.
    cluster = cluster_or_skip(tls=True)
    prefix = f"/meshnet/test-{uuid.uuid4().hex[:8]}/"
    honest = Registry([MODEL], store=EtcdStore(cluster.endpoints, prefix, tls=cluster.tls))
    try:
        first = Identity.generate()
        register(honest, first)
        no_certificate = ec.EtcdTls(cluster.tls.ca, cluster.tls.cert, cluster.tls.key)
        refused = {
            "another CA's certificate": ec.EtcdClient(cluster.endpoints, deadline_s=1.0, tls=cluster.stranger_tls),
            "plain http": ec.EtcdClient(cluster.endpoints, deadline_s=1.0),
        }
        bare = ec.EtcdClient(cluster.endpoints, deadline_s=1.0, tls=no_certificate)
        for member in bare._members:  # noqa: SLF001 - the CA to check the members, and no certificate
            member.session.cert = None
        refused["no certificate"] = bare
        for what, client in refused.items():
            with pytest.raises(StoreUnavailable) as err:
                client.get((prefix + "nodes/").encode())
            assert "no etcd member answered" in str(err.value), (what, err.value)
        second = Identity.generate()
        register(honest, second)
        route = honest.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
        assert route.status.ok and route.session.epoch == 1, route.status
        assert {n.info.node_id for n in honest._store.nodes()} == {first.node_id, second.node_id}
        assert honest.close_route(route.session, CLIENT.public_key).ok
    finally:
        honest.close()
        cluster.teardown()
