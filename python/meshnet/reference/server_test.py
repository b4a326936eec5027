"""Shard server over real gRPC on loopback with a fake engine (named as such, test only):
epoch fencing, idempotent steps, release, stream loss and the idle deadline free sessions."""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest
import torch

from meshnet.protocol import seam
from meshnet.reference.server import ShardServer
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.types import seam as t
from meshnet.types.status import StatusCode


class FakeEngine:
    """Test fake of ReferenceEngine: a last-and-first shard whose logits favour token (n + 1)."""

    class shard:  # noqa: N801 (mirrors the attribute the server reads)
        first = True
        last = True

    max_kv_tokens = 1000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict = {}
        self.steps = 0

    def step(self, key, position, token_ids=None, hidden=None):
        with self.lock:
            self.steps += 1
            self.sessions[key] = position + len(token_ids)
            logits = torch.zeros(16)
            logits[(int(token_ids[-1]) + 1) % 16] = 1.0
            return logits, self.sessions[key]

    def release(self, key):
        with self.lock:
            return self.sessions.pop(key, None) is not None

    def stats(self):
        with self.lock:
            return len(self.sessions), sum(self.sessions.values())


@pytest.fixture
def served():
    engine = FakeEngine()
    shard = ShardServer(engine, "fake-node", idle_seconds=0.6)
    engine.server = shard  # lets tests read the server's session table
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    shard_pb2_grpc.add_ShardServicer_to_server(shard, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield engine, shard_pb2_grpc.ShardStub(channel)
    channel.close()
    server.stop(None)


class Stream:
    def __init__(self, stub) -> None:
        self.frames: queue.Queue = queue.Queue()
        self.call = stub.Seam(iter(self.frames.get, None))

    def send(self, frame: t.SeamFrame) -> t.SeamReply:
        self.frames.put(seam.to_proto(frame))
        return seam.from_proto(next(self.call))

    def close(self) -> None:
        self.frames.put(None)


def frame(session, step, phase=t.Phase.PREFILL, start=0, tokens=(3,)):
    return t.SeamFrame(seam.PROTOCOL_VERSION, session, phase, step, span=t.TokenSpan(start, len(tokens)),
                       token_ids=tuple(tokens))


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_steps_results_replay_and_fencing(served):
    engine, stub = served
    s1 = t.RouteSession("s", 1)
    results = stub.Results(seam.to_proto(t.ResultsRequest(seam.PROTOCOL_VERSION, s1)))
    stream = Stream(stub)
    assert stream.send(frame(s1, 1, tokens=(1, 2, 3))).cache.length == 3
    assert seam.from_proto(next(results)).tokens[0].token_id == 4
    replay = stream.send(frame(s1, 1, tokens=(1, 2, 3)))
    assert replay.replayed and replay.cache.length == 3 and engine.steps == 1  # answered, not recomputed
    assert stream.send(frame(s1, 2, t.Phase.DECODE, 3, (4,))).cache.length == 4
    work = stub.TakeWork(shard_pb2.TakeWorkRequest())
    assert [(w.session.session_id, w.session.epoch, w.prefill_tokens, w.decode_tokens) for w in work.work] == \
        [("s", 1, 3, 1)]  # the replayed step is not counted twice
    assert not stub.TakeWork(shard_pb2.TakeWorkRequest()).work  # taken means reset
    old = stream.send(frame(s1, 1, tokens=(9,)))
    assert old.status.code == StatusCode.INVALID_ARGUMENT  # older than the last step
    newer = Stream(stub)
    assert newer.send(frame(t.RouteSession("s", 2), 1)).status.ok
    fenced = stream.send(frame(s1, 3, t.Phase.DECODE, 4, (5,)))
    assert fenced.status.code == StatusCode.STALE_EPOCH and fenced.status.hop == "fake-node"
    wait_until(lambda: ("s", 1) not in engine.sessions)  # the fenced epoch's KV is freed
    assert newer.send(frame(t.RouteSession("s", 2), 2, t.Phase.RELEASE)).status.ok
    wait_until(lambda: engine.stats()[0] == 0)
    stream.close()
    newer.close()


def test_a_failed_first_step_frees_the_session(served):
    engine, stub = served
    stream = Stream(stub)
    bad = stream.send(t.SeamFrame(seam.PROTOCOL_VERSION, t.RouteSession("x", 1), t.Phase.PREFILL, 1,
                                  span=t.TokenSpan(0, 2), token_ids=(1,)))  # 1 token for a span of 2
    assert bad.status.code == StatusCode.INVALID_ARGUMENT
    assert engine.server.session_records() == 0  # freed at once, not at stream loss or idle reap
    assert stream.send(frame(t.RouteSession("x", 1), 1)).status.ok  # the retry gets a fresh slot
    stream.close()
    wait_until(lambda: engine.stats()[0] == 0)


def test_stream_loss_and_idle_deadline_free_sessions(served):
    engine, stub = served
    lost = Stream(stub)
    assert lost.send(frame(t.RouteSession("a", 1), 1)).status.ok
    lost.close()
    wait_until(lambda: ("a", 1) not in engine.sessions)
    idle = Stream(stub)
    assert idle.send(frame(t.RouteSession("b", 1), 1)).status.ok
    assert engine.stats()[0] == 1
    wait_until(lambda: engine.stats()[0] == 0, timeout=3.0)  # idle_seconds = 0.6
    idle.close()
