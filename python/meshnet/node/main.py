"""`bazel run //python:node -- --join INVITE [--data-dir DIR] [--max-memory 6G]`: joins with one
command (node/join.py: the tracker assigns the model and range, the part is fetched and checked).
By hand: `--tracker HOST:PORT --tracker-ca CA.pem --identity KEY --gguf PATH --model NAME --layers
A:B [--backend gguf]`.

Loads (or creates) the node's Ed25519 identity, whose public key names the node; fetches the
tracker's ticket key over TLS; makes a fresh TLS certificate for its shard service; runs the
shard backend (reference: HF Transformers in this process; gguf: the native worker as a
supervised child process, restarted if it dies) with that key and certificate, so it admits
only ticketed work; computes the artifact, recipe and range fingerprints; registers (signed,
with the node role token from --token-file or $MESHNET_NODE_TOKEN) and heartbeats with load
telemetry. A tracker outage does not stop the node: it keeps serving its sessions, retries with
backoff and registers again when the tracker is back (node/tracker_link.py). The worker is
killed by the kernel if the node dies (PR_SET_PDEATHSIG), so no worker outlives its node.
SIGTERM drains: no new routes, live sessions get `--drain-seconds` to finish, then the
node deregisters and stops. Exit status 2 when the tracker refuses the node (the reason is
logged). `--insecure` serves and dials plaintext (loopback development only).
`--metrics-listen HOST:PORT` (off by default) serves Prometheus /metrics: the worker's Health,
read on each scrape, and the node's own counters (node/metrics.py).
Relays (ADR 0007): `--behind-nat` registers the node's allocation on the relay `--relay-via`
instead of its own address; without it, a tracker that cannot reach the node (UNAVAILABLE at
registration) sends it to `--relay-via` too. `--relay HOST:PORT` also serves the relay role here
for other nodes of the swarm.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import grpc

from meshnet.identity import tls
from meshnet.identity.keys import Identity
from meshnet.node import join
from meshnet.node import metrics as node_metrics
from meshnet.node.backends import Backend, GgufBackend, ReferenceBackend
from meshnet.node.restarts import RestartBudget
from meshnet.node.tracker_link import NodeRefused, TrackerLink
from meshnet.node.device_budget import DEFAULT_KV_TOKENS, DeviceBudget, find_device, list_devices, plan
from meshnet.process import log, parse_size, stop_on_signals, tracker_token, write_port_file
from meshnet.protocol.tracker_client import TrackerClient, tracker_addresses
from meshnet.recipe.certify import recipe_of
from meshnet.recipe.recipe import MATMUL_ACTIVATIONS, compute_backend_of
from meshnet.recipe.fingerprint import declared_artifact_fingerprint, summarize_range
from meshnet.recipe.range_memory import range_memory
from meshnet.recipe.range_part import part_of
from meshnet.relay.agent import RelayAgent
from meshnet.relay.errors import RelayUnavailable
from meshnet.relay.server import RelayServer
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints
from meshnet.wire.status import StatusCode
from meshnet.webserver import parse_listen


def parse_layers(text: str) -> tuple[int, int]:
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers wants START:END, got {text!r}") from None
    if not 0 <= start < end:
        raise argparse.ArgumentTypeError(f"--layers {text}: need 0 <= START < END")
    return start, end



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--join" or a.startswith("--join=") for a in argv):  # issue 50: the tracker decides the rest
        argv = join.resolve(argv)
    parser = argparse.ArgumentParser(description="Meshnet node")
    parser.add_argument("--tracker", required=True, type=tracker_addresses,
                        help="tracker HOST:PORT; several, comma-separated, for replicated trackers (calls fail over between them)")
    parser.add_argument("--token-file", type=Path, help="the node role's token (else $MESHNET_NODE_TOKEN)")
    parser.add_argument("--identity", required=True, type=Path, help="Ed25519 key file (created 0600 if absent)")
    parser.add_argument("--tracker-ca", type=Path, help="PEM that verifies the tracker's TLS certificate")
    parser.add_argument("--tracker-tls-name", help="the name the tracker's certificate is checked for (default: the "
                        "host dialed); --join sets it for a certificate trusted by its pin")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext to the tracker and on the shard service (loopback development only)")
    parser.add_argument("--gguf", required=True, type=Path, help="the model file: the whole GGUF, or a per-range "
                        "part cut from it (//python:cut_model) that holds --layers")
    parser.add_argument("--model", required=True, help="the certified model name")
    parser.add_argument("--layers", required=True, type=parse_layers, help="START:END, end exclusive")
    parser.add_argument("--backend", choices=["reference", "gguf"], default="reference")
    parser.add_argument("--worker-binary", type=Path, default=os.environ.get("MESHNET_WORKER_BINARY"),
                        help="the native worker (cpp/worker), for --backend gguf")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port of the shard service")
    parser.add_argument("--advertise", help="host:port registered with the tracker, where peers dial this node, when "
                        "it is not the bound --listen address (a port forward or a proxy in front of it)")
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--max-kv-tokens", type=int,
                        help=f"KV cells the node holds (default: as many as fit on --device beside the range's weights, "
                             f"at most {DEFAULT_KV_TOKENS}; gguf refuses a value that does not fit)")
    parser.add_argument("--device-memory", type=parse_size, metavar="SIZE",
                        help="gguf: the most the node may hold on --device for weights and KV, e.g. 6G (default: the "
                             "device's free memory less a reserve for compute buffers and the driver)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads")
    parser.add_argument("--heartbeat-seconds", type=float, default=2.0)
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--session-idle-seconds", type=float, default=300.0,
                        help="free a session that sent nothing for this long")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="worker restarts within --restart-window-seconds before giving up (gguf)")
    parser.add_argument("--restart-window-seconds", type=float, default=600.0,
                        help="the sliding window --max-restarts counts over")
    parser.add_argument("--hang-probes", type=int, default=3,
                        help="unanswered Health probes in a row before a hung worker is killed and restarted")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once registered")
    parser.add_argument("--metrics-listen", help="host:port for Prometheus /metrics (off by default; port 0 picks "
                        "one; read-only, but bind a loopback or private address)")
    parser.add_argument("--metrics-port-file", type=Path, help="write the metrics port here (before --port-file)")
    parser.add_argument("--behind-nat", action="store_true",
                        help="this node takes no inbound connections: peers reach it through --relay-via")
    parser.add_argument("--relay-via", metavar="HOST:PORT",
                        help="the relay to register through when behind NAT or unreachable by the tracker")
    parser.add_argument("--relay-ca", type=Path, help="PEM that verifies --relay-via's TLS certificate "
                        "(default: --tracker-ca, for a relay the tracker serves)")
    parser.add_argument("--relay", metavar="HOST:PORT", help="also serve the relay role here (ADR 0007)")
    parser.add_argument("--relay-public-host", help="the host peers dial for nodes relayed here (default: --relay's)")
    parser.add_argument("--relay-tls-cert", type=Path, help="TLS certificate of the relay role (with --relay)")
    parser.add_argument("--relay-tls-key", type=Path, help="its key")
    parser.add_argument("--no-commitments", action="store_true", help="BENCHMARKS ONLY: keep no commitments (such a "
                        "node cannot be audited; ADR 0008)")
    parser.add_argument("--matmul-activations", choices=MATMUL_ACTIVATIONS,
                        help="what matmuls with quantized weights do with their activations, as the model's "
                             "certified recipe says (its models.json entry): quantized (llama.cpp's arithmetic, the "
                             "gguf default) or f32 (weights dequantized, F32 dot products; ADR 0012). The tracker "
                             "refuses another recipe")
    parser.add_argument("--device", default="cpu",
                        help="gguf: where the worker computes its range: cpu, or a GPU device of a backend its binary "
                             "links (vulkan0, ... with //cpp/worker:worker_vulkan; ADR 0014). The backend is part of the "
                             "recipe: the model must be certified on it")
    parser.add_argument("--optimized-kernels", action="store_true", help="BENCHMARKS ONLY: upstream's CPU "
                        "defaults (ggml's optimized kernels, flash attention over an F16 KV cache); sessions batched "
                        "together may then differ from solo (ADR 0009, 0010)")
    parser.add_argument("--cheat", help="TESTS ONLY: a cheating worker (noise:F, garbage, forge_tokens, skip_layer) that audits "
                        "must catch (ADR 0008)")
    join.add_pieces_arguments(parser)
    parser.add_argument("--cheat-serve-gguf", type=Path, help="TESTS ONLY: the worker loads this GGUF (e.g. a cheaper "
                        "quantization) while the node registers --gguf's fingerprints")
    args = parser.parse_args(argv)
    try:
        restarts = RestartBudget(args.max_restarts, args.restart_window_seconds)
    except ValueError as err:
        parser.error(f"--max-restarts/--restart-window-seconds: {err}")
    token = tracker_token(parser, args.token_file, "MESHNET_NODE_TOKEN", "node", args.tracker_ca, args.insecure)
    if not args.gguf.is_file():
        parser.error(f"no GGUF file at {args.gguf}")
    if args.backend == "gguf" and (args.worker_binary is None or not Path(args.worker_binary).is_file()):
        parser.error("--backend gguf needs --worker-binary (or $MESHNET_WORKER_BINARY) naming cpp/worker's binary")
    if args.behind_nat and not args.relay_via:
        parser.error("--behind-nat needs --relay-via HOST:PORT (the relay that peers reach this node through)")
    if args.relay and not args.insecure and not (args.relay_tls_cert and args.relay_tls_key):
        parser.error("--relay needs --relay-tls-cert and --relay-tls-key (or --insecure)")
    for flag, value in (("--metrics-listen", args.metrics_listen), ("--advertise", args.advertise),
                        ("--relay-via", args.relay_via), ("--relay", args.relay)):
        if value:
            try:
                parse_listen(value)
            except ValueError as err:
                parser.error(f"{flag}: {err}")
    start, end = args.layers

    try:
        # a per-range part (cut_model) declares the whole file it was cut from, if it holds the range
        artifact = declared_artifact_fingerprint(args.gguf, start, end)
        summary, range_fp = summarize_range(args.gguf, start, end)  # one parse of the GGUF
    except ValueError as err:
        parser.error(f"--layers {start}:{end}: {err}")
    if args.backend == "reference" and part_of(args.gguf) is not None:
        parser.error(f"{args.gguf} is a per-range part: the reference backend (Transformers) loads only whole GGUF "
                     "files; serve parts with --backend gguf")
    try:
        recipe = recipe_of(summary, args.backend, args.matmul_activations, compute_backend_of(args.device))
    except ValueError as err:
        parser.error(f"--matmul-activations/--device: {err}")
    budget: Optional[DeviceBudget] = None
    if args.backend == "gguf":
        try:
            budget = device_budget(args, start, end)
        except (ValueError, RuntimeError) as err:  # DoesNotFit among them: nothing is loaded yet
            parser.error(f"--device {args.device}: {err}")
        log("device", device=budget.device.name, description=budget.device.description,
            free_bytes=budget.device.memory_free_bytes, budget_bytes=budget.budget_bytes,
            kv_tokens=budget.kv_tokens, memory_bytes=budget.memory_bytes)
    max_kv_tokens = budget.kv_tokens if budget else (args.max_kv_tokens or DEFAULT_KV_TOKENS)
    identity = Identity.load_or_create(args.identity)
    node_id = identity.node_id
    relay_ca = args.relay_ca or args.tracker_ca
    via = Via(args.relay_via, identity, token, None if args.insecure else relay_ca.read_bytes()) \
        if args.relay_via else None
    tracker = TrackerClient(args.tracker, token, identity, tls_name=args.tracker_tls_name,
                            tracker_ca=None if args.insecure else args.tracker_ca.read_bytes())
    try:
        tracker_key = tracker.tracker_key()
    except grpc.RpcError as err:
        log("tracker_unreachable", tracker=args.tracker, error=err.code().name, message=err.details())
        return 1
    with tempfile.TemporaryDirectory(prefix="meshnet-node-tls-") as private:
        cert_path, key_path = Path(private) / "shard.crt", Path(private) / "shard.key"
        cert_pem, key_pem = (None, None) if args.insecure else tls.write_node_certificate(cert_path, key_path)
        backend: Backend  # the node drives either through the one interface
        if args.backend == "gguf":
            served = args.cheat_serve_gguf or args.gguf  # tests only: another file than the one certified
            backend = GgufBackend(Path(args.worker_binary), served, (start, end), args.listen, node_id,
                                  threads=args.threads, max_sessions=args.max_sessions,
                                  max_kv_tokens=max_kv_tokens, idle_seconds=args.session_idle_seconds,
                                  tracker_key=tracker_key,
                                  tls=(cert_path, key_path) if cert_pem else None,
                                  log=args.port_file.with_suffix(".worker.log") if args.port_file else None,
                                  node_key=identity.seed, cheat=args.cheat or "",
                                  commitments=not args.no_commitments,
                                  reference_kernels=not args.optimized_kernels,
                                  f32_matmul_activations=recipe.matmul_activations == "f32", device=args.device)
        else:
            import torch  # only the reference backend computes in this process

            torch.set_num_threads(args.threads)
            backend = ReferenceBackend(args.gguf, (start, end), args.listen, node_id,
                                       max_sessions=args.max_sessions, max_kv_tokens=max_kv_tokens,
                                       idle_seconds=args.session_idle_seconds, tracker_key=tracker_key,
                                       tls=(cert_pem, key_pem) if cert_pem else None)
        probe = node_metrics.HealthProbe(lambda: backend.address, cert_pem)
        metrics = node_metrics.NodeMetrics(node_id, args.model, backend.kind, (start, end), probe)
        try:
            http = node_metrics.serve(metrics, args.metrics_listen) if args.metrics_listen else None
        except (OSError, RuntimeError) as err:
            log("metrics_unavailable", listen=args.metrics_listen, error=str(err))
            backend.stop()
            return 1
        if http is not None:
            log("metrics", node=node_id, url=f"{http.url}/metrics")
            write_port_file(args.metrics_port_file, http.port)
        try:
            relay = RelayServer(args.relay, args.relay_public_host or args.relay.rpartition(":")[0], token=token,
                                tls=None if args.insecure else (args.relay_tls_cert.read_bytes(),
                                                                args.relay_tls_key.read_bytes())).start() \
                if args.relay else None
        except OSError as err:
            log("relay_unavailable", listen=args.relay, error=str(err))
            backend.stop()
            return 1
        try:
            pieces = join.serve_pieces(args, token, tracker_key, (cert_pem, key_pem) if cert_pem else None)
        except (OSError, ValueError) as err:
            log("pieces_unavailable", manifest=str(args.pieces_manifest), error=str(err))
            backend.stop()
            return 1
        try:
            return serve(args, tracker, backend, via, tt.NodeInfo(
                node_id, backend.address, backend.kind, args.model, summary.architecture,
                Fingerprints(artifact, recipe.fingerprint()), range_fp, tt.LayerRange(start, end),
                tt.Capacity(args.max_sessions, max_kv_tokens, budget.memory_bytes if budget else 0,
                            backend.max_session_tokens),
                summary.n_layer, identity.public_key, cert_pem.decode() if cert_pem else "",
                device=budget.device if budget else None,
                pieces_address=pieces.address if pieces else ""), metrics, restarts)
        finally:
            if pieces is not None:
                pieces.stop()
            if relay is not None:
                relay.stop()
            if http is not None:
                http.stop()
            probe.close()


def device_budget(args: argparse.Namespace, start: int, end: int) -> DeviceBudget:
    """What a gguf node holds on --device: its worker binary's device list, the range's memory at
    the worker's KV type, --device-memory and --max-kv-tokens (node/device_budget.py)."""
    # The worker's KV is F32 for its F32 attention, F16 under upstream's kernels (engine.cc
    # UsesF32Attention).
    memory = range_memory(args.gguf, start, end, "f16" if args.optimized_kernels else "f32")
    found = find_device(list_devices(Path(args.worker_binary)), args.device)
    return plan(found, memory, layers=(start, end), max_kv_tokens=args.max_kv_tokens,
                device_memory=args.device_memory)


def serve(args: argparse.Namespace, tracker: TrackerClient, backend, via: Optional["Via"], info: tt.NodeInfo,
          metrics: node_metrics.NodeMetrics, restarts: RestartBudget) -> int:
    """Registers, heartbeats and supervises until a stop signal, then drains; the exit status.
    `restarts`: how many times a dead or hung worker may be restarted, over a sliding window."""
    node_id = info.node_id

    def take_work() -> tuple[tt.WorkEntry, ...]:
        entries = backend.take_work()
        metrics.count_work(entries)
        return entries

    def node_info() -> tt.NodeInfo:
        if via is not None and via.agent is not None:
            return dataclasses.replace(info, address=via.agent.address, relay=via.relay, relay_rtt_ms=via.agent.rtt_ms)
        return dataclasses.replace(info, address=args.advertise or backend.address)

    link = TrackerLink(tracker, node_info)

    def attach() -> None:  # a new allocation (the relay restarted) is registered at the next tick
        via.attach(backend, on_address=lambda address: setattr(link, "registered", False))

    if args.behind_nat and via is not None:
        try:
            attach()
        except RelayUnavailable as err:
            log("relay_unavailable", node=node_id, relay=args.relay_via, error=str(err))
            backend.stop()
            return 1
    try:
        try:
            link.register()
        except NodeRefused as refused:
            if refused.reply.status.code != StatusCode.UNAVAILABLE or via is None or via.agent is not None:
                raise
            log("unreachable", node=node_id, reason=refused.reply.reason, relay=via.relay)
            attach()
            link.register()
    except (NodeRefused, RelayUnavailable) as err:
        log("not_registered", node=node_id, reason=str(err))
        if via is not None:
            via.stop()
        backend.stop()
        return 2
    stop = stop_on_signals()  # before the port file: a launcher may signal as soon as it sees it
    write_port_file(args.port_file, int(backend.address.rsplit(":", 1)[1]))
    unanswered = 0
    try:
        while not stop.wait(args.heartbeat_seconds):
            try:
                load = backend.load() if backend.alive() else None
                unanswered = 0
            except grpc.RpcError as err:  # alive but not answering Health: hung (e.g. SIGSTOP)
                unanswered += 1
                log("worker_unresponsive", node=node_id, error=err.code().name, times=unanswered)
                if unanswered < args.hang_probes:
                    continue  # no heartbeat: the tracker stops routing here when the lease lapses
                load = None
                backend.kill()  # a hang that lasts is treated as a crash: restarted below
            if load is None:
                _quietly(tracker.deregister, node_id)  # its sessions are gone; clients fail over
                link.registered = False
                if not restarts.allow(time.monotonic()):
                    log("worker_failed", node=node_id, restarts=restarts.recent(time.monotonic()),
                        window_seconds=args.restart_window_seconds)
                    tracker.close()
                    return 1
                metrics.count_restart()
                log("worker_restart", node=node_id, restarts=restarts.recent(time.monotonic()))
                backend.restart()
                unanswered = 0
                continue
            link.tick(load, take_work)  # registers again after a restart or outage
            metrics.heartbeat(load, link.registered)
    except NodeRefused as refused:
        log("refused", node=node_id, reason=str(refused))
        backend.stop()
        tracker.close()
        return 2
    log("draining", node=node_id)
    _quietly(tracker.drain, node_id)
    deadline = time.monotonic() + args.drain_seconds
    while backend.alive() and _active_sessions(backend) and time.monotonic() < deadline:
        time.sleep(0.1)
    if backend.alive():
        link.flush(take_work)
    _quietly(tracker.deregister, node_id)
    if via is not None:
        via.stop()
    backend.stop()
    tracker.close()
    log("stopped", node=node_id)
    return 0


class Via:
    """The relay a node is reached through, once it needs one (ADR 0007)."""

    def __init__(self, relay: str, identity: Identity, token: str, ca: Optional[bytes]) -> None:
        self.relay, self._identity, self._token, self._ca = relay, identity, token, ca
        self.agent: Optional[RelayAgent] = None

    def attach(self, backend, on_address: Callable[[str], None] = lambda address: None) -> str:
        """Holds an allocation that pipes to the backend's shard service; its address."""
        agent = RelayAgent(self.relay, self._identity, self._token, lambda: backend.address, ca=self._ca,
                           on_address=on_address)
        address = agent.start()
        self.agent = agent
        return address

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()


def _active_sessions(backend) -> int:
    try:
        return backend.load().active_sessions
    except grpc.RpcError:
        return 0  # a worker that does not answer has nothing to finish for us


def _quietly(call, node_id: str) -> None:
    """A courtesy call to the tracker that must not stop the node if the tracker is gone."""
    try:
        call(node_id)
    except grpc.RpcError as err:
        log("tracker_unreachable", node=node_id, call=getattr(call, "__name__", "?"), error=err.code().name)


if __name__ == "__main__":
    sys.exit(main())
