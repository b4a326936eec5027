"""Single-stream speed of every route kind, side by side in one run.

  bazel run //python:bench_routes -- --out results.json [--tokens 64] [--repeats 3]

Lanes (same prompt, same new tokens, greedy, one compute thread per process):
  llama_cpp_single_process  the whole model in one process (//cpp/engine:greedy)
  llama_cpp_rpc_3           upstream llama.cpp RPC: llama-bench over 3 local ggml-rpc-servers
                            (decode only; llama-bench reports no TTFT)
  gguf_route_1_node         tracker + 1 GGUF node [0,30) through RouteSession
  gguf_route_3_nodes        tracker + 3 GGUF nodes [0,10) [10,20) [20,30)
  reference_route_3_nodes   tracker + 3 Transformers nodes, same split
TTFT and decode tok/s are medians over repeats; ratios are against the llama.cpp lane. A
measurement for notes and the performance contract, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshnet.client.session import GenerationParams, RouteSession
from meshnet.process import free_port
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import LocalSwarm

CUTS = {"1": [(0, 30)], "3": [(0, 10), (10, 20), (20, 30)]}


def llama_cpp(greedy: Path, gguf: Path, ids: list[int], tokens: int) -> tuple[list[int], float, float]:
    proc = subprocess.run([str(greedy), str(gguf), str(tokens), *map(str, ids)], capture_output=True, text=True,
                          check=True, env=dict(os.environ, MESHNET_THREADS="1"))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["tokens"], result["ttft_ms"] / 1000, result["decode_tok_s"]


def llama_cpp_rpc(bench: Path, rpc_server: Path, gguf: Path, servers: int, tokens: int,
                  repeats: int) -> list[tuple[None, None, float]]:
    """Decode tok/s of llama-bench with the model split over `servers` local rpc-servers."""
    ports = [free_port() for _ in range(servers)]
    procs = [subprocess.Popen([str(rpc_server), "-p", str(port), "-t", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for port in ports]
    try:
        time.sleep(1.0)
        endpoints = ",".join(f"127.0.0.1:{port}" for port in ports)
        proc = subprocess.run([str(bench), "-m", str(gguf), "-rpc", endpoints, "-ngl", "99", "-t", "1", "-p", "0",
                               "-n", str(tokens), "-r", str(repeats), "-o", "json"], capture_output=True, text=True,
                              check=True)
        rows = [r for r in json.loads(proc.stdout) if r.get("n_gen")]
        return [(None, None, float(rows[0]["avg_ts"]))]
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def route_lane(workdir: Path, gguf: Path, worker: Path, backend: str, cuts, ids, tokens, repeats):
    with LocalSwarm(workdir, gguf, cuts, backend=backend, worker_binary=worker, threads=1) as swarm:
        with swarm.client() as tracker:
            runs = []
            for i in range(repeats + 1):  # the first run warms up
                session = RouteSession(tracker, "smollm2", client_id="bench")
                started = time.perf_counter()
                out = list(session.generate(ids, GenerationParams(max_tokens=tokens)))
                total = time.perf_counter() - started
                if i:
                    runs.append((out, session.ttft, (tokens - 1) / (total - session.ttft)))
            return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=os.environ.get("MESHNET_BUNDLED_GGUF"))
    parser.add_argument("--worker-binary", type=Path, required=True)
    parser.add_argument("--greedy-binary", type=Path, required=True)
    parser.add_argument("--llama-bench", type=Path, required=True)
    parser.add_argument("--rpc-server", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompt", default="Explain why the sky is blue in simple words.")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gguf, worker, greedy = (Path(p).resolve() for p in (args.gguf, args.worker_binary, args.greedy_binary))
    ids = load_tokenizer(gguf)(args.prompt)["input_ids"]
    lanes = {}
    print("lane llama_cpp_single_process ...", file=sys.stderr, flush=True)
    llama_cpp(greedy, gguf, ids, 4)
    lanes["llama_cpp_single_process"] = [llama_cpp(greedy, gguf, ids, args.tokens) for _ in range(args.repeats)]
    print("lane llama_cpp_rpc_3 ...", file=sys.stderr, flush=True)
    lanes["llama_cpp_rpc_3"] = llama_cpp_rpc(Path(args.llama_bench).resolve(), Path(args.rpc_server).resolve(), gguf,
                                             3, args.tokens, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        for name, backend, nodes in (("gguf_route_1_node", "gguf", "1"), ("gguf_route_3_nodes", "gguf", "3"),
                                     ("reference_route_3_nodes", "reference", "3")):
            print(f"lane {name} ...", file=sys.stderr, flush=True)
            lanes[name] = route_lane(Path(tmp) / name, gguf, worker, backend, CUTS[nodes], ids, args.tokens,
                                     args.repeats)
    base = lanes["llama_cpp_single_process"]
    result = {"prompt_tokens": len(ids), "new_tokens": args.tokens, "repeats": args.repeats, "threads_per_process": 1,
              "lanes": {}}
    for name, runs in lanes.items():
        lane = {"decode_tok_s": round(statistics.median(r[2] for r in runs), 2)}
        if runs[0][1] is not None:
            lane["ttft_ms"] = round(statistics.median(r[1] for r in runs) * 1000, 1)
            lane["same_tokens_as_llama_cpp"] = runs[0][0] == base[0][0]
        result["lanes"][name] = lane
    ref = result["lanes"]["llama_cpp_single_process"]
    for lane in result["lanes"].values():
        lane["decode_vs_llama_cpp"] = round(lane["decode_tok_s"] / ref["decode_tok_s"], 3)
        if "ttft_ms" in lane:
            lane["ttft_vs_llama_cpp"] = round(lane["ttft_ms"] / ref["ttft_ms"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
