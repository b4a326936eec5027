"""Issue 17: audits of live sessions on a 3-node GGUF swarm. Each hop's worker commits to what
it received and handed on; an audit (the tracker's ticket, the node's signature) fetches that,
replays the session on the whole model and blames the first hop it refutes. Honest sessions
pass; a worker that adds noise, sends garbage, forges tokens, skips a layer of its range or serves a
cheaper quantization is named as the culprit. The tolerance is the calibrated one (docs/evidence/verification/)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.identity.keys import Identity
from meshnet.identity.tls import pinned_channel
from meshnet.swarm.local import LocalSwarm
from meshnet.verify import audit
from audit_cases import gguf, q4_0, replayers, tokenizer, tolerance  # noqa: F401 (fixtures)
from route_cases import PROMPTS

TOKENS = 32
CUTS = [(0, 10), (10, 20), (20, 30)]


@pytest.fixture(scope="module")
def swarm(gguf, tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("audit"), gguf, CUTS, backend="gguf",
                    worker_binary=Path(os.environ["MESHNET_WORKER_BINARY"])) as swarm:
        yield swarm


def generate(swarm, tokenizer, prompt: str, grammar: str = ""):
    """Greedy tokens and the route (session, hops) they came from."""
    with swarm.client() as tracker:
        session = RouteClient(tracker, swarm.model)
        route = {}
        tokens = []
        for token in session.generate(tokenizer.encode(prompt), GenerationParams(max_tokens=TOKENS, grammar=grammar)):
            if not route:
                route = {"session": session._connection.route, "hops": session._connection.hops}
            tokens.append(token)
    return tokens, route


def fetch_route(swarm, route) -> list[audit.HopCommitments]:
    tracker_key = Identity.load_or_create(swarm.tracker.ticket_key)
    fetched = []
    for hop in route["hops"]:
        ticket = audit.audit_ticket(tracker_key, route["session"].session_id, route["session"].epoch,
                                    hop.node.node_id)
        with pinned_channel(hop.node.address, hop.node.tls_certificate.encode()) as channel:
            fetched.append(audit.fetch(channel, ticket, hop.node.public_key))
    return fetched


def audit_route(swarm, route, replayers, tolerance, positions=16, seed=0) -> audit.Verdict:
    fetched = fetch_route(swarm, route)
    replay = replayers[0].replay(audit.session_tokens(fetched), [h.layers for h in fetched])
    return audit.judge(fetched, replay, tolerance, positions, np.random.default_rng(seed))


def test_honest_sessions_pass_every_checked_position(swarm, tokenizer, replayers, tolerance):
    checked = 0
    for prompt in PROMPTS:
        _, route = generate(swarm, tokenizer, prompt)
        verdict = audit_route(swarm, route, replayers, tolerance, positions=1000)
        assert verdict.passed, verdict.findings
        checked += verdict.checked_positions
    assert checked >= 300


def test_a_session_sampled_under_a_grammar_passes_its_audit(swarm, tokenizer, replayers, tolerance):
    """Issue 33: greedy under a grammar takes the largest logit the grammar allows, often not the
    row's. The last hop commits that it sampled under a grammar, and the audit checks those
    tokens' logits, not their rank: the honest session passes."""
    grammar = 'root ::= "{\\"city\\": \\"" [a-z]{1,12} "\\", \\"stars\\": " [1-5] "}"'
    _, route = generate(swarm, tokenizer, PROMPTS[0], grammar)
    fetched = fetch_route(swarm, route)
    assert fetched[-1].constrained and not any(hop.constrained for hop in fetched[:-1])
    replay = replayers[0].replay(audit.session_tokens(fetched), [h.layers for h in fetched])
    verdict = audit.judge(fetched, replay, tolerance, TOKENS, np.random.default_rng(0))
    assert verdict.passed, verdict.findings
    sampled = fetched[-1].sampled.tokens
    rows = np.flatnonzero(sampled >= 0)
    off_argmax = int(np.sum(replay["logits"][rows].argmax(axis=1) != sampled[rows]))
    assert off_argmax > 0  # the grammar changed greedy's choice: a rank check would have refuted it


def test_commitments_need_the_tracker_s_ticket_for_that_node(swarm, tokenizer):
    _, route = generate(swarm, tokenizer, PROMPTS[0])
    first, second = route["hops"][0].node, route["hops"][1].node
    session = route["session"]
    forger = Identity.generate()
    tracker_key = Identity.load_or_create(swarm.tracker.ticket_key)
    with pinned_channel(first.address, first.tls_certificate.encode()) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            audit.fetch(channel, audit.audit_ticket(forger, session.session_id, session.epoch, first.node_id),
                        first.public_key)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:  # a ticket for another node
            audit.fetch(channel, audit.audit_ticket(tracker_key, session.session_id, session.epoch,
                                                    second.node_id), first.public_key)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as caught:
            audit.fetch(channel, audit.audit_ticket(tracker_key, "no-such-session", 1, first.node_id),
                        first.public_key)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        honest = audit.fetch(channel, audit.audit_ticket(tracker_key, session.session_id, session.epoch,
                                                         first.node_id), first.public_key)
        assert honest.positions > TOKENS and honest.input_tokens is not None
        with pytest.raises(audit.AuditError, match="not signed"):  # another node's key does not verify it
            audit.fetch(channel, audit.audit_ticket(tracker_key, session.session_id, session.epoch,
                                                    first.node_id), second.public_key)


@pytest.mark.parametrize("layers,cheat", [
    ((10, 20), ["--cheat", "noise:1.0"]),
    ((10, 20), ["--cheat", "garbage"]),
    ((20, 30), ["--cheat", "forge_tokens"]),
    ((10, 20), ["--cheat", "skip_layer"]),
    ((20, 30), ["--cheat", "skip_layer"]),
    ((10, 20), "q4_0"),
])
def test_a_cheating_hop_is_named_by_the_audit(swarm, tokenizer, replayers, tolerance, q4_0, layers, cheat):
    honest_id = swarm.ids[f"node-{CUTS.index(layers)}"]
    swarm.nodes[honest_id].stop()  # the cheater is the only node for its range
    extra = ["--cheat-serve-gguf", str(q4_0)] if cheat == "q4_0" else cheat
    name = f"cheat-{layers[0]}-{cheat if isinstance(cheat, str) else cheat[1].replace(':', '_')}"
    cheater = swarm.add_node(name, layers, extra_args=extra)
    try:
        _, route = generate(swarm, tokenizer, PROMPTS[1])
        assert cheater.node_id in [h.node.node_id for h in route["hops"]]
        verdict = audit_route(swarm, route, replayers, tolerance)
        assert not verdict.passed and verdict.culprit == cheater.node_id, verdict.findings
    finally:
        cheater.stop()
        swarm.nodes[honest_id].launch().wait_ready()
