"""Issue 50: a swarm that forms itself, on real processes. A tracker's files made in one call
(`state_dir.init`, as `tracker --init` makes them), the bundled model published in two parts
(//python:publish), the tracker serving from its state; then four GGUF nodes that each start
with only `--join INVITE` and an empty data directory, one after another. Each redeems the
invite, is assigned a range by the tracker (the least served first), fetches only its part,
checked piece by piece, from the tracker and from the nodes already serving that part, and
serves. The first node serves corrupted pieces (--cheat-pieces): the third, joining for its
part, drops it and completes from the tracker; the fourth fetches from an honest peer too. A
generation through them equals single-process llama.cpp. A node restarted on its data directory
neither redeems nor fetches again, and a fifth with the used-up invite is refused with the
reason while the swarm serves on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from joining import Joiner, made_invite, published_state
from meshnet.identity.keys import Identity
from meshnet.process import child_env
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.cut_model import even_cuts
from meshnet.swarm.local import wait_for_port
from meshnet.tracker.doctor import main as doctor
from route_cases import PROMPTS, generate, llama_cpp_greedy, tokenizer  # noqa: F401 - fixtures

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
CUTS = even_cuts(30, 2)
TOKENS = 24


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    work = tmp_path_factory.mktemp("join")
    state = published_state(work / "tracker", GGUF, "smollm2", CUTS, piece_mib=4)
    log = work / "tracker.log"
    tracker = subprocess.Popen([sys.executable, "-m", "meshnet.tracker.main", "--state", str(state.root),
                                "--listen", "127.0.0.1:0", "--allow-uncertified", "--lease-seconds", "3",
                                "--http-listen", "127.0.0.1:0", "--http-port-file", str(work / "http.port"),
                                "--port-file", str(work / "tracker.port")],
                               env=child_env(), stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    address = f"127.0.0.1:{wait_for_port(tracker, work / 'tracker.port', log, 60, 'tracker')}"
    text = made_invite(state, address, uses=4)
    nodes = []
    try:
        for i in range(4):  # one after another, as operators add machines; the first serves corrupted pieces
            nodes.append(Joiner(work, f"node-{i}", text, WORKER, *(["--cheat-pieces"] if i == 0 else [])).wait_ready())
        yield work, state, address, text, nodes
    finally:
        for node in nodes:
            node.stop()
        tracker.terminate()
        tracker.wait(timeout=30)


@pytest.fixture(scope="module")
def tracker(swarm):
    _, state, address, _, _ = swarm
    roles = json.loads(state.roles.read_text())
    with TrackerClient(address, roles["client"], Identity.generate(), tracker_ca=state.tls_cert.read_bytes(),
                       tls_name="localhost") as client:
        yield client


def test_four_nodes_join_with_an_invite_and_each_fetches_only_its_part(swarm, tracker):
    _, state, _, _, nodes = swarm
    coverage = tracker.coverage("smollm2")
    assert coverage.routable_count == 4 and not coverage.gaps, coverage
    assert sorted((n.layers.start, n.layers.end) for n in coverage.nodes) == sorted(CUTS + CUTS)
    published = json.loads((state.published / "smollm2" / "manifest.json").read_text())
    sizes = {(p["start"], p["end"]): p["size"] for p in published["parts"]}
    layers = [tuple(n.events("assigned")[0]["layers"]) for n in nodes]
    assert layers[0] != layers[1] and layers[2] == layers[0] and layers[3] == layers[1]  # the least served first
    for node, held_layers in zip(nodes, layers):
        (fetched,) = node.events("fetched")
        assert fetched["bytes"] == sizes[held_layers] and sum(fetched["per_source"].values()) == sizes[held_layers]
        part = node.events("assigned")[0]["part"]
        assert sorted(p.name for p in (node.data / "parts").iterdir()) == [part, f"{part}.manifest.json"]
        assert (node.data / "parts" / part).stat().st_size < GGUF.stat().st_size  # its part, not the whole model
    assert set(nodes[0].events("fetched")[0]["per_source"]) == {"tracker"}  # nobody held its part yet
    # The third fetched from the tracker and was offered the corrupting first node: every piece
    # it took from it was dropped and reported, none written.
    bad = {line["source"] for line in nodes[2].lines("bad_piece")}
    assert bad == {nodes[0].node_id} and nodes[0].node_id not in nodes[2].events("fetched")[0]["per_source"]
    # The fourth fetched from the tracker and from the honest second node, both at once.
    assert set(nodes[3].events("fetched")[0]["per_source"]) == {"tracker", nodes[1].node_id}


def test_a_generation_through_the_joined_nodes_equals_llama_cpp(swarm, tracker, tokenizer):
    for prompt in PROMPTS[:2]:
        expected = llama_cpp_greedy(GREEDY, GGUF, tokenizer(prompt)["input_ids"], TOKENS)
        assert generate(tracker, tokenizer, prompt, TOKENS) == expected, prompt


def test_the_doctor_says_why_each_node_serves_what_it_does(swarm, capsys):
    work, _, _, _, nodes = swarm
    assert doctor(["--status", f"http://127.0.0.1:{int((work / 'http.port').read_text())}/status.json"]) == 0
    report = capsys.readouterr().out
    for node in nodes:
        start, end = node.events("assigned")[0]["layers"]
        said = report.split(node.node_id + "\n", 1)[1].split("\nn", 1)[0]
        assert f"serves smollm2 layers {start}-{end} (routable" in said, said
        assert "offered 2.00 GiB of memory" in said and f"assigned smollm2 layers {start}-{end}" in said, said


def test_a_used_up_invite_is_refused_and_a_restart_neither_redeems_nor_fetches_again(swarm, tracker, tokenizer):
    work, _, _, text, nodes = swarm
    late = Joiner(work, "node-late", text, WORKER)
    assert late.proc.wait(timeout=120) == 2
    assert "is used up (4 of 4 uses)" in late.log.read_text()
    assert not (work / "node-late" / "parts").exists()
    nodes[1].stop()
    again = Joiner(work, "node-1", text, WORKER).wait_ready()  # the same data directory
    nodes[1] = again
    assert again.events("redeemed before") and len(again.events("redeemed")) == 1  # the first start's only
    fetched = again.events("fetched")[-1]
    assert fetched["resumed_bytes"] == fetched["bytes"] and fetched["per_source"] == {}
    assert tracker.coverage("smollm2").routable_count == 4
    prompt = PROMPTS[0]
    assert generate(tracker, tokenizer, prompt, TOKENS) == llama_cpp_greedy(
        GREEDY, GGUF, tokenizer(prompt)["input_ids"], TOKENS)


def test_a_node_that_cannot_hold_its_part_says_so_and_is_given_another(swarm, tracker):
    """The tracker assigns by a part's file size; the node measures its part's weights and the
    least KV once fetched. Offered memory between the two parts' needs, the node refuses the first
    part it is given (the larger, as every range is served twice), removes it, and is given the
    other, which it serves."""
    from meshnet.node.device_budget import MIN_KV_TOKENS, RESERVE_MIN_BYTES
    from meshnet.recipe.range_memory import range_memory

    work, state, address, _, nodes = swarm
    published = state.published / "smollm2"
    manifest = json.loads((published / "manifest.json").read_text())
    first, second = sorted(manifest["parts"], key=lambda p: (-p["size"], p["start"]))  # the tracker's order

    def need(part: dict) -> int:
        memory = range_memory(published / part["file"], part["start"], part["end"], "f32")
        return memory.weight_bytes + MIN_KV_TOKENS * memory.kv_bytes_per_token

    assert need(first) > need(second)  # the larger file is the larger range here
    offered = RESERVE_MIN_BYTES + (need(first) + need(second)) // 2
    tight = Joiner(work, "node-tight", made_invite(state, address, uses=1), WORKER, max_memory=str(offered))
    try:
        tight.wait_ready()
        (refused,) = tight.events("does not fit")
        assert refused["part"] == first["file"] and "serve fewer layers" in refused["reason"]
        assert [e["part"] for e in tight.events("assigned")] == [first["file"], second["file"]]
        assert sorted(p.name for p in (tight.data / "parts").iterdir()) == [second["file"],
                                                                              f"{second['file']}.manifest.json"]
        assert tracker.coverage("smollm2").routable_count == 5
    finally:
        tight.stop()
