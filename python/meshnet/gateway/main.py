"""`bazel run //python:gateway -- --tracker HOST:PORT --tracker-ca CA.pem --token-file GATEWAY.token
--model NAME=PATH.gguf [--model ...] --keys-file KEYS.json [--listen 127.0.0.1:8000]`: the
OpenAI-compatible gateway (api.py) in front of a swarm.

The gateway is a tracker client with the "gateway" role (its token from --token-file or
$MESHNET_GATEWAY_TOKEN) and its own Ed25519 identity (--identity, created 0600 if absent, else a
fresh one per run). Each --model names a certified model and the GGUF its tokenizer and chat
template come from (only its metadata is read). --keys-file lists the API keys (keys.py);
without one the gateway refuses to start unless --no-auth says it is a private, loopback
deployment. Served by uvicorn; SIGTERM/SIGINT stop it; logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path
from typing import Optional

import uvicorn

from meshnet.gateway.api import Gateway, GatewayConfig, ServedModel, create_app
from meshnet.gateway.generation import SwarmBackend
from meshnet.gateway.keys import KeyRing
from meshnet.gateway.tokenizer import GgufTokenizer
from meshnet.identity.keys import Identity
from meshnet.process import log, tracker_token, write_port_file
from meshnet.protocol.tracker_client import TrackerClient, tracker_addresses


def parse_model(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("expected NAME=PATH.gguf")
    return name, Path(path)


def bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


MAX_REQUEST_HEAD_BYTES = 64 << 10


def server_config(app, max_connections: int) -> uvicorn.Config:
    """uvicorn for the gateway: at most `max_connections` connections and requests at a time (more
    are answered 503 before anything is parsed), request heads of at most 64 KiB, idle
    keep-alive connections closed after 5 s. Bodies are bounded by the app (api.py). (uvicorn
    refuses once its count reaches the limit, the new connection included: hence + 1.)"""
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
                          limit_concurrency=max_connections + 1, timeout_keep_alive=5,
                          h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES, server_header=False)


def serve(app, sock: socket.socket, max_connections: int, port_file: Optional[Path] = None) -> None:
    """Runs uvicorn on an already bound socket until SIGTERM/SIGINT."""
    server = uvicorn.Server(server_config(app, max_connections))
    host, port = sock.getsockname()[:2]
    log("listening", address=f"{host}:{port}", base_url=f"http://{host}:{port}/v1")
    write_port_file(port_file, port)
    asyncio.run(server.serve(sockets=[sock]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Meshnet's OpenAI-compatible gateway")
    parser.add_argument("--tracker", required=True, type=tracker_addresses,
                        help="tracker HOST:PORT; several, comma-separated, for replicated trackers (calls fail over between them)")
    parser.add_argument("--tracker-ca", type=Path, help="PEM that verifies the tracker's TLS certificate")
    parser.add_argument("--token-file", type=Path, help="the gateway role's token (else $MESHNET_GATEWAY_TOKEN)")
    parser.add_argument("--identity", type=Path, help="Ed25519 key file (created 0600 if absent); default: fresh")
    parser.add_argument("--model", action="append", type=parse_model, required=True,
                        help="NAME=PATH.gguf: a certified model and the GGUF its tokenizer comes from (repeatable)")
    parser.add_argument("--keys-file", type=Path, help="JSON list of API keys (see meshnet/gateway/keys.py)")
    parser.add_argument("--no-auth", action="store_true", help="serve without API keys (private loopback use)")
    parser.add_argument("--listen", default="127.0.0.1:8000", help="host:port (port 0 picks one)")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext to the tracker and the hops (loopback development only)")
    parser.add_argument("--default-max-tokens", type=int, default=256)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-connections", type=int, default=1024,
                        help="connections and requests at a time; more are answered 503")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    args = parser.parse_args(argv)

    token = tracker_token(parser, args.token_file, "MESHNET_GATEWAY_TOKEN", "gateway", args.tracker_ca, args.insecure)
    if args.keys_file is None and not args.no_auth:
        parser.error("--keys-file is required (or --no-auth for a private loopback gateway)")
    try:
        keys = KeyRing.load(args.keys_file) if args.keys_file else None
        models = [ServedModel(name, GgufTokenizer.from_gguf(path)) for name, path in args.model]
        sock = bind(args.listen)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    identity = Identity.load_or_create(args.identity) if args.identity else Identity.generate()
    tracker = TrackerClient(args.tracker, token, identity,
                            tracker_ca=None if args.insecure else args.tracker_ca.read_bytes())
    gateway = Gateway(models, SwarmBackend(tracker, insecure=args.insecure), keys,
                      GatewayConfig(default_max_tokens=args.default_max_tokens, max_body_bytes=args.max_body_bytes))
    log("gateway", tracker=args.tracker, models=[m.name for m in models], auth=keys is not None)
    serve(create_app(gateway), sock, args.max_connections, args.port_file)
    tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
