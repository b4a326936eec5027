"""Issue 16: a model no single node can hold. The synthetic ~1.1B Llama Q4_0 (//tools:synthetic_model,
built once into the model cache) runs on 3 GGUF nodes, each node (its Python control process and
its worker) in a memory cgroup capped at 45% of the model file's size plus its KV cache, reading
its own copy of the file (evicted from the page cache first), so that, as on separate machines,
each node is charged for every page of weights it reads. The route
must give the greedy tokens of an uncapped single-process llama.cpp on 3 prompts. Then the single
process runs under one node's cap, and what happens (killed, or how much slower) is reported.

Root only, with the cgroup v1 `memory` controller or cgroup v2's; skipped with the reason
otherwise. Writes its report (caps, per-node peaks, parity, the capped single process) to
$TEST_UNDECLARED_OUTPUTS_DIR/model_fit.json and prints it: docs/evidence/model-fit/ quotes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.memory_cap import MemoryCap, cgroup_problem, evict_from_page_cache, peak_rss_bytes
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.range_memory import range_memory
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import LocalSwarm, even_cuts
from route_cases import PROMPTS, llama_cpp_greedy
from synthetic_model import DEFAULT_CACHE, build  # tools/synthetic_model.py

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
TOKENS = 16  # greedy tokens per prompt
CAP_FRACTION = 0.45  # of the model file, per node, plus the node's KV
MAX_SESSIONS, SESSION_TOKENS = 2, 512

pytestmark = pytest.mark.skipif(cgroup_problem() is not None, reason=str(cgroup_problem()))


@pytest.fixture(scope="module")
def model() -> dict:
    return build(DEFAULT_CACHE, 0, GGUF, Path(os.environ["MESHNET_CONVERTER"]), Path(os.environ["MESHNET_QUANTIZE"]))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = load_tokenizer(GGUF)  # the synthetic model has SmolLM2's vocabulary
    return [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]


@pytest.fixture(scope="module")
def report() -> dict:
    out: dict = {}
    yield out
    print(json.dumps(out, indent=1))
    folder = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if folder:
        Path(folder, "model_fit.json").write_text(json.dumps(out, indent=1) + "\n")


def node_kv_bytes(path: Path, layers: int) -> int:
    """f16 K and V for MAX_SESSIONS x SESSION_TOKENS positions over `layers` layers."""
    return MAX_SESSIONS * SESSION_TOKENS * range_memory(path, 0, layers, "f16").kv_bytes_per_token


def test_three_capped_nodes_give_the_single_process_tokens(tmp_path, model, prompts, report):
    path = Path(model["path"])
    size = path.stat().st_size
    n_layer = gguf_summary(path).n_layer
    cuts = even_cuts(n_layer, 3)
    caps = [MemoryCap(f"fit-node{i}", int(CAP_FRACTION * size) + node_kv_bytes(path, end - start))
            for i, (start, end) in enumerate(cuts)]
    report["model"] = {k: model[k] for k in ("path", "bytes", "sha256", "parameters")}
    copies = []  # a file per node, as on separate machines: no node reads pages another paid for
    for i in range(len(cuts)):
        copies.append(tmp_path / f"node{i}.gguf")
        shutil.copyfile(path, copies[-1])
        evict_from_page_cache(copies[-1])  # the node pays for the pages it reads
    try:
        with LocalSwarm(tmp_path / "swarm", path, cuts, model="synthetic-1b", backend="gguf", worker_binary=WORKER,
                        threads=1, max_sessions=MAX_SESSIONS, max_kv_tokens=MAX_SESSIONS * SESSION_TOKENS,
                        node_prefixes=[cap.prefix for cap in caps], node_ggufs=copies) as swarm:
            with swarm.client() as tracker:
                started = time.monotonic()
                got = [list(RouteClient(tracker, "synthetic-1b").generate(ids, GenerationParams(max_tokens=TOKENS)))
                       for ids in prompts]
                report["route_s"] = round(time.monotonic() - started, 1)
            nodes = []
            for cap, (start, end), node in zip(caps, cuts, swarm.nodes.values()):
                workers = psutil.Process(node.proc.pid).children(recursive=True)
                nodes.append({"layers": [start, end], "cap_bytes": cap.limit, "cgroup_peak_bytes": cap.peak(),
                              "control_peak_rss_bytes": peak_rss_bytes(node.proc.pid),
                              "worker_peak_rss_bytes": sum(peak_rss_bytes(w.pid) or 0 for w in workers),
                              "oom_kills": cap.oom_kills()})
        report["nodes"] = nodes
        started = time.monotonic()
        baseline = [llama_cpp_greedy(GREEDY, path, ids, TOKENS) for ids in prompts]
        report["single_process_uncapped_s"] = round(time.monotonic() - started, 1)
        report["parity"] = [g == b for g, b in zip(got, baseline)]
        assert got == baseline
        assert all(n["oom_kills"] == 0 for n in nodes), nodes
    finally:
        for cap in caps:
            cap.remove()


def test_the_single_process_under_one_nodes_cap(model, prompts, report):
    """Reported, not required: the whole model in one process under the cap one node ran in."""
    path = Path(model["path"])
    n_layer = gguf_summary(path).n_layer
    cap = MemoryCap("fit-single", int(CAP_FRACTION * path.stat().st_size) + node_kv_bytes(path, n_layer // 3 + 1))
    evict_from_page_cache(path)
    try:
        started = time.monotonic()
        proc = subprocess.run([*cap.prefix, str(GREEDY), str(path), str(TOKENS), *map(str, prompts[0])],
                              capture_output=True, text=True, timeout=600)
        report["single_process_under_one_node_cap"] = {
            "cap_bytes": cap.limit, "exit_code": proc.returncode, "seconds": round(time.monotonic() - started, 1),
            "cgroup_peak_bytes": cap.peak(), "oom_kills": cap.oom_kills(),
            "stderr_tail": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []}
    finally:
        cap.remove()
