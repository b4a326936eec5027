"""`bazel run //python:node -- --tracker HOST:PORT --gguf PATH --model NAME --layers A:B`.

Loads the shard backend, serves the seam protocol, computes the artifact, recipe and range
fingerprints, registers with the tracker and heartbeats with load telemetry. SIGTERM drains:
no new routes, live sessions get `--drain-seconds` to finish, then the node deregisters and
stops. Exit status 2 when the tracker refuses the node (the reason is logged).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import torch

from meshnet.process import log, read_secret, stop_on_signals, write_port_file
from meshnet.protocol import diag
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.certify import node_fingerprints
from meshnet.recipe.fingerprint import range_fingerprint
from meshnet.reference.model import ReferenceEngine, ShardModel, load_model
from meshnet.reference.server import ShardServer
from meshnet.shard.v1 import shard_pb2_grpc
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.seam import Fingerprints, ProtocolVersion


def parse_layers(text: str) -> tuple[int, int]:
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers wants START:END, got {text!r}") from None
    if not 0 <= start < end:
        raise argparse.ArgumentTypeError(f"--layers {text}: need 0 <= START < END")
    return start, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Meshnet node")
    parser.add_argument("--tracker", required=True, help="tracker host:port")
    parser.add_argument("--secret-file", type=Path, help="swarm secret (else $MESHNET_SWARM_SECRET)")
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--model", required=True, help="the certified model name")
    parser.add_argument("--layers", required=True, type=parse_layers, help="START:END, end exclusive")
    parser.add_argument("--backend", choices=["reference", "gguf"], default="reference")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port of the shard service")
    parser.add_argument("--node-id", help="default: <host>-<port>")
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--max-kv-tokens", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--heartbeat-seconds", type=float, default=2.0)
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--session-idle-seconds", type=float, default=300.0,
                        help="free a session that sent nothing for this long")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once registered")
    args = parser.parse_args(argv)
    if args.backend == "gguf":
        parser.error("--backend gguf needs the native shard worker, which is not built yet; use --backend reference")
    secret = read_secret(args.secret_file)
    if not secret:
        parser.error("a swarm secret is required: --secret-file or $MESHNET_SWARM_SECRET")
    if not args.gguf.is_file():
        parser.error(f"no GGUF file at {args.gguf}")
    start, end = args.layers
    torch.set_num_threads(args.threads)

    summary, artifact, recipe = node_fingerprints(args.gguf, args.backend)
    if end > summary.n_layer:
        parser.error(f"--layers {start}:{end} exceeds the model's {summary.n_layer} layers")
    range_fp = range_fingerprint(args.gguf, start, end)
    engine = ReferenceEngine(ShardModel(load_model(args.gguf), start, end), args.max_sessions, args.max_kv_tokens)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 * args.max_sessions + 8))
    host = args.listen.rsplit(":", 1)[0]
    port = server.add_insecure_port(args.listen)
    node_id = args.node_id or f"{socket.gethostname()}-{port}"
    shard = ShardServer(engine, node_id, Fingerprints(artifact, recipe), idle_seconds=args.session_idle_seconds)
    shard_pb2_grpc.add_ShardServicer_to_server(shard, server)
    diag.add_to_server(server, node_id)
    server.start()
    info = tt.NodeInfo(NodeId(node_id), f"{host}:{port}", tt.BackendKind.REFERENCE, args.model, summary.architecture,
                       Fingerprints(artifact, recipe), range_fp, tt.LayerRange(start, end),
                       tt.Capacity(args.max_sessions, args.max_kv_tokens, 0), summary.n_layer)

    tracker = TrackerClient(args.tracker, secret)
    reply = tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), info))
    log("registered", node=node_id, address=info.address, layers=[start, end], admission=reply.admission.name,
        status=reply.status.code.name, reason=reply.reason)
    if not reply.status.ok or reply.admission == tt.Admission.REFUSED:
        server.stop(None)
        return 2
    write_port_file(args.port_file, port)
    stop = stop_on_signals()
    while not stop.wait(args.heartbeat_seconds):
        sessions, tokens = engine.stats()
        beat = tracker.heartbeat(NodeId(node_id), tt.Load(active_sessions=sessions, kv_cells_used=tokens,
                                                           kv_cells_total=args.max_kv_tokens))
        if beat.status.code.name == "NOT_FOUND":  # the lease lapsed (e.g. tracker restart): register again
            tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), info))
    log("draining", node=node_id)
    tracker.drain(NodeId(node_id))
    deadline = time.monotonic() + args.drain_seconds
    while engine.stats()[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    tracker.deregister(NodeId(node_id))
    server.stop(grace=2).wait()
    tracker.close()
    log("stopped", node=node_id, sessions_left=engine.stats()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
