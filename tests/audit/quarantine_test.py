"""Issue 17 acceptance, through the tracker: closed route sessions are sampled for audit by the
tracker (a fixed seed), the verifier role takes each audit, and a refuted hop is quarantined (never
routed again, shown as such in the coverage) with its credit for the audited session withheld.

- Honest: a 3-node swarm with a replica per range, every closed session audited (rate 1.0, so
  the test needs dozens of sessions, not hundreds), at least 1,000 positions checked, no hop
  refuted, nobody quarantined.
- Each cheating worker (noise of 10% of each row's RMS, garbage, forged tokens, a skipped layer,
  Q4_0 served as the certified Q4_1), at a 5% audit rate with seed 7: quarantined within its
  stated number of audited sessions (AUDITS_TO_QUARANTINE), blamed on it and no other hop by both
  verifier keys (the tracker's quorum, ADR 0016, each refutation with the culprit's signed
  commitments), and that session's credit withheld.
The tracker serves as verifiers only the two keys the operator enrolled (ADR 0017)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.identity.keys import Identity
from meshnet.swarm.local import LocalSwarm
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.verify import verifier
from audit_cases import gguf, q4_0, replayers, tokenizer, tolerance  # noqa: F401 (fixtures)
from route_cases import MORE_PROMPTS, PROMPTS

CUTS = [(0, 10), (10, 20), (20, 30)]
TOKENS = 12
# Audited sessions through a cheat by which it is quarantined (the calibration's p per audited
# session, docs/evidence/verification/: 1.0 for all but noise at 10% of the row RMS, 0.954,
# for which 3 leave a chance of 1e-4 to miss).
AUDITS_TO_QUARANTINE = {"noise:0.1": 3, "garbage": 1, "forge_tokens": 1, "skip_layer": 1, "q4_0": 1}
MAX_SESSIONS_PER_CHEAT = 300  # at 5%, 3 audits are expected within 60
VERIFIERS = (Identity.generate(), Identity.generate())


def swarm_with(tmp: Path, gguf: Path, rate: float, seed: int, replicas: bool) -> LocalSwarm:
    """The swarm, its tracker serving only the two VERIFIERS as verifiers: the operator enrolls
    them with the principals command before it starts (ADR 0017), and a minted key is refused."""
    swarm = LocalSwarm(tmp, gguf, CUTS, backend="gguf", worker_binary=Path(os.environ["MESHNET_WORKER_BINARY"]),
                       tracker_args=["--enrolled-roles", "verifier"])
    swarm.tracker.audit_rate, swarm.tracker.audit_seed = rate, seed
    Ledger(swarm.tracker.db).close()
    for key in VERIFIERS:
        subprocess.run([sys.executable, "-m", "meshnet.tracker.ledger.principals", "enroll", "--db",
                        str(swarm.tracker.db), "verifier", key.public_key.hex()], check=True, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    swarm.start()
    try:
        with swarm.tracker.client("verifier", Identity.generate()) as minted, pytest.raises(grpc.RpcError) as refused:
            minted.take_audit()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    except BaseException:
        swarm.stop()
        raise
    if replicas:
        for i, cut in enumerate(CUTS):
            swarm.add_node(f"replica-{i}", cut, wait=False)
        for node in swarm.nodes.values():
            node.wait_ready()
    return swarm


def one_session(swarm, tokenizer, prompt: str) -> list[str]:
    """A greedy generation on a route the client then closes; the route's node ids."""
    with swarm.client() as tracker:
        session = RouteClient(tracker, swarm.model)
        hops = []
        for _ in session.generate(tokenizer.encode(prompt), GenerationParams(max_tokens=TOKENS)):
            if not hops:
                hops = [h.node.node_id for h in session._connection.hops]
    return hops


def audit_pending(swarm, replayers, tolerance) -> list[tuple[str, object]]:
    """Runs every audit the tracker has queued, as the verifier role with two keys, so that a
    refutation by one is confirmed by the other (the quorum of ADR 0016); (session id, report)
    per audit reported."""
    reports = []
    with swarm.tracker.client("verifier", VERIFIERS[0]) as first, swarm.tracker.client("verifier", VERIFIERS[1]) as second:
        took = True
        while took:
            took = False
            for tracker in (first, second):
                if (reply := tracker.take_audit()).job is None:
                    continue
                took = True
                report = verifier.run_audit(reply.job, replayers, tolerance, positions=16, seed=reply.job.audit_id)
                assert tracker.report_audit(report).status.ok
                reports.append((reply.job.session.session_id, report))
    return reports


def test_an_honest_swarm_with_replicas_passes_1000_audited_positions(gguf, tokenizer, replayers, tolerance,
                                                                      tmp_path):
    swarm = swarm_with(tmp_path, gguf, rate=1.0, seed=1, replicas=True)
    try:
        checked, sessions, prompts = 0, 0, PROMPTS + MORE_PROMPTS
        while checked < 1000:
            one_session(swarm, tokenizer, prompts[sessions % len(prompts)])
            sessions += 1
            for _, report in audit_pending(swarm, replayers, tolerance):
                assert report.passed, report.evidence
                assert "inconclusive" not in report.evidence
                checked += report.checked_positions
        with swarm.client() as tracker:
            assert tracker.coverage(swarm.model).quarantined_node_ids == ()
        print(f"honest: {sessions} sessions audited, {checked} positions checked, 0 refuted")
    finally:
        swarm.stop()


def test_each_cheat_is_quarantined_within_its_stated_audited_sessions(gguf, tokenizer, replayers, tolerance, q4_0,
                                                                     tmp_path):
    swarm = swarm_with(tmp_path, gguf, rate=0.05, seed=7, replicas=False)
    cheats = [((10, 20), ["--cheat", "noise:0.1"]), ((10, 20), ["--cheat", "garbage"]),
              ((20, 30), ["--cheat", "forge_tokens"]), ((10, 20), ["--cheat", "skip_layer"]),
              ((10, 20), ["--cheat-serve-gguf", str(q4_0)])]
    outcomes = {}
    try:
        for n, (layers, flags) in enumerate(cheats):
            name = "q4_0" if "--cheat-serve-gguf" in flags else flags[-1]
            budget = AUDITS_TO_QUARANTINE[name]
            honest = swarm.nodes[swarm.ids[f"node-{CUTS.index(layers)}"]]
            honest.stop()  # the cheater alone serves its range
            cheater = swarm.add_node(f"cheat-{n}", layers, extra_args=flags)
            audited, sessions, failed = 0, 0, []
            while sessions < MAX_SESSIONS_PER_CHEAT and not failed and audited < budget:
                hops = one_session(swarm, tokenizer, PROMPTS[sessions % len(PROMPTS)])
                sessions += 1
                assert cheater.node_id in hops
                reports = audit_pending(swarm, replayers, tolerance)
                audited += len({session for session, _ in reports})
                failed = [r for _, r in reports if not r.passed]
            assert failed, f"{name}: not refuted by {audited} audited sessions ({sessions} sessions)"
            assert audited <= budget
            assert len(failed) == 2  # the refutation, and the other verifier's confirmation
            for report in failed:
                assert report.culprit_node_id == cheater.node_id, report.evidence
                assert json.loads(report.evidence)["confirmed"] is True
                assert report.commitments  # the culprit's signed commitments, checked by the tracker
            with swarm.client() as tracker:
                assert cheater.node_id in tracker.coverage(swarm.model).quarantined_node_ids
            honest.launch().wait_ready()
            assert cheater.node_id not in one_session(swarm, tokenizer, PROMPTS[0])  # never routed again
            audit_pending(swarm, replayers, tolerance)  # that session may be drawn too
            cheater.stop()
            outcomes[name] = {"sessions": sessions, "audited": audited}
        swarm.stop()  # every node flushes its last work report
        ledger = Ledger(swarm.tracker.db)
        try:
            failed = [a for a in ledger.audits() if not a["passed"]]
            assert {a["culprit"] for a in failed} == ledger.quarantined()
            assert len(ledger.quarantined()) == len(cheats)
            credited = {t.node_id: t.prefill_tokens + t.decode_tokens for t in ledger.totals()}
            raw = dict(sqlite3.connect(str(swarm.tracker.db)).execute(
                "SELECT node_id, SUM(prefill_tokens + decode_tokens) FROM work GROUP BY node_id").fetchall())
            for culprit in ledger.quarantined():
                withheld = ledger.withheld_tokens(culprit)
                assert withheld > 0, f"the audited session's work of {culprit} never reached the ledger"
                assert credited.get(culprit, 0) == raw[culprit] - withheld
        finally:
            ledger.close()
        print("cheats:", json.dumps(outcomes))
    finally:
        swarm.stop()
