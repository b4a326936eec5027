"""`bazel run //python:tracker -- --init DIR [--listen HOST:PORT] [--advertise HOST]`: makes a
tracker's every file in DIR (state_dir.py), serves, and prints its address and its certificate's
SHA-256; `--state DIR` serves from DIR again (issue 50). The manual path names each file:
`--listen HOST:PORT (--db PATH | --ledger URL) --models FILE --roles-file FILE --ticket-key FILE
(--tls-cert C --tls-key K | --insecure)`; with --state, a file flag given replaces DIR's file.

The work ledger is a SQLite file (`--db PATH`, created if missing: one tracker) or a PostgreSQL
database (`--ledger postgresql://USER@HOST:PORT/DATABASE`), which every tracker of a replicated
control plane is given, each report counted once whichever tracker it reaches (ledger/ledger_postgres.py).

--roles-file is a JSON object mapping roles ("node", "client", "gateway", "verifier") to their
bearer tokens (never from argv, which other users can read). --ticket-key holds the Ed25519
key that signs route tickets (created 0600 when absent). --models is a JSON list of certified
models (see docs/operating.md, "Tracker"). `--http-listen HOST:PORT` (off by default) also serves the
read-only /metrics, /status and /status.json (tracker/web/web.py says what they reveal); `--relay
HOST:PORT` also serves the relay role (ADR 0007), and `--check-reachability` sends a node the
tracker cannot reach to a relay. `--audit-rate` (default 0.05) of closed route sessions are
queued for the verifier role (ADR 0008); a hop is quarantined when `--audit-quorum` (default 2)
verifiers refute it (ADR 0016), each enrolled verifier key counting one and all others together
one (issue 55, finding 9; `audit_quorum_warning` at start says when that matters), and the
ledger, the quarantine's record, is read again every QUARANTINE_SYNC_SECONDS (an operator's
`ledger release NODE_ID` takes effect). Every calling key is a principal with quotas
(`--max-routes-per-principal`, `--failure-reports-per-minute`); for the roles in
`--enrolled-roles` only keys the operator enrolled in the ledger are served (`python -m
meshnet.tracker.ledger.principals enroll ROLE KEY`, read again every QUARANTINE_SYNC_SECONDS;
ADR 0017). `--etcd HOST:PORT,HOST:PORT,...` keeps nodes, route
sessions, bans and the quarantine in etcd under `--etcd-prefix`, shared by every tracker given
the same cluster and prefix (ADR 0011); without it the state is in memory (one tracker).
`--etcd-ca/--etcd-cert/--etcd-key` speak to etcd over TLS with a client certificate (etcd's
--client-cert-auth); without them, plain http on a network only trackers reach. SIGTERM/SIGINT
stop it gracefully; logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Optional

from meshnet.identity.keys import Identity
from meshnet.identity.roles import ROLES
from meshnet.process import log, raise_file_limit, stop_on_signals, write_port_file
from meshnet.relay.server import RelayServer
from meshnet.tracker.audits import DEFAULT_QUORUM, DEFAULT_RATE, Audits, quorum_warning
from meshnet.tracker.grpc_server import ServerLimits
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.ledger_postgres import is_postgres_url
from meshnet.tracker.ledger.principals import DEFAULT_FAILURE_REPORTS_PER_MINUTE, DEFAULT_MAX_ROUTES, Principals
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.prefill_grace import DEFAULT_GRACE_SECONDS, check_grace
from meshnet.tracker.probe import health_fails
from meshnet.tracker.certified import load_models
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import TICKET_SECONDS, serve
from meshnet.tracker.state_dir import StateDir, certificate_names, certificate_sha256, init
from meshnet.tracker.store import etcd_client
from meshnet.tracker.store.etcd_store import DEFAULT_PREFIX, EtcdStore
from meshnet.tracker.store.state_store import StoreError
from meshnet.tracker.web import web
from meshnet.weights.piece_service import PublishedModels

QUARANTINE_SYNC_SECONDS = 5.0  # how often the ledger's quarantines and enrolments are read


def load_roles(path: Path) -> dict[str, str]:
    try:
        roles = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"tracker: cannot read role tokens from {path}: {err}") from err
    if not isinstance(roles, dict) or not all(isinstance(v, str) for v in roles.values()):
        raise SystemExit(f"tracker: {path} must map roles {ROLES} to token strings")
    return roles


def apply_state(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Optional[StateDir]:
    """With --init or --state, the state directory (made first with --init), and every file flag
    not given set to its file there; without, checks the hand-made files are all named."""
    if args.force and not args.init:
        parser.error("--force goes with --init")
    if args.init is None and args.state is None:
        if args.roles_file is None or args.ticket_key is None or (args.db is None and args.ledger is None):
            parser.error("--roles-file, --ticket-key and --db (or --ledger) are required, or --init DIR makes them")
        return None
    if args.insecure:
        parser.error("--init and --state serve TLS with their own certificate; --insecure is for hand-made "
                     "loopback swarms")
    state = StateDir(args.init or args.state)
    if args.init is not None:
        listen_host = args.listen.rpartition(":")[0].strip("[]")
        try:
            replaced = init(state, *certificate_names(listen_host, args.advertise), force=args.force)
        except (FileExistsError, OSError) as err:
            parser.error(f"--init: {err}")
        log("state_made", directory=str(state.root), replaced=[str(p) for p in replaced])
    elif state.missing():
        parser.error(f"--state {state.root}: not a tracker's state directory, missing "
                     f"{', '.join(p.name for p in state.missing())} (make one with --init DIR)")
    args.roles_file = args.roles_file or state.roles
    args.ticket_key = args.ticket_key or state.ticket_key
    args.tls_cert, args.tls_key = args.tls_cert or state.tls_cert, args.tls_key or state.tls_key
    args.models = args.models or state.models
    args.published = args.published or state.published
    if args.db is None and args.ledger is None:
        args.db = state.ledger
    return state


def published_models(root: Optional[Path], ticket_key: Identity,
                     models: list[CertifiedModel]) -> Optional[PublishedModels]:
    """The published models under `root` whose artifact a certified entry names (None: no --published)."""
    if root is None:
        return None
    published = PublishedModels(root, ticket_key.public_key, [m.artifact_fingerprint for m in models])
    log("published_models", directory=str(root), models=sorted(published.models))
    return published


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The gRPC server's limits, with the connection caps of the command line."""
    limits = ServerLimits()
    return dataclasses.replace(limits, connections=dataclasses.replace(
        limits.connections, max_connections=args.max_connections, max_per_peer=args.max_connections_per_peer,
        max_per_prefix=args.max_connections_per_prefix))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Meshnet tracker")
    parser.add_argument("--listen", default="127.0.0.1:7700", help="host:port (port 0 picks one)")
    state_at = parser.add_mutually_exclusive_group()
    state_at.add_argument("--init", type=Path, metavar="DIR",
                          help="make everything a tracker needs in DIR (role tokens, ticket key, TLS certificate and "
                          "key, ledger, models list; mode 0600), then serve from it; an existing file is an error "
                          "unless --force")
    state_at.add_argument("--state", type=Path, metavar="DIR", help="serve from a directory --init made")
    parser.add_argument("--force", action="store_true", help="with --init: replace the files DIR already holds")
    parser.add_argument("--advertise", action="append", default=[], metavar="HOST",
                        help="with --init: a name or address peers dial (put in the certificate; repeatable)")
    ledger_at = parser.add_mutually_exclusive_group()
    ledger_at.add_argument("--db", type=Path, help="SQLite work ledger (created if missing)")
    ledger_at.add_argument("--ledger", metavar="URL",
                           help="PostgreSQL work ledger, postgresql://USER[:PASSWORD]@HOST:PORT/DATABASE (tables created "
                           "if missing), shared with the other trackers given the same URL; a password is better "
                           "kept in ~/.pgpass or $PGPASSWORD than on the command line")
    parser.add_argument("--models", type=Path, help="JSON list of certified models")
    parser.add_argument("--published", type=Path, metavar="DIR",
                        help="serve the pieces of the models `//python:publish` put here (one directory per model; "
                        "default with --state: its models/); only manifests this tracker's key signed for a "
                        "certified artifact are served")
    parser.add_argument("--allow-uncertified", action="store_true",
                        help="serve models.json entries without a passed certification (local test swarms only)")
    parser.add_argument("--roles-file", type=Path, help="JSON: role -> bearer token (default with --state: its own)")
    parser.add_argument("--ticket-key", type=Path, help="Ed25519 ticket key (created if absent; default with --state: "
                        "its own)")
    parser.add_argument("--ticket-seconds", type=float, default=TICKET_SECONDS, help="route ticket lifetime")
    parser.add_argument("--lease-seconds", type=float, default=10.0, help="node lease (heartbeat within it)")
    parser.add_argument("--route-lease-seconds", type=float, default=60.0,
                        help="route lease: a route its client neither renews nor closes frees its hops after it")
    parser.add_argument("--route-prefill-grace-seconds", type=float, default=DEFAULT_GRACE_SECONDS,
                        help="a route epoch none of whose hops reports a prefill within this is closed and its "
                        "sessions return (tracker/prefill_grace.py); keep it above the longest first-hop prefill "
                        "the swarm serves plus a node heartbeat")
    parser.add_argument("--ban-seconds", type=float, default=5.0,
                        help="first ban of a node reported failed; each further report doubles it")
    parser.add_argument("--max-ban-seconds", type=float, default=300.0, help="the longest ban")
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--insecure", action="store_true", help="plaintext (loopback development only)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--http-listen", help="host:port for the read-only /metrics and /status pages (off by "
                        "default; port 0 picks one; bind a loopback or private address: anyone reaching it sees "
                        "the swarm)")
    parser.add_argument("--http-port-file", type=Path, help="write the HTTP port here (before --port-file)")
    parser.add_argument("--check-reachability", action="store_true",
                        help="refuse (UNAVAILABLE) a node whose registered address does not accept a TCP connection "
                        "from the tracker, so that it registers through a relay instead (ADR 0007)")
    parser.add_argument("--relay", metavar="HOST:PORT",
                        help="also serve the relay role here (ADR 0007; same TLS certificate as the tracker; only "
                        "holders of the node role's token may attach); port 0 picks one")
    parser.add_argument("--relay-public-host", help="the host peers dial for relayed nodes (default: --relay's host)")
    parser.add_argument("--relay-port-file", type=Path, help="write the relay's port here (before --port-file)")
    parser.add_argument("--audit-rate", type=float, default=DEFAULT_RATE,
                        help="fraction of closed route sessions queued for the verifier role to audit (ADR 0008)")
    parser.add_argument("--audit-seed", type=int, help="seed of the audit draw (default: random)")
    parser.add_argument("--audit-quorum", type=int, default=DEFAULT_QUORUM,
                        help="verifiers that must refute the same hop before it is quarantined and its credit "
                        "withheld (ADR 0016): each enrolled verifier key counts one, all unenrolled keys together one")
    parser.add_argument("--enrolled-roles", default="", metavar="ROLE,...",
                        help="roles whose keys must be enrolled in the ledger (client, gateway, verifier; "
                        "python -m meshnet.tracker.ledger.principals enroll); default none: any key with the role's "
                        "token")
    parser.add_argument("--max-routes-per-principal", type=int, default=DEFAULT_MAX_ROUTES,
                        help="routes one key may hold open at once, unless its enrolment names its own quota")
    parser.add_argument("--failure-reports-per-minute", type=int, default=DEFAULT_FAILURE_REPORTS_PER_MINUTE,
                        help="failure reports one key may make in any minute (or two per route it holds, if more)")
    caps = ServerLimits().connections
    parser.add_argument("--max-connections", type=int, default=caps.max_connections,
                        help="connections open on the gRPC port in all (lowered to what the file limit holds)")
    parser.add_argument("--max-connections-per-peer", type=int, default=caps.max_per_peer,
                        help="connections open on the gRPC port from one IP address")
    parser.add_argument("--max-connections-per-prefix", type=int, default=caps.max_per_prefix,
                        help="connections open on the gRPC port from one /24 (IPv4) or /64 (IPv6)")
    parser.add_argument("--etcd", metavar="HOST:PORT,...",
                        help="keep the tracker state in this etcd cluster (its members' client addresses), shared "
                        "with the other trackers on it (ADR 0011); default: in memory, this tracker alone")
    parser.add_argument("--etcd-prefix", default=DEFAULT_PREFIX,
                        help="the keys of this swarm in etcd (trackers of one swarm use the same prefix)")
    parser.add_argument("--etcd-ca", type=Path, help="TLS to etcd: the CA that signed its members' certificates "
                        "(with --etcd-cert and --etcd-key; without the three, etcd is spoken to in plain http)")
    parser.add_argument("--etcd-cert", type=Path, help="this tracker's client certificate for etcd's "
                        "--client-cert-auth (signed by a CA in etcd's --trusted-ca-file)")
    parser.add_argument("--etcd-key", type=Path, help="the private key of --etcd-cert")
    args = parser.parse_args(argv)
    raise_file_limit()  # before anything listens
    state = apply_state(parser, args)

    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is None and not args.insecure:
        parser.error("TLS is required: --tls-cert and --tls-key (or --insecure for loopback development)")
    try:
        check_grace(args.route_prefill_grace_seconds)
    except ValueError as err:
        parser.error(f"--route-prefill-grace-seconds: {err}")
    roles = load_roles(args.roles_file)
    tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes()) if args.tls_cert else None
    models = load_models(args.models, args.allow_uncertified) if args.models else []

    if not 0.0 <= args.audit_rate <= 1.0:
        parser.error("--audit-rate must be in [0, 1]")
    if args.audit_quorum < 1:
        parser.error("--audit-quorum must be at least 1")
    if args.ledger is not None and not is_postgres_url(args.ledger):
        parser.error("--ledger takes a postgresql:// URL (a SQLite ledger is --db PATH)")
    store = None
    etcd_tls_flags = (args.etcd_ca, args.etcd_cert, args.etcd_key)
    if any(etcd_tls_flags) and not all(etcd_tls_flags):
        parser.error("--etcd-ca, --etcd-cert and --etcd-key go together")
    if any(etcd_tls_flags) and not args.etcd:
        parser.error("--etcd-ca, --etcd-cert and --etcd-key need --etcd")
    if args.etcd:
        etcd_tls = etcd_client.EtcdTls(args.etcd_ca, args.etcd_cert, args.etcd_key) if args.etcd_ca else None
        try:
            store = EtcdStore(etcd_client.parse_endpoints(args.etcd), args.etcd_prefix, tls=etcd_tls)
        except (ValueError, StoreError) as err:
            parser.error(f"--etcd: {err}")
    try:
        ledger = Ledger(args.db if args.db is not None else args.ledger)
    except StoreError as err:  # LedgerUnavailable: the database cannot be reached (named without its password)
        parser.error(f"--ledger: {err}")
    try:
        principals = Principals([r for r in args.enrolled_roles.split(",") if r],
                                default_max_routes=args.max_routes_per_principal,
                                failure_reports_per_minute=args.failure_reports_per_minute,
                                enrolments=ledger.enrolments())
    except ValueError as err:
        parser.error(str(err))
    ticket_key = Identity.load_or_create(args.ticket_key)
    audits: list[Audits] = []  # made after the registry, which calls it when a route closes
    registry = Registry(models, lease_seconds=args.lease_seconds, route_lease_seconds=args.route_lease_seconds,
                        prefill_grace_seconds=args.route_prefill_grace_seconds,
                        ban_seconds=args.ban_seconds, max_ban_seconds=args.max_ban_seconds,
                        quarantined=ledger.quarantined(), on_close=lambda *closed: audits[0].consider(*closed),
                        store=store, corroborate=health_fails, route_quota=principals.route_quota,
                        share_weight=principals.share_weight)
    audits.append(Audits(registry, ledger, ticket_key, rate=args.audit_rate, seed=args.audit_seed,
                         ticket_seconds=args.ticket_seconds, quorum=args.audit_quorum, principals=principals))
    metrics = TrackerMetrics(registry, ledger)
    try:
        server, port = serve(registry, ledger, args.listen, roles, ticket_key, tls=tls,
                             ticket_seconds=args.ticket_seconds, metrics=metrics,
                             check_reachability=args.check_reachability, audits=audits[0], principals=principals,
                             limits=server_limits(args), published=published_models(args.published, ticket_key, models))
        http = web.serve(metrics, args.http_listen, server.service.joining) if args.http_listen else None
        relay = None
        if args.relay:
            relay = RelayServer(args.relay, args.relay_public_host or args.relay.rpartition(":")[0], tls=tls,
                                token=roles.get("node", ""), registered=registry.registered_at).start()
    except (ValueError, OSError) as err:
        parser.error(str(err))
    log("listening", address=args.listen, port=port, ledger=ledger.location, models=[m.model for m in models],
        tls=tls is not None, http=http.url if http else None, etcd=args.etcd, etcd_prefix=args.etcd_prefix,
        etcd_tls=bool(args.etcd_ca), enrolled_roles=sorted(principals.enrolled_roles),
        enrolled_keys=len(principals.enrolled()))
    warning = quorum_warning(args.audit_rate, args.audit_quorum, principals)
    if warning:
        log("audit_quorum_warning", warning=warning)
    if state is not None:
        print(f"tracker listening on {args.listen.rpartition(':')[0]}:{port}\n"
              f"certificate {certificate_sha256(tls[0])}\nstate {state.root}", flush=True)
    if http is not None:
        write_port_file(args.http_port_file, http.port)
    if relay is not None:
        write_port_file(args.relay_port_file, relay.port)
    stop = stop_on_signals()  # before the port file: a launcher may signal as soon as it sees it
    write_port_file(args.port_file, port)
    # The ledger is the record of quarantines (an operator's release) and enrolments (ledger/principals.py).
    while not stop.wait(QUARANTINE_SYNC_SECONDS):
        try:
            registry.sync_quarantine(ledger.quarantined())
            principals.sync(ledger.enrolments())
        except StoreError as err:
            log("ledger_sync_failed", error=str(err))
    log("stopping")
    if http is not None:
        http.stop()
    if relay is not None:
        relay.stop()
    server.stop(grace=5).wait()
    registry.close()
    ledger.close()


if __name__ == "__main__":
    main()
