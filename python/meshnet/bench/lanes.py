"""What the bench's lanes run: Bench (the ways of running a lane: llama.cpp, Transformers, a
route, the gateway, the WAN lanes) and run_group, which runs the lanes of lane_table.py in
rounds and merges them, plus the prompts and model facts they share. harness.py is the command
around them: arguments, progress, results, report and the contract check.
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

from meshnet.bench import gateway_lane, lane_table, llama_lanes, route_lanes
from meshnet.bench.measure import find_cell
from meshnet.memory_cap import RssWatch
from meshnet.certify.prompts import BENCH_TEXT, COPY_HEAVY
from meshnet.bench.rounds import merge_rounds
from meshnet.bench.route_lanes import RouteOptions
from meshnet.bench.schema import Lane
from meshnet.process import child_env
from meshnet.recipe.fingerprint import gguf_summary, owned_tensor_names
from meshnet.swarm.local import even_cuts
from meshnet.swarm.wan import WanLink

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
        lane["label"] = lane_table.BY_NAME[name].label.format(k=k)
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
        lane = {"cells": result["cells"], "tokens": result["tokens"], "processes": processes, "nodes": nodes,
                "peak_rss_bytes": sum(n["peak_rss_bytes"] for n in nodes), "kv_bytes": sum(n["kv_bytes"] for n in nodes),
                "notes": notes}
        if options.beside is not None:
            beside = lane["beside"] = result["beside"]
            notes.append(f"beside the measured streams, one client at its limit of {beside['sessions_at_once']} sessions "
                         f"sampled under {beside['label']} on the same hops: {beside['tokens']} tokens in "
                         f"{beside['sessions_opened']} sessions ({beside['tok_s']} tok/s), sessions ended {beside['endings']}")
        return lane

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

    def wan_lane(self, model: Path, prompts: dict, progress: Progress) -> Lane:
        a = self.args
        why = WanLink.unavailable()
        if why:
            raise LaneUnavailable(why)
        wan_prompts = {length: prompts[length] for length in [int(x) for x in a.wan_prompts.split(",")]}
        with WanLink(a.k, a.wan_delay_ms, a.wan_rate_mbit) as link:
            lane = self.route(model, "gguf", a.k, wan_prompts, [int(x) for x in a.wan_concurrency.split(",")],
                              progress, wan=link)
            lane["notes"] += link.notes
            lane["wan"] = link.applied
        return lane

    def proxy_wan_lane(self, model: Path, prompts: dict, progress: Progress, delay_ms: float, ring: bool) -> Lane:
        """A GGUF route of K nodes, each behind a DelayProxy (every link into a node delayed)."""
        a = self.args
        wan_prompts = {length: prompts[length] for length in self.wan_prompt_lengths}
        return self.route(model, "gguf", a.k, wan_prompts, self.wan_concurrency, progress,
                          options=RouteOptions(ring=ring, delay_ms=delay_ms, rate_mbit=a.wan_rate_mbit))

    def copy_lane(self, model: Path, progress: Progress, delay_ms: float, speculate: int) -> Lane:
        """The copy-heavy prompts one at a time (each its own cell), K nodes behind delay proxies of
        `delay_ms`; the lane's decode rate is all decode tokens over all decode time."""
        from meshnet.reference.model import load_tokenizer

        a = self.args
        tokenizer = load_tokenizer(model)
        prompts = {len(ids): [ids] for ids in (tokenizer(p)["input_ids"] for p in COPY_HEAVY)}
        lane = self.route(model, "gguf", a.k, prompts, [1], progress,
                          options=RouteOptions(ring=True, speculate=speculate, delay_ms=delay_ms,
                                               rate_mbit=a.wan_rate_mbit))
        cells = [c for c in lane["cells"] if c.get("decode_tok_s")]
        seconds = sum((c["new_tokens"] - 1) / c["decode_tok_s"] for c in cells)
        lane["figures"] = {"decode_tok_s": sum(c["new_tokens"] - 1 for c in cells) / seconds if seconds else None}
        lane["notes"].append(f"{len(COPY_HEAVY)} copy-heavy prompts (python/meshnet/certify/prompts.py), one stream each"
                             + (f"; speculation: up to {speculate} drafted tokens per step" if speculate else ""))
        return lane


class LaneUnavailable(Exception):
    """The lane cannot run here (a missing component or privilege); the message says why."""


def run_group(bench: Bench, model: Path, names: list[str], prompts: dict, prompt_lengths: list[int],
              concurrency: list[int], progress: Progress) -> dict[str, Lane]:
    """Runs `names` (lane_table.py's runners) --rounds times, interleaved, and merges the rounds."""
    k = bench.args.k
    group = lane_table.Run(bench, model, prompts, prompt_lengths, concurrency, progress)
    runs: dict[str, list[Lane]] = {name: [] for name in names}
    for _ in range(bench.args.rounds):  # interleaved: A, B, ..., then A, B, ... (bench/rounds.py)
        for name in names:
            runs[name].append(bench.lane(name, lambda run=lane_table.BY_NAME[name].run: run(group), progress, k))
    lanes = {name: merge_rounds(runs[name]) for name in names}
    for spec, plain in lane_table.SPECULATION_PAIRS:
        if lanes.get(spec, {}).get("available") and lanes.get(plain, {}).get("available"):
            same = lanes[spec]["tokens"] == lanes[plain]["tokens"]
            lanes[spec].setdefault("figures", {})["tokens_identical"] = int(same)
            lanes[spec]["notes"].append(f"single-stream tokens {'identical to' if same else 'DIFFER from'} {plain}")
    reference = lanes.get(lane_table.REFERENCE_TOKENS, {}).get("tokens", {})
    for lane in lanes.values():
        tokens = lane.pop("tokens", {})
        for length, ids in tokens.items():
            if length in reference:
                find_cell(lane, length, 1)["tokens_matching_transformers"] = common_prefix(ids, reference[length])
    return lanes

