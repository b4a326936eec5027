"""Issue 29, point 5: the synthetic 8B served and audited by nodes that each hold a quarter of it,
every process in a memory cgroup (root; v1 or v2 memory controller). Writes one JSON report.

  tools/bazel run //tests/big_model:evidence_8b -- route --gguf /abs/8B.gguf --out /abs/route.json
  tools/bazel run //tests/big_model:evidence_8b -- audit --gguf /abs/8B.gguf --out /abs/audit.json

Both cut the model into --nodes per-range parts under --work (kept and reused while the record's
files are all there with their recorded sizes) and cap each node at --cap-fraction (0.4) of the
whole file plus the F16 KV cache of its range at --max-kv-tokens.

route: route parity (3 prompts x 32 greedy tokens by default) of the capped nodes against
  uncapped single-process llama.cpp and against the teacher-forced llama.cpp range chain, whose
  range processes run under the largest node cap, each reading its own part; then 8 concurrent
  sessions against solo.
audit: every session audited by a verifier whose replay processes run under the largest node cap,
  reading the whole file that no node maps; an honest session passes, then a node serving the
  middle range with noise of 10% of each row's RMS, and one serving it from the model requantized
  to --substitute-type (what the node computes is not the certified Q4_0), must each be refuted,
  blamed and quarantined.
Exit status: 0 every check held, 1 one did not (the report says which), 2 bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from meshnet.certify.prompts import PARITY_PROMPTS
from meshnet.text.llama_cpp_tokenizer import LlamaCppTokenizer
from meshnet.memory_cap import cgroup_problem
from meshnet.recipe.cut_model import cut
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.range_memory import range_memory
from meshnet.swarm.local import even_cuts
from meshnet.verify import commitment
from capped_runs import Cheat, audit_cheaters, capped_route, middle_part_of

MIB = 1 << 20


def log(message: str) -> None:
    print(f"evidence_8b: {message}", file=sys.stderr, flush=True)


def parts_for(gguf: Path, cuts: list[tuple[int, int]], work: Path) -> tuple[list[Path], Path]:
    """(each range's part, the record): cut unless a record with every part at its size is there."""
    folder = work / f"parts-{len(cuts)}"
    record_path = folder / f"{gguf.stem}.parts.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        files = [folder / p["file"] for p in record["parts"]]
        if [tuple(p["layers"]) for p in record["parts"]] == cuts and \
                record["source"]["size"] == gguf.stat().st_size and \
                all(f.exists() and f.stat().st_size == p["size"] for f, p in zip(files, record["parts"])):
            log(f"reusing the parts in {folder}")
            return files, record_path
    log(f"cutting {gguf.name} into {cuts} under {folder}")
    record = cut(gguf, cuts, folder, progress=lambda m: log(f"  {m}"))
    return [folder / p["file"] for p in record["parts"]], record_path


def node_caps(args: argparse.Namespace, cuts: list[tuple[int, int]]) -> list[int]:
    whole = args.gguf.stat().st_size
    return [int(args.cap_fraction * whole) + range_memory(args.gguf, *c).kv_bytes_per_token * args.max_kv_tokens for c in cuts]


def run_route(args: argparse.Namespace, cuts, parts, record) -> tuple[dict, bool]:
    caps = node_caps(args, cuts)
    prompts = LlamaCppTokenizer(args.gguf, args.tokenize_binary).encode_many(PARITY_PROMPTS[:args.prompts])
    out = capped_route(args.gguf, parts, cuts, caps, model="synthetic-8b", prompts=prompts, tokens=args.tokens,
                       worker=args.worker_binary, greedy=args.greedy_binary, dump_boundaries=args.dump_boundaries,
                       parts_record=record, max_kv_tokens=args.max_kv_tokens, log=log)
    route = out["route"]
    tf = [p["teacher_forced"]["equal"] for p in route["prompts"]]
    out["checks"] = {
        "route_equals_single_process": all(p["first_difference"] is None for p in route["prompts"]),
        "route_equals_teacher_forced_chain": all(tf),
        "concurrent_equal_solo": route["concurrent_equal"],
        "nodes_under_cap": all(n["oom_kills"] == 0 and n["cgroup_peak_bytes"] <= n["cap_bytes"]
                               for n in out["nodes"]),
        "teacher_forced_processes_under_cap": all(
            r["exit_code"] == 0 and not r["oom_killed"] and r["cgroup_peak_bytes"] <= max(caps)
            for r in out["teacher_forced_processes"]),
    }
    return out, all(out["checks"].values())


def run_audit(args: argparse.Namespace, cuts, parts, record) -> tuple[dict, bool]:
    cap = max(node_caps(args, cuts))
    substitute = args.work / f"{args.gguf.stem}-as-{args.substitute_type.lower()}.gguf"
    if not substitute.exists():
        log(f"requantizing to {args.substitute_type}: {substitute}")
        subprocess.run([str(args.quantize), "--allow-requantize", str(args.gguf), str(substitute),
                        args.substitute_type, "2"], check=True, capture_output=True)
    substitute_part = middle_part_of(substitute, cuts, args.work / f"substitute-{args.substitute_type.lower()}")
    tokenizer = LlamaCppTokenizer(args.gguf, args.tokenize_binary)
    cheats = [Cheat("noise:0.1", ["--cheat", "noise:0.1"], sessions=3),  # the calibration's p per session: 0.954
              Cheat(f"served_as_{args.substitute_type.lower()}", ["--cheat-serve-gguf", str(substitute_part)],
                    sessions=1, reads=[substitute_part])]
    out = audit_cheaters(args.work / "audit-swarm", args.gguf, parts, cuts, cap, cheats, model="synthetic-8b",
                         worker=args.worker_binary, dump_boundaries=args.dump_boundaries,
                         tolerance=commitment.tolerance_from_calibration(args.calibration), encode=tokenizer.encode,
                         prompts=PARITY_PROMPTS[:4], tokens=args.tokens, max_kv_tokens=args.max_kv_tokens, log=log)
    out["substitute"] = {"type": args.substitute_type, "file_bytes": substitute.stat().st_size,
                         "part": str(substitute_part), "part_bytes": substitute_part.stat().st_size}
    out["checks"] = {
        "honest_passed": out["honest_passed"],
        **{f"{name}_refuted_blamed_quarantined": o["refuted"] and o["culprit_is_cheater"] and o["quarantined"]
           and o["through_cheater"] == o["sessions"] for name, o in out["cheats"].items()},
        "verifier_under_cap": all(r["exit_code"] == 0 and not r["oom_killed"] and r["cgroup_peak_bytes"] <= cap
                                  for r in out["verifier_processes"]),
        "nodes_under_cap": out["node_oom_kills"] == 0 and all(p <= cap for p in out["node_peaks_bytes"] if p),
    }
    return out, all(out["checks"].values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", choices=("route", "audit"))
    parser.add_argument("--gguf", required=True, type=Path, help="the 8B (tools/bazel run //tools:synthetic_big_model)")
    parser.add_argument("--out", required=True, type=Path, help="the JSON report")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "meshnet" / "big-model",
                        help="where the parts (and the substitute) are written and kept")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cap-fraction", type=float, default=0.4, help="of the whole file, plus the range's KV")
    parser.add_argument("--max-kv-tokens", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per session")
    parser.add_argument("--prompts", type=int, default=3, help="route: parity prompts")
    parser.add_argument("--substitute-type", default="Q2_K", help="audit: what the substituting cheater serves")
    for tool in ("worker-binary", "greedy-binary", "dump-boundaries", "tokenize-binary", "quantize", "calibration"):
        parser.add_argument(f"--{tool}", type=Path, required=True, help="set by bazel run")
    args = parser.parse_args(argv)
    args.gguf, args.work = args.gguf.resolve(), args.work.resolve()
    if not args.gguf.is_file():
        parser.error(f"--gguf {args.gguf}: no such file")
    if cgroup_problem():
        parser.error(f"needs memory cgroups: {cgroup_problem()}")
    if not 0 < args.cap_fraction <= 1 or args.nodes < 2 or args.tokens < 1 or not 1 <= args.prompts <= 5:
        parser.error("--cap-fraction in (0, 1], --nodes at least 2, --tokens at least 1, --prompts 1 to 5")
    cuts = even_cuts(gguf_summary(args.gguf).n_layer, args.nodes)
    started = time.monotonic()
    parts, record = parts_for(args.gguf, cuts, args.work)
    out, passed = (run_route if args.run == "route" else run_audit)(args, cuts, parts, record)
    out.update(run=args.run, gguf=str(args.gguf), gguf_bytes=args.gguf.stat().st_size, cuts=[list(c) for c in cuts],
               cap_fraction=args.cap_fraction, max_kv_tokens=args.max_kv_tokens, tokens=args.tokens,
               passed=passed, seconds=round(time.monotonic() - started, 1))
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    log(f"{'passed' if passed else 'FAILED'}: {json.dumps(out['checks'])}; report {args.out} "
        f"({out['seconds'] / 60:.1f} min)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
