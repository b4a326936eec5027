"""Issue 29, per-range model files on real processes: the bundled SmolLM2 Q4_1 cut into three
parts (//python:cut_model), then a tracker and three GGUF nodes, each given only its part.

Each part holds its range's tensors and one header, nothing more. Each node from a part
registers the artifact and range fingerprints that a node serving the same range from the whole
file registers (one beside it here), so the tracker admits both against the one certified entry.
The route through the parts gives single-process llama.cpp's greedy tokens on the whole file,
and a node asked for layers its part does not hold refuses to start, saying which part it has.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshnet.recipe.cut_model import cut, even_cuts
from meshnet.recipe.fingerprint import artifact_fingerprint, range_fingerprint
from meshnet.recipe.gguf_header import read_header
from meshnet.swarm.local import LocalSwarm, NodeProcess
from route_cases import PROMPTS, generate, llama_cpp_greedy, tokenizer, tracker  # noqa: F401 - fixtures

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
CUTS = even_cuts(30, 3)
TOKENS = 32


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[tuple[int, int], Path]:
    out = tmp_path_factory.mktemp("parts")
    record = cut(GGUF, CUTS, out)
    return {tuple(p["layers"]): out / p["file"] for p in record["parts"]}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, parts):
    with LocalSwarm(tmp_path_factory.mktemp("parts-swarm"), GGUF, CUTS, backend="gguf", worker_binary=WORKER,
                    max_sessions=4, node_ggufs=[parts[c] for c in CUTS]) as s:
        s.add_node("whole-0", CUTS[0])  # the same range from the whole file, for the fingerprints
        yield s


def test_a_part_is_its_ranges_tensors_and_one_header(parts):
    source = read_header(GGUF)
    for (start, end), path in parts.items():
        part = read_header(path)
        tensor_bytes = sum(t.n_bytes for t in part.tensors)
        padding = part.alignment * len(part.tensors)
        assert part.data_start <= path.stat().st_size - tensor_bytes <= part.data_start + padding, path
        assert part.data_start < source.data_start + 4096  # the source's metadata plus the part's pairs and infos
    assert parts[CUTS[1]].stat().st_size < 0.4 * GGUF.stat().st_size  # a third of the layers, no embeddings


def test_nodes_from_parts_register_the_whole_files_fingerprints(swarm, tracker):
    coverage = tracker.coverage("smollm2")
    assert coverage.routable_count == 4 and not coverage.dark_node_ids, coverage
    by_name = {name: next(n for n in coverage.nodes if n.node_id == node_id) for name, node_id in swarm.ids.items()}
    artifact = artifact_fingerprint(GGUF)
    for i, (start, end) in enumerate(CUTS):
        node = by_name[f"node-{i}"]
        assert (node.layers.start, node.layers.end) == (start, end)
        assert node.fingerprints.model_artifact == artifact
        assert node.range_fingerprint == range_fingerprint(GGUF, start, end)
    assert by_name["node-0"].fingerprints == by_name["whole-0"].fingerprints
    assert by_name["node-0"].range_fingerprint == by_name["whole-0"].range_fingerprint


def test_route_through_parts_matches_single_process_llama_cpp(swarm, tracker, tokenizer):
    swarm.nodes[swarm.ids["whole-0"]].stop()  # every route now runs on the three parts alone
    for prompt in PROMPTS[:3]:
        expected = llama_cpp_greedy(GREEDY, GGUF, tokenizer(prompt)["input_ids"], TOKENS)
        assert generate(tracker, tokenizer, prompt, TOKENS) == expected, prompt


def test_a_node_refuses_layers_its_part_lacks(swarm, parts):
    node = NodeProcess(swarm.workdir, swarm.tracker, parts[CUTS[0]], "smollm2", CUTS[1], "wrong-part",
                       backend="gguf", worker_binary=WORKER).launch()
    assert node.proc.wait(timeout=120) == 2
    log = node.log.read_text()
    assert f"holding layers [{CUTS[0][0]}, {CUTS[0][1]}) only" in log, log[-2000:]
