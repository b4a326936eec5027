"""Ed25519 identities: a node's or client's keypair, and the ids derived from public keys.

Used by nodes (their identity file), clients and gateways (a key per process or a file), and
the tracker (its ticket key). Invariant: an id names exactly one public key,
`node_id(pk) == "n" + hex(sha256(pk))[:40]`, so an id cannot be claimed with another key.

Signing and verifying use libsodium (PyNaCl): a long-lived node loads it for ~1 MiB, where
cryptography's bindings cost ~9 MiB of RSS. Key files are PKCS#8 PEM (RFC 8410), the form
OpenSSL and cryptography write; this module writes and reads that canonical 48-byte form itself
and hands any other PEM to cryptography's parser, loaded only then.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import nacl.exceptions
import nacl.signing

from meshnet.wire.ids import NodeId

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_ID_HEX = 40
# PKCS#8 v1 PrivateKeyInfo of an Ed25519 key (RFC 8410 section 7): this prefix, then the 32-byte seed
_PKCS8_ED25519_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
_PEM_BEGIN, _PEM_END = "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----"


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

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 private key seed has 32 bytes, not {len(seed)}")
        self._key = nacl.signing.SigningKey(seed)
        self.public_key: bytes = bytes(self._key.verify_key)

    @classmethod
    def generate(cls) -> "Identity":
        return cls(os.urandom(32))

    @classmethod
    def from_pem(cls, pem: bytes) -> "Identity":
        """The key in a PEM file's bytes; ValueError if it is not an Ed25519 private key."""
        text = pem.decode("ascii", errors="replace").strip()
        if text.startswith(_PEM_BEGIN) and text.endswith(_PEM_END):
            try:
                der = base64.b64decode("".join(text[len(_PEM_BEGIN):-len(_PEM_END)].split()), validate=True)
            except ValueError:
                der = b""
            if len(der) == 48 and der.startswith(_PKCS8_ED25519_PREFIX):
                return cls(der[len(_PKCS8_ED25519_PREFIX):])
        return cls(_seed_by_cryptography(pem))

    def to_pem(self) -> bytes:
        """PKCS#8 PEM, unencrypted (the file is what protects it: mode 0600)."""
        body = base64.b64encode(_PKCS8_ED25519_PREFIX + bytes(self._key)).decode()
        return f"{_PEM_BEGIN}\n{body}\n{_PEM_END}\n".encode()

    @classmethod
    def load_or_create(cls, path: Path) -> "Identity":
        """The key in `path` (PEM, PKCS#8); created with mode 0600 when the file is absent."""
        if path.exists():
            try:
                return cls.from_pem(path.read_bytes())
            except ValueError as err:
                raise ValueError(f"{path}: {err}") from None
        identity = cls.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(identity.to_pem())
        return identity

    @property
    def seed(self) -> bytes:
        """The private key (32 bytes): a node hands it to its own worker (through the
        environment) to sign commitments; never logged, never sent."""
        return bytes(self._key)

    @property
    def node_id(self) -> NodeId:
        return node_id(self.public_key)

    @property
    def principal(self) -> str:
        return principal(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message).signature


def _seed_by_cryptography(pem: bytes) -> bytes:
    """The seed of a PEM private key in a form other than the canonical one (cryptography parses
    it); ValueError unless it is an unencrypted Ed25519 key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"not a PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 private key")
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `public_key`'s Ed25519 signature of `message`."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True
