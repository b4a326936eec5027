"""TLS channels and servers over self-signed certificates pinned by their peers (ADR 0003).

Peers trust exactly the certificate they were given, with the fixed target name NODE_TLS_NAME,
so a node's certificate proves nothing but itself; the tracker's certificate is verified the
same way (`--tracker-ca`). The certificates themselves are made by meshnet.identity.certificates.
Used by nodes, the tracker's launcher, clients and tests. Only grpc: a lean node imports this.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import grpc

NODE_TLS_NAME = "meshnet-node"  # every shard certificate's name; trust comes from pinning
MAX_MESSAGE_BYTES = (1 << 20) + (64 << 10)  # one 1 MiB fragment plus headers and tickets
CERTIFICATE_CHILD_TIMEOUT_S = 60


def write_private(path: Path, data: bytes) -> Path:
    """Writes `data` to `path` readable by the owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
    return path


def write_node_certificate(cert_path: Path, key_path: Path) -> tuple[bytes, bytes]:
    """A new node certificate and key, made by a short-lived child process (meshnet.identity.
    certificates: this process never loads the X.509 stack), written to the two paths (mode
    0600); (certificate PEM, key PEM). RuntimeError if the child fails."""
    from meshnet.process import child_env

    proc = subprocess.run([sys.executable, "-m", "meshnet.identity.certificates", str(cert_path), str(key_path)],
                          capture_output=True, text=True, timeout=CERTIFICATE_CHILD_TIMEOUT_S, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"certificate child exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return cert_path.read_bytes(), key_path.read_bytes()


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
