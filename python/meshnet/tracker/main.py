"""`bazel run //python:tracker -- --listen HOST:PORT --db PATH --models FILE`: runs the tracker.

The swarm secret comes from --secret-file or $MESHNET_SWARM_SECRET (never from argv, which
other users can read). --models is a JSON list of certified models (see README, "Tracker").
SIGTERM/SIGINT stop it gracefully; logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshnet.process import log, read_secret, stop_on_signals, write_port_file
from meshnet.tracker.ledger import Ledger
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve


def load_models(path: Path) -> list[CertifiedModel]:
    try:
        entries = json.loads(path.read_text())
        return [CertifiedModel(**entry) for entry in entries]
    except (OSError, ValueError, TypeError) as err:
        raise SystemExit(f"tracker: cannot read certified models from {path}: {err}") from err


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Meshnet tracker")
    parser.add_argument("--listen", default="127.0.0.1:7700", help="host:port (port 0 picks one)")
    parser.add_argument("--db", required=True, type=Path, help="SQLite work ledger (created if missing)")
    parser.add_argument("--models", type=Path, help="JSON list of certified models")
    parser.add_argument("--secret-file", type=Path, help="file holding the swarm secret")
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--ban-seconds", type=float, default=5.0)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    args = parser.parse_args(argv)

    secret = read_secret(args.secret_file)
    if not secret:
        parser.error("a swarm secret is required: --secret-file or $MESHNET_SWARM_SECRET")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes()) if args.tls_cert else None
    models = load_models(args.models) if args.models else []

    ledger = Ledger(args.db)
    registry = Registry(models, lease_seconds=args.lease_seconds, ban_seconds=args.ban_seconds)
    server, port = serve(registry, ledger, args.listen, secret, tls=tls)
    log("listening", address=args.listen, port=port, db=str(args.db), models=[m.model for m in models],
        tls=tls is not None)
    write_port_file(args.port_file, port)
    stop = stop_on_signals()
    stop.wait()
    log("stopping")
    server.stop(grace=5).wait()
    ledger.close()


if __name__ == "__main__":
    main()
