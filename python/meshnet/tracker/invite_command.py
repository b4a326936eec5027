"""`bazel run //python:invite -- make --state DIR --role node --tracker HOST:PORT [--uses N]
[--expires 24h]` prints one invite string (issue 50, item 2); `list` shows every invite and what
is left of it, `revoke ID` ends one. The operator's command, on the tracker's ledger: `--state
DIR` (a directory `tracker --init` made: its ledger and certificate), or `--db PATH | --ledger
URL` with `--tls-cert PEM` for the pin.

The secret is printed once, inside the invite, and never stored: the ledger keeps its SHA-256.
Anyone holding the string can redeem it (up to its uses, until it expires): hand it over as a
password.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Optional

from meshnet.identity.invites import InviteError, new_invite
from meshnet.identity.roles import ROLES
from meshnet.tracker.ledger.invites import MAX_USES, InviteRecord, secret_sha256
from meshnet.tracker.ledger.ledger import Ledger, open_ledger
from meshnet.tracker.state_dir import StateDir, certificate_sha256

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def parse_duration(text: str) -> float:
    """'90s', '30m', '24h', '7d' or a number of seconds -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 24h or 7d")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]


def _locate(parser: argparse.ArgumentParser, args: argparse.Namespace, pin_needed: bool) -> tuple[Ledger, str]:
    """The ledger and the certificate pin the flags name."""
    if args.state is not None:
        if args.db is not None or args.ledger is not None or args.tls_cert is not None:
            parser.error("--state names the ledger and the certificate; give it alone")
        state = StateDir(args.state)
        if state.missing():
            parser.error(f"--state {state.root}: missing {', '.join(p.name for p in state.missing())}")
        args.db, args.tls_cert = state.ledger, state.tls_cert
    elif args.db is None and args.ledger is None:
        parser.error("--state DIR, or --db PATH or --ledger URL")
    pin = ""
    if pin_needed:
        if args.tls_cert is None:
            parser.error("the invite pins the tracker's certificate: --tls-cert PEM (or --state DIR)")
        try:
            pin = certificate_sha256(args.tls_cert.read_bytes())
        except (OSError, ValueError) as err:
            parser.error(f"--tls-cert {args.tls_cert}: {err}")
    return open_ledger(parser, args), pin


def _listed(record: InviteRecord, now: float) -> dict:
    return {"id": record.invite_id, "role": record.role, "uses": record.uses, "used": record.used,
            "expires_at": record.expires_at, "state": record.state(now)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Make, list and revoke invites to the tracker (issue 50).")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="print a new invite")
    make.add_argument("--role", required=True, choices=ROLES)
    make.add_argument("--tracker", action="append", required=True, metavar="HOST:PORT",
                      help="an address the newcomer dials (repeat for replicated trackers)")
    make.add_argument("--uses", type=int, default=1, help="how many keys may redeem it (default 1)")
    make.add_argument("--expires", type=parse_duration, default=parse_duration("24h"),
                      help="how long it stays good: 30m, 24h, 7d (default 24h)")
    listing = commands.add_parser("list", help="every invite and what is left of it, as JSON")
    revoke = commands.add_parser("revoke", help="end an invite")
    revoke.add_argument("invite_id")
    for command in (make, listing, revoke):
        command.add_argument("--state", type=Path, metavar="DIR", help="the directory `tracker --init` made")
        command.add_argument("--db", type=Path, help="the SQLite ledger file")
        command.add_argument("--ledger", metavar="URL", help="the PostgreSQL ledger")
        command.add_argument("--tls-cert", type=Path, help="the tracker's certificate (its SHA-256 is the pin)")
    args = parser.parse_args(argv)
    ledger, pin = _locate(parser, args, pin_needed=args.command == "make")
    try:
        now = time.time()
        if args.command == "list":
            print(json.dumps([_listed(r, now) for r in ledger.invites()], indent=2))
            return 0
        if args.command == "revoke":
            revoked = ledger.revoke_invite(args.invite_id)
            print(json.dumps({"id": args.invite_id, "revoked": bool(revoked)}))
            return 0 if revoked else 1
        try:
            invite = new_invite(tuple(args.tracker), pin, args.role)
            record = InviteRecord(invite.invite_id, secret_sha256(invite.secret), args.role, args.uses, 0,
                                  now + args.expires, now)
        except (InviteError, ValueError) as err:
            parser.error(str(err) if args.uses <= MAX_USES else f"--uses: at most {MAX_USES}")
        ledger.add_invite(record)
        print(json.dumps(_listed(record, now)), file=sys.stderr)
        print(invite.encode())
        return 0
    finally:
        ledger.close()


if __name__ == "__main__":
    raise SystemExit(main())
