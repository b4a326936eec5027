"""Meshnet benchmark: every lane on the same GGUF, prompts, threads and token counts, in one run.

  bazel run //python:bench -- [--out DIR] [--tokens 64] [--prompts 128,512] [--concurrency 1,8]
                               [--all-cells] [--threads 1] [--k 3] [--lanes a,b,...] [--no-runtime-only]
                               [--rounds 1]

Defaults keep a full run under 25 minutes on a 2-core machine: concurrency 1 and 8 (add 2,4 for
the whole curve) for the shortest prompt, longer prompts (there for TTFT) at one stream unless
--all-cells, WAN lanes at one stream.

Lanes: (1) llama_cpp_single_process: upstream llama.cpp, one process (llama-batched-bench);
(2) llama_cpp_rpc_3: the same tool over K local ggml-rpc-servers; (3) transformers_single_process
(fp32, the GGUF's weights dequantized); (4) reference_route_3_nodes; (5) gguf_route_1_node;
(6) gguf_route_3_nodes; gguf_route_3_nodes_plaintext: lane 6 with TLS off on every link (route
tickets are still checked), which prices TLS; and gguf_route_3_nodes_wan: lane 6 with each node
in its own network namespace behind a shaped veth (root only); gateway_3_nodes: the
OpenAI-compatible gateway over lane 6's swarm against the direct client, and 32 concurrent
streams through it (gateway_lane.py). The gguf_route_* lanes are client-driven (the client
sends each decode step, as in v1); gguf_ring_1_node and gguf_ring_3_nodes use ring decode
(ADR 0005), and gguf_ring_3_nodes_spec adds speculation (up to SPECULATE drafts a step) on the
same ordinary prompts. WAN lanes put a DelayProxy (bench/delay_proxy.py) in front of every node,
or every ggml-rpc-server: wan_<d>ms_gguf_ring_3_nodes, wan_<d>ms_llama_cpp_rpc_3 and the copy-heavy
pair wan_<d>ms_gguf_ring_3_nodes_copy / _spec_copy (certify/prompts.py, without and with
speculation) for d in 5, 10 and 25 ms one-way per link, and wan_10ms_gguf_route_3_nodes
(client-driven, N+1 trips). With --synthetic-gguf (the synthetic ~1.1B Llama Q4_0 of
//tools:synthetic_model), the synthetic_1b_* lanes run llama.cpp single-process, the GGUF ring
on 1 and K nodes and the Transformers fp32 reference route (one stream) on it, at the shortest
prompt: weights dominate memory there; without it they report "not available". With
--synthetic-8b-gguf (//tools:synthetic_big_model), synthetic_8b_* run llama.cpp single-process
and the GGUF ring on 4 nodes on the ~8B the same way (issue 29). A
runtime-only comparison runs lanes 1, 3, 5 and 6
again on the same weights dequantized to an F32 GGUF (`llama-quantize --allow-requantize IN OUT
F32`), so runtime gains are reported apart from quantization gains. Drift: teacher-forced top-1
agreement and KL against Transformers fp32 over 256 positions, for both GGUFs.

Threads: every process of every lane gets --threads compute threads (default 1). On this 2-core
machine the K-node lanes put K workers on the same cores; with 2 threads each, ggml's spinning
barriers collapse once several workers compute at once (3 workers x 2 threads, 4 sessions:
3.7 tok/s, against 119 tok/s with 1 thread each), so 1 thread per process is the default that
every lane can share. Use --threads 2 to see the collapse.

Writes DIR/results.json (raw figures; "contract_figures" is the layout the contract check
reads), DIR/summary.md and DIR/plots/*.png, then prints the performance contract check. A lane
that cannot run is recorded with its reason, never with made-up figures. Greedy decoding
throughout; every stream generates exactly --tokens tokens.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from meshnet.bench import contract, llama_lanes, report, schema
from meshnet.bench.lane_table import BATCHED_BASELINE, DEFAULT_LANES, LANES, NAMESPACE_WAN, RUNTIME_ONLY, lanes_help
from meshnet.bench.lanes import Bench, Progress, make_prompts, run_group
from meshnet.bench.measure import find_cell

def contract_figures(results: dict) -> dict:
    """The flat per-lane figures docs/performance-contract.json names."""
    lanes = {}
    for name, lane in results["lanes"].items():
        if not lane.get("available"):
            continue
        short = min(results["meta"]["prompts"])
        fig = {"decode_tok_s": find_cell(lane, short, 1).get("decode_tok_s"),
               "ttft_ms": find_cell(lane, short, 1).get("ttft_ms"),
               "ttft_ms_prompt_512": find_cell(lane, 512, 1).get("ttft_ms"),
               "aggregate_tok_s_c8": find_cell(lane, short, 8).get("aggregate_tok_s"),
               "peak_rss_bytes": lane.get("peak_rss_bytes")}
        for metric in ("overhead_ms_per_token_per_hop", "itl_p50_over_model_ms", "itl_p95_over_model_ms",
                       "decode_compute_ms_per_token", "itl_p50_ms", "itl_p95_ms"):
            fig[metric] = find_cell(lane, short, 1).get(metric)
        if lane.get("nodes"):
            fig["nodes"] = lane["nodes"]
            fig["sum_node_peak_rss_bytes"] = sum(n["peak_rss_bytes"] for n in lane["nodes"])
        controls = [p["peak_rss_bytes"] for p in lane.get("processes", [])
                    if p.get("role", "").endswith("node (python)") and p.get("peak_rss_bytes")]
        if controls:
            fig["max_node_control_peak_rss_mib"] = max(controls) / (1 << 20)
        fig.update(lane.get("figures", {}))  # lanes with figures of their own (the gateway lane)
        lanes[name] = {k: v for k, v in fig.items() if v is not None}
    if BATCHED_BASELINE in lanes:  # lane 1's batched figures, as the contract names them
        lanes["llama_cpp_batched"] = {k: v for k, v in lanes[BATCHED_BASELINE].items()
                                      if k == "aggregate_tok_s_c8"}
    for kind, d in results.get("drift", {}).items():
        if "top1_agreement" in d:
            lanes[f"drift_{kind}"] = d
    return {"lanes": lanes}


def _user_args(argv: Optional[list[str]]) -> list[str]:
    """The command line without the tool paths the BUILD target passes itself."""
    baked = ("--gguf=", "--worker-binary=", "--vulkan-worker-binary=", "--batched-bench=", "--rpc-server=", "--quantize=",
             "--dump-logits=", "--dump-boundaries=", "--calibration=")
    return [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith(baked)]


def host_details() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    mem = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release(),
            "python": platform.python_version()}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, default=os.environ.get("MESHNET_BUNDLED_GGUF"))
    for tool in ("worker-binary", "batched-bench", "rpc-server", "quantize", "dump-logits"):
        p.add_argument(f"--{tool}", type=Path, required=True)
    p.add_argument("--dump-boundaries", type=Path, help="//cpp/engine:dump_boundaries, for the audited lane's verifier")
    p.add_argument("--calibration", type=Path, help="the commitment tolerance (docs/evidence/verification/"
                   "calibration.json), for the audited lane's verifier")
    p.add_argument("--out", type=Path, help="output folder (default: bench-out/<time> in the workspace)")
    p.add_argument("--prompts", default="128,512", help="prompt lengths in tokens")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--all-cells", action="store_true", help="every prompt at every concurrency in the route and "
                   "Transformers lanes (default: prompts longer than the shortest at concurrency 1 only)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per stream (64 to 256)")
    p.add_argument("--threads", type=int, default=1, help="compute threads of every process (see the module doc)")
    p.add_argument("--k", type=int, default=3, help="processes in the split lanes")
    p.add_argument("--lanes", default=",".join(DEFAULT_LANES), help=lanes_help())
    p.add_argument("--vulkan-worker-binary", type=Path, help="//cpp/worker:worker_vulkan, for the *_vulkan lanes")
    p.add_argument("--no-runtime-only", action="store_true", help="skip the F32 runtime-only comparison")
    p.add_argument("--runtime-prompts", default="128")
    p.add_argument("--runtime-concurrency", default="1,8")
    p.add_argument("--wan-delay-ms", type=float, default=10.0, help="one-way delay per node link")
    p.add_argument("--wan-rate-mbit", type=float, default=100.0)
    p.add_argument("--wan-prompts", default="128")
    p.add_argument("--wan-concurrency", default="1")
    p.add_argument("--rounds", type=int, default=1, help="run every lane this many times, interleaved (A, B, "
                   "..., A, B, ...), and report each figure's median over the rounds (bench/rounds.py)")
    p.add_argument("--contract", type=Path, help="default: docs/performance-contract.json of the workspace")
    p.add_argument("--synthetic-gguf", type=Path, help="the synthetic ~1.1B model for the synthetic_1b_* lanes "
                   "(//tools:synthetic_model); those lanes report 'not available' without it")
    p.add_argument("--synthetic-8b-gguf", type=Path, help="the synthetic ~8B model for the synthetic_8b_* lanes "
                   "(//tools:synthetic_big_model); those lanes report 'not available' without it")
    args = p.parse_args(argv)
    for name in args.lanes.split(","):
        if name not in LANES:
            p.error(f"unknown lane {name!r}; lanes: {', '.join(LANES)}")
    if not 1 <= args.rounds <= 9:
        p.error("--rounds must be between 1 and 9")
    if not 1 <= args.tokens <= 4096:
        p.error("--tokens must be between 1 and 4096")
    for path in (args.gguf, args.worker_binary, args.batched_bench, args.rpc_server, args.quantize, args.dump_logits):
        if path is None or not Path(path).exists():
            p.error(f"missing file: {path}")
    for name in ("synthetic_gguf", "synthetic_8b_gguf", "vulkan_worker_binary"):
        if getattr(args, name) is not None:
            if not getattr(args, name).exists():
                p.error(f"missing file: {getattr(args, name)}")
            setattr(args, name, getattr(args, name).resolve())
    for name in ("gguf", "worker_binary", "batched_bench", "rpc_server", "quantize", "dump_logits"):
        setattr(args, name, Path(getattr(args, name)).resolve())
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    workspace = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", "."))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = (args.out or workspace / "bench-out" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(args.lanes.split(",")))  # in the order given (lanes run one after another)
    runtime_names = [] if args.no_runtime_only else [n for n in RUNTIME_ONLY if n in names]
    progress = Progress((len(names) + len(runtime_names)) * args.rounds)
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    from meshnet.reference.model import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="meshnet-bench-") as tmp:
        bench = Bench(args, out, Path(tmp))
        tokenizer = load_tokenizer(args.gguf)
        prompts = make_prompts(tokenizer, bench.prompt_lengths, max(bench.concurrency))
        summary = bench.facts(args.gguf)["summary"]
        results = {"meta": {
            "command": "bazel run //python:bench -- " + shlex.join(_user_args(argv)),
            "started": started.isoformat(timespec="seconds"), "host": host_details(),
            "model": {"name": summary.name, "path": str(args.gguf), "type": summary.file_type,
                      "bytes": args.gguf.stat().st_size, "n_layer": summary.n_layer},
            "threads": args.threads, "new_tokens": args.tokens, "prompts": bench.prompt_lengths,
            "concurrency": bench.concurrency, "k": args.k, "n_ctx": bench.n_ctx, "rounds": args.rounds}}
        results["lanes"] = run_group(bench, args.gguf, names, prompts, bench.prompt_lengths, bench.concurrency,
                                     progress)
        results["drift"] = {}
        progress.lane = "drift"
        progress(f"teacher-forced drift of {summary.file_type} against Transformers fp32")
        results["drift"][summary.file_type.lower()] = bench.drift(args.gguf)
        if runtime_names:
            f32 = Path(tmp) / f"{args.gguf.stem}-f32.gguf"
            progress(f"writing the F32 GGUF: llama-quantize --allow-requantize {args.gguf.name} {f32.name} F32")
            cmd = llama_lanes.quantize_to_f32(args.quantize, args.gguf, f32)
            rt_prompts_len = [int(x) for x in args.runtime_prompts.split(",")]
            rt_conc = [int(x) for x in args.runtime_concurrency.split(",")]
            rt_prompts = {length: make_prompts(tokenizer, [length], max(rt_conc))[length] for length in rt_prompts_len}
            results["runtime_only"] = {
                "model": {"type": "F32", "bytes": f32.stat().st_size,
                          "command": "llama-quantize " + shlex.join([Path(c).name for c in cmd[1:]])},
                "lanes": run_group(bench, f32, runtime_names, rt_prompts, rt_prompts_len, rt_conc, progress)}
            progress.lane = "drift"
            progress("teacher-forced drift of F32 against Transformers fp32")
            results["drift"]["f32"] = bench.drift(f32)
        wan = results["lanes"].get(NAMESPACE_WAN, {})
        if wan.get("available"):
            results["wan"] = {"applied": wan.get("wan"), "notes": wan.get("notes", [])}
        results["meta"]["duration_s"] = round(time.monotonic() - t0, 1)
        results["meta"]["schema_problems"] = schema.problems(results)  # bench/schema.py; [] when it conforms
        for problem in results["meta"]["schema_problems"]:
            print(f"results do not fit bench/schema.py: {problem}", file=sys.stderr)
        results["contract_figures"] = contract_figures(results)
    contract_path = args.contract or workspace / "docs" / "performance-contract.json"
    contract_doc = json.loads(contract_path.read_text())
    results["meta"]["node_budget"] = contract.node_budget(contract_doc)
    outcomes = contract.evaluate(contract_doc, results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    written = report.write_report(results, out, outcomes)
    for o in outcomes:
        print(contract.format_outcome(o))
    print(f"contract: {contract.summary(outcomes)}")
    print(f"wrote {out / 'results.json'}, {len(written)} report files under {out} "
          f"({results['meta']['duration_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
