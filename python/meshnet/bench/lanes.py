"""The bench's lanes: their names and labels, what each one runs (Bench and the runners of
run_group), and the prompts and model facts they share. harness.py is the command around them:
arguments, progress, results, report and the contract check. Every lane is described in
harness.py's docstring.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import gguf as gguf_lib

from meshnet.bench import gateway_lane, llama_lanes, route_lanes
from meshnet.bench.measure import find_cell
from meshnet.memory_cap import RssWatch
from meshnet.bench.prompts import BENCH_TEXT, COPY_HEAVY
from meshnet.bench.rounds import merge_rounds
from meshnet.bench.route_lanes import RouteOptions
from meshnet.bench.schema import Lane
from meshnet.gateway.json_grammar import schema_grammar
from meshnet.process import child_env
from meshnet.recipe.fingerprint import gguf_summary, owned_tensor_names
from meshnet.swarm.local import even_cuts
from meshnet.swarm.wan import WanLink

WAN_DELAYS_MS = (5, 10, 25)  # one-way delay per link in the proxy WAN lanes


def wan_lane_names(delay_ms: int) -> tuple[str, ...]:
    """The lanes run at one delay: the ring, RPC, and the copy-heavy pair without and with speculation."""
    return (f"wan_{delay_ms}ms_gguf_ring_3_nodes", f"wan_{delay_ms}ms_llama_cpp_rpc_3",
            f"wan_{delay_ms}ms_gguf_ring_3_nodes_copy", f"wan_{delay_ms}ms_gguf_ring_3_nodes_spec_copy")


# Lanes on the synthetic ~1.1B model (//tools:synthetic_model; issue 16), run with
# --synthetic-gguf: weights dominate memory there, as they do for the models Meshnet is for.
SYNTHETIC_LANES = ("synthetic_1b_llama_cpp_single_process", "synthetic_1b_gguf_ring_1_node",
                   "synthetic_1b_gguf_ring_3_nodes", "synthetic_1b_reference_route_3_nodes")
# Issue 29: the synthetic ~8B (//tools:synthetic_big_model), run with --synthetic-8b-gguf: a
# 4-node ring against one llama.cpp process holding the whole model.
BIG_MODEL_NODES = 4
# The last two are diagnostics (no contract check): upstream without its repacked copy of the
# weights (what the nodes run: the mapped file itself), and the ring on upstream's CPU kernels.
BIG_MODEL_LANES = ("synthetic_8b_llama_cpp_single_process", "synthetic_8b_gguf_ring_4_nodes",
                   "synthetic_8b_llama_cpp_single_process_no_repack",
                   "synthetic_8b_gguf_ring_4_nodes_optimized_kernels")
# Issue 17: the ring with audits at 5% (commitments kept, the verifier role running on this
# machine) against no commitments and no audits; and every session audited, the verifier's
# worst case here (a lane's few sessions seldom draw a 5% audit), which also measures its cost.
AUDIT_LANES = ("gguf_ring_3_nodes_unaudited", "gguf_ring_3_nodes_audited", "gguf_ring_3_nodes_audited_all")
# Issue 30: the bundled model's ring with every node on Vulkan (`--device vulkan0`), 1 node (the
# whole model in one worker on the device) and 3. On lavapipe (no GPU) their speed is a cost of
# running the Vulkan code, never a GPU figure; tools/gpu_check.py measures real GPUs.
VULKAN_LANES = ("gguf_ring_1_node_vulkan", "gguf_ring_3_nodes_vulkan")
LANES = ("transformers_single_process", "llama_cpp_single_process", "llama_cpp_rpc_3", "gguf_route_1_node",
         "gguf_route_3_nodes", "gguf_ring_1_node", "gguf_ring_3_nodes", "gguf_route_3_nodes_plaintext",
         "reference_route_3_nodes", "gguf_route_3_nodes_wan",
         *(name for d in WAN_DELAYS_MS for name in wan_lane_names(d)), "wan_10ms_gguf_route_3_nodes",
         "gguf_ring_3_nodes_spec", "gguf_ring_3_nodes_json", "gateway_3_nodes", *AUDIT_LANES, "gguf_ring_3_nodes_optimized_kernels",
         "gguf_ring_1_node_optimized_kernels", "gguf_ring_3_nodes_f32_matmul", *SYNTHETIC_LANES, *BIG_MODEL_LANES, *VULKAN_LANES)
# Run by default: every lane but the Vulkan ones, which need a worker linked with Vulkan and, on
# Mesa's lavapipe, take minutes for what the CPU lanes do in seconds (named with --lanes).
DEFAULT_LANES = tuple(name for name in LANES if name not in VULKAN_LANES)
SPECULATE = 8  # the most tokens the first hop drafts per step in the speculation lanes
# The JSON lane's grammar: the document cannot end within a lane's new tokens, so each one is
# drawn inside it (once a JSON answer is complete only end-of-generation tokens are allowed).
OPEN_JSON_GRAMMAR = schema_grammar({"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 64})
LABELS = {
    "llama_cpp_single_process": "llama.cpp, one process (upstream, batched-bench)",
    "llama_cpp_rpc_3": "llama.cpp RPC over {k} local rpc-servers",
    "transformers_single_process": "Transformers fp32, one process",
    "reference_route_3_nodes": "Transformers reference route, {k} nodes",
    "gguf_route_1_node": "GGUF route, 1 node, client-driven decode",
    "gguf_route_3_nodes": "GGUF route, {k} nodes, client-driven decode",
    "gguf_ring_1_node": "GGUF route, 1 node, ring decode",
    "gguf_ring_1_node_vulkan": "GGUF route, 1 node, ring decode, on vulkan0",
    "gguf_ring_3_nodes_vulkan": "GGUF route, {k} nodes, ring decode, every node on vulkan0",
    "gguf_ring_3_nodes": "GGUF route, {k} nodes, ring decode",
    "gguf_ring_3_nodes_optimized_kernels": "GGUF route, {k} nodes, ring decode, upstream's CPU kernels and F16 flash "
                                           "attention (batched sessions may differ from solo; ADR 0009, 0010)",
    "gguf_ring_1_node_optimized_kernels": "GGUF route, 1 node, ring decode, upstream's CPU kernels and F16 flash "
                                          "attention: against gguf_ring_1_node, what batch invariance costs at c=8; "
                                          "against llama.cpp batched, the runtime's own cost (issue 31)",
    "gguf_ring_3_nodes_f32_matmul": "GGUF route, {k} nodes, ring decode, F32 matmul activations (quantized weights "
                                    "dequantized; the recipe of ADR 0012)",
    "gguf_ring_3_nodes_unaudited": "GGUF route, {k} nodes, ring decode, no commitments, no audits",
    "gguf_ring_3_nodes_audited": "GGUF route, {k} nodes, ring decode, audits at 5% (verifier on this machine)",
    "gguf_ring_3_nodes_audited_all": "GGUF route, {k} nodes, ring decode, every session audited (verifier on this "
                                     "machine)",
    **{f"wan_{d}ms_gguf_ring_3_nodes": f"GGUF route, {{k}} nodes, ring decode, {d} ms one-way per link (delay proxy)"
       for d in WAN_DELAYS_MS},
    **{f"wan_{d}ms_llama_cpp_rpc_3": f"llama.cpp RPC over {{k}} rpc-servers, {d} ms one-way per link (delay proxy)"
       for d in WAN_DELAYS_MS},
    "wan_10ms_gguf_route_3_nodes": "GGUF route, {k} nodes, client-driven decode, 10 ms one-way per link (delay proxy)",
    "gguf_ring_3_nodes_spec": "GGUF route, {k} nodes, ring decode with speculation (prompt lookup), ordinary prompts",
    "gguf_ring_3_nodes_json": "GGUF route, {k} nodes, ring decode sampled under a JSON-schema grammar on the last "
                              "hop (issue 33; an array of at least 64 short strings, so that every new token is "
                              "inside the document): against gguf_ring_3_nodes, the last hop's sampling time per "
                              "token",
    **{f"wan_{d}ms_gguf_ring_3_nodes_copy": f"GGUF route, {{k}} nodes, ring decode, copy-heavy prompts, {d} ms one-way "
       "per link" for d in WAN_DELAYS_MS},
    **{f"wan_{d}ms_gguf_ring_3_nodes_spec_copy": f"GGUF route, {{k}} nodes, ring decode with speculation, copy-heavy "
       f"prompts, {d} ms one-way per link" for d in WAN_DELAYS_MS},
    "gguf_route_3_nodes_plaintext": "GGUF route, {k} nodes, plaintext links (--insecure; tickets on)",
    "gguf_route_3_nodes_wan": "GGUF route, {k} nodes in network namespaces (WAN)",
    "gateway_3_nodes": "OpenAI-compatible gateway over a GGUF route of {k} nodes, vs the direct client",
    "synthetic_1b_llama_cpp_single_process": "synthetic 1.1B Q4_0: llama.cpp, one process (batched-bench)",
    "synthetic_1b_gguf_ring_1_node": "synthetic 1.1B Q4_0: GGUF route, 1 node, ring decode",
    "synthetic_1b_gguf_ring_3_nodes": "synthetic 1.1B Q4_0: GGUF route, {k} nodes, ring decode",
    "synthetic_1b_reference_route_3_nodes": "synthetic 1.1B: Transformers fp32 reference route, {k} nodes",
    "synthetic_8b_llama_cpp_single_process": "synthetic 8B Q4_0: llama.cpp, one process (batched-bench)",
    "synthetic_8b_gguf_ring_4_nodes": f"synthetic 8B Q4_0: GGUF route, {BIG_MODEL_NODES} nodes, ring decode",
    "synthetic_8b_llama_cpp_single_process_no_repack": "synthetic 8B Q4_0: llama.cpp, one process, --no-repack",
    "synthetic_8b_gguf_ring_4_nodes_optimized_kernels": f"synthetic 8B Q4_0: GGUF route, {BIG_MODEL_NODES} nodes, ring "
                                                        "decode, upstream's CPU kernels (not the certified runtime)",
}
RUNTIME_ONLY = ("transformers_single_process", "llama_cpp_single_process", "gguf_route_1_node", "gguf_route_3_nodes")


class Progress:
    """One line per event on stderr, with the elapsed time and the lane's place in the run."""

    def __init__(self, total: int) -> None:
        self.total, self.index, self.lane, self.t0 = total, 0, "", time.monotonic()

    def start_lane(self, name: str) -> None:
        self.index += 1
        self.lane = name
        self("starting")

    def __call__(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.t0)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] lane {self.index}/{self.total} {self.lane}: {message}",
              file=sys.stderr, flush=True)


def make_prompts(tokenizer, lengths: list[int], streams: int) -> dict[int, list[list[int]]]:
    """`streams` different prompts of exactly each length (the text rotated by a sentence each)."""
    sentences = [s.strip() + "." for s in BENCH_TEXT.split(".") if s.strip()]
    prompts = {}
    for length in lengths:
        prompts[length] = []
        for i in range(streams):
            rotated = " ".join(sentences[i % len(sentences):] + sentences[: i % len(sentences)])
            ids: list[int] = []
            while len(ids) < length:
                ids += tokenizer(rotated + " ")["input_ids"]
            prompts[length].append(ids[:length])
    return prompts


def model_facts(path: Path) -> dict:
    """Tensor bytes per layer range and KV bytes per token and layer (f16 K and V)."""
    reader = gguf_lib.GGUFReader(path, "r")
    summary = gguf_summary(path)
    arch = summary.architecture

    def field(key: str) -> int:
        f = reader.fields[f"{arch}.{key}"]
        return int(f.parts[f.data[0]][0])

    heads, heads_kv = field("attention.head_count"), field("attention.head_count_kv")
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}

    def weight_bytes(start: int, end: int) -> int:
        return sum(sizes[n] for n in owned_tensor_names(summary, sizes, start, end, path))

    return {"summary": summary, "weight_bytes": weight_bytes, "total_bytes": sum(sizes.values()),
            "kv_bytes_per_token_layer": 2 * 2 * summary.n_embd * heads_kv // heads}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Bench:
    def __init__(self, args: argparse.Namespace, out: Path, work: Path) -> None:
        self.args, self.out, self.work = args, out, work
        self.prompt_lengths = [int(x) for x in args.prompts.split(",")]
        self.concurrency = [int(x) for x in args.concurrency.split(",")]
        self.wan_prompt_lengths = [int(x) for x in args.wan_prompts.split(",")]
        self.wan_concurrency = [int(x) for x in args.wan_concurrency.split(",")]
        per_session = -(-(max(self.prompt_lengths) + args.tokens) // 256) * 256
        self.n_ctx = max(self.concurrency) * per_session  # llama.cpp lanes: every stream at once
        # nodes split their KV evenly over max_sessions (at least 8) sessions, each needing per_session
        self.node_kv_tokens = max(max(self.concurrency), 8) * per_session
        self._facts: dict[Path, dict] = {}

    def grid(self, prompt_lengths: list[int], concurrency: list[int]) -> list[tuple[int, int]]:
        """The (prompt length, concurrency) cells a lane runs: the shortest prompt at every
        concurrency, longer prompts (there for TTFT) at concurrency 1 only, unless --all-cells."""
        short = min(prompt_lengths)
        return [(length, c) for length in prompt_lengths for c in concurrency
                if self.args.all_cells or length == short or c == 1]

    def lane(self, name: str, fn: Callable[[], Lane], progress: Progress, k: int) -> Lane:
        progress.start_lane(name)
        started = time.monotonic()
        try:
            lane = fn()
            lane["available"] = True
        except LaneUnavailable as e:
            lane = {"available": False, "reason": str(e)}
        except Exception as e:  # noqa: BLE001 - a broken lane is reported, the others still run
            traceback.print_exc()
            lane = {"available": False, "reason": f"failed: {type(e).__name__}: {str(e)[-600:]}"}
        lane["label"] = LABELS[name].format(k=k)
        lane["duration_s"] = round(time.monotonic() - started, 1)
        progress("done" if lane["available"] else f"not available: {lane['reason']}")
        return lane

    def llama_single(self, model: Path, prompts: list[int], concurrency: list[int], extra: tuple = ()) -> Lane:
        a = self.args
        lane = llama_lanes.single_process(a.batched_bench, model, self.grid(prompts, concurrency), a.tokens,
                                          a.threads, self.n_ctx, self.work, extra)
        lane["kv_bytes"] = self.n_ctx * self.facts(model)["kv_bytes_per_token_layer"] * self.n_layer(model)
        lane["notes"] = ["upstream llama.cpp (no Meshnet patches) at the pinned commit; prompts are random tokens "
                         "(batched-bench), so output drift is measured separately (teacher-forced)"]
        return lane

    def llama_rpc(self, model: Path, delay_ms: Optional[float] = None) -> Lane:
        a = self.args
        prompts, concurrency = self.prompt_lengths, self.concurrency
        if delay_ms is not None:
            prompts, concurrency = self.wan_prompt_lengths, self.wan_concurrency
        lane = llama_lanes.rpc_split(a.batched_bench, a.rpc_server, model, a.k, self.grid(prompts, concurrency),
                                     a.tokens, a.threads, self.n_ctx, self.work, delay_ms,
                                     a.wan_rate_mbit if delay_ms is not None else None)
        lane["notes"] = [f"upstream llama.cpp, every layer offloaded to {a.k} ggml-rpc-servers on loopback "
                         f"(-ngl 99), {a.threads} threads each"]
        if delay_ms is not None:
            lane["notes"].append(f"each rpc-server behind a delay proxy: {delay_ms:g} ms one-way, "
                                 f"{a.wan_rate_mbit:g} Mbit/s per link")
        return lane

    def transformers(self, model: Path, prompts: dict, concurrency: list[int], progress: Progress) -> Lane:
        a = self.args
        prompts_file = self.work / "prompts.json"
        prompts_file.write_text(json.dumps({str(k): v for k, v in prompts.items()}))
        out_file = self.work / "transformers.json"
        cmd = [sys.executable, "-m", "meshnet.bench.transformers_lane", "--gguf", str(model), "--prompts",
               str(prompts_file), "--cells", ",".join(f"{length}x{c}" for length, c in self.grid(list(prompts),
                                                                                                   concurrency)),
               "--tokens", str(a.tokens),
               "--threads", str(a.threads), "--out", str(out_file)]
        log = self.work / "transformers.log"
        with open(log, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env())
            watch = RssWatch(proc.pid)
            for line in proc.stdout:
                if line.startswith("{"):
                    length, c = json.loads(line)["cell"]
                    progress(f"prompt {length}, concurrency {c} done")
            code = proc.wait()
            rss = watch.result()
        if code != 0:
            raise RuntimeError(f"transformers lane exited {code}: {log.read_text()[-1500:]}")
        result = json.loads(out_file.read_text())
        return {"cells": result["cells"], "tokens": {int(k): v for k, v in result["tokens"].items()},
                "processes": [{"role": "python (transformers)", "peak_rss_bytes": rss}], "peak_rss_bytes": rss,
                "notes": [f"fp32, torch threads {a.threads}; c streams run as one batch (lockstep)"]}

    def route(self, model: Path, backend: str, k: int, prompts: dict, concurrency: list[int], progress: Progress,
              wan: Optional[WanLink] = None, options: RouteOptions = RouteOptions()) -> Lane:
        a = self.args
        facts = self.facts(model)
        lane_cuts = even_cuts(facts["summary"].n_layer, k)
        extra = {}
        if wan is not None:
            extra = {"host": wan.host, "node_hosts": [wan.node_host(i) for i in range(k)],
                     "node_prefixes": [wan.prefix(i) for i in range(k)]}
        workdir = self.work / (f"{backend}-{k}-{model.stem}{'-wan' if wan else ''}"
                               f"{'-plaintext' if options.insecure else ''}{'-ring' if options.ring else ''}"
                               f"{f'-delay{options.delay_ms:g}' if options.delay_ms is not None else ''}"
                               f"{f'-spec{options.speculate}' if options.speculate else ''}"
                               f"{'' if options.commitments else '-nocommit'}"
                               f"{'' if options.reference_kernels else '-optimized'}"
                               f"{'-f32matmul' if options.matmul_activations == 'f32' else ''}"
                               f"{'' if options.device == 'cpu' else '-' + options.device}"
                               f"{f'-audit{options.audit_rate:g}' if options.verifier else ''}"
                               f"-p{min(prompts)}")
        worker = a.worker_binary
        if options.device != "cpu":
            if a.vulkan_worker_binary is None:
                raise RuntimeError(f"--device {options.device} needs --vulkan-worker-binary (bazel run sets it)")
            worker = a.vulkan_worker_binary
        result = route_lanes.run_lane(workdir, model, lane_cuts, backend, worker, prompts,
                                      self.grid(list(prompts), concurrency),
                                      a.tokens, a.threads, self.node_kv_tokens, progress, options=options, **extra)
        processes, nodes = [], []
        for node, cut in zip(result["nodes"], lane_cuts):
            processes += node["processes"]
            rss = sum(p["peak_rss_bytes"] or 0 for p in node["processes"])
            kv = node["kv_cells_total"] * facts["kv_bytes_per_token_layer"] * (cut[1] - cut[0])
            nodes.append({"node": node["node"], "layers": list(cut), "peak_rss_bytes": rss,
                          "weight_bytes": facts["weight_bytes"](*cut), "kv_bytes": kv})
        notes = [f"{backend} backend, {a.threads} compute threads per node, swarm ready in {result['startup_s']} s",
                 "plaintext links (--insecure), route tickets checked" if options.insecure else
                 "TLS on every link (pinned certificates), route tickets checked",
                 "ring decode: the last hop sends each token to the first hop" if options.ring else
                 "client-driven decode: the client sends each decode step"]
        if options.delay_ms is not None:
            notes.append(f"every link into a node through a delay proxy: {options.delay_ms:g} ms one-way, "
                         f"{options.rate_mbit:g} Mbit/s")
        if options.speculate:
            notes.append(f"speculation: the first hop drafts up to {options.speculate} tokens per step by prompt "
                         "lookup; cells report drafted and accepted tokens")
        if options.device != "cpu":
            notes.append(f"every node computes on {options.device}: {result.get('devices')}; on Mesa's lavapipe "
                         "(llvmpipe) this is the cost of running the Vulkan shaders on the CPU, not a GPU speed")
        if backend == "reference":
            notes.append("the reference shard does not report compute time, so seam overhead is n/a")
        if not options.commitments:
            notes.append("workers keep no commitments (--no-commitments) and the tracker audits nothing")
        if options.verifier is not None:
            audits = result.get("audits", {})
            notes.append(f"audits: the tracker samples {options.audit_rate:.0%} of closed route sessions; the verifier "
                         f"role ran on this machine and reported {audits.get('audits', 0)} audits during the lane "
                         f"(replay {audits.get('verifier_ms_per_audited_token')} ms per audited token; signed "
                         f"commitments {audits.get('commitment_bytes_per_position_per_hop')} bytes per position per "
                         "hop, kept in each worker's memory, never sent on the data path)")
        return {"cells": result["cells"], "tokens": result["tokens"], "processes": processes, "nodes": nodes,
                "peak_rss_bytes": sum(n["peak_rss_bytes"] for n in nodes), "kv_bytes": sum(n["kv_bytes"] for n in nodes),
                "notes": notes}

    def gateway(self, model: Path, prompts: dict, progress: Progress) -> Lane:
        a = self.args
        short = min(prompts)
        lane = gateway_lane.run_lane(self.work / f"gateway-{a.k}-{model.stem}", model,
                                     even_cuts(self.n_layer(model), a.k), a.worker_binary, prompts[short], a.tokens,
                                     a.threads, progress)
        lane["notes"].append(f"{a.threads} compute threads per node; swarm and gateway ready in {lane['startup_s']} s")
        return lane

    def verifier_tools(self) -> tuple[Path, Path]:
        """(dump_boundaries, calibration.json) for the verifier role; LaneUnavailable without them."""
        a = self.args
        if a.dump_boundaries is None or a.calibration is None:
            raise LaneUnavailable("needs --dump-boundaries and --calibration (//python:bench passes both)")
        return a.dump_boundaries, a.calibration

    def synthetic(self, size: str = "1b") -> Path:
        """The synthetic ~1.1B GGUF of --synthetic-gguf, or the ~8B of --synthetic-8b-gguf (`size`
        "8b"); LaneUnavailable without it."""
        flag, tool = {"1b": ("synthetic-gguf", "synthetic_model"),
                      "8b": ("synthetic-8b-gguf", "synthetic_big_model")}[size]
        path = getattr(self.args, flag.replace("-", "_"))
        if path is None:
            raise LaneUnavailable(f"needs --{flag} (tools/bazel run //tools:{tool} prints its path)")
        return path

    def facts(self, model: Path) -> dict:
        if model not in self._facts:
            self._facts[model] = model_facts(model)
        return self._facts[model]

    def n_layer(self, model: Path) -> int:
        return self.facts(model)["summary"].n_layer

    def drift(self, model: Path) -> dict:
        out = self.work / f"drift-{model.stem}.json"
        subprocess.run([sys.executable, "-m", "meshnet.bench.drift", "--gguf", str(model), "--dump-logits",
                        str(self.args.dump_logits), "--out", str(out)], check=True, capture_output=True,
                       env=child_env())
        d = json.loads(out.read_text())
        return {"top1_agreement": d["top1_agreement"], "mean_kl": d["mean_kl_transformers_to_gguf"],
                "max_kl": d["max_kl"], "positions": d["positions"]}


class LaneUnavailable(Exception):
    """The lane cannot run here (a missing component or privilege); the message says why."""


def run_group(bench: Bench, model: Path, names: list[str], prompts: dict, prompt_lengths: list[int],
              concurrency: list[int], progress: Progress) -> dict[str, Lane]:
    k = bench.args.k
    runners = {
        "transformers_single_process": lambda: bench.transformers(model, prompts, concurrency, progress),
        "llama_cpp_single_process": lambda: bench.llama_single(model, prompt_lengths, concurrency),
        "llama_cpp_rpc_3": lambda: bench.llama_rpc(model),
        "gguf_route_1_node": lambda: bench.route(model, "gguf", 1, prompts, concurrency, progress),
        "gguf_route_3_nodes": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress),
        "gguf_route_3_nodes_plaintext": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                            options=RouteOptions(insecure=True)),
        "gguf_ring_1_node": lambda: bench.route(model, "gguf", 1, prompts, concurrency, progress,
                                                options=RouteOptions(ring=True)),
        "gguf_ring_3_nodes": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                 options=RouteOptions(ring=True)),
        "gguf_ring_1_node_vulkan": lambda: bench.route(model, "gguf", 1, prompts, concurrency, progress,
                                                       options=RouteOptions(ring=True, device="vulkan0")),
        "gguf_ring_3_nodes_vulkan": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                        options=RouteOptions(ring=True, device="vulkan0")),
        "wan_10ms_gguf_route_3_nodes": lambda: proxy_wan_lane(bench, model, prompts, progress, 10, ring=False),
        "gguf_ring_3_nodes_optimized_kernels": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                                   options=RouteOptions(ring=True,
                                                                                        reference_kernels=False)),
        "gguf_ring_1_node_optimized_kernels": lambda: bench.route(model, "gguf", 1, prompts, concurrency, progress,
                                                                  options=RouteOptions(ring=True,
                                                                                       reference_kernels=False)),
        "gguf_ring_3_nodes_f32_matmul": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                            options=RouteOptions(ring=True, matmul_activations="f32")),
        "gguf_ring_3_nodes_json": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                      options=RouteOptions(ring=True, grammar=OPEN_JSON_GRAMMAR)),
        "gguf_ring_3_nodes_spec": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                      options=RouteOptions(ring=True, speculate=SPECULATE)),
        "gguf_ring_3_nodes_unaudited": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                           options=RouteOptions(ring=True, commitments=False,
                                                                                audit_rate=0.0)),
        "gguf_ring_3_nodes_audited": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                         options=RouteOptions(ring=True, audit_rate=0.05,
                                                                              verifier=bench.verifier_tools())),
        "gguf_ring_3_nodes_audited_all": lambda: bench.route(model, "gguf", k, prompts, concurrency, progress,
                                                             options=RouteOptions(ring=True, audit_rate=1.0,
                                                                                  verifier=bench.verifier_tools())),
        "reference_route_3_nodes": lambda: bench.route(model, "reference", k, prompts, concurrency, progress),
        "gguf_route_3_nodes_wan": lambda: wan_lane(bench, model, prompts, progress),
        "gateway_3_nodes": lambda: bench.gateway(model, prompts, progress),
    }
    short = {min(prompt_lengths): prompts[min(prompt_lengths)]}
    runners.update({
        "synthetic_1b_llama_cpp_single_process": lambda: bench.llama_single(bench.synthetic(), list(short),
                                                                            concurrency),
        "synthetic_1b_gguf_ring_1_node": lambda: bench.route(bench.synthetic(), "gguf", 1, short, concurrency,
                                                             progress, options=RouteOptions(ring=True)),
        "synthetic_1b_gguf_ring_3_nodes": lambda: bench.route(bench.synthetic(), "gguf", k, short, concurrency,
                                                              progress, options=RouteOptions(ring=True)),
        "synthetic_1b_reference_route_3_nodes": lambda: bench.route(bench.synthetic(), "reference", k, short, [1],
                                                                    progress),
        "synthetic_8b_llama_cpp_single_process": lambda: bench.llama_single(bench.synthetic("8b"), list(short),
                                                                            concurrency),
        "synthetic_8b_gguf_ring_4_nodes": lambda: bench.route(bench.synthetic("8b"), "gguf", BIG_MODEL_NODES, short,
                                                              concurrency, progress, options=RouteOptions(ring=True)),
        "synthetic_8b_llama_cpp_single_process_no_repack": lambda: bench.llama_single(
            bench.synthetic("8b"), list(short), concurrency, extra=("--no-repack",)),
        "synthetic_8b_gguf_ring_4_nodes_optimized_kernels": lambda: bench.route(
            bench.synthetic("8b"), "gguf", BIG_MODEL_NODES, short, concurrency, progress,
            options=RouteOptions(ring=True, reference_kernels=False)),
    })
    speculation_pairs = [("gguf_ring_3_nodes_spec", "gguf_ring_3_nodes")]
    for d in WAN_DELAYS_MS:
        ring_lane, rpc_lane, copy, spec_copy = wan_lane_names(d)
        runners[ring_lane] = lambda d=d: proxy_wan_lane(bench, model, prompts, progress, d, ring=True)
        runners[rpc_lane] = lambda d=d: bench.llama_rpc(model, delay_ms=d)
        runners[copy] = lambda d=d: copy_lane(bench, model, progress, d, speculate=0)
        runners[spec_copy] = lambda d=d: copy_lane(bench, model, progress, d, speculate=SPECULATE)
        speculation_pairs.append((spec_copy, copy))
    runs: dict[str, list[Lane]] = {name: [] for name in names}
    for _ in range(bench.args.rounds):  # interleaved: A, B, ..., then A, B, ... (bench/rounds.py)
        for name in names:
            runs[name].append(bench.lane(name, runners[name], progress, k))
    lanes = {name: merge_rounds(runs[name]) for name in names}
    for spec, plain in speculation_pairs:
        if lanes.get(spec, {}).get("available") and lanes.get(plain, {}).get("available"):
            same = lanes[spec]["tokens"] == lanes[plain]["tokens"]
            lanes[spec].setdefault("figures", {})["tokens_identical"] = int(same)
            lanes[spec]["notes"].append(f"single-stream tokens {'identical to' if same else 'DIFFER from'} {plain}")
    reference = lanes.get("transformers_single_process", {}).get("tokens", {})
    for lane in lanes.values():
        tokens = lane.pop("tokens", {})
        for length, ids in tokens.items():
            if length in reference:
                find_cell(lane, length, 1)["tokens_matching_transformers"] = common_prefix(ids, reference[length])
    return lanes


def wan_lane(bench: Bench, model: Path, prompts: dict, progress: Progress) -> Lane:
    a = bench.args
    why = WanLink.unavailable()
    if why:
        raise LaneUnavailable(why)
    wan_prompts = {length: prompts[length] for length in [int(x) for x in a.wan_prompts.split(",")]}
    with WanLink(a.k, a.wan_delay_ms, a.wan_rate_mbit) as link:
        lane = bench.route(model, "gguf", a.k, wan_prompts, [int(x) for x in a.wan_concurrency.split(",")],
                           progress, wan=link)
        lane["notes"] += link.notes
        lane["wan"] = link.applied
    return lane


def proxy_wan_lane(bench: Bench, model: Path, prompts: dict, progress: Progress, delay_ms: float,
                   ring: bool) -> Lane:
    """A GGUF route of K nodes, each behind a DelayProxy (every link into a node delayed)."""
    a = bench.args
    wan_prompts = {length: prompts[length] for length in bench.wan_prompt_lengths}
    return bench.route(model, "gguf", a.k, wan_prompts, bench.wan_concurrency, progress,
                       options=RouteOptions(ring=ring, delay_ms=delay_ms, rate_mbit=a.wan_rate_mbit))


def copy_lane(bench: Bench, model: Path, progress: Progress, delay_ms: float, speculate: int) -> Lane:
    """The copy-heavy prompts one at a time (each its own cell), K nodes behind delay proxies of
    `delay_ms`; the lane's decode rate is all decode tokens over all decode time."""
    from meshnet.reference.model import load_tokenizer

    a = bench.args
    tokenizer = load_tokenizer(model)
    prompts = {len(ids): [ids] for ids in (tokenizer(p)["input_ids"] for p in COPY_HEAVY)}
    lane = bench.route(model, "gguf", a.k, prompts, [1], progress,
                       options=RouteOptions(ring=True, speculate=speculate, delay_ms=delay_ms,
                                            rate_mbit=a.wan_rate_mbit))
    cells = [c for c in lane["cells"] if c.get("decode_tok_s")]
    seconds = sum((c["new_tokens"] - 1) / c["decode_tok_s"] for c in cells)
    lane["figures"] = {"decode_tok_s": sum(c["new_tokens"] - 1 for c in cells) / seconds if seconds else None}
    lane["notes"].append(f"{len(COPY_HEAVY)} copy-heavy prompts (python/meshnet/bench/prompts.py), one stream each"
                         + (f"; speculation: up to {speculate} drafted tokens per step" if speculate else ""))
    return lane
