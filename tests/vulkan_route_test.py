"""Issue 30, point 5, on Mesa's software Vulkan (lavapipe) in CI: every hop of a 3-node GGUF route
computes its range on Vulkan (`--device vulkan0`, //cpp/worker:worker_vulkan).

- Route parity: the route's greedy tokens equal the whole model's on the same backend
  (//cpp/engine:greedy_vulkan --device vulkan0), and every hop's Health names the Vulkan device
  and the memory its weights and KV take there.
- Cancel frees every Vulkan hop.
- kill -9 of the middle Vulkan worker mid-decode ends with the same tokens on a new route (its
  replica, also on Vulkan).

Lavapipe runs the shaders on the CPU, slowly (about 2 tok/s for the bundled model here): the
generations are short, and nothing here is a speed figure."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from meshnet.certify.route_parity import llama_cpp_greedy
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.swarm.local import LocalSwarm
from route_cases import PROMPTS, tokenizer, tracker  # noqa: F401 - fixtures

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_VULKAN_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_VULKAN_GREEDY_BINARY"]).resolve()
DEVICE = "vulkan0"
TOKENS = 12
PARITY_PROMPTS = PROMPTS[:3]


def generate(tracker, tokenizer, prompt: str) -> list[int]:
    session = RouteClient(tracker, "smollm2")
    return list(session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=TOKENS)))


@pytest.fixture(scope="module")
def baseline(tokenizer):
    return {prompt: llama_cpp_greedy(GREEDY, GGUF, tokenizer(prompt)["input_ids"], TOKENS, device=DEVICE)
            for prompt in PARITY_PROMPTS}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("vulkan-swarm"), GGUF, [(0, 10), (10, 20), (20, 30)], backend="gguf",
                    worker_binary=WORKER, max_sessions=4, threads=1, device=DEVICE) as s:
        s.add_node("node-1b", (10, 20))
        yield s


def test_every_hop_computes_on_vulkan(swarm):
    replies = swarm.health()
    assert sorted(replies) == ["node-0", "node-1", "node-1b", "node-2"]
    for name, reply in replies.items():
        assert reply.device == DEVICE, (name, reply.device)
        assert reply.device_description, name  # the driver's name for it (llvmpipe here)
        # weights and KV of a third of SmolLM2 (about 30 MB of Q4_1 and 4 MiB of F32 KV at least)
        assert reply.device_memory_used > 16 << 20, (name, reply.device_memory_used)
        assert reply.device_memory_total > 0, name


def test_vulkan_route_matches_the_vulkan_whole_model(swarm, tracker, tokenizer, baseline):
    for prompt in PARITY_PROMPTS:
        assert generate(tracker, tokenizer, prompt) == baseline[prompt], prompt


def wait_all_free(swarm, timeout: float) -> tuple[float, dict]:
    started = time.monotonic()
    while True:
        busy = {name: (h.active_sessions, h.kv_cells_used) for name, h in swarm.health().items()
                if h.active_sessions or h.kv_cells_used}
        if not busy or time.monotonic() - started > timeout:
            return time.monotonic() - started, busy
        time.sleep(0.05)


def test_cancel_frees_every_vulkan_hop(swarm, tracker, tokenizer):
    session = RouteClient(tracker, "smollm2")
    got = []
    for token in session.generate(tokenizer("Tell me a long story.")["input_ids"], GenerationParams(max_tokens=24)):
        got.append(token)
        if len(got) == 3:
            session.cancel()
    assert 3 <= len(got) < 24
    # a Vulkan step in flight on lavapipe takes a good part of a second; the hops free after it
    elapsed, busy = wait_all_free(swarm, timeout=5.0)
    assert not busy, (elapsed, busy)


def test_kill_the_middle_vulkan_worker_mid_decode(swarm, tracker, tokenizer, baseline):
    prompt = PARITY_PROMPTS[0]
    session = RouteClient(tracker, "smollm2")
    got, killed = [], ""
    for token in session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=TOKENS)):
        got.append(token)
        if len(got) == 4:
            killed = session._connection.hops[1].node.node_id
            workers = psutil.Process(swarm.nodes[killed].proc.pid).children()
            assert len(workers) == 1
            workers[0].kill()  # kill -9 of the worker; the route fails over to the replica
    assert got == baseline[prompt]
    assert session.failovers and session.failovers[0][1] == killed
