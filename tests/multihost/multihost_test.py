"""Issue 16: the swarm across hosts, simulated with network namespaces on one machine.

Hosts (each its own namespace, one bridge; see topology.py): `tracker` (the tracker, serving
the relay role too), `client` (the generations run there, as a separate program), direct GGUF
nodes `n0` [0,10), `n1` [10,20), `n2` [20,30), and nodes behind NAT (no inbound connection
reaches them): `r1` [10,20) (not told: the tracker's reachability check sends it to the
relay), `r2` [20,30) and `r1b` [10,20) (`--behind-nat`; r1b through the relay that node n0
serves, the others through the tracker's), and for the last test `t1` [10,20)
behind a test-only relay on host `evil` that changes a byte. Each test compares greedy tokens
with single-process llama.cpp. The measurements (per-link RTT, per-token latency direct and
relayed, relay throughput) go to multihost.json in the test's undeclared outputs (Bazel's
TEST_UNDECLARED_OUTPUTS_DIR); docs/evidence/multihost/ holds a copy. Root only; skipped with
the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import grpc
import pytest

from meshnet.identity import certificates, tls
from meshnet.process import child_env
from meshnet.protocol import seam
from meshnet.shard.v1 import shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire.status import StatusCode
from meshnet.reference.model import load_tokenizer
from meshnet.swarm.local import LocalSwarm, NodeProcess, wait_for_port
from route_cases import PROMPTS, llama_cpp_greedy
from topology import Topology

HERE = Path(__file__).resolve().parent
TOKENS = 48
CUTS = {"n0": (0, 10), "n1": (10, 20), "n2": (20, 30), "r1": (10, 20), "r2": (20, 30), "r1b": (10, 20),
        "t1": (10, 20)}
NAT = {"r1", "r2", "r1b", "t1"}
HOSTS = {"tracker": False, "client": False, "evil": False, **{name: name in NAT for name in CUTS}}

pytestmark = pytest.mark.skipif(Topology.unavailable() is not None, reason=str(Topology.unavailable()))
MEASURED: dict = {"marking": "multi-host, simulated with network namespaces on one machine"}


@pytest.fixture(scope="module")
def gguf() -> Path:
    return Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()


@pytest.fixture(scope="module")
def tokenizer(gguf):
    return load_tokenizer(gguf)


@pytest.fixture(scope="module")
def expected(gguf, tokenizer):
    """Single-process llama.cpp's greedy tokens per prompt."""
    binary = Path(os.environ["MESHNET_GREEDY_BINARY"])
    return {p: llama_cpp_greedy(binary, gguf, tokenizer(p)["input_ids"], TOKENS) for p in PROMPTS[:3]}


@pytest.fixture(scope="module")
def net():
    with Topology(HOSTS) as topology:
        yield topology
    out = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if out:
        Path(out, "multihost.json").write_text(json.dumps(MEASURED, indent=2) + "\n")


@pytest.fixture(scope="module")
def swarm(net, gguf, tmp_path_factory):
    work = tmp_path_factory.mktemp("multihost")
    swarm = LocalSwarm(work, gguf, [], backend="gguf", worker_binary=Path(os.environ["MESHNET_WORKER_BINARY"]),
                       host=net["tracker"].ip)
    tracker = swarm.tracker
    tracker.prefix, tracker.relay, tracker.check_reachability = net["tracker"].prefix, True, True
    # n0 serves the relay role too (a node can), with a certificate for its address; r1b uses it.
    cert, key = certificates.self_signed("meshnet-relay", [], [net["n0"].ip])
    n0_cert = swarm.workdir / "n0-relay.crt"
    n0_cert.write_bytes(cert)
    n0_key = tls.write_private(swarm.workdir / "n0-relay.key", key)
    try:
        tracker.start()
        launch(swarm, net, "n0", "", extra=["--relay", n0_relay(net), "--relay-tls-cert", str(n0_cert),
                                            "--relay-tls-key", str(n0_key)], wait=True)
        for name in ("n1", "n2", "r1", "r2"):
            launch(swarm, net, name, tracker.relay_address)
        launch(swarm, net, "r1b", n0_relay(net), relay_ca=n0_cert)
        for node in swarm.nodes.values():
            node.wait_ready()
        yield swarm
    finally:
        swarm.stop()


def n0_relay(net: Topology) -> str:
    """The relay node n0 serves (a fixed port: each namespace has its own)."""
    return f"{net['n0'].ip}:7710"


def launch(swarm: LocalSwarm, net: Topology, name: str, relay: str, wait: bool = False,
           relay_ca: Optional[Path] = None, extra: Sequence[str] = ()) -> NodeProcess:
    """Starts node `name` on its host; NAT hosts go through `relay` (r1 only once the tracker
    finds it unreachable, the others with --behind-nat)."""
    extra = list(extra) + (["--relay-via", relay] if name in NAT else [])
    if relay_ca is not None:
        extra += ["--relay-ca", str(relay_ca)]
    if name in NAT - {"r1"}:
        extra.append("--behind-nat")
    node = NodeProcess(swarm.workdir, swarm.tracker, swarm.gguf, swarm.model, CUTS[name], name, backend="gguf",
                       worker_binary=swarm.worker_binary, host=net[name].ip, prefix=net[name].prefix,
                       extra_args=extra).launch()
    swarm.nodes[node.node_id] = node
    swarm.ids[name] = node.node_id
    return node.wait_ready() if wait else node


def generate(net: Topology, swarm: LocalSwarm, prompts: list[list[int]], tokens: int = TOKENS,
             on_token=None) -> list[dict]:
    """Runs generate.py on the client host; its events, per prompt."""
    tracker = swarm.tracker
    cmd = [*net["client"].prefix, sys.executable, str(HERE / "generate.py"), tracker.address, str(tracker.tls[0]),
           str(tracker.token_files["client"]), swarm.model, str(tokens), *map(json.dumps, prompts)]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs, current = [], {"tokens": [], "times": []}
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "route":
            current["hops"], current["addresses"] = event["hops"], event["addresses"]
        elif event["event"] == "token":
            current["times"].append(event["t"])
            if on_token is not None:
                on_token(current, event)
        elif event["event"] in ("done", "error"):
            current.update(event)
            runs.append(current)
            current = {"tokens": [], "times": []}
    stderr = proc.stderr.read()
    proc.wait(timeout=60)
    for run in runs:
        run["client_log"] = stderr
    assert runs, f"the client printed nothing (exit {proc.returncode}):\n{stderr[-3000:]}"
    return runs


def gaps_ms(runs: list[dict]) -> list[float]:
    """Time between consecutive tokens, all runs (the first token, which includes prefill, is out)."""
    return [(b - a) * 1000 for run in runs for a, b in zip(run["times"], run["times"][1:])]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def test_nat_hosts_take_no_inbound_connections_and_register_through_the_relay(net, swarm):
    coverage = {n.node_id: n for n in swarm.client().coverage(swarm.model).nodes}
    for name, node in ((n, swarm.nodes[swarm.ids[n]]) for n in ("n0", "n1", "n2", "r1", "r2", "r1b")):
        registered = coverage[node.node_id]
        if name in NAT:
            relay = n0_relay(net) if name == "r1b" else swarm.tracker.relay_address
            assert not net.connects("client", node.address), f"{name} at {node.address} accepted a connection"
            assert registered.relay == relay and registered.address.startswith(relay.rsplit(":", 1)[0] + ":")
            assert registered.relay_rtt_ms > 0
            assert net.connects("client", registered.address), f"{name}'s allocation {registered.address} is closed"
        else:
            assert net.connects("client", node.address)
            assert registered.relay == "" and registered.address == node.address
    r1_log = swarm.nodes[swarm.ids["r1"]].log.read_text()
    assert '"unreachable"' in r1_log, "r1 was not told by the tracker that it cannot be reached"
    MEASURED["topology"] = {name: {"namespace": h.namespace, "ip": h.ip, "behind_nat": h.nat}
                            for name, h in net.hosts.items()}
    MEASURED["rtt"] = {f"{a}->{b}": net.rtt_ms(a, net[b].ip)
                       for a, b in (("client", "n0"), ("n0", "n1"), ("n1", "n2"), ("n2", "n0"), ("r1", "tracker"),
                                    ("r2", "tracker"), ("client", "tracker"), ("client", "r1"))}
    MEASURED["relay_rtt_ms_registered"] = {name: coverage[swarm.ids[name]].relay_rtt_ms for name in ("r1", "r2", "r1b")}


def test_tickets_and_certificate_pinning_hold_through_the_relay(net, swarm):
    """A frame without a ticket is refused by the relayed node itself; a peer pinning another
    certificate cannot talk to it (the relay does not terminate TLS). The parity tests after
    this one are the honest sessions beside it."""
    coverage = {n.node_id: n for n in swarm.client().coverage(swarm.model).nodes}
    r2, r1 = coverage[swarm.ids["r2"]], coverage[swarm.ids["r1"]]
    frame = seam.to_proto(t.SeamFrame(seam.PROTOCOL_VERSION, t.RouteSession("probe-without-ticket", 1), t.Phase.CANCEL,
                                      1))
    with tls.pinned_channel(r2.address, r2.tls_certificate.encode()) as channel:
        reply = seam.from_proto(next(shard_pb2_grpc.ShardStub(channel).Seam(iter([frame]), timeout=10)))
    assert reply.status.code == StatusCode.UNAUTHENTICATED, reply.status
    with tls.pinned_channel(r2.address, r1.tls_certificate.encode()) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            next(shard_pb2_grpc.ShardStub(channel).Seam(iter([frame]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_routes_prefer_direct_links_and_match_llama_cpp(net, swarm, tokenizer, expected):
    runs = generate(net, swarm, [tokenizer(p)["input_ids"] for p in expected])
    direct = [swarm.ids[n] for n in ("n0", "n1", "n2")]
    for prompt, run in zip(expected, runs):
        assert run["event"] == "done", run
        assert run["hops"] == direct, "a relayed node was chosen over a direct one"
        assert run["tokens"] == expected[prompt], f"direct route diverged for {prompt!r}"
    MEASURED["direct"] = {"route": ["n0", "n1", "n2"], "token_gap_ms": gaps_ms(runs)}


def test_a_relayed_middle_and_last_hop_match_llama_cpp(net, swarm, tokenizer, expected):
    for name in ("n1", "n2"):
        swarm.nodes[swarm.ids[name]].stop()  # deregisters: only relayed nodes serve [10, 30) now
    runs = generate(net, swarm, [tokenizer(p)["input_ids"] for p in expected])
    relayed = {swarm.ids[n]: n for n in ("r1", "r1b", "r2")}
    for prompt, run in zip(expected, runs):
        assert run["event"] == "done", run
        assert run["hops"][0] == swarm.ids["n0"] and all(h in relayed for h in run["hops"][1:]), run["hops"]
        assert relayed[run["hops"][2]] == "r2"
        assert all(not a.startswith(f"{net[relayed[h]].ip}:") for h, a in zip(run["hops"][1:], run["addresses"][1:]))
        assert run["tokens"] == expected[prompt], f"relayed route diverged for {prompt!r}"
    MEASURED["relayed"] = {"route": ["n0"] + [relayed[h] for h in runs[0]["hops"][1:]], "token_gap_ms": gaps_ms(runs)}
    direct, relayed_gaps = MEASURED["direct"]["token_gap_ms"], MEASURED["relayed"]["token_gap_ms"]
    MEASURED["relay_added_ms_per_token"] = {
        "p50": percentile(relayed_gaps, 0.5) - percentile(direct, 0.5),
        "p95": percentile(relayed_gaps, 0.95) - percentile(direct, 0.95),
        "direct_p50": percentile(direct, 0.5), "direct_p95": percentile(direct, 0.95),
        "relayed_p50": percentile(relayed_gaps, 0.5), "relayed_p95": percentile(relayed_gaps, 0.95),
        "relayed_hops": 2, "tokens": len(relayed_gaps)}


def test_kill_9_of_a_relayed_hop_fails_over_with_the_same_tokens(net, swarm, tokenizer, expected):
    prompt = next(iter(expected))
    killed = []

    def kill_middle(run: dict, event: dict) -> None:
        if event["i"] == 10 and not killed:
            node = next(n for n in swarm.nodes.values() if n.node_id == run["hops"][1])
            node.kill()
            killed.append(node.name)

    [run] = generate(net, swarm, [tokenizer(prompt)["input_ids"]], on_token=kill_middle)
    assert killed and killed[0] in ("r1", "r1b")
    assert run["event"] == "done", run
    assert run["failovers"] == [swarm.ids[killed[0]]]
    assert run["tokens"] == expected[prompt]
    MEASURED["failover"] = {"killed": killed[0], "tokens": len(run["tokens"]), "identical": True}


def test_relay_throughput_against_a_direct_link(net, swarm):
    """64 MiB echoed over one TLS stream from the client host: to a host behind NAT through the
    tracker's relay, and to a direct host."""
    tracker, figures = swarm.tracker, {}
    for label, host, mode in (("relayed", "r2", ["--relay", tracker.relay_address, str(tracker.tls[0]),
                                                  str(tracker.token_files["node"])]),
                              ("direct", "n1", ["--direct", net["n1"].ip])):
        out = swarm.workdir / f"throughput-{label}.json"
        server = subprocess.Popen([*net[host].prefix, sys.executable, str(HERE / "relay_throughput.py"), "serve",
                                   str(out), *mode], env=child_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not out.exists():
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()[-2000:]
                time.sleep(0.1)
            served = json.loads(out.read_text())
            cert = swarm.workdir / f"throughput-{label}.crt"
            cert.write_text(served["certificate"])
            proc = subprocess.run([*net["client"].prefix, sys.executable, str(HERE / "relay_throughput.py"),
                                   "measure", served["address"], str(cert), "64"], env=child_env(),
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-2000:]
            figures[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        finally:
            server.terminate()
            server.wait(timeout=30)
    figures["relayed_over_direct"] = figures["relayed"]["mib_per_s"] / figures["direct"]["mib_per_s"]
    MEASURED["throughput"] = figures


def test_a_relay_that_changes_a_byte_is_caught_and_no_token_differs(net, swarm, tokenizer, expected):
    tracker = swarm.tracker
    port_file = swarm.workdir / "evil-relay.port"
    log = swarm.workdir / "evil-relay.log"
    cert, key = certificates.self_signed("meshnet-relay", [], [net["evil"].ip])
    cert_file, key_file = swarm.workdir / "evil-relay.crt", tls.write_private(swarm.workdir / "evil-relay.key", key)
    cert_file.write_bytes(cert)
    evil = subprocess.Popen([*net["evil"].prefix, sys.executable, str(HERE / "tampering_relay.py"),
                             f"{net['evil'].ip}:0", net["evil"].ip, str(cert_file), str(key_file),
                             str(tracker.token_files["node"]), str(port_file)],
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    try:
        evil_relay = f"{net['evil'].ip}:{wait_for_port(evil, port_file, log, 60, 'tampering relay')}"
        for name in ("r1", "r1b"):  # only t1, behind the tampering relay, serves [10, 20) now
            if name in swarm.ids:
                swarm.nodes[swarm.ids[name]].stop()
        t1 = launch(swarm, net, "t1", evil_relay, wait=True, relay_ca=cert_file)
        prompt = next(iter(expected))
        [run] = generate(net, swarm, [tokenizer(prompt)["input_ids"]])
        assert '"tampered"' in log.read_text(), "the relay changed nothing, so nothing was tested"
        assert run["tokens"] == expected[prompt][:len(run["tokens"])], "a token differs after tampering"
        assert run["event"] == "error", "the generation completed with [10, 20) served only through a tampering relay"
        assert t1.node_id in run["client_log"] and "hop_failed" in run["client_log"]
        MEASURED["tampering"] = {"tokens_before_failure": len(run["tokens"]), "error": run["code"],
                                 "message": run["message"][:300]}
    finally:
        evil.terminate()
        evil.wait(timeout=30)
