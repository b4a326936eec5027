"""`bazel run //python:node -- --tracker HOST:PORT --gguf PATH --model NAME --layers A:B [--backend gguf]`.

Runs the shard backend (reference: HF Transformers in this process; gguf: the native worker as
a supervised child process, restarted if it dies), serves the seam protocol, computes the artifact, recipe and range
fingerprints, registers with the tracker and heartbeats with load telemetry. SIGTERM drains:
no new routes, live sessions get `--drain-seconds` to finish, then the node deregisters and
stops. Exit status 2 when the tracker refuses the node (the reason is logged).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from meshnet.node.backends import GgufBackend, ReferenceBackend
from meshnet.process import log, read_secret, stop_on_signals, write_port_file
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.certify import recipe_of
from meshnet.recipe.fingerprint import artifact_fingerprint, summarize_range
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


def report_work(tracker: TrackerClient, node_id: str, backend) -> None:
    """Moves the backend's token counters to the tracker's ledger (at most once: counters that
    are taken but not acknowledged are logged, not retried)."""
    entries = backend.take_work()
    if entries:
        reply = tracker.report_work(tt.WorkReport(NodeId(node_id), entries))
        if not reply.status.ok:
            log("work_report_refused", node=node_id, entries=len(entries), status=reply.status.code.name,
                message=reply.status.message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Meshnet node")
    parser.add_argument("--tracker", required=True, help="tracker host:port")
    parser.add_argument("--secret-file", type=Path, help="swarm secret (else $MESHNET_SWARM_SECRET)")
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--model", required=True, help="the certified model name")
    parser.add_argument("--layers", required=True, type=parse_layers, help="START:END, end exclusive")
    parser.add_argument("--backend", choices=["reference", "gguf"], default="reference")
    parser.add_argument("--worker-binary", type=Path, default=os.environ.get("MESHNET_WORKER_BINARY"),
                        help="the native worker (cpp/worker), for --backend gguf")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port of the shard service")
    parser.add_argument("--node-id", help="default: <host>-<pid>")
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--max-kv-tokens", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=1, help="compute threads")
    parser.add_argument("--heartbeat-seconds", type=float, default=2.0)
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--session-idle-seconds", type=float, default=300.0,
                        help="free a session that sent nothing for this long")
    parser.add_argument("--max-restarts", type=int, default=3, help="worker restarts before giving up (gguf)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once registered")
    args = parser.parse_args(argv)
    secret = read_secret(args.secret_file)
    if not secret:
        parser.error("a swarm secret is required: --secret-file or $MESHNET_SWARM_SECRET")
    if not args.gguf.is_file():
        parser.error(f"no GGUF file at {args.gguf}")
    if args.backend == "gguf" and (args.worker_binary is None or not Path(args.worker_binary).is_file()):
        parser.error("--backend gguf needs --worker-binary (or $MESHNET_WORKER_BINARY) naming cpp/worker's binary")
    start, end = args.layers

    try:
        summary, range_fp = summarize_range(args.gguf, start, end)  # one parse of the GGUF
    except ValueError as err:
        parser.error(f"--layers {start}:{end}: {err}")
    artifact = artifact_fingerprint(args.gguf)
    recipe = recipe_of(summary, args.backend).fingerprint()
    node_id = args.node_id or f"{socket.gethostname()}-{os.getpid()}"
    if args.backend == "gguf":
        backend = GgufBackend(Path(args.worker_binary), args.gguf, (start, end), args.listen, node_id,
                              threads=args.threads, max_sessions=args.max_sessions, max_kv_tokens=args.max_kv_tokens,
                              log=args.port_file.with_suffix(".worker.log") if args.port_file else None)
    else:
        import torch  # only the reference backend computes in this process

        torch.set_num_threads(args.threads)
        backend = ReferenceBackend(args.gguf, (start, end), args.listen, node_id, Fingerprints(artifact, recipe),
                                   max_sessions=args.max_sessions, max_kv_tokens=args.max_kv_tokens,
                                   idle_seconds=args.session_idle_seconds)

    def node_info() -> tt.NodeInfo:
        return tt.NodeInfo(NodeId(node_id), backend.address, backend.kind, args.model, summary.architecture,
                           Fingerprints(artifact, recipe), range_fp, tt.LayerRange(start, end),
                           tt.Capacity(args.max_sessions, args.max_kv_tokens, 0), summary.n_layer)

    tracker = TrackerClient(args.tracker, secret)
    reply = tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info()))
    log("registered", node=node_id, backend=args.backend, address=backend.address, layers=[start, end],
        admission=reply.admission.name, status=reply.status.code.name, reason=reply.reason)
    if not reply.status.ok or reply.admission == tt.Admission.REFUSED:
        backend.stop()
        return 2
    write_port_file(args.port_file, int(backend.address.rsplit(":", 1)[1]))
    stop = stop_on_signals()
    restarts = 0
    while not stop.wait(args.heartbeat_seconds):
        if not backend.alive():
            tracker.deregister(NodeId(node_id))  # its sessions are gone; clients fail over
            if restarts >= args.max_restarts:
                log("worker_failed", node=node_id, restarts=restarts)
                tracker.close()
                return 1
            restarts += 1
            log("worker_restart", node=node_id, restarts=restarts)
            backend.restart()
            tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info()))
            continue
        beat = tracker.heartbeat(NodeId(node_id), backend.load())
        report_work(tracker, node_id, backend)
        if beat.status.code.name == "NOT_FOUND":  # the lease lapsed (e.g. tracker restart): register again
            tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info()))
    log("draining", node=node_id)
    tracker.drain(NodeId(node_id))
    deadline = time.monotonic() + args.drain_seconds
    while backend.alive() and backend.load().active_sessions and time.monotonic() < deadline:
        time.sleep(0.1)
    if backend.alive():
        report_work(tracker, node_id, backend)
    tracker.deregister(NodeId(node_id))
    backend.stop()
    tracker.close()
    log("stopped", node=node_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
