"""Issue 29's runs of a model under per-process memory caps, shared by the CI test on the 1.07B
(capped_trust_test.py) and the 8B evidence (evidence_8b.py): nodes each serving its own per-range
part in a memory cgroup, route parity against the teacher-forced range chain, and cheaters
refuted by a verifier whose replay processes run under the same cap.

Every capped node and replay process reads files evicted from the page cache first, so that its
cgroup is charged for every page of weights it touches, as on a machine of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

from meshnet.certify.route_parity import route_parity
from meshnet.certify.streamed import greedy_matches_teacher_forced
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.identity.keys import Identity
from meshnet.memory_cap import CappedRunner, MemoryCap, evict_from_page_cache
from meshnet.recipe.cut_model import cut
from meshnet.recipe.model_files import open_model_files
from meshnet.swarm.local import LocalSwarm
from meshnet.verify import audit, verifier

VERIFIERS = (Identity.generate(), Identity.generate())  # the tracker quarantines on both enrolled keys' refutations


def capped_route(gguf: Path, parts: Sequence[Path], cuts: Sequence[tuple[int, int]], caps: Sequence[int], *,
                 model: str, prompts: Sequence[Sequence[int]], tokens: int, worker: Path, greedy: Path,
                 dump_boundaries: Path, parts_record: Path, max_kv_tokens: int, log: Callable[[str], None],
                 single_process: bool = True, matmul_activations: str = "quantized") -> dict:
    """Route parity (certify/route_parity.py) on nodes that each serve `parts[i]` in a cgroup
    capped at `caps[i]`: every route token checked against the teacher-forced llama.cpp range
    chain, each range process capped at the largest node cap and reading its own part, and,
    with `single_process`, against uncapped single-process llama.cpp; then 8 concurrent
    sessions against solo. {"route", "nodes": [{layers, cap_bytes, cgroup_peak_bytes,
    oom_kills}], "teacher_forced_processes": [...]}."""
    node_caps = [MemoryCap(f"big-node{i}", cap) for i, cap in enumerate(caps)]
    runner = CappedRunner(max(caps), "big-teacher-forced")
    files = open_model_files(parts_record)
    try:
        route = route_parity(
            gguf, model, prompts, worker=worker, greedy=greedy, tokens=tokens, cuts=cuts, n_layer=cuts[-1][1],
            log=log, matmul_activations=matmul_activations, single_process=single_process,
            node_prefixes=[cap.prefix for cap in node_caps], node_ggufs=list(parts), max_kv_tokens=max_kv_tokens,
            teacher_forced=lambda ids, got: greedy_matches_teacher_forced(dump_boundaries, files, ids, got, cuts,
                                                                          matmul_activations, runner))
        nodes = [{"layers": list(c), "part": str(p), "part_bytes": p.stat().st_size, "cap_bytes": limit,
                  "cgroup_peak_bytes": cap.peak(), "oom_kills": cap.oom_kills()}
                 for c, p, limit, cap in zip(cuts, parts, caps, node_caps)]
    finally:
        for cap in node_caps:
            cap.remove()
    return {"route": route, "nodes": nodes,
            "teacher_forced_processes": [dataclasses.asdict(r) for r in runner.records]}


@dataclasses.dataclass
class Cheat:
    """A cheating node for the middle range: `args` to its node (--cheat ..., or
    --cheat-serve-gguf FILE), `reads` the files it computes from (evicted before it starts), and
    the audited sessions within which it must be refuted (the calibration's p per session)."""

    name: str
    args: list[str]
    sessions: int = 1
    reads: list[Path] = dataclasses.field(default_factory=list)


def audit_cheaters(workdir: Path, gguf: Path, parts: Sequence[Path], cuts: Sequence[tuple[int, int]], cap: int,
                   cheats: Sequence[Cheat], *, model: str, worker: Path, dump_boundaries: Path, tolerance,
                   encode: Callable[[str], list[int]], prompts: Sequence[str], tokens: int, max_kv_tokens: int,
                   log: Callable[[str], None] = print, threads: int = 1) -> dict:
    """Nodes (quantized recipe) each serving its own part in a cgroup capped at `cap`, every
    closed session audited by a verifier that replays each route range in its own process under
    the same cap, from `gguf` (the whole file, which no node maps). An honest session must pass;
    then each cheat in turn serves the middle range alone and must be refuted, blamed and
    quarantined within its sessions. The report: {"honest_passed", "cheats": {name: {...}},
    "verifier_processes", "node_peaks_bytes", ...}; the caller asserts."""
    middle = len(cuts) // 2
    node_caps = [MemoryCap(f"big-node{i}", cap) for i in range(len(cuts) + len(cheats))]
    runner = CappedRunner(cap, "big-verifier")
    replayers = (audit.Replayer(dump_boundaries, gguf, 2, runner), audit.Replayer(dump_boundaries, gguf, 1, runner))
    for path in parts:
        evict_from_page_cache(path)
    swarm = LocalSwarm(workdir, gguf, cuts, model=model, backend="gguf", worker_binary=worker, threads=threads,
                       max_sessions=2, max_kv_tokens=max_kv_tokens, node_ggufs=list(parts),
                       node_prefixes=[c.prefix for c in node_caps[:len(cuts)]],
                       tracker_args=["--enrolled-roles", "verifier"])
    swarm.tracker.audit_rate, swarm.tracker.audit_seed = 1.0, 1
    report: dict = {"cap_bytes": cap, "cuts": [list(c) for c in cuts], "cheats": {}}
    try:
        for key in VERIFIERS:  # only enrolled verifiers make up the quorum (issue 55, finding 9)
            swarm.tracker.enroll("verifier", key.public_key)
        with swarm:
            def audited_session(prompt: str) -> tuple[list[str], list]:
                with swarm.client() as tracker:
                    session = RouteClient(tracker, model)
                    hops: list[str] = []
                    for _ in session.generate(encode(prompt), GenerationParams(max_tokens=tokens)):
                        hops = hops or [h.node.node_id for h in session._connection.hops]
                reports = []
                # Two verifier keys: a refutation by one is confirmed by the other (ADR 0016's quorum).
                with swarm.tracker.client("verifier", VERIFIERS[0]) as first, \
                        swarm.tracker.client("verifier", VERIFIERS[1]) as second:
                    took = True
                    while took:
                        took = False
                        for tracker in (first, second):
                            if (reply := tracker.take_audit(replayers[0].artifact)).job is None:
                                continue
                            took = True
                            reports.append(verifier.run_audit(reply.job, replayers, tolerance, positions=16,
                                                              seed=reply.job.audit_id))
                            tracker.report_audit(reports[-1])
                return hops, reports

            _, honest = audited_session(prompts[0])
            report["honest_passed"] = [r.passed for r in honest] == [True]
            report["honest_evidence"] = [r.evidence for r in honest]
            log(f"honest session: audited {len(honest)}, passed {report['honest_passed']}")
            swarm.nodes[swarm.ids[f"node-{middle}"]].stop()  # each cheater alone serves the middle range
            for n, cheat in enumerate(cheats):
                for path in [parts[middle], *cheat.reads]:
                    evict_from_page_cache(path)
                cheater = swarm.add_node(f"cheat-{n}", cuts[middle], prefix=node_caps[len(cuts) + n].prefix,
                                         gguf=parts[middle], extra_args=cheat.args)
                outcome: dict = {"args": cheat.args, "sessions": 0, "through_cheater": 0, "audited": 0}
                refuted: list = []
                for prompt in prompts[1:1 + cheat.sessions]:
                    hops, reports = audited_session(prompt)
                    outcome["sessions"] += 1
                    outcome["through_cheater"] += cheater.node_id in hops
                    outcome["audited"] += len(reports)
                    refuted = [r for r in reports if not r.passed]
                    if refuted:
                        break
                outcome["refuted"] = bool(refuted)
                outcome["culprit_is_cheater"] = bool(refuted) and refuted[0].culprit_node_id == cheater.node_id
                outcome["evidence"] = refuted[0].evidence if refuted else None
                with swarm.client() as tracker:
                    outcome["quarantined"] = cheater.node_id in tracker.coverage(model).quarantined_node_ids
                log(f"cheat {cheat.name}: {outcome['sessions']} sessions, {outcome['audited']} audited, refuted "
                    f"{outcome['refuted']}, blamed {outcome['culprit_is_cheater']}, quarantined {outcome['quarantined']}")
                report["cheats"][cheat.name] = outcome
                cheater.stop()
        report["verifier_processes"] = [
            {"what": r.what, "cgroup_peak_bytes": r.cgroup_peak_bytes, "oom_killed": r.oom_killed,
             "exit_code": r.exit_code, "seconds": r.seconds} for r in runner.records]
        report["node_peaks_bytes"] = [c.peak() for c in node_caps]
        report["node_oom_kills"] = sum(c.oom_kills() for c in node_caps)
    finally:
        for c in node_caps:
            c.remove()
    return report


def middle_part_of(source: Path, cuts: Sequence[tuple[int, int]], out: Path) -> Path:
    """The middle range's part of `source` (another quantization, for the substitution cheat)."""
    [part] = cut(source, [cuts[len(cuts) // 2]], out)["parts"]
    return out / part["file"]
