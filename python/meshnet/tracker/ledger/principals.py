"""Principals: the keys that call the tracker, each with its own quotas (issue 35; ADR 0017).

Every tracker call is signed by its caller's Ed25519 key (ADR 0003); that key is the principal
that quotas, bans, audits and billing attach to. A role token only says which methods a key may
call. For a role the operator names in `enrolled_roles` (the tracker's --enrolled-roles), a
token is no longer enough: only keys the operator enrolled for that role are served, so a token
holder cannot mint keys to multiply quotas. Whether or not the verifier role is in
`enrolled_roles`, only enrolled verifier keys count one each toward the audit quorum
(`enrolled_as`; tracker/audits.py, issue 55 finding 9), so minted keys never make up a quorum.
Enrolments live in the ledger (its `principals` table, written by this module's command line),
which a running tracker reads every SYNC_SECONDS; a revoked key is refused from the next sync.

Quotas, per principal, enrolled or not:
  - routes open at once: the enrolment's `max_routes`, else `default_max_routes` (the registry
    asks `route_quota(key)` when it opens a route: RESOURCE_EXHAUSTED past it);
  - failure reports in any minute: `failure_reports_per_minute`, or two per route the key holds
    open if that is more (a gateway's many routes fail over together when a hop dies);
    RESOURCE_EXHAUSTED past them, and the report is not acted on;
  - renewals need the route's traffic (ADR 0016), audits in flight are capped per verifier key
    (tracker/audits.py), and node registrations are one per node key, within the dark-node cap (registry).
Node keys are not enrolled here: a node's key is its node id, admitted by its certified recipe.

Called by tracker/service.py (gRPC threads, any thread: one lock) and by tracker/main.py (sync).
Command line (the operator's, on the tracker's ledger):
  python -m meshnet.tracker.ledger.principals (--db tracker.db | --ledger postgresql://...) \\
      enroll ROLE KEY [--name NAME] [--max-routes N] | revoke KEY | list
  python -m meshnet.tracker.ledger.principals show-key IDENTITY.pem   (prints the key to enroll)
KEY is the 64-hex-digit public key, or a file holding the principal's identity (PEM).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from meshnet.identity import keys
from meshnet.identity.keys import Identity

ENROLLED_ROLES = ("client", "gateway", "verifier")  # roles whose keys may be enrolled
DEFAULT_MAX_ROUTES = 64  # routes one principal holds open at once, unless its enrolment says
DEFAULT_FAILURE_REPORTS_PER_MINUTE = 30
REPORTS_PER_ROUTE_PER_MINUTE = 2  # a principal with many routes may report each twice a minute
MAX_ROUTES_LIMIT = 1 << 16  # MAX_SESSIONS (tracker/admission.py): no enrolment may name more
MAX_NAME_CHARS = 128
MAX_TRACKED_REPORTERS = 1 << 16  # reporters whose last minute is remembered (the oldest forgotten past it)
SYNC_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Enrolment:
    public_key: bytes
    role: str
    name: str = ""
    max_routes: int = 0  # 0: the tracker's default
    enrolled_at: float = 0.0

    @property
    def principal(self) -> str:
        return keys.principal(self.public_key)


def validate(enrolment: Enrolment) -> None:
    """Raises ValueError for an enrolment the tracker could not act on."""
    if enrolment.role not in ENROLLED_ROLES:
        raise ValueError(f"role {enrolment.role!r} is not enrolled by key; roles are {ENROLLED_ROLES}")
    if len(enrolment.public_key) != keys.PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {keys.PUBLIC_KEY_BYTES} bytes, not {len(enrolment.public_key)}")
    if not 0 <= enrolment.max_routes <= MAX_ROUTES_LIMIT:
        raise ValueError(f"max_routes must be in [0, {MAX_ROUTES_LIMIT}], got {enrolment.max_routes}")
    if len(enrolment.name) > MAX_NAME_CHARS or not enrolment.name.isprintable():
        raise ValueError(f"a name is printable text of at most {MAX_NAME_CHARS} characters")


class Principals:
    """The tracker's view of its principals: who is enrolled, and what each may still do.
    Thread-safe (one lock); time from `clock` (monotonic seconds)."""

    def __init__(self, enrolled_roles: Iterable[str] = (), *, default_max_routes: int = DEFAULT_MAX_ROUTES,
                 failure_reports_per_minute: int = DEFAULT_FAILURE_REPORTS_PER_MINUTE,
                 enrolments: Iterable[Enrolment] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.enrolled_roles = frozenset(enrolled_roles)
        unknown = self.enrolled_roles - set(ENROLLED_ROLES)
        if unknown:
            raise ValueError(f"roles {sorted(unknown)} are not enrolled by key; roles are {ENROLLED_ROLES}")
        if not 1 <= default_max_routes <= MAX_ROUTES_LIMIT:
            raise ValueError(f"the default route quota must be in [1, {MAX_ROUTES_LIMIT}], got {default_max_routes}")
        if failure_reports_per_minute < 1:
            raise ValueError(f"failure reports per minute must be at least 1, got {failure_reports_per_minute}")
        self.default_max_routes = default_max_routes
        self.failure_reports_per_minute = failure_reports_per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._enrolled: dict[tuple[str, bytes], Enrolment] = {}
        # reporter key -> times of its failure reports within the last minute, oldest reporter first
        self._reports: collections.OrderedDict[bytes, collections.deque] = collections.OrderedDict()
        self.sync(enrolments)

    def sync(self, enrolments: Iterable[Enrolment]) -> None:
        """Replaces the enrolled keys with `enrolments` (the ledger's table, read by the caller)."""
        table = {(e.role, e.public_key): e for e in enrolments}
        with self._lock:
            self._enrolled = table

    def enrolled(self) -> list[Enrolment]:
        with self._lock:
            return list(self._enrolled.values())

    def enrolled_as(self, role: str, key: bytes) -> bool:
        """Whether the operator enrolled `key` for `role`, whether or not the role is in
        `enrolled_roles` (tracker/audits.py counts only enrolled verifiers toward its quorum)."""
        with self._lock:
            return (role, key) in self._enrolled

    def refusal(self, role: str, key: bytes) -> Optional[str]:
        """Why a call by `key` under `role` is refused (PERMISSION_DENIED), or None."""
        if role not in self.enrolled_roles or self.enrolled_as(role, key):
            return None
        return (f"key {keys.principal(key)} is not enrolled as a {role} on this tracker; the operator enrolls it "
                f"with: python -m meshnet.tracker.ledger.principals enroll {role} {key.hex()}")

    def route_quota(self, key: bytes) -> int:
        """How many routes `key` may hold open at once: its largest enrolment's, else the default."""
        with self._lock:
            named = [e.max_routes for (_, k), e in self._enrolled.items() if k == key and e.max_routes]
        return max(named) if named else self.default_max_routes

    def share_weight(self, key: bytes) -> float:
        """`key`'s weight in a range's fair share while others wait (tracker/fair_share.py): its
        route quota over the default, at least 1. Only an enrolment raises it: a gateway enrolled
        with 640 routes holds ten times a single key's share; a minted key holds one."""
        return max(1.0, self.route_quota(key) / self.default_max_routes) if self.default_max_routes else 1.0

    def take_failure_report(self, key: bytes, routes_held: int = 0) -> Optional[str]:
        """Counts a failure report by `key`, which holds `routes_held` open routes; why it is
        refused (over its quota for the last minute), or None."""
        allowed = max(self.failure_reports_per_minute, REPORTS_PER_ROUTE_PER_MINUTE * routes_held)
        now = self._clock()
        with self._lock:
            times = self._reports.pop(key, None)
            if times is None:
                times = collections.deque()
            while times and times[0] <= now - 60.0:
                times.popleft()
            over = len(times) >= allowed
            if not over:
                times.append(now)
            self._reports[key] = times  # most recent reporter last
            while len(self._reports) > MAX_TRACKED_REPORTERS:
                self._reports.popitem(last=False)
        if over:
            return (f"principal {keys.principal(key)} has made {allowed} failure reports in the last minute, "
                    "its quota; this one is not acted on")
        return None


def public_key_of(text: str) -> bytes:
    """A public key given as 64 hex digits, or read from an identity file (PEM)."""
    if len(text) == 2 * keys.PUBLIC_KEY_BYTES and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"{text!r} is neither a 64-hex-digit public key nor an identity file")
    return Identity.from_pem(path.read_bytes()).public_key


def _listed(e: Enrolment) -> dict:
    return {"role": e.role, "principal": e.principal, "public_key": e.public_key.hex(), "name": e.name,
            "max_routes": e.max_routes, "enrolled_at": e.enrolled_at}


def main(argv: Optional[list[str]] = None) -> int:
    from meshnet.tracker.ledger.ledger import add_location_arguments, open_ledger  # the CLI only

    parser = argparse.ArgumentParser(description="Enroll, revoke and list the tracker's principals (ADR 0017).")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show-key", help="print the public key and principal of an identity file")
    show.add_argument("identity", type=Path)
    enroll = commands.add_parser("enroll", help="enroll a key for a role")
    add_location_arguments(enroll)
    enroll.add_argument("role", choices=ENROLLED_ROLES)
    enroll.add_argument("key", help="64 hex digits, or the principal's identity file (PEM)")
    enroll.add_argument("--name", default="", help="who the key belongs to (for the operator)")
    enroll.add_argument("--max-routes", type=int, default=0, help="routes open at once (0: the tracker's default)")
    revoke = commands.add_parser("revoke", help="revoke every enrolment of a key")
    add_location_arguments(revoke)
    revoke.add_argument("key", help="64 hex digits, or the principal's identity file (PEM)")
    listing = commands.add_parser("list", help="every enrolment, as JSON")
    add_location_arguments(listing)
    args = parser.parse_args(argv)

    if args.command == "show-key":
        try:
            key = public_key_of(str(args.identity))
        except ValueError as err:
            parser.error(str(err))
        print(json.dumps({"public_key": key.hex(), "principal": keys.principal(key)}))
        return 0
    ledger = open_ledger(parser, args)
    try:
        if args.command == "list":
            print(json.dumps([_listed(e) for e in ledger.enrolments()], indent=2))
            return 0
        try:
            key = public_key_of(args.key)
            if args.command == "enroll":
                enrolment = Enrolment(key, args.role, args.name, args.max_routes, time.time())
                validate(enrolment)
                ledger.enroll(enrolment)
                print(json.dumps(_listed(enrolment)))
                return 0
        except ValueError as err:
            parser.error(str(err))
        removed = ledger.revoke(key)
        print(json.dumps({"principal": keys.principal(key), "enrolments_removed": removed}))
        return 0 if removed else 1
    finally:
        ledger.close()


if __name__ == "__main__":
    raise SystemExit(main())
