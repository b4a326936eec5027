"""TLS material and channels: self-signed certificates pinned by their peers (ADR 0003).

A node makes a fresh ECDSA P-256 key and a self-signed certificate for its shard service and
registers the PEM with the tracker (the registration is signed by its identity key, which ties
the two). Peers trust exactly that certificate, with the fixed target name NODE_TLS_NAME, so a
node's certificate proves nothing but itself. The tracker's certificate is verified the same way
(`--tracker-ca`). Used by nodes, the tracker's launcher, clients and tests.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Optional, Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NODE_TLS_NAME = "meshnet-node"  # every shard certificate's name; trust comes from pinning
MAX_MESSAGE_BYTES = (1 << 20) + (64 << 10)  # one 1 MiB fragment plus headers and tickets


def self_signed(common_name: str, dns_names: Sequence[str] = (), ip_addresses: Sequence[str] = (),
                days: int = 365) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) of a new ECDSA P-256 self-signed certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    alt = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def node_certificate() -> tuple[bytes, bytes]:
    """A shard service's certificate and key (pinned by peers under NODE_TLS_NAME)."""
    return self_signed(NODE_TLS_NAME, [NODE_TLS_NAME])


def write_private(path: Path, data: bytes) -> Path:
    """Writes `data` to `path` readable by the owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
    return path


def server_credentials(cert_pem: bytes, key_pem: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def bind(server: grpc.Server, listen: str, tls: Optional[tuple[bytes, bytes]]) -> int:
    """Adds `listen` to `server`, TLS with (certificate PEM, key PEM) or plaintext when `tls` is
    None (--insecure); returns the bound port, OSError when it cannot listen."""
    if tls is not None:
        port = server.add_secure_port(listen, server_credentials(*tls))
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return port


def channel_options(cert_pem: Optional[bytes], name: str = NODE_TLS_NAME) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                         ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    if cert_pem is not None:
        options.append(("grpc.ssl_target_name_override", name))
    return options


def pinned_channel(address: str, cert_pem: Optional[bytes], name: str = NODE_TLS_NAME) -> grpc.Channel:
    """A channel that trusts only `cert_pem` (plaintext when it is None: --insecure only)."""
    if cert_pem is None:
        return grpc.insecure_channel(address, options=channel_options(None))
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=cert_pem),
                               options=channel_options(cert_pem, name))
