"""`bazel run //python:gateway -- --tracker HOST:PORT --tracker-ca CA.pem --token-file GATEWAY.token
--model NAME=PATH.gguf [--model ...] --keys-file KEYS.json [--listen 127.0.0.1:8000]`: the
OpenAI-compatible gateway (api.py) in front of a swarm.

The gateway is a tracker client with the "gateway" role (its token from --token-file or
$MESHNET_GATEWAY_TOKEN) and its own Ed25519 identity (--identity, created 0600 if absent, else a
fresh one per run). Each --model names a certified model and the GGUF its tokenizer and chat
template come from (only its metadata is read): that file must be the artifact the tracker
certified (its sha256, certified.py), else the gateway refuses to start (exit 2). --keys-file lists the API keys (keys.py);
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
from meshnet.gateway.certified import uncertified_models
from meshnet.gateway.generation import SwarmBackend
from meshnet.gateway.keys import KeyRing
from meshnet.text.tokenizer import GgufTokenizer
from meshnet.http_bounds import HttpBounds, uvicorn_config
from meshnet.identity.keys import Identity
from meshnet.process import log, raise_file_limit, tracker_token, write_port_file
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


def server_config(app, bounds: HttpBounds) -> uvicorn.Config:
    """uvicorn for the gateway under `bounds` (http_bounds.py): a complete request within
    request_timeout of connecting or of the previous response, connections capped per peer and in
    all, at most max_in_flight requests handled at once (more are answered 503; connections that
    wait are not counted), request heads of at most 64 KiB. Bodies are bounded by the app (api.py)."""
    return uvicorn_config(app, bounds, log_level="warning", timeout_graceful_shutdown=5)


def serve(app, sock: socket.socket, bounds: HttpBounds, port_file: Optional[Path] = None) -> None:
    """Runs uvicorn on an already bound socket until SIGTERM/SIGINT."""
    server = uvicorn.Server(server_config(app, bounds))
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
    parser.add_argument("--max-in-flight", type=int, default=256,
                        help="requests handled at a time (streams included); more are answered 503")
    parser.add_argument("--max-connections", type=int, default=768,
                        help="open connections from all peers; more are closed at once (keep under the fd limit)")
    parser.add_argument("--max-connections-per-peer", type=int, default=64,
                        help="open connections from one IP address (raise it behind a reverse proxy)")
    parser.add_argument("--max-connections-per-prefix", type=int, default=192,
                        help="open connections from one /24 (IPv4) or /64 (IPv6) network (raise it behind a "
                        "reverse proxy)")
    parser.add_argument("--request-timeout", type=float, default=10.0,
                        help="seconds a connection has to send a complete request (head and body)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    args = parser.parse_args(argv)
    raise_file_limit()  # before anything listens

    token = tracker_token(parser, args.token_file, "MESHNET_GATEWAY_TOKEN", "gateway", args.tracker_ca, args.insecure)
    if args.keys_file is None and not args.no_auth:
        parser.error("--keys-file is required (or --no-auth for a private loopback gateway)")
    try:
        bounds = HttpBounds(request_timeout=args.request_timeout, max_connections=args.max_connections,
                            max_per_peer=args.max_connections_per_peer,
                            max_per_prefix=args.max_connections_per_prefix, max_in_flight=args.max_in_flight,
                            max_head_bytes=MAX_REQUEST_HEAD_BYTES)
        keys = KeyRing.load(args.keys_file) if args.keys_file else None
        models = [ServedModel(name, GgufTokenizer.from_gguf(path)) for name, path in args.model]
        sock = bind(args.listen)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    identity = Identity.load_or_create(args.identity) if args.identity else Identity.generate()
    tracker = TrackerClient(args.tracker, token, identity,
                            tracker_ca=None if args.insecure else args.tracker_ca.read_bytes())
    problems = uncertified_models(tracker, args.model)
    if problems:  # before anything is served: templates and vocabularies only from certified files
        tracker.close()
        parser.error("; ".join(problems))
    gateway = Gateway(models, SwarmBackend(tracker, insecure=args.insecure), keys,
                      GatewayConfig(default_max_tokens=args.default_max_tokens, max_body_bytes=args.max_body_bytes))
    log("gateway", tracker=args.tracker, models=[m.name for m in models], auth=keys is not None)
    serve(create_app(gateway), sock, bounds, args.port_file)
    tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
