"""Exact route parity: a real tracker and GGUF nodes on loopback against single-process llama.cpp.

Greedy tokens of a route over `nodes` even layer ranges must equal //cpp/engine:greedy's (the
whole model, no layer range: upstream behaviour) token for token where one process may hold the
model, and the argmax of the teacher-forced range chain (certify/streamed.py) when one is given;
then 8 sessions at once (batched together inside each worker) must each keep its solo tokens.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.memory_cap import CappedRunner, evict_from_page_cache
from meshnet.recipe.recipe import engine_tool_flags
from meshnet.swarm.local import LocalSwarm, even_cuts

CONCURRENT_SESSIONS = 8
SUITE_KV_TOKENS = 4096  # each node's KV cells, unless the sessions need more (they share them)
# The tracker's bans in this swarm: short, so that a hop that missed a Health probe while the
# machine was starved (8 sessions, 3 nodes and a loaded CI on 2 cores) is routed through again
# well within the client's route_wait, however many of the sessions reported it at once (each
# report doubles the ban). A node that really died still fails the check: it never answers.
BAN_SECONDS, MAX_BAN_SECONDS = 1.0, 4.0
LOG_TAIL_CHARS = 3000  # of each process's log, shown when the swarm fails


def llama_cpp_greedy(greedy: Path, gguf: Path, ids: Sequence[int], tokens: int,
                     matmul_activations: str = "quantized", runner: Optional[CappedRunner] = None,
                     device: str = "cpu") -> list[int]:
    """The whole model's greedy tokens in one llama.cpp process (//cpp/engine:greedy: no layer
    range, upstream behaviour; with the recipe's matmul activations), the baseline a route must
    match token for token. `runner`: where it runs (capped, measured); a plain subprocess if None.
    `device`: where it computes (a GPU device needs a `greedy` linked with its backend, e.g.
    //cpp/engine:greedy_vulkan; ADR 0014)."""
    command = [str(greedy), *engine_tool_flags(matmul_activations), *(["--device", device] if device != "cpu" else []),
               str(gguf), str(tokens), *map(str, ids)]
    if runner is None:
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
    else:
        proc = runner.run(f"llama.cpp whole model, {tokens} greedy tokens", command, reads=[gguf])
        if proc.returncode != 0:
            raise RuntimeError(f"single-process llama.cpp exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["tokens"]


def route_parity(gguf: Path, model: str, prompts: Sequence[Sequence[int]], *, worker: Path, greedy: Path,
                 tokens: int = 64, nodes: int = 3, n_layer: int, log: Callable[[str], None] = print,
                 cuts: Optional[Sequence[tuple[int, int]]] = None, matmul_activations: str = "quantized",
                 single_process: bool = True,
                 teacher_forced: Optional[Callable[[Sequence[int], list[int]], dict]] = None,
                 node_prefixes: Optional[Sequence[Sequence[str]]] = None,
                 node_ggufs: Optional[Sequence[Path]] = None, runner: Optional[CappedRunner] = None,
                 max_kv_tokens: Optional[int] = None, devices: Optional[Sequence[str]] = None) -> dict:
    """{"cuts", "prompts": [{"equal", "first_difference", "teacher_forced"}...], "route_equal",
    "concurrent": {...}}. `cuts` (default: `nodes` even ranges) are the nodes' layer ranges;
    `matmul_activations` the recipe's, on the nodes and the baseline alike. The route's tokens
    must equal single-process llama.cpp's (`single_process`: only where one process may hold the
    whole model) and pass `teacher_forced(prompt, tokens)` (its "equal"), when given: the check
    that needs no whole-model process. The concurrent sessions must keep the solo tokens (the
    single process's, else the route's own solo runs). `node_prefixes`: a command prefix per
    node (a memory cgroup); `node_ggufs`: the file each node serves from (its per-range part),
    evicted from the page cache before the nodes start, so that each node's cgroup is charged
    for the weights it reads; `runner`: where single-process llama.cpp runs; `max_kv_tokens`: each
    node's KV cells (default: what the concurrent sessions need, at least SUITE_KV_TOKENS);
    `devices`: where each node computes (default the CPU; ADR 0014), and where the single process
    computes when they all name one device (a mix of devices has no single process: give
    `single_process=False`)."""
    cuts = list(cuts) if cuts is not None else even_cuts(n_layer, nodes)
    if max_kv_tokens is None:  # not the node's default (32768), whose KV would dwarf a capped node's layers
        max_kv_tokens = max(SUITE_KV_TOKENS, CONCURRENT_SESSIONS * (max(map(len, prompts)) + tokens))
    devices = list(devices) if devices is not None else ["cpu"] * len(cuts)
    baseline = None
    if single_process:
        if len(set(devices)) != 1:
            raise ValueError(f"devices {devices}: a route over several devices has no single-process baseline")
        baseline = [llama_cpp_greedy(greedy, gguf, ids, tokens, matmul_activations, runner, devices[0])
                    for ids in prompts]
        log(f"single-process llama.cpp: {len(prompts)} prompts x {tokens} greedy tokens")
    result: dict = {"cuts": cuts, "tokens": tokens, "prompts": [], "single_process": single_process}
    for path in node_ggufs or ():
        evict_from_page_cache(path)
    with tempfile.TemporaryDirectory(prefix="meshnet-certify-") as tmp:
        try:
            with LocalSwarm(Path(tmp), gguf, cuts, model=model, backend="gguf", worker_binary=worker,
                            max_sessions=CONCURRENT_SESSIONS, threads=1, ban_seconds=BAN_SECONDS,
                            max_ban_seconds=MAX_BAN_SECONDS, matmul_activations=matmul_activations,
                            max_kv_tokens=max_kv_tokens, device=devices,
                            node_prefixes=node_prefixes or (), node_ggufs=node_ggufs or ()) as swarm, \
                    swarm.client() as tracker:
                log(f"swarm up: tracker + {len(cuts)} GGUF nodes {cuts} on {', '.join(devices)}")

                def run(ids: Sequence[int]) -> list[int]:
                    return list(RouteClient(tracker, model).generate(list(ids), GenerationParams(max_tokens=tokens)))

                solo = [run(ids) for ids in prompts]
                batch = [prompts[i % len(prompts)] for i in range(CONCURRENT_SESSIONS)]
                started = time.monotonic()
                with ThreadPoolExecutor(max_workers=CONCURRENT_SESSIONS) as pool:
                    together = list(pool.map(run, batch))
                seconds = round(time.monotonic() - started, 2)
        except BaseException:
            _log_tails(Path(tmp), log)  # before the folder goes
            raise
    for i, (ids, got) in enumerate(zip(prompts, solo)):
        entry: dict = {"prompt_tokens": len(ids), "equal": True, "first_difference": None}
        if baseline is not None:
            expected = baseline[i]
            first = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b),
                         None if len(got) == len(expected) else min(len(got), len(expected)))
            entry.update(equal=got == expected, first_difference=first)
        if teacher_forced is not None:
            entry["teacher_forced"] = teacher_forced(ids, got)
            entry["equal"] = entry["equal"] and entry["teacher_forced"]["equal"]
        result["prompts"].append(entry)
    result["route_equal"] = all(p["equal"] for p in result["prompts"])
    against = " and ".join(name for name, used in (("single-process llama.cpp", baseline is not None),
                                                   ("the teacher-forced range chain", teacher_forced is not None))
                           if used)
    log(f"route parity: {sum(p['equal'] for p in result['prompts'])}/{len(prompts)} prompts identical to {against}")
    reference = baseline if baseline is not None else solo
    expected_together = [reference[i % len(prompts)] for i in range(CONCURRENT_SESSIONS)]
    equal = sum(a == b for a, b in zip(together, expected_together))
    result["concurrent"] = {"sessions": CONCURRENT_SESSIONS, "identical_to_solo": equal, "seconds": seconds}
    result["concurrent_equal"] = equal == CONCURRENT_SESSIONS
    log(f"{CONCURRENT_SESSIONS} concurrent sessions: {equal}/{CONCURRENT_SESSIONS} identical to solo")
    return result


def _log_tails(folder: Path, log: Callable[[str], None]) -> None:
    for name in sorted(folder.glob("*.log")):
        log(f"--- {name.name} (last {LOG_TAIL_CHARS} characters) ---\n"
            f"{name.read_text(errors='replace')[-LOG_TAIL_CHARS:]}")
