"""The relay's throughput, measured between two hosts: bytes echoed through a TLS gRPC stream.

`serve OUT_JSON [--relay H:P CA TOKEN_FILE | --direct HOST]` runs a Diag service (TLS, its own
certificate) on this host and writes {"address", "certificate"} to OUT_JSON once reachable:
through an allocation on the relay (the host is behind NAT), or directly on HOST; it serves
until SIGTERM. `measure ADDRESS CERT_FILE MIB` (on another host) echoes MIB MiB in 1 MiB
messages over one stream and prints {"bytes", "seconds", "mib_per_s"} (bytes each way).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc

from meshnet.identity import certificates
from meshnet.identity.keys import Identity
from meshnet.identity.tls import bind, pinned_channel
from meshnet.process import stop_on_signals
from meshnet.protocol import diag
from meshnet.relay.agent import RelayAgent

MIB = 1 << 20


def serve(out: Path, mode: str, args: list[str]) -> int:
    cert, key = certificates.self_signed("meshnet-node", ["meshnet-node"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 4 * MIB)])
    diag.add_to_server(server, "throughput")
    host = args[0] if mode == "--direct" else "127.0.0.1"
    local = f"{host}:{bind(server, f'{host}:0', (cert, key))}"
    server.start()
    agent = None
    if mode == "--relay":
        relay, ca, token_file = args
        agent = RelayAgent(relay, Identity.generate(), Path(token_file).read_text().strip(), lambda: local,
                           ca=Path(ca).read_bytes())
        address = agent.start()
    else:
        address = local
    stop = stop_on_signals()
    out.write_text(json.dumps({"address": address, "certificate": cert.decode()}))
    stop.wait()
    if agent is not None:
        agent.stop()
    server.stop(0)
    return 0


def measure(address: str, cert_file: Path, mib: int) -> int:
    payload = b"\x5a" * MIB
    with pinned_channel(address, cert_file.read_bytes()) as channel:
        list(diag.echo(channel, [payload]))  # connect and warm up
        started = time.perf_counter()
        echoed = sum(len(p) for _, p in diag.echo(channel, [payload] * mib, timeout=300))
        seconds = time.perf_counter() - started
    print(json.dumps({"bytes": echoed, "seconds": seconds, "mib_per_s": echoed / MIB / seconds}))
    return 0 if echoed == mib * MIB else 1


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve(Path(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    sys.exit(measure(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
