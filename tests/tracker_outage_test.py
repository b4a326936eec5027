"""Issue 13 on real processes: a tracker and two GGUF nodes (native workers), SmolLM2 Q4_1
[0,15) + [15,30) on loopback.

- The tracker is killed mid-generation and restarted on the same port: the session's tokens
  keep flowing while it is gone and equal single-process llama.cpp's, the client finishes
  cleanly (its CloseRoute cannot reach a tracker, or meets one that forgot the route), the
  nodes register again by themselves, and both workers end with 0 sessions and 0 KV cells.
- A session longer than any route can hold (n_ctx / n_seq per session) is refused at
  OpenRoute with INVALID_ARGUMENT, before any hop is touched.
- kill -9 of a node takes its worker with it (PR_SET_PDEATHSIG): no orphan.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.reference.model import load_tokenizer
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.swarm.local import LocalSwarm
from meshnet.wire import tracker as tt
from meshnet.wire.status import StatusCode
from route_cases import llama_cpp_greedy

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
PROMPT = "Tell me about the tides."
TOKENS = 24


@pytest.fixture(scope="module")
def prompt_ids():
    return load_tokenizer(GGUF)(PROMPT)["input_ids"]


@pytest.fixture(scope="module")
def baseline(prompt_ids):
    return llama_cpp_greedy(GREEDY, GGUF, prompt_ids, TOKENS)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("outage"), GGUF, [(0, 15), (15, 30)], backend="gguf",
                    worker_binary=WORKER, max_sessions=4, max_kv_tokens=4096, threads=1) as s:
        yield s


def wait_registered(swarm, count: int, timeout: float = 30.0) -> list[tt.NodeInfo]:
    deadline = time.monotonic() + timeout
    with swarm.client() as probe:
        while True:
            try:
                nodes = probe.coverage(swarm.model).nodes
            except Exception:  # the tracker is still coming up
                nodes = ()
            if len(nodes) >= count or time.monotonic() > deadline:
                return list(nodes)
            time.sleep(0.2)


def idle(swarm, timeout: float = 2.0) -> list[tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while True:
        state = []
        for channel in swarm.shard_channels().values():
            h = shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(), timeout=5)
            state.append((h.active_sessions, h.kv_cells_used))
        if all(s == (0, 0) for s in state) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def test_a_tracker_outage_mid_generation_costs_no_token(swarm, prompt_ids, baseline):
    with swarm.client() as tracker:
        session = RouteClient(tracker, swarm.model)
        stream = session.generate(prompt_ids, GenerationParams(max_tokens=TOKENS))
        tokens = [next(stream) for _ in range(4)]
        swarm.tracker.kill()
        tokens += [next(stream) for _ in range(8)]  # decoding goes on hop to hop without it
        swarm.tracker.restart()
        assert len(wait_registered(swarm, 2)) == 2  # the nodes registered again by themselves
        tokens += [next(stream) for _ in range(6)]
        swarm.tracker.kill()
        tokens += list(stream)  # the last tokens, and a finish whose CloseRoute reaches no tracker
    assert tokens == baseline and session.failovers == []
    swarm.tracker.restart()
    assert len(wait_registered(swarm, 2)) == 2
    assert idle(swarm) == [(0, 0), (0, 0)]


def test_a_session_longer_than_any_route_holds_is_refused_at_open_route(swarm):
    wait_registered(swarm, 2)
    with swarm.client() as tracker:
        nodes = tracker.coverage(swarm.model).nodes
        assert {n.capacity.max_session_tokens for n in nodes} == {4096 // 4}
        reply = tracker.open_route(tt.OpenRouteRequest(swarm.model, "c", 1025))
        assert reply.status.code == StatusCode.INVALID_ARGUMENT and "at most 1024 tokens" in reply.status.message
        assert reply.hops == ()
        fits = tracker.open_route(tt.OpenRouteRequest(swarm.model, "c", 1024))
        assert fits.status.ok and len(fits.hops) == 2
        assert tracker.close_route(fits.session).status.ok


def test_a_killed_node_takes_its_worker_with_it(swarm):
    node = swarm.nodes[swarm.ids["node-1"]]
    workers = psutil.Process(node.proc.pid).children()
    assert [os.path.basename(w.exe()) for w in workers] == ["worker"]
    node.kill()
    gone, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == [], f"worker {alive} outlived its node"


def test_a_failover_after_the_tracker_forgot_the_route_opens_a_new_one(swarm, prompt_ids, baseline):
    """The chaos soak's finding (issue 35): a route opened before a tracker restart (its state in
    memory) failed over afterwards; the restarted tracker answered ReportFailure NOT_FOUND and the
    gateway gave the user 404. The client now opens a new route session and replays there: the
    same tokens, one failover. Runs last: it adds a replica and kills the route's last hop."""
    swarm.nodes[swarm.ids["node-1"]].launch().wait_ready()  # the test above killed it
    swarm.add_node("replica-15", (15, 30))
    assert len(wait_registered(swarm, 3)) == 3
    with swarm.client() as tracker:
        session = RouteClient(tracker, swarm.model)
        # Client-driven decode: no step is taken while the test holds the stream, so the hop dies
        # mid-generation (in a ring the last hop would run the 24 tokens out meanwhile).
        stream = session.generate(prompt_ids, GenerationParams(max_tokens=TOKENS, ring=False))
        tokens = [next(stream) for _ in range(4)]
        last_hop = session._connection.hops[-1].node.node_id
        swarm.tracker.kill()
        swarm.tracker.restart()
        assert len(wait_registered(swarm, 3)) == 3  # the route session is gone with the old tracker
        swarm.nodes[last_hop].kill()
        tokens += list(stream)
    assert tokens == baseline
    assert [node for _, node in session.failovers] == [last_hop]
