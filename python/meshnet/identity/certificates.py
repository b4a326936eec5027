"""Self-signed X.509 certificates for TLS (ADR 0003), and a child process that makes one.

A node makes a fresh ECDSA P-256 key and a self-signed certificate for its shard service and
registers the PEM with the tracker (the registration is signed by its identity key, which ties
the two). Peers trust exactly that certificate, with the fixed target name NODE_TLS_NAME, so a
node's certificate proves nothing but itself. The launcher of a tracker makes one the same way.
`issued` signs a leaf with such a certificate as a CA (etcd's TLS, in the etcd test cluster).

cryptography's X.509 stack costs ~9 MiB of RSS once loaded, so a lean node never loads it:
`tls.write_node_certificate` runs this module as a short-lived child

  python -m meshnet.identity.certificates CERT_PATH KEY_PATH

which writes the node's certificate and key (mode 0600) and exits.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshnet.identity.tls import NODE_TLS_NAME, write_private

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


def issued(ca_cert_pem: bytes, ca_key_pem: bytes, common_name: str, dns_names: Sequence[str] = (),
           ip_addresses: Sequence[str] = (), days: int = 365) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) of a new ECDSA P-256 leaf certificate signed by the CA
    (`self_signed` makes one), for TLS servers and clients alike."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def node_certificate() -> tuple[bytes, bytes]:
    """A shard service's certificate and key (pinned by peers under NODE_TLS_NAME)."""
    return self_signed(NODE_TLS_NAME, [NODE_TLS_NAME])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Writes a new node certificate and its key (mode 0600).")
    parser.add_argument("cert", type=Path)
    parser.add_argument("key", type=Path)
    args = parser.parse_args(argv)
    cert_pem, key_pem = node_certificate()
    write_private(args.key, key_pem)
    write_private(args.cert, cert_pem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
