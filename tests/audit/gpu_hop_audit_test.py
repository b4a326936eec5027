"""Issue 30: audits of GPU hops, each backend judged by its own arithmetic (ADR 0015), on Mesa's
software Vulkan (lavapipe) in CI.

A mixed route, CPU -> Vulkan -> CPU (the entry certifies each backend and their mix), every closed
session queued for audit (rate 1.0):

- A verifier that replays only the CPU is never handed the session (NOT_FOUND, naming what it
  replays); one that also replays Vulkan takes it, replays the middle range on vulkan0
  (//cpp/engine:dump_boundaries_vulkan) and the others on the CPU, judges each hop at the
  loosest calibrated tolerance of the backends its boundary went through (the CPU's calibration
  and lavapipe's, docs/evidence/gpu/calibration-lavapipe/), and passes the honest session at
  every checked position.
- A cheating Vulkan hop (noise of 100% of each row's RMS on its output) is refuted and named,
  the CPU hop before it is not.

Lavapipe runs the shaders on the CPU, slowly: the generations are short."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.identity.keys import Identity
from meshnet.swarm.local import LocalSwarm
from meshnet.verify import audit, commitment, verifier
from meshnet.wire.status import StatusCode
from audit_cases import gguf, tokenizer  # noqa: F401 (fixtures)

CUTS = [(0, 10), (10, 20), (20, 30)]
DEVICES = ["cpu", "vulkan0", "cpu"]
TOKENS = 8
PROMPT = "The capital of France is"
VERIFIER = Identity.generate()  # an audit is reported by the key that took it (ADR 0016)


@pytest.fixture(scope="module")
def tolerances():
    return {"cpu": commitment.tolerance_from_calibration(os.environ["MESHNET_CALIBRATION"]),
            "vulkan": commitment.tolerance_from_calibration(os.environ["MESHNET_VULKAN_CALIBRATION"], "vulkan")}


@pytest.fixture(scope="module")
def replayers(gguf):
    binary = Path(os.environ["MESHNET_VULKAN_DUMP_BOUNDARIES"])
    devices = {"cpu": "cpu", "vulkan": "vulkan0"}
    return (audit.Replayer(binary, gguf, threads=2, devices=devices),
            audit.Replayer(binary, gguf, threads=1, devices=devices))


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, gguf):
    with LocalSwarm(tmp_path_factory.mktemp("gpu-audit"), gguf, CUTS, backend="gguf",
                    worker_binary=Path(os.environ["MESHNET_VULKAN_WORKER_BINARY"]), max_sessions=4, threads=1,
                    device=DEVICES, audit_rate=1.0) as s:
        yield s


def one_session(swarm, tokenizer) -> list[str]:
    """A greedy generation the client then closes (queued for audit); the route's node ids."""
    with swarm.client() as tracker:
        session = RouteClient(tracker, swarm.model)
        hops = []
        for _ in session.generate(tokenizer.encode(PROMPT), GenerationParams(max_tokens=TOKENS)):
            hops = hops or [h.node.node_id for h in session._connection.hops]
    return hops


def take(swarm, backends: tuple[str, ...], key: Identity = VERIFIER):
    with swarm.tracker.client("verifier", key) as tracker:
        return tracker.take_audit("", backends)


def test_an_honest_mixed_route_is_audited_by_a_verifier_replaying_both_backends(swarm, tokenizer, replayers,
                                                                                tolerances):
    hops = one_session(swarm, tokenizer)
    assert len(hops) == 3
    cpu_only = take(swarm, ("cpu",), Identity.generate())
    assert cpu_only.status.code == StatusCode.NOT_FOUND and "on cpu" in cpu_only.status.message
    job = take(swarm, ("cpu", "vulkan")).job
    assert [h.node.node_id for h in job.hops] == hops
    assert [r.compute_backend for r in job.hop_recipes] == ["cpu", "vulkan", "cpu"]
    outcome = verifier.run_audit(job, replayers, tolerances, positions=16, seed=job.audit_id)
    assert outcome.passed, outcome.evidence
    positions = json.loads(outcome.evidence)["tokens"]
    # both boundaries at min(16, positions) positions each, and some of the last hop's tokens
    assert outcome.checked_positions > 2 * min(16, positions)
    with swarm.tracker.client("verifier", VERIFIER) as tracker:
        assert tracker.report_audit(outcome).status.ok


def test_a_cheating_vulkan_hop_is_named(swarm, tokenizer, replayers, tolerances):
    honest = next(node for node in swarm.nodes.values() if node.name == "node-1")
    honest.stop()  # the cheater alone serves the middle range
    cheater = swarm.add_node("cheat-vulkan", CUTS[1], extra_args=["--cheat", "noise:1.0"], device="vulkan0")
    try:
        hops = one_session(swarm, tokenizer)
        assert cheater.node_id in hops and honest.node_id not in hops
        job = take(swarm, ("cpu", "vulkan")).job
        outcome = verifier.run_audit(job, replayers, tolerances, positions=16, seed=job.audit_id)
        assert not outcome.passed and outcome.culprit_node_id == cheater.node_id, outcome.evidence
        refuted = {finding["node_id"] for finding in json.loads(outcome.evidence)["findings"]}
        assert cheater.node_id in refuted and hops[0] not in refuted  # the CPU hop before it is honest
    finally:
        cheater.stop()
