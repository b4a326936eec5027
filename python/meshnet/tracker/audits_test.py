"""Audits on the tracker's side: the seeded draw, tickets per hop, and what a verdict may do:
bound to the verifier that took it, a refutation only with the culprit's signed commitments, and
a quarantine only at the quorum of verifiers, which an operator can release (ADR 0016), where
only enrolled verifier keys count one each (issue 55, finding 9; ADR 0017).
Refusals have exact statuses and leave an honest audit beside them untouched."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity, verify
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.commitments import COMMITMENTS_DOMAIN
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.shard.v1 import shard_pb2
from meshnet.tracker.audits import (DEFAULT_QUORUM, MAX_EVIDENCE_CHARS, MAX_IN_FLIGHT_PER_VERIFIER,
                                    MAX_REFUTATION_COMMITMENTS, Audits, quorum_warning)
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.principals import Enrolment, Principals
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion, RouteSession
from meshnet.wire.status import StatusCode

ART, REC = "sha256:" + "a" * 64, "sha256:" + "r" * 64
MODEL = CertifiedModel("smol", "llama", 30, ART, REC, matmul_activations="f32")
OTHER = CertifiedModel("other", "llama", 30, "sha256:" + "b" * 64, REC, matmul_activations="quantized")


NODE_KEYS: dict[str, Identity] = {}  # node id -> key, for hops made here
VERIFIER, SECOND_VERIFIER = Identity.generate().public_key, Identity.generate().public_key
ENROLLED = Principals(["verifier"], enrolments=[Enrolment(key, "verifier") for key in (VERIFIER, SECOND_VERIFIER)])


def hop(name: str, start: int, end: int) -> tt.Hop:
    key = Identity.generate()
    NODE_KEYS[key.node_id] = key
    info = tt.NodeInfo(key.node_id, f"{name}:1", tt.BackendKind.GGUF, "smol", "llama", Fingerprints(ART, REC), "",
                       tt.LayerRange(start, end), tt.Capacity(4, 4096, 0), 30, key.public_key, "")
    return tt.Hop(info, tt.LayerRange(start, end))


def signed(h: tt.Hop, route: RouteSession, by: Identity | None = None) -> tt.SignedCommitments:
    """`h`'s commitments for `route`, signed by its node key (or by `by`: a forgery)."""
    body = shard_pb2.CommitmentsBody(node_id=h.node.node_id, session_id=route.session_id, epoch=route.epoch,
                                     layer_start=h.layers.start, layer_end=h.layers.end, k=8, count=1)
    raw = body.SerializeToString()
    return tt.SignedCommitments(raw, (by or NODE_KEYS[h.node.node_id]).sign(COMMITMENTS_DOMAIN + raw))


def refutation(job: tt.AuditJob, culprit: tt.Hop, evidence: str = "{}") -> tt.ReportAuditRequest:
    return tt.ReportAuditRequest(job.audit_id, False, culprit.node.node_id, 32, evidence, (signed(culprit, job.session),))


@pytest.fixture
def setup(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    registry = Registry([MODEL])
    key = Identity.generate()
    yield Audits(registry, ledger, key, rate=1.0, seed=3, principals=ENROLLED), registry, ledger, key
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
    route = RouteSession("s1", 1)
    audits.consider(route, "smol", hops)
    job = audits.take(verifier=VERIFIER).job
    culprit = hops[1].node.node_id
    proof = (signed(hops[1], route),)

    def code(request: tt.ReportAuditRequest, verifier: bytes = VERIFIER) -> StatusCode:
        return audits.report(request, verifier).status.code

    assert code(tt.ReportAuditRequest(job.audit_id + 1, False, culprit, commitments=proof)) == StatusCode.NOT_FOUND
    outsider = Identity.generate().node_id
    assert code(tt.ReportAuditRequest(job.audit_id, False, outsider, commitments=proof)) == StatusCode.INVALID_ARGUMENT
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 8, "x" * (MAX_EVIDENCE_CHARS + 1), proof)) \
        == StatusCode.INVALID_ARGUMENT
    # Finding 6: a verdict made up by whoever holds the verifier token.
    assert code(refutation(job, hops[1]), SECOND_VERIFIER) == StatusCode.PERMISSION_DENIED  # not its audit
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}")) == StatusCode.INVALID_ARGUMENT  # no proof
    forged = (signed(hops[1], route, by=Identity.generate()),)
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}", forged)) == StatusCode.INVALID_ARGUMENT
    elsewhere = (signed(hops[1], RouteSession("s1", 2)),)  # the node's own signature, another epoch
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}", elsewhere)) == \
        StatusCode.INVALID_ARGUMENT
    other_hop = (signed(hops[0], route),)  # signed, but not the culprit's
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}", other_hop)) == \
        StatusCode.INVALID_ARGUMENT
    padded = proof * (MAX_REFUTATION_COMMITMENTS + 1)  # a valid proof, repeated past the bound
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}", padded)) == StatusCode.INVALID_ARGUMENT
    garbage = (tt.SignedCommitments(b"\xff\xff", b"s" * 64),)
    assert code(tt.ReportAuditRequest(job.audit_id, False, culprit, 32, "{}", garbage)) == StatusCode.INVALID_ARGUMENT
    assert ledger.quarantined() == set() and registry.quarantined == frozenset() and ledger.audits() == []
    evidence = json.dumps({"findings": [{"node_id": culprit, "check": "output", "refuted": 3}]})
    assert code(refutation(job, hops[1], evidence)) == StatusCode.OK
    [record] = ledger.audits()
    assert record["culprit"] == culprit and not record["passed"] and json.loads(record["evidence"])["findings"]
    assert ledger.quarantined() == set() and registry.quarantined == frozenset()  # one verifier is not a quorum
    assert code(tt.ReportAuditRequest(job.audit_id, True)) == StatusCode.NOT_FOUND  # once


def test_a_quarantine_needs_the_quorum_and_the_operator_can_release_it(setup):
    """Two distinct enrolled verifier keys must refute the same hop: the first refutation puts
    the session back, first in line, for another verifier (never the one that refuted it); the
    second quarantines the hop and withholds its credit. A confirmation that passes is a
    dispute: recorded, nobody punished. The operator's release (the ledger) ends a quarantine."""
    audits, registry, ledger, _ = setup
    hops = (hop("a", 0, 10), hop("b", 10, 30))
    route = RouteSession("s1", 1)
    ledger.issue([(route.session_id, route.epoch, h.node.node_id) for h in hops], 100)
    ledger.record(hops[1].node.node_id, 1, [tt.WorkEntry(route, 10, 5)])
    audits.consider(route, "smol", hops)
    audits.consider(RouteSession("s2", 1), "smol", hops)
    first = audits.take(verifier=VERIFIER).job
    assert audits.report(refutation(first, hops[1]), VERIFIER).status.ok
    again = audits.take(verifier=VERIFIER).job  # it may not confirm itself: it gets the next session
    assert again.session == RouteSession("s2", 1)
    confirmation = audits.take(verifier=SECOND_VERIFIER).job
    assert confirmation.session == route and confirmation.audit_id != first.audit_id
    assert ledger.quarantined() == set() and ledger.totals()[0].decode_tokens == 5
    assert audits.report(refutation(confirmation, hops[1]), SECOND_VERIFIER).status.ok
    culprit = hops[1].node.node_id
    assert ledger.quarantined() == {culprit} and registry.quarantined == frozenset({culprit})
    assert ledger.totals() == [] and ledger.withheld_tokens(culprit) == 15
    assert [a["passed"] for a in ledger.audits()] == [False, False]

    # A dispute: s2 refuted by one verifier, passed by another.
    assert audits.report(refutation(again, hops[0]), VERIFIER).status.ok
    disputing = audits.take(verifier=SECOND_VERIFIER).job
    assert disputing.session == RouteSession("s2", 1)
    assert audits.report(tt.ReportAuditRequest(disputing.audit_id, True), SECOND_VERIFIER).status.ok
    assert audits.disputed == 1 and hops[0].node.node_id not in ledger.quarantined()
    assert audits.take(verifier=b"third").status.code == StatusCode.NOT_FOUND  # settled

    assert ledger.release(culprit) == 2  # its quarantine row and its withheld row
    registry.sync_quarantine(ledger.quarantined())
    assert registry.quarantined == frozenset() and ledger.totals()[0].decode_tokens == 5


def test_a_verifier_holds_a_bounded_number_of_audits(setup):
    """Finding 6: one verifier could take the whole audit queue and sit on it."""
    audits, _, _, _ = setup
    for i in range(MAX_IN_FLIGHT_PER_VERIFIER + 2):
        audits.consider(RouteSession(f"s{i}", 1), "smol", (hop("a", 0, 30),))
    held = [audits.take(verifier=VERIFIER).job for _ in range(MAX_IN_FLIGHT_PER_VERIFIER)]
    refused = audits.take(verifier=VERIFIER)
    assert refused.status.code == StatusCode.RESOURCE_EXHAUSTED and refused.status.retryable and refused.job is None
    assert audits.take(verifier=SECOND_VERIFIER).job is not None  # another verifier is served beside it
    assert audits.report(tt.ReportAuditRequest(held[0].audit_id, True), VERIFIER).status.ok
    assert audits.take(verifier=VERIFIER).job is not None  # one reported, one more taken


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


def test_each_hop_is_audited_on_its_own_backend_by_a_verifier_that_replays_it(tmp_path):
    """ADR 0015: a job names, per hop, the certified recipe that hop ran, and goes only to a
    verifier replaying every backend in it (each with its own calibrated tolerance). A CPU-only
    verifier (no backends named, as before) never gets a route with a Vulkan hop, and takes the
    CPU route behind it; a hop on a recipe the entry does not certify is counted, not queued."""
    vulkan = "sha256:" + "v" * 64
    model = CertifiedModel("smol", "llama", 30, ART, vulkan, matmul_activations="quantized", compute_backend="vulkan",
                           other_backends=[{"compute_backend": "cpu", "recipe_fingerprint": REC,
                                            "matmul_activations": "f32"}])
    ledger = Ledger(tmp_path / "ledger.db")
    audits = Audits(Registry([model]), ledger, Identity.generate(), rate=1.0, seed=3)

    def on(fingerprint: str, h: tt.Hop) -> tt.Hop:
        return tt.Hop(dataclasses.replace(h.node, fingerprints=Fingerprints(ART, fingerprint)), h.layers)

    audits.consider(RouteSession("s-mixed", 1), "smol", (hop("a", 0, 10), on(vulkan, hop("gpu", 10, 20)),
                                                          hop("c", 20, 30)))
    audits.consider(RouteSession("s-cpu", 1), "smol", (hop("a", 0, 15), hop("b", 15, 30)))
    audits.consider(RouteSession("s-odd", 1), "smol", (on("sha256:" + "x" * 64, hop("x", 0, 30)),))
    assert (audits.sampled, audits.unaudited_backend) == (2, 1)

    job = audits.take(verifier=VERIFIER).job  # the CPU alone: past the mixed route
    assert job.session == RouteSession("s-cpu", 1) and job.fingerprints == Fingerprints(ART, REC)
    assert job.matmul_activations == "f32" and job.hop_recipes == (tt.HopRecipe("cpu", REC, "f32"),) * 2
    none_left = audits.take(verifier=SECOND_VERIFIER, compute_backends=("cpu",))
    assert none_left.status.code == StatusCode.NOT_FOUND and "on cpu" in none_left.status.message

    job = audits.take(verifier=SECOND_VERIFIER, compute_backends=("vulkan", "cpu")).job
    assert job.session == RouteSession("s-mixed", 1)
    assert job.hop_recipes == (tt.HopRecipe("cpu", REC, "f32"), tt.HopRecipe("vulkan", vulkan, "quantized"),
                               tt.HopRecipe("cpu", REC, "f32"))
    assert job.fingerprints == Fingerprints(ART, REC)  # the first hop's recipe, as before hop_recipes
    ledger.close()


@pytest.mark.parametrize("backends", [("cpu",) * 9, ("Vulkan",), ("x" * 33,), ("",)])
def test_a_take_naming_bad_backends_is_refused_and_takes_nothing(setup, backends):
    audits, _, _, _ = setup
    audits.consider(RouteSession("s1", 1), "smol", (hop("a", 0, 30),))
    refused = audits.take(verifier=VERIFIER, compute_backends=backends)
    assert refused.status.code == StatusCode.INVALID_ARGUMENT and refused.job is None
    assert audits.take(verifier=VERIFIER, compute_backends=("cpu",)).job.session.session_id == "s1"


def test_a_confirmation_is_never_pushed_out_of_the_bounded_queue(setup, monkeypatch):
    """A refutation waits at the front for its quorum; fresh draws past MAX_PENDING push out the
    oldest other audit (ADR 0016), or a cheat could never be confirmed while, say, audits of a
    backend no verifier replays fill the queue."""
    audits, _, _, _ = setup
    monkeypatch.setattr("meshnet.tracker.audits.MAX_PENDING", 3)
    cheat = hop("cheat", 0, 30)
    audits.consider(RouteSession("s-cheat", 1), "smol", (cheat,))
    job = audits.take(verifier=VERIFIER).job
    assert audits.report(refutation(job, cheat), VERIFIER).status.ok  # one of two: a confirmation queued
    for i in range(5):
        audits.consider(RouteSession(f"s{i}", 1), "smol", (hop("a", 0, 30),))
    confirmation = audits.take(verifier=SECOND_VERIFIER).job
    assert confirmation is not None and confirmation.session.session_id == "s-cheat"


@contextlib.contextmanager
def tracker(tmp_path, enrolled_roles=(), enrolled_verifiers=()):
    """A tracker on loopback assembled as tracker/main.py does (the registry's on_close feeding
    the audits, principals from the ledger's enrolments gating calls and counting verifiers,
    the default quorum), every closed route audited; (address, role tokens, ledger, audits)."""
    ledger = Ledger(tmp_path / "ledger.db")
    for key in enrolled_verifiers:  # the operator's `principals enroll verifier KEY`
        ledger.enroll(Enrolment(key.public_key, "verifier"))
    principals = Principals(enrolled_roles, enrolments=ledger.enrolments())
    ticket_key, tokens, audits = Identity.generate(), new_role_tokens(), []
    registry = Registry([MODEL], lease_seconds=30, on_close=lambda *closed: audits[0].consider(*closed),
                        route_quota=principals.route_quota)
    audits.append(Audits(registry, ledger, ticket_key, rate=1.0, seed=3, principals=principals))
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, ticket_key, audits=audits[0], principals=principals)
    try:
        yield f"127.0.0.1:{port}", tokens, ledger, audits[0]
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def refuted_on_the_wire(address: str, tokens: dict, verifiers: tuple[Identity, ...]) -> str:
    """A node serves one route its client closes (queued for audit); each of `verifiers` in turn
    takes that session (the audit, then the confirmation) and refutes the node with its own
    signed commitments, which anyone taking the audit can fetch from it. The node's id."""
    key = Identity.generate()
    NODE_KEYS[key.node_id] = key
    info = tt.NodeInfo(key.node_id, "127.0.0.1:9", tt.BackendKind.GGUF, "smol", "llama", Fingerprints(ART, REC), "",
                       tt.LayerRange(0, 30), tt.Capacity(4, 4096, 0), 30, key.public_key, "")
    with TrackerClient(address, tokens["node"], key) as node, \
            TrackerClient(address, tokens["client"], Identity.generate()) as client:
        assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
        route = client.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
        assert client.close_route(route.session).status.ok
    for verifier_key in verifiers:
        with TrackerClient(address, tokens["verifier"], verifier_key) as verifier:
            job = verifier.take_audit().job
            assert job.session == route.session and [h.node.node_id for h in job.hops] == [key.node_id]
            assert verifier.report_audit(refutation(job, job.hops[0])).status.ok
    return key.node_id


def test_two_minted_verifier_keys_do_not_quarantine_an_honest_node(tmp_path):
    """Issue 55, finding 9: on a tracker with the defaults (no --enrolled-roles, --audit-quorum 2),
    one holder of the verifier token minted two keys and refuted an honest node with its own
    signed commitments; it was quarantined. Now both refutations are recorded and nobody is
    punished; the session is not queued again, and the node is still routed."""
    assert DEFAULT_QUORUM == 2
    with tracker(tmp_path) as (address, tokens, ledger, audits):
        honest = refuted_on_the_wire(address, tokens, (Identity.generate(), Identity.generate()))
        with TrackerClient(address, tokens["client"], Identity.generate()) as client:
            assert client.coverage("smol").quarantined_node_ids == ()
            again = client.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert again.status.ok and [h.node.node_id for h in again.hops] == [honest]
        assert ledger.quarantined() == set() and ledger.withheld_tokens(honest) == 0
        assert [(a["passed"], a["culprit"]) for a in ledger.audits()] == [(False, honest)] * 2
        assert (audits.uncounted, audits.disputed) == (1, 0)
        with TrackerClient(address, tokens["verifier"], Identity.generate()) as third:
            assert third.take_audit().status.code == StatusCode.NOT_FOUND  # not queued for a third minted key


def test_two_enrolled_verifiers_still_quarantine_a_cheat(tmp_path):
    """With the verifiers enrolled (ADR 0017), the same two refutations quarantine the node."""
    verifiers = (Identity.generate(), Identity.generate())
    with tracker(tmp_path, ["verifier"], verifiers) as (address, tokens, ledger, audits):
        cheat = refuted_on_the_wire(address, tokens, verifiers)
        with TrackerClient(address, tokens["client"], Identity.generate()) as client:
            assert client.coverage("smol").quarantined_node_ids == (cheat,)
        assert ledger.quarantined() == {cheat} and audits.uncounted == 0


def test_only_enrolled_verifier_keys_count_toward_the_quorum(tmp_path):
    """The verifier role not enrolled, one key enrolled: the enrolled key and a minted one do not
    make two (an enrolled verifier cannot mint its way to a quorum either); a second enrolled key
    does. A key revoked before the confirmation no longer counts."""
    ledger = Ledger(tmp_path / "ledger.db")
    principals = Principals(enrolments=[Enrolment(VERIFIER, "verifier")])
    registry = Registry([MODEL])
    audits = Audits(registry, ledger, Identity.generate(), rate=1.0, seed=3, principals=principals)
    cheat = hop("cheat", 0, 30)
    for session in ("s1", "s2"):
        audits.consider(RouteSession(session, 1), "smol", (cheat,))
    minted = Identity.generate().public_key
    for key in (VERIFIER, minted):
        job = audits.take(verifier=key).job
        assert job.session == RouteSession("s1", 1) and audits.report(refutation(job, cheat), key).status.ok
    assert registry.quarantined == frozenset() and audits.uncounted == 1
    first = audits.take(verifier=VERIFIER).job  # s2: refuted, then VERIFIER revoked before the confirmation
    assert first.session == RouteSession("s2", 1) and audits.report(refutation(first, cheat), VERIFIER).status.ok
    principals.sync([Enrolment(SECOND_VERIFIER, "verifier")])
    confirmation = audits.take(verifier=SECOND_VERIFIER).job
    assert audits.report(refutation(confirmation, cheat), SECOND_VERIFIER).status.ok
    assert registry.quarantined == frozenset() and audits.uncounted == 2
    principals.sync([Enrolment(VERIFIER, "verifier"), Enrolment(SECOND_VERIFIER, "verifier")])
    audits.consider(RouteSession("s3", 1), "smol", (cheat,))
    for key in (VERIFIER, SECOND_VERIFIER):
        job = audits.take(verifier=key).job
        assert job.session == RouteSession("s3", 1) and audits.report(refutation(job, cheat), key).status.ok
    assert registry.quarantined == frozenset({cheat.node.node_id})
    ledger.close()


@pytest.mark.parametrize("rate, quorum, roles, enrolled, says", [
    (0.05, 2, (), 0, "fewer than --audit-quorum 2"),  # the defaults
    (0.05, 1, (), 0, "can quarantine a hop alone"),
    (0.05, 2, (), 2, "only the 2 enrolled keys count"),
    (0.05, 2, ("verifier",), 2, ""),
    (0.0, 2, (), 0, ""),  # no audits
])
def test_the_tracker_warns_at_start_when_unenrolled_verifiers_matter(rate, quorum, roles, enrolled, says):
    principals = Principals(roles, enrolments=[Enrolment(Identity.generate().public_key, "verifier")
                                               for _ in range(enrolled)])
    warning = quorum_warning(rate, quorum, principals)
    assert (says in warning) if says else warning == ""
