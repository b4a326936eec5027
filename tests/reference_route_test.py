"""Issue 5 acceptance on real processes: a tracker and reference nodes [0,10), [10,20) (twice:
a replica), [20,30) on loopback, serving the bundled SmolLM2 in fp32.

Parity with single-process Transformers generate, 8 concurrent sessions without cross-talk,
cancellation in prefill and decode, capacity limits, and a kill -9 of the middle node during
generation (last, since it removes a node)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.reference.model import load_model
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.swarm.local import LocalSwarm
from route_cases import (MORE_PROMPTS, PROMPTS, TOKENS, cancel_after, generate,  # noqa: F401 - fixtures
                         generate_killing_the_middle_hop, tokenizer, tracker)
from meshnet.wire import tracker as tt
from meshnet.wire.status import StatusCode

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()


@pytest.fixture(scope="module")
def baseline(tokenizer):
    """Single-process Transformers greedy continuations (no early stop), computed once."""
    model = load_model(GGUF)
    out = {}
    for prompt in PROMPTS + MORE_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None,
                                       pad_token_id=tokenizer.eos_token_id)
        out[prompt] = generated[0, ids.shape[1]:].tolist()
    return out


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    s = LocalSwarm(tmp_path_factory.mktemp("swarm"), GGUF, [(0, 10), (10, 20), (20, 30)], lease_seconds=3.0,
                   max_sessions=16)
    s.start()
    s.add_node("node-1b", (10, 20))
    yield s
    s.stop()



def live_sessions(swarm) -> dict[str, int]:
    counts = {}
    for node_id, channel in swarm.shard_channels().items():
        if swarm.nodes[node_id].proc.poll() is not None:
            continue
        counts[node_id] = shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(),
                                                                   timeout=5).active_sessions
    return counts


def wait_all_released(swarm, timeout=10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        counts = live_sessions(swarm)
        if not any(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_parity_with_single_process_generate(swarm, tracker, tokenizer, baseline):
    for prompt in PROMPTS:
        assert generate(tracker, tokenizer, prompt) == baseline[prompt], prompt
    assert wait_all_released(swarm) == {name: 0 for name in swarm.nodes}


def test_eight_concurrent_sessions_match_their_solo_runs(swarm, tracker, tokenizer, baseline):
    prompts = PROMPTS + MORE_PROMPTS
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda p: generate(tracker, tokenizer, p, tokens=24), prompts))
    for prompt, tokens in zip(prompts, results):
        assert tokens == baseline[prompt][:24], prompt
    assert wait_all_released(swarm) == {name: 0 for name in swarm.nodes}


def test_cancel_in_prefill_and_in_decode_frees_every_hop(swarm, tracker, tokenizer):
    long_prompt = tokenizer(" ".join(["The quick brown fox jumps over the lazy dog."] * 40))["input_ids"]
    session = RouteClient(tracker, "smollm2")
    stream = session.generate(long_prompt, GenerationParams(max_tokens=32))
    canceller = threading.Timer(0.05, session.cancel)  # while the first hops are still prefilling
    canceller.start()
    assert len(list(stream)) < 32
    assert wait_all_released(swarm) == {name: 0 for name in swarm.nodes}

    got = cancel_after(tracker, tokenizer)
    assert 5 <= len(got) < 48
    assert wait_all_released(swarm) == {name: 0 for name in swarm.nodes}


def test_session_over_the_limit_is_resource_exhausted(swarm, tracker, tokenizer):
    routes = [tracker.open_route(tt.OpenRouteRequest("smollm2", "hog", 16)) for _ in range(16)]
    assert all(r.status.ok for r in routes)
    over = tracker.open_route(tt.OpenRouteRequest("smollm2", "one-too-many", 16))
    assert over.status.code == StatusCode.RESOURCE_EXHAUSTED and over.status.retryable, over.status
    with pytest.raises(MeshnetError) as err:
        generate(tracker, tokenizer, "hello", tokens=2)
    assert err.value.status.code == StatusCode.RESOURCE_EXHAUSTED
    for r in routes:
        assert tracker.close_route(r.session).status.ok
    assert generate(tracker, tokenizer, "hello", tokens=2)


def test_kill_the_middle_node_mid_generation(swarm, tracker, tokenizer, baseline):
    prompt = PROMPTS[0]
    session, got, killed = generate_killing_the_middle_hop(tracker, tokenizer, prompt,
                                                           lambda middle: swarm.nodes[middle].kill())
    assert killed
    assert got == baseline[prompt]  # no duplicated, missing or different token
    assert session.failovers and session.failovers[0][1] == killed and session.failovers[0][0] == 2
    log = swarm.tracker.log.read_text()
    assert '"event": "report_failure"' in log and killed in log
    assert wait_all_released(swarm) == {name: 0 for name in swarm.nodes if name != killed}
