"""Audits on the tracker's side: the seeded draw, tickets per hop, and what a verdict may do.
Refusals have exact statuses and leave an honest audit beside them untouched."""

from __future__ import annotations

import dataclasses
import json

import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity, verify
from meshnet.tracker.audits import MAX_EVIDENCE_CHARS, Audits
from meshnet.tracker.ledger import Ledger
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, RouteSession
from meshnet.wire.status import StatusCode

ART, REC = "sha256:" + "a" * 64, "sha256:" + "r" * 64
MODEL = CertifiedModel("smol", "llama", 30, ART, REC, matmul_activations="f32")
OTHER = CertifiedModel("other", "llama", 30, "sha256:" + "b" * 64, REC, matmul_activations="quantized")


def hop(name: str, start: int, end: int) -> tt.Hop:
    key = Identity.generate()
    info = tt.NodeInfo(key.node_id, f"{name}:1", tt.BackendKind.GGUF, "smol", "llama", Fingerprints(ART, REC), "",
                       tt.LayerRange(start, end), tt.Capacity(4, 4096, 0), 30, key.public_key, "")
    return tt.Hop(info, tt.LayerRange(start, end))


@pytest.fixture
def setup(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    registry = Registry([MODEL])
    key = Identity.generate()
    yield Audits(registry, ledger, key, rate=1.0, seed=3), registry, ledger, key
    ledger.close()


def test_the_draw_is_repeatable_for_a_seed(tmp_path):
    def drawn(seed: int) -> int:
        audits = Audits(Registry([MODEL]), Ledger(tmp_path / f"{seed}-{id(object())}.db"), Identity.generate(),
                        rate=0.05, seed=seed)
        for i in range(400):
            audits.consider(RouteSession(f"s{i}", 1), "smol", (hop("a", 0, 30),))
        return audits.sampled

    assert drawn(7) == drawn(7) and 5 <= drawn(7) <= 40
    with pytest.raises(ValueError):
        Audits(Registry([MODEL]), Ledger(tmp_path / "bad.db"), Identity.generate(), rate=1.5)


def test_a_taken_audit_carries_a_verifiable_ticket_per_hop(setup):
    audits, _, _, key = setup
    hops = (hop("a", 0, 10), hop("b", 10, 30))
    audits.consider(RouteSession("s1", 2), "smol", hops)
    job = audits.take().job
    assert job.session == RouteSession("s1", 2) and [h.node.node_id for h in job.hops] == [h.node.node_id for h in hops]
    for h, ticket in zip(job.hops, job.tickets):
        assert verify(key.public_key, ticket.signature, tickets.AUDIT_DOMAIN + ticket.body)
        assert h.ticket is None  # route tickets are not handed to the verifier
    assert audits.take().status.code == StatusCode.NOT_FOUND


def test_refused_reports_change_nothing_and_an_honest_one_beside_them_lands(setup):
    audits, registry, ledger, _ = setup
    hops = (hop("a", 0, 10), hop("b", 10, 30))
    audits.consider(RouteSession("s1", 1), "smol", hops)
    job = audits.take().job
    culprit = hops[1].node.node_id
    assert audits.report(tt.ReportAuditRequest(job.audit_id + 1, False, culprit)).status.code == StatusCode.NOT_FOUND
    outsider = Identity.generate().node_id
    assert audits.report(tt.ReportAuditRequest(job.audit_id, False, outsider)).status.code \
        == StatusCode.INVALID_ARGUMENT
    assert audits.report(tt.ReportAuditRequest(job.audit_id, False, culprit, 8, "x" * (MAX_EVIDENCE_CHARS + 1))) \
        .status.code == StatusCode.INVALID_ARGUMENT
    assert ledger.quarantined() == set() and registry.quarantined == frozenset() and ledger.audits() == []
    evidence = json.dumps({"findings": [{"node_id": culprit, "check": "output", "refuted": 3}]})
    assert audits.report(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, evidence)).status.ok
    assert ledger.quarantined() == {culprit} and registry.quarantined == frozenset({culprit})
    [record] = ledger.audits()
    assert record["culprit"] == culprit and not record["passed"] and json.loads(record["evidence"])["findings"]
    assert audits.report(tt.ReportAuditRequest(job.audit_id, True)).status.code == StatusCode.NOT_FOUND  # once


def test_a_job_names_its_models_certified_artifact_and_recipe(setup):
    audits, _, _, _ = setup
    audits.consider(RouteSession("s1", 1), "smol", (hop("a", 0, 30),))
    job = audits.take().job
    assert job.fingerprints == Fingerprints(ART, REC) and job.matmul_activations == "f32"


def test_a_verifier_takes_only_audits_of_its_artifact(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    audits = Audits(Registry([MODEL, OTHER]), ledger, Identity.generate(), rate=1.0, seed=3)
    audits.consider(RouteSession("s-smol", 1), "smol", (hop("a", 0, 30),))
    audits.consider(RouteSession("s-other", 1), "other", (hop("b", 0, 30),))
    refused = audits.take("sha256:" + "A" * 64)
    assert refused.status.code == StatusCode.INVALID_ARGUMENT and refused.job is None
    job = audits.take(OTHER.artifact_fingerprint).job  # past the older audit of another artifact
    assert job.session.session_id == "s-other" and job.fingerprints.model_artifact == OTHER.artifact_fingerprint
    none_left = audits.take(OTHER.artifact_fingerprint)
    assert none_left.status.code == StatusCode.NOT_FOUND and OTHER.artifact_fingerprint in none_left.status.message
    assert audits.take().job.session.session_id == "s-smol"  # "" takes any, and the refusal took nothing
    ledger.close()


def test_a_route_with_a_hop_off_the_cpu_is_not_audited_against_cpu_arithmetic(tmp_path):
    """ADR 0015: verifiers replay on the CPU, the one backend whose tolerance is calibrated. A
    route with a Vulkan hop is drawn but not queued (counted); a CPU route beside it is audited,
    and its job names the CPU recipe even where the entry lists Vulkan first."""
    vulkan = "sha256:" + "v" * 64
    model = CertifiedModel("smol", "llama", 30, ART, vulkan, matmul_activations="quantized", compute_backend="vulkan",
                           other_backends=[{"compute_backend": "cpu", "recipe_fingerprint": REC,
                                            "matmul_activations": "f32"}])
    ledger = Ledger(tmp_path / "ledger.db")
    audits = Audits(Registry([model]), ledger, Identity.generate(), rate=1.0, seed=3)
    on_vulkan = hop("gpu", 10, 20)
    on_vulkan = tt.Hop(dataclasses.replace(on_vulkan.node, fingerprints=Fingerprints(ART, vulkan)), on_vulkan.layers)
    audits.consider(RouteSession("s-mixed", 1), "smol", (hop("a", 0, 10), on_vulkan, hop("c", 20, 30)))
    assert (audits.sampled, audits.unaudited_backend) == (0, 1)
    assert audits.take().status.code == StatusCode.NOT_FOUND
    audits.consider(RouteSession("s-cpu", 1), "smol", (hop("a", 0, 15), hop("b", 15, 30)))
    job = audits.take().job
    assert job.session == RouteSession("s-cpu", 1) and job.fingerprints == Fingerprints(ART, REC)
    assert job.matmul_activations == "f32"
    ledger.close()
