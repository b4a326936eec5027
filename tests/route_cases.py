"""What the route tests (reference and GGUF, faults) share: the prompts, the token count, one
greedy generation through a RouteClient, single-process llama.cpp's greedy tokens, the
`tokenizer` and `tracker` fixtures (a test module that imports them defines `swarm`), and the
cancel and kill-the-middle-hop scenarios, and waiting until every hop is free."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pytest

from meshnet.certify.prompts import PARITY_PROMPTS
from meshnet.certify.route_parity import llama_cpp_greedy  # noqa: F401 - the tests' baseline
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.reference.model import load_tokenizer

PROMPTS = PARITY_PROMPTS
MORE_PROMPTS = ["Once upon a time", "The largest planet is", "1, 2, 3, 4,"]  # for 8 concurrent sessions
TOKENS = 64  # greedy tokens per parity prompt


def generate(tracker, tokenizer, prompt: str, tokens: int = TOKENS) -> list[int]:
    session = RouteClient(tracker, "smollm2")
    return list(session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=tokens)))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve())


@pytest.fixture(scope="module")
def tracker(swarm):
    with swarm.client() as client:
        yield client


def cancel_after(tracker, tokenizer, after: int = 5, max_tokens: int = 48) -> list[int]:
    """A generation the client cancels once it has `after` tokens; the tokens it got."""
    session = RouteClient(tracker, "smollm2")
    got = []
    for token in session.generate(tokenizer("Tell me a long story.")["input_ids"],
                                  GenerationParams(max_tokens=max_tokens)):
        got.append(token)
        if len(got) == after:
            session.cancel()
    return got


def generate_killing_the_middle_hop(tracker, tokenizer, prompt: str, kill: Callable[[str], None], *,
                                    tokens: int = TOKENS, after: int = 10) -> tuple[RouteClient, list[int], str]:
    """Generates `tokens` greedy tokens of `prompt`; after `after`, `kill(node id)` of the route's
    middle hop. (the session, with its failovers; the tokens; the id killed)."""
    session = RouteClient(tracker, "smollm2")
    got, killed = [], ""
    for token in session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=tokens)):
        got.append(token)
        if len(got) == after:
            killed = session._connection.hops[1].node.node_id
            kill(killed)
    return session, got, killed


def wait_all_free(swarm, timeout: float) -> tuple[float, dict]:
    """Seconds until every hop holds no session and no KV cell (or the timeout), and the busy ones."""
    started = time.monotonic()
    while True:
        busy = {name: (h.active_sessions, h.kv_cells_used) for name, h in swarm.health().items()
                if h.active_sessions or h.kv_cells_used}
        if not busy or time.monotonic() - started > timeout:
            return time.monotonic() - started, busy
        time.sleep(0.02)
