"""`tools/bazel run //python:verifier -- --tracker HOST:PORT --tracker-ca CA --token-file
VERIFIER.token`: the verifier role (docs/adr/0008-verified-outputs.md).

Takes the tracker's pending audits of the model it holds (`--gguf`: the whole file or its parts
record) one at a time, fetches each hop's signed commitments with the audit tickets the tracker
issued, replays the session range by range (one process per route range: no process holds the
whole model), each range on its hop's compute backend under the recipe the job names for it (ADR 0015:
`--device vulkan=vulkan0` adds a backend, with its own `--calibration vulkan=PATH`; the tracker
hands out only audits whose every hop ran a backend the verifier replays; a job of another
artifact or recipe is refused, not reported, and goes back to the tracker's queue), checks
`--positions` random positions per hop at the calibrated tolerance of the backends its boundary
went through, and reports the verdict. Policy for a
refutation: check every position of every hop (so that blame goes to the first hop refuted
anywhere, not to a downstream hop whose tokens a cheat upstream spoiled at positions the sample
missed), replay once more with another thread count, and blame the culprit only when the second
replay refutes the same hop (a glitch of the verifier itself must not quarantine anyone); a hop
answering UNIMPLEMENTED (the reference backend keeps no commitments) or NOT_FOUND (the session
left its bounded log, or its worker restarted) makes the audit inconclusive, reported as passed
with the reason in the evidence. Logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Optional

import grpc
import numpy as np

from meshnet.identity.keys import Identity
from meshnet.identity.tls import pinned_channel
from meshnet.process import log, stop_on_signals, tracker_token
from meshnet.protocol.tracker_client import TrackerClient, tracker_addresses
from meshnet.recipe.recipe import compute_backend_of
from meshnet.verify import audit, commitment
from meshnet.wire import tracker as tt
from meshnet.wire.status import StatusCode

INCONCLUSIVE = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)
ALL_POSITIONS = audit.MAX_POSITIONS


@dataclasses.dataclass
class VerifierStats:
    """What the audits run so far cost (for the bench's audited lane)."""

    audits: int = 0
    replayed_tokens: int = 0
    replay_seconds: float = 0.0  # wall time of the replays (the first; a confirming one is extra)
    commitment_bytes: int = 0  # signed commitment bodies fetched, all hops
    committed_positions: int = 0  # positions those bodies covered, all hops

    def summary(self) -> dict:
        per_token = self.replay_seconds / self.replayed_tokens if self.replayed_tokens else None
        per_position = self.commitment_bytes / self.committed_positions if self.committed_positions else None
        return {"audits": self.audits, "verifier_ms_per_audited_token": per_token and round(per_token * 1000, 3),
                "commitment_bytes_per_position_per_hop": per_position and round(per_position, 1)}


def findings_json(verdict: audit.Verdict, listed: int = 64) -> list[dict]:
    """What differed, where: per finding, the count and the first `listed` positions (the
    tracker keeps at most 64 KiB of evidence per audit)."""
    return [{"node_id": f.node_id, "check": f.check, "refuted": len(f.positions),
             "positions": list(f.positions[:listed]), "detail": f.detail} for f in verdict.findings]


def run_audit(job: tt.AuditJob, replayers: tuple[audit.Replayer, audit.Replayer],
              tol: commitment.Tolerance | Mapping[str, commitment.Tolerance], positions: int, seed: int,
              stats: Optional[VerifierStats] = None) -> tt.ReportAuditRequest:
    """`tol`: the calibrated tolerance per compute backend (one Tolerance: the CPU's)."""
    stats = stats if stats is not None else VerifierStats()
    plan = replayers[0].plan(job)  # WrongRecipe before any hop is asked
    calibrated = {"cpu": tol} if isinstance(tol, commitment.Tolerance) else tol
    missing = sorted(set(plan.backends) - set(calibrated))
    if missing:
        raise audit.WrongRecipe(f"audit {job.audit_id}: no calibrated tolerance for {', '.join(missing)}")
    tol = plan.tolerances(calibrated)
    fetched = []
    for hop, ticket in zip(job.hops, job.tickets):
        node = hop.node
        try:
            with pinned_channel(node.address, node.tls_certificate.encode() or None) as channel:
                fetched.append(audit.fetch(channel, ticket, node.public_key))
        except grpc.RpcError as err:
            if err.code() not in INCONCLUSIVE:
                raise
            return tt.ReportAuditRequest(job.audit_id, True, evidence=json.dumps(
                {"inconclusive": f"{node.node_id} answered {err.code().name}: {err.details()}"}))
    tokens = audit.session_tokens(fetched)
    layers = [h.layers for h in fetched]
    started = time.perf_counter()
    prompt = audit.prompt_length(fetched)
    replay = replayers[0].replay(tokens, layers, plan, prompt)
    stats.audits += 1
    stats.replay_seconds += time.perf_counter() - started
    stats.replayed_tokens += len(tokens)
    stats.commitment_bytes += sum(h.signed_bytes for h in fetched)
    stats.committed_positions += sum(h.positions for h in fetched)
    verdict = audit.judge(fetched, replay, tol, positions, np.random.default_rng(seed))
    evidence: dict = {"findings": findings_json(verdict), "tokens": len(tokens)}
    if not verdict.passed:
        # Blame needs every position: a cheat refuted at few positions can leave its sampled ones
        # clean while its downstream hop's tokens, computed from its output, are refuted. The
        # replay covers them all already; the second replay (another thread count) must agree.
        full = audit.judge(fetched, replay, tol, ALL_POSITIONS, np.random.default_rng(seed))
        second = audit.judge(fetched, replayers[1].replay(tokens, layers, plan, prompt), tol, ALL_POSITIONS,
                             np.random.default_rng(seed))
        evidence.update(findings=findings_json(full), sampled_culprit=verdict.culprit,
                        confirmed=second.culprit == full.culprit)
        if not evidence["confirmed"]:
            return tt.ReportAuditRequest(job.audit_id, True, "", verdict.checked_positions, json.dumps(evidence))
        verdict = full
    return tt.ReportAuditRequest(job.audit_id, verdict.passed, verdict.culprit, verdict.checked_positions,
                                 json.dumps(evidence), proof(fetched, verdict.culprit))


def proof(fetched: list[audit.HopCommitments], culprit: str) -> tuple[tt.SignedCommitments, ...]:
    """What the tracker needs to record a refutation of `culprit` (ADR 0016): its commitments as
    it signed them, and its upstream hop's (an input refutation compares the two); () if passed."""
    at = next((i for i, hop in enumerate(fetched) if hop.node_id == culprit), None)
    if at is None:
        return ()
    return tuple(hop.signed for hop in fetched[max(0, at - 1):at + 1])


def serve_audits(tracker: TrackerClient, replayers: tuple[audit.Replayer, audit.Replayer],
                 tol: commitment.Tolerance | Mapping[str, commitment.Tolerance],
                 positions: int, stop: threading.Event, poll_seconds: float = 1.0,
                 seed: Optional[int] = None, stats: Optional[VerifierStats] = None) -> int:
    """Runs audits until `stop`; how many were reported (`stats`, if given, adds up their cost)."""
    reported = 0
    while not stop.is_set():
        try:
            reply = tracker.take_audit(replayers[0].artifact, replayers[0].compute_backends)
        except grpc.RpcError as err:
            # not reached, or refused (an unenrolled key: ADR 0017, enrolment is read again within 5 s)
            log("take_audit_failed", error=err.code().name, details=err.details())
            stop.wait(poll_seconds)
            continue
        if reply.status.code == StatusCode.NOT_FOUND or reply.job is None:
            if reply.status.code != StatusCode.NOT_FOUND:  # refused (INVALID_ARGUMENT, RESOURCE_EXHAUSTED)
                log("take_audit_refused", status=reply.status.code.name, message=reply.status.message)
            stop.wait(poll_seconds)
            continue
        job = reply.job
        try:
            report = run_audit(job, replayers, tol, positions, seed if seed is not None else job.audit_id, stats)
        except (audit.AuditError, grpc.RpcError) as err:
            log("audit_refused" if isinstance(err, audit.WrongRecipe) else "audit_failed_to_run",
                audit_id=job.audit_id, error=str(err))
            continue  # the tracker hands it out again after its report deadline
        answer = tracker.report_audit(report)
        if not answer.status.ok:
            log("audit_report_refused", audit_id=job.audit_id, status=answer.status.code.name,
                message=answer.status.message)
            continue
        reported += 1
        log("audited", audit_id=job.audit_id, session=job.session.session_id, passed=report.passed,
            culprit=report.culprit_node_id, checked=report.checked_positions)
    return reported


def backends_from_flags(parser: argparse.ArgumentParser, device_flags: list[str],
                        calibration_flags: list[str]) -> tuple[dict[str, str], dict[str, commitment.Tolerance]]:
    """(backend -> device, backend -> tolerance) from --device and --calibration; the CPU always,
    and every backend replayed must have its own calibration (exit 2 otherwise)."""
    devices = {"cpu": "cpu"}
    for flag in device_flags:
        backend, _, device = flag.partition("=")
        try:
            of_device = compute_backend_of(device)
        except ValueError as err:
            parser.error(f"--device {flag!r}: BACKEND=DEVICE, e.g. vulkan=vulkan0 ({err})")
        if backend != of_device or backend == "cpu":
            parser.error(f"--device {flag!r}: BACKEND=DEVICE with DEVICE a device of BACKEND, e.g. vulkan=vulkan0")
        devices[backend] = device
    tolerances = {}
    for flag in calibration_flags:
        backend, _, path = flag.partition("=")
        if not path or "/" in backend:  # a plain PATH: the CPU's
            backend, path = "cpu", flag
        try:
            tolerances[backend] = commitment.tolerance_from_calibration(path, backend)
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"--calibration {flag}: {err}")
    missing = sorted(set(devices) - set(tolerances))
    if missing:
        parser.error(f"no --calibration for {', '.join(missing)}: a backend is judged only at its own tolerance")
    return devices, tolerances


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Meshnet verifier role")
    parser.add_argument("--tracker", required=True, type=tracker_addresses, help="tracker HOST:PORT; several, comma-separated, for replicated trackers (calls fail over between them)")
    parser.add_argument("--tracker-ca", type=Path)
    parser.add_argument("--token-file", type=Path, help="the verifier role's token (else $MESHNET_VERIFIER_TOKEN)")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--identity", type=Path, help="this verifier's Ed25519 key file (created 0600 if absent; "
                        "the key the tracker's operator enrolls: only enrolled keys are served with --enrolled-roles "
                        "verifier, and unenrolled keys' refutations count together as one verifier toward the "
                        "quarantine quorum); default: fresh")
    parser.add_argument("--gguf", required=True, type=Path,
                        help="the certified model: the whole GGUF, or the parts record (MODEL.parts.json) of its "
                             "per-range files (//python:cut_model); replays open one range at a time")
    parser.add_argument("--dump-boundaries", required=True, type=Path,
                        help="//cpp/engine:dump_boundaries, or a build of it linked with the GPU backends of --device")
    parser.add_argument("--calibration", required=True, action="append", metavar="[BACKEND=]PATH",
                        help="calibration.json of this model's recipe on BACKEND (default cpu); once per backend")
    parser.add_argument("--device", action="append", default=[], metavar="BACKEND=DEVICE",
                        help="also replay hops of BACKEND on DEVICE (vulkan=vulkan0, cuda=cuda0); needs its calibration")
    parser.add_argument("--vulkan-dump-boundaries", type=Path, help=argparse.SUPPRESS)  # set by bazel run
    parser.add_argument("--positions", type=int, default=16, help="positions checked per hop per audit")
    args = parser.parse_args(argv)
    token = tracker_token(parser, args.token_file, "MESHNET_VERIFIER_TOKEN", "verifier", args.tracker_ca,
                          args.insecure)
    identity = Identity.load_or_create(args.identity) if args.identity else Identity.generate()
    tracker = TrackerClient(args.tracker, token, identity,
                            tracker_ca=None if args.insecure else args.tracker_ca.read_bytes())
    devices, tolerances = backends_from_flags(parser, args.device, args.calibration)
    binary = args.vulkan_dump_boundaries if "vulkan" in devices and args.vulkan_dump_boundaries else args.dump_boundaries
    try:
        replayers = (audit.Replayer(binary, args.gguf, threads=2, devices=devices),
                     audit.Replayer(binary, args.gguf, threads=1, devices=devices))
    except ValueError as err:
        parser.error(f"--gguf {args.gguf}: {err}")
    stop = stop_on_signals()
    log("verifying", tracker=args.tracker, model=str(args.gguf), positions=args.positions, principal=identity.principal,
        compute_backends=list(devices))
    serve_audits(tracker, replayers, tolerances, args.positions, stop)
    tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
