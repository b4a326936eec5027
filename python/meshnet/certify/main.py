"""Certify a GGUF for the swarm: run the parity suite, and write the tracker's entry only if it passes.

  tools/bazel run //python:certify -- --gguf /abs/M.gguf --model NAME [--append /abs/models.json]
                                      [--report /abs/report.json] [--matmul-activations f32]

Checks, for a model whose architecture has a layer-range adapter (others stay dark: exit 2):
  1. route parity: a tracker and 3 GGUF nodes on loopback give the greedy tokens of
     single-process llama.cpp, 64 tokens on each of 5 prompts;
  2. 8 concurrent sessions on that route each keep their solo tokens;
  3. teacher-forced top-1 agreement with Transformers fp32 on the same (dequantized) weights is
     at least 0.98 over 256 positions (KL reported);
  4. each node's memory follows its range (certify/memory.py).
Every check runs the recipe being certified: `--matmul-activations quantized` (the default,
llama.cpp's arithmetic) or `f32` (quantized weights dequantized and dotted with F32 activations,
ADR 0012: slower decode, the arithmetic of the fp32 reference); the entry records which, and
nodes and verifiers must run the same.
Prompts are tokenized by llama.cpp itself (//cpp/engine:tokenize), so any vocabulary works.
The report (all figures) goes to stdout's last line and to --report; the entry (meshnet.recipe
.certify, plus a "certification" record of the figures) is added to --append, replacing one of
the same model name, only when every check passed. Exit status: 0 passed; 1 a check failed
(nothing written to --append); 2 bad input or an architecture without an adapter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from meshnet.bench.prompts import PARITY_PROMPTS
from meshnet.certify.memory import shard_memory
from meshnet.certify.route_parity import route_parity
from meshnet.certify.teacher_forced import POSITIONS, agreements, sequence
from meshnet.gateway.llama_cpp_tokenizer import LlamaCppTokenizer
from meshnet.recipe import certify as entries
from meshnet.recipe.adapters import has_adapter, layer_range_adapters
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.gguf_header import read_header
from meshnet.recipe.recipe import MATMUL_ACTIVATIONS, engine_tool_flags
from meshnet.swarm.local import even_cuts

SUITE = "meshnet-certify-v1"
TOKENS = 64
NODES = 3
TOP1_MIN = 0.98  # issue 18's bar, fixed before any model was measured
UNQUANTIZED = ("F32", "F16", "BF16")  # weight types no matmul quantizes activations for


def kernel_diagnostics(matmul_activations: str) -> dict[str, list[str]]:
    """--diagnose-kernels: teacher-forced agreement under other kernel choices than the certified
    runtime's (not checks), as dump_logits flags: the other matmul activations (ADR 0012), F16
    flash attention (ADR 0010), and upstream's CPU kernels in full (ADR 0009)."""
    other = "quantized" if matmul_activations == "f32" else "f32"
    return {f"{other}_matmul_activations": engine_tool_flags(other),
            "f16_flash_attention": [*engine_tool_flags(matmul_activations), "--f16-flash-attention"],
            "upstream_cpu_kernels": ["--optimized-kernels", "--f16-flash-attention"]}


def expert_count(gguf: Path, architecture: str) -> int:
    value = read_header(gguf).metadata.get(f"{architecture}.expert_count")
    return int(value) if isinstance(value, int) else 0


def run_suite(args: argparse.Namespace, log) -> dict:
    gguf = args.gguf
    summary = gguf_summary(gguf)
    tokenizer = LlamaCppTokenizer(gguf, args.tokenize_binary)
    prompts = tokenizer.encode_many(PARITY_PROMPTS)
    report: dict = {"suite": SUITE, "model": args.model, "architecture": summary.architecture,
                    "n_layer": summary.n_layer, "gguf": str(gguf), "matmul_activations": args.matmul_activations}
    started = time.monotonic()
    report["route"] = route_parity(gguf, args.model, prompts, worker=args.worker_binary, greedy=args.greedy_binary,
                                   tokens=args.tokens, nodes=NODES, n_layer=summary.n_layer, log=log,
                                   matmul_activations=args.matmul_activations)
    ids = sequence(tokenizer, args.positions)
    log(f"teacher-forced: Transformers fp32 against llama.cpp over {len(ids)} positions")
    diagnostics = kernel_diagnostics(args.matmul_activations) if args.diagnose_kernels else {}
    measured = agreements(gguf, args.dump_logits, ids,
                          [engine_tool_flags(args.matmul_activations), *diagnostics.values()])
    report["teacher_forced"] = measured[0]
    log(f"  top-1 {report['teacher_forced']['top1_agreement']}, mean KL "
        f"{report['teacher_forced']['mean_kl_transformers_to_gguf']}")
    if args.diagnose_kernels:
        report["diagnostics"] = {f"teacher_forced_{name}": m for name, m in zip(diagnostics, measured[1:])}
        for name, m in zip(diagnostics, measured[1:]):
            log(f"  diagnostic, {name.replace('_', ' ')}: top-1 {m['top1_agreement']}, mean KL "
                f"{m['mean_kl_transformers_to_gguf']}")
    log("memory: the whole model and each range in its own process")
    report["memory"] = shard_memory(args.measure_shard, gguf, even_cuts(summary.n_layer, NODES))
    report["checks"] = {
        "route_parity": report["route"]["route_equal"],
        "concurrent_sessions": report["route"]["concurrent_equal"],
        "teacher_forced_top1": report["teacher_forced"]["top1_agreement"] >= TOP1_MIN,
        "memory_proportional": report["memory"]["proportional"],
    }
    report["passed"] = all(report["checks"].values())
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def write_entry(models: Path, entry: dict) -> None:
    existing = json.loads(models.read_text()) if models.exists() else []
    existing = [e for e in existing if e.get("model") != entry["model"]] + [entry]
    partial = models.with_name(models.name + ".partial")
    partial.write_text(json.dumps(existing, indent=2) + "\n")
    partial.replace(models)  # a reader sees the old file or the new one, never half of one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--model", required=True, help="the name clients ask for")
    parser.add_argument("--append", type=Path, help="models.json to add (or replace) the entry in, on a pass")
    parser.add_argument("--report", type=Path, help="also write the report here")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=argparse.SUPPRESS)
    parser.add_argument("--positions", type=int, default=POSITIONS, help=argparse.SUPPRESS)
    parser.add_argument("--matmul-activations", choices=MATMUL_ACTIVATIONS, default="quantized",
                        help="the recipe to certify: quantized (llama.cpp's arithmetic) or f32 (quantized weights "
                             "dequantized and dotted with F32 activations; slower decode; ADR 0012)")
    parser.add_argument("--diagnose-kernels", action="store_true",
                        help="also report teacher-forced agreement under the other matmul activations, F16 flash "
                             "attention and upstream's CPU kernels (diagnostics, not checks)")
    for tool in ("worker-binary", "greedy-binary", "dump-logits", "measure-shard", "tokenize-binary"):
        parser.add_argument(f"--{tool}", type=Path, required=True, help="set by bazel run")
    args = parser.parse_args(argv)
    args.gguf = args.gguf.resolve()
    if not args.gguf.is_file():
        parser.error(f"--gguf {args.gguf}: no such file")
    if args.tokens < 1 or args.positions < 2:
        parser.error("--tokens must be at least 1 and --positions at least 2")

    def log(message: str) -> None:
        print(f"certify: {message}", file=sys.stderr, flush=True)

    try:
        summary = gguf_summary(args.gguf)
    except ValueError as err:
        print(f"certify: {err}", file=sys.stderr)
        return 2
    experts = expert_count(args.gguf, summary.architecture)
    if not has_adapter(summary.architecture, experts):
        print(f"certify: architecture {summary.architecture!r}{f' with {experts} experts' if experts else ''} has no "
              f"layer-range adapter (adapters: {', '.join(layer_range_adapters())}); it stays dark", file=sys.stderr)
        return 2
    log(f"{args.gguf.name}: {summary.architecture}, {summary.n_layer} layers; suite {SUITE}")
    report = run_suite(args, log)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    if report["passed"] and args.append:
        entry = entries.certify(args.gguf, args.model, "gguf", args.matmul_activations)
        entry["certification"] = {"suite": SUITE, "passed": True, "checks": report["checks"],
                                  "teacher_forced": report["teacher_forced"], "cuts": report["route"]["cuts"]}
        write_entry(args.append, entry)
        log(f"passed: entry for {args.model!r} written to {args.append}")
    elif report["passed"]:
        log("passed (no --append: nothing written)")
    else:
        failed = [name for name, ok in report["checks"].items() if not ok]
        log(f"FAILED: {', '.join(failed)}; nothing written")
        if failed == ["teacher_forced_top1"] and args.matmul_activations == "quantized" and \
                summary.file_type not in UNQUANTIZED:
            log("  quantized activations may be what costs the agreement: --matmul-activations f32 certifies the "
                "recipe that dequantizes the weights instead (slower decode; ADR 0012)")
    print(json.dumps(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
