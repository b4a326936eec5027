"""A tracker's state in one directory (issue 50, item 1): `--init DIR` makes it and serves,
`--state DIR` serves from it again.

Before, a tracker needed five files made by hand (role tokens, a ticket key, a TLS certificate
and key made with other tools, a ledger, a models list). The directory holds them under fixed
names, each readable by its owner only, the directory itself 0700. `init` never replaces a file
that exists unless told to (`force`), and then says which it replaced. The TLS certificate is
self-signed: peers trust it by its SHA-256 (printed at start, carried by invites), not by a CA.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import ssl
from pathlib import Path
from typing import Sequence

from meshnet.identity.invites import certificate_pin
from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.identity.tls import write_private

CERTIFICATE_DAYS = 3650  # the self-signed certificate's lifetime; peers pin it, so renewing means new invites


@dataclasses.dataclass(frozen=True)
class StateDir:
    """Where each of a tracker's files lives under `root`."""

    root: Path

    @property
    def roles(self) -> Path:
        return self.root / "roles.json"  # role -> bearer token

    @property
    def ticket_key(self) -> Path:
        return self.root / "ticket_key.pem"  # Ed25519: signs route tickets (and, later, manifests)

    @property
    def tls_cert(self) -> Path:
        return self.root / "tls_cert.pem"

    @property
    def tls_key(self) -> Path:
        return self.root / "tls_key.pem"

    @property
    def ledger(self) -> Path:
        return self.root / "tracker.db"  # the SQLite work ledger (principals, invites, work)

    @property
    def models(self) -> Path:
        return self.root / "models.json"  # certified models served (a list; empty at first)

    @property
    def published(self) -> Path:
        return self.root / "models"  # one directory per published model: its parts and signed manifest

    def files(self) -> tuple[Path, ...]:
        return (self.roles, self.ticket_key, self.tls_cert, self.tls_key, self.ledger, self.models)

    def missing(self) -> list[Path]:
        return [path for path in self.files() if not path.is_file()]


def certificate_sha256(cert_pem: bytes) -> str:
    """'sha256:HEX' of the certificate's DER bytes (what `openssl x509 -fingerprint -sha256` shows),
    the pin invites carry."""
    return certificate_pin(ssl.PEM_cert_to_DER_cert(cert_pem.decode()))


def certificate_names(listen_host: str, advertise: Sequence[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) the certificate names: the advertised hosts, the listen host when
    it is not a wildcard, this machine's name, and loopback."""
    import ipaddress

    dns, ips = ["localhost", socket.gethostname()], ["127.0.0.1", "::1"]
    for host in [*advertise, listen_host]:
        if host in ("", "0.0.0.0", "::"):
            continue
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns.append(host)
    return sorted(set(dns)), sorted(set(ips))


def init(state: StateDir, dns_names: Sequence[str], ip_addresses: Sequence[str], force: bool = False) -> list[Path]:
    """Makes every file of `state`; FileExistsError naming them where some exist and not `force`.
    Returns the files it replaced."""
    from meshnet.identity import certificates
    from meshnet.tracker.ledger.ledger import Ledger

    existing = [path for path in state.files() if path.exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(str(p) for p in existing)} already exist: serve them with --state "
                              f"{state.root}, or pass --force to replace them (new tokens, key and certificate: "
                              "every node and client must be given them again)")
    state.root.mkdir(parents=True, exist_ok=True)
    state.root.chmod(0o700)
    write_private(state.roles, (json.dumps(new_role_tokens(), indent=2) + "\n").encode())
    write_private(state.ticket_key, Identity.generate().to_pem())
    cert, key = certificates.self_signed("meshnet-tracker", dns_names, ip_addresses, days=CERTIFICATE_DAYS)
    write_private(state.tls_key, key)
    write_private(state.tls_cert, cert)
    write_private(state.models, b"[]\n")
    if state.ledger.exists():
        state.ledger.unlink()
    for suffix in ("-wal", "-shm", "-journal"):
        Path(f"{state.ledger}{suffix}").unlink(missing_ok=True)
    state.ledger.touch(mode=0o600)
    Ledger(state.ledger).close()  # made with its schema now, so a bad directory fails here
    os.chmod(state.ledger, 0o600)
    return existing
