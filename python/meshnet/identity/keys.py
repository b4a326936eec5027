"""Ed25519 identities: a node's or client's keypair, and the ids derived from public keys.

Used by nodes (their identity file), clients and gateways (a key per process or a file), and
the tracker (its ticket key). Invariant: an id names exactly one public key,
`node_id(pk) == "n" + hex(sha256(pk))[:40]`, so an id cannot be claimed with another key.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from meshnet.types.ids import NodeId

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_ID_HEX = 40


def _derived(prefix: str, public_key: bytes) -> str:
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, not {len(public_key)}")
    return prefix + hashlib.sha256(public_key).hexdigest()[:_ID_HEX]


def node_id(public_key: bytes) -> NodeId:
    """The node id a public key owns."""
    return NodeId(_derived("n", public_key))


def principal(public_key: bytes) -> str:
    """The principal name of a client, gateway or verifier key."""
    return _derived("c", public_key)


class Identity:
    """An Ed25519 private key and what it proves. Any thread (the key is immutable)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                       serialization.PublicFormat.Raw)

    @classmethod
    def generate(cls) -> "Identity":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> "Identity":
        """The key in `path` (PEM, PKCS#8); created with mode 0600 when the file is absent."""
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} does not hold an Ed25519 private key")
            return cls(key)
        identity = cls.generate()
        pem = identity._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return identity

    @property
    def node_id(self) -> NodeId:
        return node_id(self.public_key)

    @property
    def principal(self) -> str:
        return principal(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `public_key`'s Ed25519 signature of `message`."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True
