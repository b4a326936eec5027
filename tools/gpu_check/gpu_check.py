"""The GPU check of issue 30, point 7: on a machine with a GPU (or Mesa's lavapipe, where it is a
cost, not a speed), from binaries Bazel built, for each device named:

- the worker on that device: its Health (device, the driver's name for it, bytes it holds there,
  the device's free and total memory);
- route parity: a 3-node route, every hop on the device, against the whole model in one process
  on the same device (//cpp/engine:greedy_vulkan or a greedy linked with the device's backend);
- decode speed: the same prompts through a 1-node route (the whole model in one worker on the
  device: the single process) and the 3-node ring, one session at a time, in the same run; the
  ratio and the per-hop overhead ((3-node ms/token - 1-node ms/token) / 2, the same compute in
  both) are what docs/performance-contract.json's gpu_* checks read.

  tools/bazel run //tools/gpu_check:gpu_check -- --out /abs/gpu-check.json [--devices vulkan0,cuda0]
      [--cuda-worker /abs/worker_cuda --cuda-greedy /abs/greedy_cuda] [--tokens 64]

Writes one JSON object (each device's results, the machine, the commit) and exits 1 when any
parity check failed. A device whose worker binary is not given is reported "not run" with why.
Progress goes to stderr."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from meshnet.certify.prompts import PARITY_PROMPTS
from meshnet.certify.route_parity import llama_cpp_greedy
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.recipe import compute_backend_of
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import LocalSwarm, even_cuts


def log(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


def timed_generation(client, ids: list[int], tokens: int) -> tuple[list[int], Optional[float]]:
    """Greedy tokens of one session and its decode time per token (first token to last), ms."""
    session = RouteClient(client, "smollm2")
    got, stamps = [], []
    for token in session.generate(ids, GenerationParams(max_tokens=tokens)):
        got.append(token)
        stamps.append(time.perf_counter())
    per_token = (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1) if len(stamps) > 1 else None
    return got, per_token


def run_route(workdir: Path, gguf: Path, n_layer: int, k: int, worker: Path, device: str, prompts: list[list[int]],
              tokens: int) -> dict:
    with LocalSwarm(workdir, gguf, even_cuts(n_layer, k), backend="gguf", worker_binary=worker, max_sessions=4,
                    threads=1, device=device) as swarm:
        health = {name: {"device": h.device, "device_description": h.device_description,
                         "device_memory_used": h.device_memory_used, "device_memory_free": h.device_memory_free,
                         "device_memory_total": h.device_memory_total}
                  for name, h in sorted(swarm.health().items())}
        with swarm.client() as client:
            timed_generation(client, prompts[0], 4)  # warm-up: shader pipelines, first allocations
            runs = [timed_generation(client, ids, tokens) for ids in prompts]
    per_token = [ms for _, ms in runs if ms is not None]
    return {"nodes": k, "health": health, "tokens": [t for t, _ in runs],
            "decode_ms_per_token": per_token,
            "decode_tok_s": round(1000 * len(per_token) / sum(per_token), 3) if per_token else None}


def check_device(device: str, worker: Optional[Path], greedy: Optional[Path], gguf: Path, n_layer: int,
                 prompts: list[list[int]], tokens: int, work: Path) -> dict:
    if worker is None or greedy is None:
        return {"device": device, "run": False,
                "why": f"no worker and greedy binaries linked with the {compute_backend_of(device)} backend given"}
    started = time.monotonic()
    log(f"{device}: the whole model in one process (greedy)")
    baseline = [llama_cpp_greedy(greedy, gguf, ids, tokens, device=device) for ids in prompts]
    log(f"{device}: 1-node route")
    single = run_route(work / f"{device}-1", gguf, n_layer, 1, worker, device, prompts, tokens)
    log(f"{device}: 3-node route")
    route = run_route(work / f"{device}-3", gguf, n_layer, 3, worker, device, prompts, tokens)
    parity = [got == want for got, want in zip(route["tokens"], baseline)]
    result = {"device": device, "run": True, "software": False, "baseline_tokens": baseline, "parity": parity,
              "parity_ok": all(parity), "single": single, "route_3_nodes": route,
              "duration_s": round(time.monotonic() - started, 1)}
    result["software"] = software_device(result)
    if single["decode_tok_s"] and route["decode_tok_s"]:
        result["ratio_3_nodes_over_single"] = round(route["decode_tok_s"] / single["decode_tok_s"], 4)
        ms1 = sum(single["decode_ms_per_token"]) / len(single["decode_ms_per_token"])
        ms3 = sum(route["decode_ms_per_token"]) / len(route["decode_ms_per_token"])
        result["overhead_ms_per_token_per_hop"] = round((ms3 - ms1) / 2, 4)
    log(f"{device}: parity {parity}, ratio {result.get('ratio_3_nodes_over_single')}, "
        f"per-hop overhead {result.get('overhead_ms_per_token_per_hop')} ms")
    return result


def software_device(result: dict) -> bool:
    """Mesa's lavapipe (llvmpipe) runs Vulkan on the CPU: its speed is a cost, never a GPU figure."""
    return any("llvmpipe" in h["device_description"].lower() for h in result["single"]["health"].values())


def contract_figures(results: list[dict]) -> dict:
    """The lanes docs/performance-contract.json's gpu_* checks read (//python:check_contract
    --results this file), from the first device that ran and is a real GPU; none from lavapipe."""
    for result in results:
        if result["run"] and not software_device(result) and "ratio_3_nodes_over_single" in result:
            return {"device": result["device"], "lanes": {
                "gpu_single_process": {"decode_tok_s": result["single"]["decode_tok_s"]},
                "gpu_ring_3_nodes": {"decode_tok_s": result["route_3_nodes"]["decode_tok_s"],
                                     "overhead_ms_per_token_per_hop": result["overhead_ms_per_token_per_hop"]}}}
    return {"lanes": {}, "why": "no real GPU device ran (lavapipe figures are costs, not GPU speeds)"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the JSON results go")
    parser.add_argument("--devices", default="vulkan0", help="comma-separated: vulkan0, cuda0, ...")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--prompts", type=int, default=3, help="how many of the parity prompts")
    parser.add_argument("--gguf", type=Path, required=True, help="bazel run sets the bundled model")
    parser.add_argument("--vulkan-worker", type=Path, help="bazel run sets //cpp/worker:worker_vulkan")
    parser.add_argument("--vulkan-greedy", type=Path, help="bazel run sets //cpp/engine:greedy_vulkan")
    parser.add_argument("--cuda-worker", type=Path, help="a worker linked with ggml-cuda")
    parser.add_argument("--cuda-greedy", type=Path, help="a greedy linked with ggml-cuda")
    args = parser.parse_args()
    if not 1 <= args.tokens <= 4096 or not 1 <= args.prompts <= len(PARITY_PROMPTS):
        parser.error(f"--tokens 1..4096, --prompts 1..{len(PARITY_PROMPTS)}")
    binaries = {"vulkan": (args.vulkan_worker, args.vulkan_greedy), "cuda": (args.cuda_worker, args.cuda_greedy)}
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    for device in devices:
        try:
            backend = compute_backend_of(device)
        except ValueError as err:
            parser.error(str(err))
        if backend not in binaries:
            parser.error(f"--devices {device}: the check runs vulkanN and cudaN devices")
    gguf = args.gguf.resolve()
    tokenizer = load_tokenizer(gguf)
    prompts = [tokenizer(p)["input_ids"] for p in PARITY_PROMPTS[:args.prompts]]
    n_layer = gguf_summary(gguf).n_layer
    commit = subprocess.run(["git", "-C", os.environ.get("BUILD_WORKSPACE_DIRECTORY", "."), "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    report = {"check": "gpu_check", "commit": commit, "machine": platform.node(), "model": gguf.name,
              "tokens": args.tokens, "prompts": PARITY_PROMPTS[:args.prompts], "devices": []}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for device in devices:
            worker, greedy = binaries[compute_backend_of(device)]
            report["devices"].append(check_device(device, worker and worker.resolve(), greedy and greedy.resolve(),
                                                  gguf, n_layer, prompts, args.tokens, Path(tmp)))
    report["contract_figures"] = contract_figures(report["devices"])
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {args.out}")
    return 0 if all(d["parity_ok"] for d in report["devices"] if d["run"]) else 1


if __name__ == "__main__":
    sys.exit(main())
