"""The reference shard alone, as a process: layers [A, B) of a GGUF on HF Transformers, served
over the seam protocol with the same admission rules as the native worker (ADR 0003).

  python -m meshnet.reference.main --gguf PATH --layers A:B --node-id ID --tracker-key HEX
      (--tls-cert C --tls-key K | --insecure) [--listen 127.0.0.1:0] [--max-sessions N]

Prints {"event": "listening", "port": N} on stdout once serving, like cpp/worker, so tests and
tools drive either backend the same way; SIGTERM or SIGINT stops it. The node (node/main.py)
runs the same server in its own process; this entry point is for the hop conformance suite and
for operators who want a shard without a tracker.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshnet.process import stop_on_signals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--layers", required=True, help="START:END, end exclusive")
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--tracker-key", required=True, help="the tracker's Ed25519 ticket key, 64 hex digits")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--insecure", action="store_true", help="plaintext (loopback development only)")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--max-kv-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument("--auth-grace-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    try:
        start, end = (int(x) for x in args.layers.split(":"))
        tracker_key = bytes.fromhex(args.tracker_key)
    except ValueError:
        parser.error("--layers wants START:END and --tracker-key 64 hex digits")
    if len(tracker_key) != 32:
        parser.error("--tracker-key must be 32 bytes (64 hex digits)")
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_cert is None and not args.insecure):
        parser.error("give --tls-cert and --tls-key, or --insecure")
    tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes()) if args.tls_cert else None

    import torch  # after argument checks: loading torch takes seconds

    from meshnet.reference.model import ReferenceEngine, ShardModel, load_model
    from meshnet.reference.server import serve_shard

    torch.set_num_threads(args.threads)
    engine = ReferenceEngine(ShardModel(load_model(args.gguf), start, end), args.max_sessions, args.max_kv_tokens)
    server, port = serve_shard(engine, args.node_id, tracker_key, args.listen, tls, layers=(start, end),
                               idle_seconds=args.idle_seconds, auth_grace_seconds=args.auth_grace_seconds)
    stop = stop_on_signals()
    print(json.dumps({"event": "listening", "port": port}), flush=True)
    stop.wait()
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
