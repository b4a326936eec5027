"""Issue 13: overlapping registrations give the whole model's tokens, on real processes.

- Reference nodes [0,12) and [10,30): the route runs the second from its effective start 12
  (its ticket says so), and the greedy tokens equal single-process Transformers generate.
- GGUF nodes [0,12) and [10,30): the worker runs only its whole range, so no route is issued
  ("no chain of nodes gets past layer 12") rather than one that runs layers 10 and 11 twice;
  once a [0,10) node joins, the route meets at layer 10 and gives llama.cpp's greedy tokens.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.reference.model import load_model, load_tokenizer
from meshnet.swarm.local import LocalSwarm
from meshnet.wire import tracker as tt
from meshnet.wire.status import StatusCode
from route_cases import llama_cpp_greedy

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
PROMPT = "Gravity is"
TOKENS = 12


def route_of(tracker) -> tt.RouteReply:
    deadline = time.monotonic() + 30
    while True:
        reply = tracker.open_route(tt.OpenRouteRequest("smollm2", "overlap", 64))
        if reply.status.ok or time.monotonic() > deadline or "past layer" in reply.status.message:
            return reply
        time.sleep(0.2)  # a node is still registering


def test_overlapping_reference_nodes_run_from_the_effective_start(tmp_path):
    ids = load_tokenizer(GGUF)(PROMPT)["input_ids"]
    with torch.no_grad():
        expected = load_model(GGUF).generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False,
                                             eos_token_id=None)[0, len(ids):].tolist()
    with LocalSwarm(tmp_path, GGUF, [(0, 12), (10, 30)], max_sessions=4) as swarm, swarm.client() as tracker:
        reply = route_of(tracker)
        assert reply.status.ok, reply.status
        assert [(h.node.layers.start, h.layers.start, h.layers.end) for h in reply.hops] == [(0, 0, 12), (10, 12, 30)]
        assert tracker.close_route(reply.session).status.ok
        tokens = list(RouteClient(tracker, "smollm2").generate(ids, GenerationParams(max_tokens=TOKENS)))
    assert tokens == expected


def test_overlapping_gguf_nodes_chain_only_where_boundaries_meet(tmp_path):
    ids = load_tokenizer(GGUF)(PROMPT)["input_ids"]
    expected = llama_cpp_greedy(GREEDY, GGUF, ids, TOKENS)
    with LocalSwarm(tmp_path, GGUF, [(0, 12), (10, 30)], backend="gguf", worker_binary=WORKER,
                    max_sessions=4) as swarm, swarm.client() as tracker:
        refused = route_of(tracker)
        assert refused.status.code == StatusCode.UNAVAILABLE and "past layer 12" in refused.status.message
        swarm.add_node("node-2", (0, 10))
        reply = route_of(tracker)
        assert reply.status.ok, reply.status
        assert [(h.layers.start, h.layers.end) for h in reply.hops] == [(0, 10), (10, 30)]
        assert tracker.close_route(reply.session).status.ok
        tokens = list(RouteClient(tracker, "smollm2").generate(ids, GenerationParams(max_tokens=TOKENS)))
    assert tokens == expected
