"""Issue 7 acceptance on real processes: a tracker and three GGUF nodes (each supervising a
native worker, cpp/worker) serving SmolLM2 Q4_1 [0,10), [10,20), [20,30) on loopback.

The route's greedy tokens equal single-process llama.cpp's (//cpp/engine:greedy: the whole
model, no layer range, which is upstream behaviour) for 5 prompts x 64 tokens; concurrent
sessions (batched together inside each worker) keep their solo tokens; every worker ends with
zero live sessions."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from meshnet.client.session import GenerationParams, RouteSession
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.reference.model import load_tokenizer
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.swarm.local import LocalSwarm

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Water boils at",
    "List three primary colors:",
]
TOKENS = 64


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(GGUF)


@pytest.fixture(scope="module")
def baseline(tokenizer):
    out = {}
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        proc = subprocess.run([str(GREEDY), str(GGUF), str(TOKENS), *map(str, ids)], capture_output=True, text=True,
                              check=True)
        out[prompt] = json.loads(proc.stdout.strip().splitlines()[-1])["tokens"]
    return out


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("gguf-swarm"), GGUF, [(0, 10), (10, 20), (20, 30)], backend="gguf",
                    worker_binary=WORKER, max_sessions=8, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def tracker(swarm):
    with TrackerClient(swarm.tracker.address, swarm.tracker.secret) as client:
        yield client


def generate(tracker, tokenizer, prompt, tokens=TOKENS):
    session = RouteSession(tracker, "smollm2")
    return list(session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=tokens)))


def live_sessions(swarm) -> list[int]:
    counts = []
    with TrackerClient(swarm.tracker.address, swarm.tracker.secret) as client:
        nodes = client.coverage("smollm2").nodes
    for node in nodes:
        with grpc.insecure_channel(node.address) as channel:
            counts.append(shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(), timeout=5).active_sessions)
    return counts


def test_gguf_route_matches_single_process_llama_cpp(swarm, tracker, tokenizer, baseline):
    for prompt in PROMPTS:
        assert generate(tracker, tokenizer, prompt) == baseline[prompt], prompt


def test_concurrent_sessions_keep_their_solo_tokens(swarm, tracker, tokenizer, baseline):
    with ThreadPoolExecutor(max_workers=5) as pool:
        results = list(pool.map(lambda p: generate(tracker, tokenizer, p, tokens=32), PROMPTS))
    for prompt, tokens in zip(PROMPTS, results):
        assert tokens == baseline[prompt][:32], prompt
    deadline = time.monotonic() + 10
    while any(live_sessions(swarm)) and time.monotonic() < deadline:
        time.sleep(0.1)
    counts = live_sessions(swarm)
    assert len(counts) == 3 and not any(counts), counts
