"""Issue 30, point 5, on Mesa's software Vulkan (lavapipe) in CI: every hop of a 3-node GGUF route
computes its range on Vulkan (`--device vulkan0`, //cpp/worker:worker_vulkan).

- Route parity: the route's greedy tokens equal the whole model's on the same backend
  (//cpp/engine:greedy_vulkan --device vulkan0), and every hop's Health names the Vulkan device
  and the memory its weights and KV take there.
- Every node registers its device (name, driver, memory) and a capacity sized from that memory:
  the KV that fits beside its range's weights (node/device_budget.py); a node whose range does
  not fit its --device-memory is refused before it loads anything.
- Cancel frees every Vulkan hop.
- kill -9 of the middle Vulkan worker mid-decode ends with the same tokens on a new route (its
  replica, also on Vulkan).

Lavapipe runs the shaders on the CPU, slowly (about 2 tok/s for the bundled model here): the
generations are short, and nothing here is a speed figure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from meshnet.certify.route_parity import llama_cpp_greedy
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.node.device_budget import DEFAULT_KV_TOKENS, default_budget
from meshnet.process import child_env
from meshnet.recipe.range_memory import range_memory
from meshnet.swarm.local import LocalSwarm
from route_cases import (PROMPTS, cancel_after, generate, generate_killing_the_middle_hop,  # noqa: F401 - fixtures
                         tokenizer, tracker, wait_all_free)

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_VULKAN_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_VULKAN_GREEDY_BINARY"]).resolve()
DEVICE = "vulkan0"
TOKENS = 12
PARITY_PROMPTS = PROMPTS[:3]


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
        assert generate(tracker, tokenizer, prompt, TOKENS) == baseline[prompt], prompt


def test_every_node_registers_its_device_and_the_kv_that_fits_there(swarm, tracker, tokenizer):
    session = RouteClient(tracker, "smollm2")
    hops = []
    for _ in session.generate(tokenizer("Hi")["input_ids"], GenerationParams(max_tokens=2)):
        hops = hops or list(session._connection.hops)  # the connection is released once generation ends
    assert len(hops) == 3
    for hop in hops:
        node = hop.node
        assert node.device.name == DEVICE and "llvmpipe" in node.device.description, node.device
        assert 0 < node.device.memory_free_bytes <= node.device.memory_total_bytes
        memory = range_memory(GGUF, node.layers.start, node.layers.end, "f32")  # the worker's F32 KV
        fit = (default_budget(node.device) - memory.weight_bytes) // memory.kv_bytes_per_token
        assert node.capacity.kv_tokens == min(fit, DEFAULT_KV_TOKENS), (node.node_id, fit)
        assert node.capacity.memory_bytes == memory.total(node.capacity.kv_tokens) <= default_budget(node.device)


def test_a_range_that_does_not_fit_the_device_memory_is_refused_before_loading(tmp_path, swarm, tracker,
                                                                                  tokenizer, baseline):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "meshnet.node.main", "--tracker", swarm.tracker.address, "--insecure",
         "--identity", str(tmp_path / "id.key"), "--gguf", str(GGUF), "--model", "smollm2", "--layers", "0:30",
         "--backend", "gguf", "--worker-binary", str(WORKER), "--device", DEVICE, "--device-memory", "16M"],
        capture_output=True, text=True, timeout=120,
        env=dict(child_env(), MESHNET_NODE_TOKEN="never-sent: refused before it registers"))
    assert done.returncode == 2, done.stderr
    assert "layers 0:30 need" in done.stderr and "the budget on vulkan0 (llvmpipe" in done.stderr, done.stderr
    assert "is 16.0 MiB" in done.stderr and time.monotonic() - started < 60
    assert generate(tracker, tokenizer, PARITY_PROMPTS[0], TOKENS) == baseline[PARITY_PROMPTS[0]]  # the swarm is unharmed


def test_cancel_frees_every_vulkan_hop(swarm, tracker, tokenizer):
    got = cancel_after(tracker, tokenizer, after=3, max_tokens=24)
    assert 3 <= len(got) < 24
    # a Vulkan step in flight on lavapipe takes a good part of a second; the hops free after it
    elapsed, busy = wait_all_free(swarm, timeout=5.0)
    assert not busy, (elapsed, busy)


def test_kill_the_middle_vulkan_worker_mid_decode(swarm, tracker, tokenizer, baseline):
    prompt = PARITY_PROMPTS[0]

    def kill_worker(middle: str) -> None:
        workers = psutil.Process(swarm.nodes[middle].proc.pid).children()
        assert len(workers) == 1
        workers[0].kill()  # kill -9 of the worker; the route fails over to the replica

    session, got, killed = generate_killing_the_middle_hop(tracker, tokenizer, prompt, kill_worker, tokens=TOKENS,
                                                           after=4)
    assert got == baseline[prompt]
    assert session.failovers and session.failovers[0][1] == killed
