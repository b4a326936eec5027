"""Audits of live sessions (docs/adr/0008-verified-outputs.md): fetch what each hop of a route
committed to, replay the session, and name the first hop whose commitments the replay refutes.

`audit_ticket` is the tracker's permission to read one hop's commitments (Ed25519 by the ticket
key over "meshnet-audit-v1\\0" || AuditBody). `fetch` reads a hop's commitments over its pinned
TLS channel and checks the node's signature against its registered key before anything in them
is used. `Replayer` recomputes a session as a trusted verifier node would: the certified model
(whole, or its per-range parts), the route's ranges one process each, one teacher-forced prefill
(//cpp/engine:dump_boundaries), each range on its hop's compute backend under the recipe the
audit job names for it (refusing a job of another artifact or recipe, or on a backend it does not
replay). `judge`
compares, at `positions` random positions per hop, each hop's output with the replay and each
hop's input with what its upstream committed to sending, and at `positions` random positions
the last hop sampled from, its tokens with the replay's logits, and blames the first hop (in route
order) that is refuted: downstream hops of a cheat are refuted too, as a consequence.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from meshnet.identity import tickets
from meshnet.identity.keys import Identity, verify
from meshnet.memory_cap import CappedRunner
from meshnet.protocol import commitments, seam
from meshnet.protocol.commitments import COMMITMENTS_DOMAIN
from meshnet.protocol.shard_client import ShardClient
from meshnet.recipe.certify import recipe_of
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.model_files import open_model_files
from meshnet.verify import boundaries
from meshnet.verify import commitment as cm
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt

MAX_POSITIONS = 4096  # the worker's kMaxAuditPositions


class AuditError(Exception):
    """The audit could not be carried out (a hop did not answer, or answered unsigned)."""


def audit_ticket(tracker: Identity, session_id: str, epoch: int, node_id: str,
                 seconds: float = 600.0) -> t.AuditTicket:
    """What the tracker hands a verifier per hop (tests sign their own with the tracker's key)."""
    return tickets.issue_audit(tracker, session_id, epoch, node_id, seconds)


@dataclasses.dataclass(frozen=True)
class HopCommitments:
    node_id: str
    layers: tuple[int, int]
    positions: int
    input_tokens: Optional[np.ndarray]  # first hop
    received: Optional[cm.HiddenCommitment]  # other hops
    sent: Optional[cm.HiddenCommitment]  # non-last hops
    sampled: Optional[cm.TokenCommitment]  # last hop (token -1: none sampled there)
    temperature: float
    constrained: bool  # last hop: sampled under a grammar (a greedy token's rank is then not checked)
    signed: tt.SignedCommitments  # as the node signed them: a refutation's proof for the tracker

    @property
    def signed_bytes(self) -> int:
        """The signed body's size: what the commitments cost on the wire."""
        return len(self.signed.body)


def _hidden(body: t.CommitmentsBody, indices: bytes, values: bytes) -> Optional[cm.HiddenCommitment]:
    if not indices:
        return None
    return cm.HiddenCommitment(np.frombuffer(indices, dtype="<u2").reshape(body.count, body.k),
                               np.frombuffer(values, dtype="<f2").reshape(body.count, body.k))


def fetch(channel, ticket: t.AuditTicket, node_public_key: bytes, start: int = 0,
          count: int = MAX_POSITIONS, timeout: float = 10.0) -> HopCommitments:
    """The hop's commitments for the ticket's session; AuditError unless signed by the node
    (ProtocolError for a signed body or a ticket body that does not parse)."""
    signed = ShardClient(channel).commitments(ticket, start, count, timeout)
    if not verify(node_public_key, signed.signature, COMMITMENTS_DOMAIN + signed.body):
        raise AuditError("the hop's commitments are not signed by its registered key")
    body = commitments.decode_body(signed.body)
    expected = seam.decode_audit_body(ticket.body)
    if (body.session_id, body.epoch, body.node_id) != (expected.session_id, expected.epoch, expected.node_id):
        raise AuditError(f"the hop answered for {body.session_id}@{body.epoch} on {body.node_id}, not the audit's")
    sampled = None
    if body.sampled_tokens:
        sampled = cm.TokenCommitment(np.frombuffer(body.sampled_tokens, dtype="<i4").copy(),
                                     np.frombuffer(body.sampled_logits, dtype="<f2").copy())
    return HopCommitments(body.node_id, (body.layer_start, body.layer_end), body.count,
                          np.frombuffer(body.input_tokens, dtype="<i4").copy() if body.input_tokens else None,
                          _hidden(body, body.input_indices, body.input_values),
                          _hidden(body, body.output_indices, body.output_values), sampled, body.temperature,
                          body.constrained, signed)


class WrongRecipe(AuditError):
    """The audit job names an artifact or recipe this verifier cannot replay under."""


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    """How each range of an audited route is replayed: on its hop's compute backend, under that
    backend's certified recipe (ADR 0015)."""

    backends: tuple[str, ...]  # per range: "cpu", "vulkan", ...
    devices: tuple[str, ...]  # per range: the verifier's device for that backend
    matmul_activations: tuple[str, ...]  # per range (ADR 0012)

    @classmethod
    def on_cpu(cls, ranges: int, matmul_activations: str = "quantized") -> "ReplayPlan":
        return cls(("cpu",) * ranges, ("cpu",) * ranges, (matmul_activations,) * ranges)

    @property
    def stepwise(self) -> bool:
        """Whether the replay must compute as the session did (the prompt in one prefill, then a
        position per step) rather than in one prefill: on a GPU backend a prefill of more than 8
        rows takes other kernels than decode steps (ADR 0014), so one prefill would differ from
        what an honest hop computed; the CPU's reference kernels compute a row alike in any batch."""
        return any(b != "cpu" for b in self.backends)

    def batch(self, positions: int, prompt: int) -> str:
        """dump_boundaries' BATCH for a session of `positions` whose prompt (what the audited
        epoch prefilled) was `prompt` positions."""
        return f"{prompt}:1" if self.stepwise and 0 < prompt < positions else str(positions)

    def tolerances(self, calibrated: Mapping[str, cm.Tolerance]) -> list[cm.Tolerance]:
        """Per hop, what its boundary may differ by: the loosest tolerance of its own backend and
        every backend before it in the route (a boundary carries all their arithmetic)."""
        return [cm.loosest(calibrated[b] for b in self.backends[:i + 1]) for i in range(len(self.backends))]


class Replayer:
    """Replays sessions as a trusted verifier node would compute them, range by range (one
    process per route range, each opening that range only: peak memory follows the largest
    range, not the model), each range on its hop's compute backend under the recipe the audit
    job names for it (`plan`)."""

    def __init__(self, dump_boundaries: Path, model: Path, threads: int = 2,
                 runner: Optional[CappedRunner] = None, devices: Optional[Mapping[str, str]] = None) -> None:
        """`model`: the certified GGUF, whole, or the parts record its per-range files came with
        (`cut_model`); ValueError if it is neither. `runner`: where the replay's processes run
        (each in a capped cgroup, their peaks recorded); plain subprocesses when None.
        `devices`: compute backend -> the device this verifier replays it on ({"cpu": "cpu",
        "vulkan": "vulkan0"}; `dump_boundaries` must be linked with those backends); the CPU alone
        when None."""
        self._binary, self._threads, self._runner = dump_boundaries, threads, runner
        self._devices = dict(devices) if devices is not None else {"cpu": "cpu"}
        self._model = open_model_files(model)
        self.artifact = self._model.artifact  # the one artifact it replays
        self._summary = gguf_summary(self._model.files[0].path)  # a part's summary is its source's

    @property
    def compute_backends(self) -> tuple[str, ...]:
        """What this replayer replays: the backends a verifier asks the tracker for."""
        return tuple(self._devices)

    def plan(self, job: tt.AuditJob) -> ReplayPlan:
        """How to replay `job`: each hop's certified recipe, once the job's artifact is this
        replayer's, every hop's backend is one it replays, and each recipe's fingerprint is the one
        that recipe gives here (WrongRecipe otherwise: replaying under other arithmetic would blame
        honest nodes). A job from a tracker before per-hop recipes ran every hop on its one recipe."""
        if job.fingerprints is None or not job.matmul_activations:
            raise WrongRecipe(f"audit {job.audit_id} names no certified artifact and recipe (a tracker before them)")
        if job.fingerprints.model_artifact != self.artifact:
            raise WrongRecipe(f"audit {job.audit_id} is of {job.model} certified from "
                              f"{job.fingerprints.model_artifact}; this verifier replays {self.artifact}")
        recipes = job.hop_recipes or (tt.HopRecipe("cpu", job.fingerprints.runtime_recipe, job.matmul_activations),
                                      ) * len(job.hops)
        if len(recipes) != len(job.hops):
            raise WrongRecipe(f"audit {job.audit_id} names {len(recipes)} hop recipes for {len(job.hops)} hops")
        for recipe in recipes:
            if recipe.compute_backend not in self._devices:
                raise WrongRecipe(f"audit {job.audit_id} has a hop on {recipe.compute_backend}; this verifier "
                                  f"replays {', '.join(self._devices)}")
            try:
                here = recipe_of(self._summary, "gguf", recipe.matmul_activations, recipe.compute_backend).fingerprint()
            except ValueError as err:
                raise WrongRecipe(f"audit {job.audit_id}: {err}") from None
            if here != recipe.recipe_fingerprint:
                raise WrongRecipe(f"audit {job.audit_id}: {job.model}'s certified recipe is {recipe.recipe_fingerprint} "
                                  f"on {recipe.compute_backend}; this verifier's engine with "
                                  f"{recipe.matmul_activations} matmul activations runs {here}")
        return ReplayPlan(tuple(r.compute_backend for r in recipes),
                          tuple(self._devices[r.compute_backend] for r in recipes),
                          tuple(r.matmul_activations for r in recipes))

    def replay(self, tokens: Sequence[int], layers: Sequence[tuple[int, int]],
               plan: Optional[ReplayPlan] = None, prompt: int = 0) -> dict:
        """{"rows": [boundary rows after each non-last range], "logits": [positions, n_vocab]};
        `plan`: the job's (`plan`); None replays every range on the CPU with quantized activations.
        `prompt`: the positions the audited epoch prefilled (`prompt_length`), for a stepwise plan."""
        plan = plan or ReplayPlan.on_cpu(len(layers))
        try:
            return boundaries.run_streamed(self._binary, self._model, tokens, layers,
                                           plan.batch(len(tokens), prompt), self._threads,
                                           plan.matmul_activations, self._runner, plan.devices)
        except boundaries.BoundariesError as err:
            raise AuditError(f"replay failed: {err}") from None


@dataclasses.dataclass(frozen=True)
class Finding:
    node_id: str
    check: str  # "output", "input" (what it received vs what its upstream committed), "token"
    positions: tuple[int, ...]  # the positions refuted
    detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    culprit: str  # "" when passed
    checked_positions: int  # over all hops
    findings: tuple[Finding, ...]


def session_tokens(hops: Sequence[HopCommitments]) -> list[int]:
    """The session's tokens as its first hop was fed them (the last hop's last sampled token
    is checked against the logits of the position before it, so it needs no position of its own)."""
    first = hops[0]
    if first.input_tokens is None:
        raise AuditError(f"the first hop {first.node_id} committed to no input tokens")
    return [int(token) for token in first.input_tokens[:first.positions]]


def prompt_length(hops: Sequence[HopCommitments]) -> int:
    """The positions the audited epoch prefilled before its first sampled token: one past the
    first position the last hop sampled from (0 when it sampled nothing)."""
    sampled = hops[-1].sampled
    if sampled is None:
        return 0
    at = np.flatnonzero(sampled.tokens >= 0)
    return int(at[0]) + 1 if len(at) else 0


def judge(hops: Sequence[HopCommitments], replay: dict, tol: cm.Tolerance | Sequence[cm.Tolerance], positions: int,
          rng: np.random.Generator) -> Verdict:
    """Checks `positions` random positions per hop at `tol` (one for every hop, or one per hop:
    `ReplayPlan.tolerances`); blames the first refuted hop in route order."""
    tolerances = [tol] * len(hops) if isinstance(tol, cm.Tolerance) else list(tol)
    n = min(h.positions for h in hops)
    findings: list[Finding] = []
    checked = 0
    for i, hop in enumerate(hops):
        tol = tolerances[i]
        pick = np.sort(rng.choice(n, size=min(positions, n), replace=False))
        if hop.sent is not None:
            sent = cm.HiddenCommitment(hop.sent.indices[pick], hop.sent.values[pick])
            bad = pick[~cm.hidden_passes(sent, replay["rows"][i][pick], tol)]
            checked += len(pick)
            if len(bad):
                findings.append(Finding(hop.node_id, "output", tuple(map(int, bad)),
                                        f"{len(bad)} of {len(pick)} positions differ from the replay"))
        if hop.received is not None and hops[i - 1].sent is not None:
            upstream = hops[i - 1].sent
            same = np.all(hop.received.indices[pick] == upstream.indices[pick], axis=1) & np.all(
                hop.received.values[pick] == upstream.values[pick], axis=1)
            if not same.all():  # the upstream sent other rows than it committed to (or this hop lies)
                findings.append(Finding(hops[i - 1].node_id, "input", tuple(map(int, pick[~same])),
                                        f"{hop.node_id} received other rows than {hops[i - 1].node_id} committed to"))
        if hop.sampled is not None:  # positions a token was sampled from, drawn among those
            sampled_at = np.flatnonzero(hop.sampled.tokens[:n] >= 0)
            rows = np.sort(rng.choice(sampled_at, size=min(positions, len(sampled_at)), replace=False))
            if len(rows):
                sampled = cm.TokenCommitment(hop.sampled.tokens[rows], hop.sampled.logits[rows])
                greedy = hop.temperature == 0 and not hop.constrained
                bad = rows[~cm.tokens_pass(sampled, replay["logits"][rows], tol, rank=greedy)]
                checked += len(rows)
                if len(bad):
                    findings.append(Finding(hop.node_id, "token", tuple(map(int, bad)),
                                            f"{len(bad)} of {len(rows)} sampled tokens differ from the replay"
                                            + ("" if greedy else " (logit only: sampled or constrained decoding)")))
    order = {hop.node_id: i for i, hop in enumerate(hops)}
    culprit = min((f.node_id for f in findings), key=order.__getitem__, default="")
    return Verdict(not findings, culprit, checked, tuple(findings))
