"""Issue 20 acceptance on real processes: three trackers of one swarm on a real 3-member etcd
cluster, one PostgreSQL ledger, one swarm ticket key; three GGUF nodes (native workers) serving
SmolLM2 Q4_1 [0,10), [10,20), [20,30) and a client, all given every tracker's address.

- One tracker is SIGKILLed during a 3-node generation: the generation completes with the tokens
  of an undisturbed run; a new route opens on the survivors within 2 s of the kill; no route
  epoch is issued twice (the ledger's issued triples, and a failover through another tracker
  fences the old epoch); the ledger holds each hop's work exactly once (the same per-hop totals
  as the undisturbed run, from reports that may have been retried on another tracker).
- The etcd leader (one member of three) is SIGKILLed: routes still open and generations still
  complete.
Skipped, with the reason, where etcd or PostgreSQL cannot start.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.certify import certify
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import LocalSwarm
from meshnet.swarm.replicated import ReplicatedTrackers
from meshnet.tracker.ledger.postgres_server import server_or_skip
from meshnet.tracker.store.etcd_cluster import cluster_or_skip
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.status import StatusCode

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
PROMPT = "Tell me about the tides."
TOKENS = 32
CUTS = [(0, 10), (10, 20), (20, 30)]


@pytest.fixture(scope="module")
def services():
    etcd = cluster_or_skip()
    try:
        postgres = server_or_skip()
    except BaseException:
        etcd.teardown()
        raise
    yield etcd, postgres
    postgres.teardown()
    etcd.teardown()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, services):
    etcd, postgres = services
    workdir = tmp_path_factory.mktemp("replicated")
    trackers = ReplicatedTrackers(workdir, [certify(GGUF, "smollm2", "gguf")], trackers=3, etcd=etcd.endpoints,
                                  etcd_prefix=f"/meshnet/test-{uuid.uuid4().hex[:8]}/",
                                  ledger_url=postgres.url, lease_seconds=3.0)
    with LocalSwarm(workdir, GGUF, CUTS, backend="gguf", worker_binary=WORKER, max_sessions=4, threads=1,
                    control_plane=trackers) as s:
        wait_covered(s)
        yield s


@pytest.fixture(scope="module")
def prompt_ids():
    return load_tokenizer(GGUF)(PROMPT)["input_ids"]


def wait_covered(swarm, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with swarm.client() as probe:
        while len(probe.coverage(swarm.model).nodes) < len(CUTS):
            assert time.monotonic() < deadline, "the nodes did not register"
            time.sleep(0.2)


def ledger(postgres, sql: str, *args) -> list[tuple]:
    with psycopg.connect(postgres.url) as conn:
        return conn.execute(sql, args).fetchall()


def hop_work(postgres, client_id: str) -> dict[str, tuple[int, int]]:
    """node -> (prefill tokens, decode tokens) recorded for the routes opened as `client_id`."""
    rows = ledger(postgres, "SELECT w.node_id, SUM(w.prefill_tokens), SUM(w.decode_tokens) FROM work w JOIN issued i "
                            "ON w.session_id = i.session_id AND w.epoch = i.epoch AND w.node_id = i.node_id "
                            "WHERE i.client_id = %s GROUP BY w.node_id", client_id)
    return {n: (int(p), int(d)) for n, p, d in rows}


def settled_work(postgres, client_id: str, timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """hop_work once every hop has reported and nothing changed for 2 s (nodes report on their
    heartbeat, every 0.5 s here)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        work = hop_work(postgres, client_id)
        if work != last:
            last, since = work, time.monotonic()
        elif len(work) == len(CUTS) and time.monotonic() - since >= 2.0:
            break
        time.sleep(0.25)
    return last or {}


def generate(client: TrackerClient, model: str, ids: list[int], client_id: str,
             kill=None) -> tuple[list[int], RouteClient]:
    session = RouteClient(client, model, client_id=client_id)
    stream = session.generate(ids, GenerationParams(max_tokens=TOKENS))
    tokens = [next(stream) for _ in range(6)]
    if kill is not None:
        kill()
    tokens += list(stream)
    return tokens, session


def test_one_tracker_of_three_killed_during_a_generation(swarm, services, prompt_ids):
    _, postgres = services
    trackers = swarm.tracker.trackers
    with swarm.client() as client:
        baseline, calm = generate(client, swarm.model, prompt_ids, "calm")
        assert len(baseline) == TOKENS and calm.failovers == []
        victim = next(t for t in trackers if t.address == client.address)  # the one this client talks to
        fresh = swarm.client()  # another client, every tracker listed, the victim first
        opened: list = []

        def kill() -> None:
            """Kills the tracker mid-generation, then opens a new route at once (the generation
            goes on meanwhile), until one opens or 2 s have passed since the kill."""
            victim.kill()
            killed_at = time.monotonic()
            while True:
                route = fresh.open_route(tt.OpenRouteRequest(swarm.model, "after-kill", 64))
                if route.status.ok or time.monotonic() - killed_at > 2.0:
                    break
                time.sleep(0.05)
            opened.extend([route, time.monotonic() - killed_at])

        tokens, disturbed = generate(client, swarm.model, prompt_ids, "disturbed", kill=kill)
    assert tokens == baseline and disturbed.failovers == []
    route, opened_after = opened
    print(f"tracker {victim.address} killed at token 6; {len(tokens)} tokens equal to the calm run's; "
          f"a new route opened {opened_after:.3f} s after the kill, through {fresh.address}")
    with fresh:
        assert route.status.ok, route.status
        assert opened_after <= 2.0, f"the first route after the kill opened {opened_after:.2f} s after it"
        assert fresh.address != victim.address and len(route.hops) == len(CUTS)
        # Fencing across trackers: the failover goes through one survivor, the old epoch is then
        # refused by the other.
        survivors = [t for t in trackers if t is not victim]
        with TrackerClient(survivors[0].address, swarm.tracker.roles["client"], fresh.identity,
                           tracker_ca=swarm.tracker.ca) as first, \
                TrackerClient(survivors[1].address, swarm.tracker.roles["client"], fresh.identity,
                              tracker_ca=swarm.tracker.ca) as second:
            moved = first.report_failure(route.session, NodeId(""))  # a new epoch, no node blamed
            assert moved.status.ok and moved.session.epoch == route.session.epoch + 1
            stale = second.report_failure(route.session, NodeId(""))
            assert stale.status.code == StatusCode.STALE_EPOCH
            assert second.close_route(moved.session).status.ok

    # No epoch issued twice: every (session, epoch) in the ledger is one route's hops, one row
    # per hop (a second issue of the same epoch would add rows, or clash with other nodes).
    issued = Counter((s, e) for s, e, _ in ledger(postgres, "SELECT session_id, epoch, node_id FROM issued"))
    assert issued and all(count <= len(CUTS) for count in issued.values()), issued
    assert issued[(route.session.session_id, route.session.epoch)] == len(CUTS)
    assert issued[(moved.session.session_id, moved.session.epoch)] == len(CUTS)

    # Each hop's work exactly once: the disturbed session's per-hop totals equal the calm one's,
    # though the nodes' reports after the kill went (or were retried) to the survivors.
    calm_work = settled_work(postgres, "calm")
    work = settled_work(postgres, "disturbed")
    assert len(calm_work) == len(CUTS) and all(p > 0 and d > 0 for p, d in calm_work.values()), calm_work
    assert work == calm_work
    print(f"per-hop work (prefill, decode), calm run: {sorted(calm_work.values())}; disturbed run: "
          f"{sorted(work.values())}; issued (session, epoch) pairs: {len(issued)}, most rows for one: "
          f"{max(issued.values())}")
    victim.restart()


def test_one_etcd_member_of_three_killed(swarm, services, prompt_ids):
    etcd, _ = services
    victim = etcd.leader()
    etcd.kill(victim)
    try:
        with swarm.client() as client:
            tokens, session = generate(client, swarm.model, prompt_ids, "one-member-down")
            assert len(tokens) == TOKENS and session.failovers == []
            route = client.open_route(tt.OpenRouteRequest(swarm.model, "one-member-down", 64))
            assert route.status.ok, route.status
            assert client.close_route(route.session).status.ok
    finally:
        etcd.start(victim)
        etcd.wait_healthy([victim])
