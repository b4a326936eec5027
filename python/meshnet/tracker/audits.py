"""Which closed route sessions are audited, and the queue the verifier role takes them from
(docs/adr/0008-verified-outputs.md).

`consider` is the registry's on_close hook: a closed route session is audited with probability
`rate`, drawn from a generator seeded with `seed` (so a run is repeatable). Pending audits wait
in a bounded queue (past MAX_PENDING the oldest is dropped, and logged). `take` hands the oldest
to a verifier with an audit ticket per hop (valid `ticket_seconds`, signed with the ticket key)
and the model's certified artifact and recipe (what the verifier must replay under), and keeps
it in flight; one not reported within `report_seconds` goes back to the queue. `report`
records the verdict in the ledger; a failed one quarantines the culprit in the registry (never
routed again) and withholds its credit for the audited session (ledger), in one transaction.
Each backend is judged by its own arithmetic (ADR 0015): a job names, per hop, the certified
recipe that hop ran (its compute backend), and goes only to a verifier that replays every one of
those backends (`take`'s `compute_backends`, each with the tolerance calibrated on it; none
given means the CPU alone, as verifiers before this did). A route with a hop whose recipe the
entry does not certify is counted in `unaudited_backend` and not queued.
Evidence before punishment (issue 35, finding 6; ADR 0016): an audit is bound to the verifier
key that took it (another's report: PERMISSION_DENIED), a verifier holds at most
MAX_IN_FLIGHT_PER_VERIFIER at once, and a refutation must carry the culprit's commitments as the
culprit signed them, for the audited (session, epoch) (INVALID_ARGUMENT otherwise). A refutation
is recorded, but the culprit is quarantined and its credit withheld only when `quorum` verifiers
(counted as below) refute the same hop: until then the session goes back to the front of the queue as
a confirmation that no verifier which already refuted it may take. A confirmation that passes,
or blames another hop, is recorded and counted as `disputed`; nobody is punished.
Who counts toward the quorum (issue 55, finding 9; ADR 0017): keys cost nothing to make, so each
key the operator enrolled as a verifier (`principals`) counts one; all other keys together count
one, and only while no enrolled key agrees. Before this, two freshly minted keys refuting an
honest node with its own signed commitments (anyone taking the audit can fetch them) met the
default quorum of 2 and quarantined it. A tracker whose verifiers are not enrolled (the default)
still serves them and records their verdicts, but above a quorum of 1 it quarantines nobody on
them, and says so at start (`quorum_warning`). Chosen over enrolling the verifier role by default
when audits run: no opt-out flag to reopen the hole, and unenrolled verifiers keep finding and
recording refutations for the operator to read. A confirmation that agrees but adds no verifier
that counts ends the round (`uncounted`), so refutations that can never reach the quorum do not
stay queued.
Thread-safe (one lock).
"""

from __future__ import annotations

import dataclasses
import random
import re
import secrets
import threading
import time
from collections import deque
from typing import Callable, Optional

from meshnet.identity import tickets
from meshnet.identity.keys import Identity, verify
from meshnet.process import log
from meshnet.protocol import commitments
from meshnet.protocol.errors import ProtocolError
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.principals import Principals
from meshnet.tracker.registry import Registry
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, RouteSession
from meshnet.wire.status import Status, StatusCode

MAX_PENDING = 1024
MAX_IN_FLIGHT_PER_VERIFIER = 2  # audits one verifier key holds untaken by others
DEFAULT_QUORUM = 2  # distinct verifier keys whose refutations of one hop quarantine it
MAX_EVIDENCE_CHARS = 64 * 1024
MAX_REFUTATION_COMMITMENTS = 2  # the culprit's, and its upstream hop's when its input was refuted
MAX_VERIFIER_BACKENDS = 8  # compute backends one verifier may say it replays
BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
DEFAULT_RATE = 0.05
ARTIFACT = re.compile(r"sha256:[0-9a-f]{64}")


@dataclasses.dataclass
class _Job:
    audit_id: int
    route: RouteSession
    model: str
    hops: tuple[tt.Hop, ...]
    backends: tuple[str, ...]  # per hop: the compute backend of the certified recipe it ran
    taken_at: float = 0.0
    verifier: bytes = b""  # the key that took it (in flight)
    refuted_by: tuple[bytes, ...] = ()  # verifier keys whose refutations of `culprit` this one would confirm
    culprit: str = ""


class Audits:
    def __init__(self, registry: Registry, ledger: Ledger, ticket_key: Identity, *, rate: float = DEFAULT_RATE,
                 seed: Optional[int] = None, ticket_seconds: float = 600.0, report_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, quorum: int = DEFAULT_QUORUM,
                 principals: Optional[Principals] = None) -> None:
        """`principals`: whose verifier keys are enrolled (None: nobody's; see the module's docstring)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"audit rate must be in [0, 1], got {rate}")
        if quorum < 1:
            raise ValueError(f"the quarantine quorum must be at least 1, got {quorum}")
        self.quorum = quorum
        self._principals = principals or Principals()
        self._registry, self._ledger, self._key = registry, ledger, ticket_key
        self.rate = rate
        self._random = random.Random(seed)
        self._ticket_seconds, self._report_seconds, self._clock = ticket_seconds, report_seconds, clock
        self._lock = threading.Lock()
        self._pending: deque[_Job] = deque()
        self._in_flight: dict[int, _Job] = {}
        self.considered = 0  # closed route sessions seen
        self.sampled = 0  # of those, queued for audit
        self.unaudited_backend = 0  # drawn, but with a hop on a recipe the entry does not certify (ADR 0015)
        self.disputed = 0  # refutations that a confirming verifier did not repeat
        self.uncounted = 0  # confirmations that agreed but added no verifier the quorum counts

    def consider(self, route: RouteSession, model: str, hops: tuple[tt.Hop, ...]) -> None:
        with self._lock:
            self.considered += 1
            if self._random.random() >= self.rate:
                return
            certified = self._registry.certified(model)
            recipes = certified.recipes() if certified else {}
            backends = tuple(recipes.get(h.node.fingerprints.runtime_recipe) if h.node.fingerprints else None
                             for h in hops)
            if not hops or None in backends:
                self.unaudited_backend += 1
                return
            self.sampled += 1
            bare = tuple(dataclasses.replace(h, ticket=None) for h in hops)
            self._pending.append(_Job(secrets.randbits(62) + 1, route, model, bare, backends))
            if len(self._pending) > MAX_PENDING:
                # the oldest that is not a confirmation: a refutation waiting for its quorum is
                # never pushed out by fresh draws (say, of a backend no verifier replays)
                dropped = next((j for j in self._pending if not j.refuted_by), self._pending[0])
                self._pending.remove(dropped)
                log("audit_dropped", audit_id=dropped.audit_id, session=dropped.route.session_id,
                    reason=f"more than {MAX_PENDING} audits pending")

    def take(self, model_artifact: str = "", verifier: bytes = b"",
             compute_backends: tuple[str, ...] = ()) -> tt.TakeAuditReply:
        """The oldest pending audit for `verifier` (its key), of a model certified from
        `model_artifact` when it is given (a verifier can replay one artifact only), whose every
        hop ran one of `compute_backends` (() = the CPU alone)."""
        if model_artifact and not ARTIFACT.fullmatch(model_artifact):
            return tt.TakeAuditReply(Status(StatusCode.INVALID_ARGUMENT,
                                            "model_artifact must be \"sha256:\" and 64 lowercase hex digits"))
        if len(compute_backends) > MAX_VERIFIER_BACKENDS or not all(map(BACKEND_NAME.fullmatch, compute_backends)):
            return tt.TakeAuditReply(Status(StatusCode.INVALID_ARGUMENT, f"compute_backends: at most "
                                            f"{MAX_VERIFIER_BACKENDS} names like \"cpu\" or \"vulkan\""))
        replays = set(compute_backends or ("cpu",))
        with self._lock:
            now = self._clock()
            for audit_id, job in list(self._in_flight.items()):  # a verifier that never reported
                if now - job.taken_at > self._report_seconds:
                    del self._in_flight[audit_id]
                    job.verifier = b""
                    self._pending.appendleft(job)
            if sum(j.verifier == verifier for j in self._in_flight.values()) >= MAX_IN_FLIGHT_PER_VERIFIER:
                return tt.TakeAuditReply(Status(StatusCode.RESOURCE_EXHAUSTED, f"this verifier holds "
                                                f"{MAX_IN_FLIGHT_PER_VERIFIER} audits already: report them first",
                                                retryable=True))
            job = next((j for j in self._pending if verifier not in j.refuted_by and set(j.backends) <= replays
                        and (not model_artifact or self._artifact(j.model) == model_artifact)), None)
            if job is None:
                return tt.TakeAuditReply(Status(StatusCode.NOT_FOUND, "no audit pending" + (
                    f" of a model certified from {model_artifact}" if model_artifact else "")
                    + f" on {', '.join(sorted(replays))} that this verifier may take"))
            self._pending.remove(job)
            job.taken_at, job.verifier = now, verifier
            self._in_flight[job.audit_id] = job
        route = job.route
        issued = tuple(tickets.issue_audit(self._key, route.session_id, route.epoch, h.node.node_id,
                                           self._ticket_seconds) for h in job.hops)
        certified = self._registry.certified(job.model)
        hop_recipes = tuple(certified.hop_recipe(h.node.fingerprints.runtime_recipe) for h in job.hops) if certified else ()
        # the first hop's recipe (every hop's, for a route on one backend), as before hop_recipes
        first = hop_recipes[0] if hop_recipes else tt.HopRecipe("", "", "")
        fingerprints = certified and Fingerprints(certified.artifact_fingerprint, first.recipe_fingerprint)
        return tt.TakeAuditReply(Status(StatusCode.OK), tt.AuditJob(
            job.audit_id, route, job.model, job.hops, issued, fingerprints, first.matmul_activations, hop_recipes))

    def _artifact(self, model: str) -> str:
        certified = self._registry.certified(model)
        return certified.artifact_fingerprint if certified else ""

    def report(self, request: tt.ReportAuditRequest, verifier: bytes = b"") -> tt.ReportAuditReply:
        """Records `verifier`'s verdict on an audit it holds; a refutation with its proof, and
        the culprit punished only at the quorum (see the module's docstring)."""
        if len(request.evidence) > MAX_EVIDENCE_CHARS:
            return tt.ReportAuditReply(Status(StatusCode.INVALID_ARGUMENT,
                                              f"evidence exceeds {MAX_EVIDENCE_CHARS} characters"))
        if len(request.commitments) > MAX_REFUTATION_COMMITMENTS:  # checked before any signature is
            return tt.ReportAuditReply(Status(StatusCode.INVALID_ARGUMENT, f"a refutation carries at most "
                                              f"{MAX_REFUTATION_COMMITMENTS} signed commitments"))
        with self._lock:
            job = self._in_flight.get(request.audit_id)
            if job is None:
                return tt.ReportAuditReply(Status(StatusCode.NOT_FOUND, f"audit {request.audit_id} is not in flight"))
            if job.verifier != verifier:
                return tt.ReportAuditReply(Status(StatusCode.PERMISSION_DENIED,
                                                  f"audit {request.audit_id} was taken by another verifier"))
            if not request.passed:
                problem = _unproven(job, request)
                if problem:
                    return tt.ReportAuditReply(Status(StatusCode.INVALID_ARGUMENT, problem))
            del self._in_flight[request.audit_id]
            culprit = "" if request.passed else request.culprit_node_id
            confirming = bool(job.refuted_by)
            agreed = job.refuted_by + (verifier,) if culprit and (not confirming or culprit == job.culprit) else ()
            counted = self._counted(agreed)
            punish = counted >= self.quorum
            if agreed and not punish and counted > self._counted(job.refuted_by):
                # Not yet the quorum: the session again, first in line, for another verifier.
                self._pending.appendleft(_Job(secrets.randbits(62) + 1, job.route, job.model, job.hops, job.backends,
                                              refuted_by=agreed, culprit=culprit))
            elif agreed and not punish:
                self.uncounted += 1
            elif confirming and not punish:
                self.disputed += 1
        self._ledger.record_audit(job.audit_id, job.route.session_id, job.route.epoch, job.model, request.passed,
                                  culprit, request.checked_positions, request.evidence, enforce=punish)
        if punish:
            self._registry.quarantine(culprit)
        log("audit", audit_id=job.audit_id, session=job.route.session_id, epoch=job.route.epoch,
            passed=request.passed, culprit=culprit, checked=request.checked_positions,
            verifier=verifier.hex()[:16], refutations=len(set(agreed)), counted=counted, quarantined=punish,
            disputed=confirming and not agreed)
        return tt.ReportAuditReply(Status(StatusCode.OK))

    def _counted(self, keys: tuple[bytes, ...]) -> int:
        """The verifiers `keys` make toward the quorum: one per key enrolled as a verifier now
        (a key revoked since its refutation no longer counts), else one for all of them."""
        enrolled = {key for key in keys if self._principals.enrolled_as("verifier", key)}
        return len(enrolled) or (1 if keys else 0)


def quorum_warning(rate: float, quorum: int, principals: Principals) -> str:
    """What the operator should hear at start about who can quarantine ('' when nothing):
    tracker/main.py logs it."""
    if rate <= 0 or "verifier" in principals.enrolled_roles:
        return ""
    if quorum == 1:
        return ("--audit-quorum 1 and the verifier role is not enrolled: any holder of the verifier token can "
                "quarantine a hop alone; run with --enrolled-roles verifier and enroll your verifiers' keys")
    enrolled = sum(e.role == "verifier" for e in principals.enrolled())
    enroll = ("enroll your verifiers (python -m meshnet.tracker.ledger.principals enroll verifier KEY) and run "
              "with --enrolled-roles verifier")
    if enrolled < quorum:
        return (f"audits run with {enrolled} verifier keys enrolled, fewer than --audit-quorum {quorum}: unenrolled "
                f"verifier keys count as one verifier in all, so their refutations are recorded and quarantine "
                f"nobody; {enroll}")
    return (f"the verifier role is not enrolled: any key with the verifier token takes audits and may dispute a "
            f"refutation, though only the {enrolled} enrolled keys count toward --audit-quorum {quorum}; {enroll}")


def _unproven(job: _Job, request: tt.ReportAuditRequest) -> str:
    """Why a refutation's proof does not hold ('' when it does): its culprit must be a hop of the
    route, and every commitments it carries, the culprit's among them, must be signed by the hop
    it names, with the route's key for that hop, for the audited (session, epoch)."""
    keys = {h.node.node_id: h.node.public_key for h in job.hops}
    if request.culprit_node_id not in keys:
        return f"culprit {request.culprit_node_id!r} is not a hop of the audited route"
    signed_by = set()
    for signed in request.commitments:
        try:
            session_id, epoch, node_id = commitments.subject(signed.body)
        except ProtocolError as err:
            return err.status.message
        if (session_id, epoch) != (job.route.session_id, job.route.epoch) or node_id not in keys:
            return f"commitments of {node_id!r} for {session_id}@{epoch} are not of a hop of the audited session"
        if not verify(keys[node_id], signed.signature, commitments.COMMITMENTS_DOMAIN + signed.body):
            return f"the commitments named {node_id!r} are not signed by that hop's key"
        signed_by.add(node_id)
    if request.culprit_node_id not in signed_by:
        return "a refutation carries the culprit's signed commitments (ReportAuditRequest.commitments)"
    return ""
