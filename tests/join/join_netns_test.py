"""Issue 50's evidence: five machines join one after another from empty disks and serve the
synthetic ~1.07B model, no one of them holding the whole file. Hosts are network namespaces on
one machine (tests/multihost/topology.py): `tracker`, and `n0`..`n4`, each node in a memory
cgroup of its own cap (and offering that cap with --max-memory). The tracker's state is made
and the model published in four parts (//python:publish); each node starts with only
`--join INVITE`, is assigned a range, fetches only its part from the tracker and the nodes
already serving it, and serves. The fifth is killed (SIGKILL) mid-fetch and started again: it
resumes from the pieces it had verified. A generation through the swarm equals single-process
llama.cpp. Per node: the range, bytes fetched and from whom, seconds to routable, the cgroup's
peak. The figures go to join.json in the test's undeclared outputs; docs/evidence/join/ holds a
copy. Root, cgroups and the cached synthetic model only; skipped with the reason otherwise.
Outside //... (manual): `tools/bazel test //tests/join:join_netns_test --test_output=streamed`.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from joining import Joiner, made_invite, published_state
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.identity.keys import Identity
from meshnet.memory_cap import MemoryCap, cgroup_problem
from meshnet.process import child_env
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.cut_model import even_cuts
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import wait_for_port
from route_cases import llama_cpp_greedy
from topology import Topology

BUNDLED = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()  # the synthetic model's vocabulary
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
# The user's model cache (tools/synthetic_model.py's; tests run with HOME pointing elsewhere).
MODEL_FILE = Path(os.environ.get("MESHNET_SYNTHETIC_1B") or Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"
                  / "meshnet" / "models" / "synthetic-llama-1.1b-s0-q4_0.gguf")
CUTS = even_cuts(22, 4)
CAPS = {"n0": "1.0G", "n1": "1.2G", "n2": "1.5G", "n3": "2.0G", "n4": "2.5G"}  # memory each host has
TOKENS = 16
PROMPT = "The capital of France is"


def _skip_reason() -> str | None:
    return (Topology.unavailable() or cgroup_problem()
            or (None if MODEL_FILE.is_file() else f"no synthetic 1.07B at {MODEL_FILE}: build it with "
                "`tools/bazel run //tools:synthetic_model -- --tokenizer-gguf /abs/smollm2.gguf` or set "
                "$MESHNET_SYNTHETIC_1B"))


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def size(text: str) -> int:
    return int(float(text[:-1]) * (1 << 30))


def wait_for_verified_piece(node: Joiner, timeout: float = 300) -> int:
    """How many pieces the node's fetch had verified when first seen on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for state in (node.data / "parts").glob("*.pieces") if (node.data / "parts").exists() else []:
            try:
                verified = json.loads(state.read_text())
            except ValueError:
                continue
            if verified:
                return len(verified)
        if node.proc.poll() is not None:
            raise AssertionError(f"{node.data.name} exited before fetching a piece:\n{node.log.read_text()[-2000:]}")
        time.sleep(0.01)
    raise AssertionError("no piece verified in time")


def test_five_nodes_join_from_empty_disks_and_serve_the_1b_model(tmp_path):
    report: dict = {"marking": "multi-host, simulated with network namespaces on one machine",
                    "model": {"file": MODEL_FILE.name, "bytes": MODEL_FILE.stat().st_size}, "nodes": {}}
    hosts = {"tracker": False, **{name: False for name in CAPS}}
    with Topology(hosts) as topo:
        tracker_ip = topo["tracker"].ip
        started = time.monotonic()
        state = published_state(tmp_path / "tracker", MODEL_FILE, "synthetic-1b", CUTS, piece_mib=16,
                                ips=("127.0.0.1", tracker_ip))
        report["publish_seconds"] = round(time.monotonic() - started, 1)
        manifest = json.loads((state.published / "synthetic-1b" / "manifest.json").read_text())
        report["parts"] = [{"layers": [p["start"], p["end"]], "bytes": p["size"], "pieces": len(p["pieces"])}
                           for p in manifest["parts"]]
        log = tmp_path / "tracker.log"
        tracker = subprocess.Popen([*topo["tracker"].prefix, sys.executable, "-m", "meshnet.tracker.main",
                                    "--state", str(state.root), "--listen", f"{tracker_ip}:7700",
                                    "--allow-uncertified", "--lease-seconds", "5",
                                    "--port-file", str(tmp_path / "tracker.port")],
                                   env=child_env(), stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
        caps: list[MemoryCap] = []
        nodes: dict[str, Joiner] = {}
        try:
            wait_for_port(tracker, tmp_path / "tracker.port", log, 60, "tracker")
            text = made_invite(state, f"{tracker_ip}:7700", uses=len(CAPS))
            for name, cap_text in CAPS.items():
                cap = MemoryCap(f"join-{name}", size(cap_text))
                caps.append(cap)
                begun = time.monotonic()
                node = Joiner(tmp_path, name, text, WORKER, prefix=[*cap.prefix, *topo[name].prefix],
                              listen=f"{topo[name].ip}:0", max_memory=cap_text)
                if name == "n4":  # killed mid-fetch, then started again on the same disk
                    report["n4_killed_after_pieces"] = wait_for_verified_piece(node)
                    node.proc.send_signal(signal.SIGKILL)
                    node.proc.wait(timeout=30)
                    node = Joiner(tmp_path, name, text, WORKER, prefix=[*cap.prefix, *topo[name].prefix],
                                  listen=f"{topo[name].ip}:0", max_memory=cap_text)
                nodes[name] = node.wait_ready(timeout=900)
                assigned, fetched = node.events("assigned")[-1], node.events("fetched")[-1]
                part = node.data / "parts" / assigned["part"]
                report["nodes"][name] = {
                    "memory_cap": cap_text, "layers": assigned["layers"], "reason": assigned["reason"],
                    "part_bytes": part.stat().st_size, "fetched_bytes": fetched["bytes"] - fetched["resumed_bytes"],
                    "resumed_bytes": fetched["resumed_bytes"], "per_source": fetched["per_source"],
                    "fetch_seconds": fetched["seconds"], "seconds_to_routable": round(time.monotonic() - begun, 1),
                    "holds_whole_file": part.stat().st_size >= MODEL_FILE.stat().st_size}
            report["node_ids"] = {name: node.node_id for name, node in nodes.items()}
            roles = json.loads(state.roles.read_text())
            with TrackerClient(f"{tracker_ip}:7700", roles["client"], Identity.generate(),
                               tracker_ca=state.tls_cert.read_bytes(), tls_name="localhost") as client:
                coverage = client.coverage("synthetic-1b")
                report["routable"] = coverage.routable_count
                ids = load_tokenizer(BUNDLED)(PROMPT)["input_ids"]
                route = RouteClient(client, "synthetic-1b")
                got = list(route.generate(ids, GenerationParams(max_tokens=TOKENS)))
            expected = llama_cpp_greedy(GREEDY, MODEL_FILE, ids, TOKENS)
            report["generation"] = {"prompt": PROMPT, "tokens": got, "equals_llama_cpp": got == expected}
            report["peak_bytes"] = {name: cap.peak() for name, cap in zip(CAPS, caps)}
        finally:
            for node in nodes.values():
                node.stop()
            tracker.terminate()
            tracker.wait(timeout=30)
            for cap in caps:
                cap.remove()
    out = Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", tmp_path)) / "join.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    assert report["routable"] == len(CAPS) and not coverage.gaps
    assert not any(n["holds_whole_file"] for n in report["nodes"].values())
    assert report["nodes"]["n4"]["resumed_bytes"] > 0
    assert report["generation"]["equals_llama_cpp"]
