"""Identities: ids derive from keys, key files are private and stable, signatures bind."""

import stat

import pytest

from meshnet.identity import keys
from meshnet.identity.keys import Identity


def test_ids_derive_from_the_public_key_alone():
    a, b = Identity.generate(), Identity.generate()
    assert a.node_id == keys.node_id(a.public_key) and a.node_id.startswith("n") and len(a.node_id) == 41
    assert a.principal.startswith("c") and a.principal[1:] == a.node_id[1:]
    assert a.node_id != b.node_id
    with pytest.raises(ValueError):
        keys.node_id(b"short")


def test_key_file_is_created_private_and_reloaded(tmp_path):
    path = tmp_path / "node.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load_or_create(path).public_key == first.public_key
    path.write_text("not a key")
    with pytest.raises(ValueError):
        Identity.load_or_create(path)


def test_signatures_verify_only_for_their_key_and_message():
    a, b = Identity.generate(), Identity.generate()
    sig = a.sign(b"hello")
    assert keys.verify(a.public_key, sig, b"hello")
    assert not keys.verify(a.public_key, sig, b"hellO")
    assert not keys.verify(b.public_key, sig, b"hello")
    assert not keys.verify(a.public_key, sig[:-1], b"hello")
    assert not keys.verify(b"", sig, b"hello")


def test_key_files_interoperate_with_cryptography(tmp_path):
    """Our PEM is the PKCS#8 that cryptography (and OpenSSL) write, both ways, and the
    signatures match (Ed25519 is deterministic)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    theirs = Ed25519PrivateKey.generate()
    pem = theirs.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())
    ours = Identity.from_pem(pem)
    assert ours.to_pem() == pem
    assert ours.sign(b"m") == theirs.sign(b"m")
    raw = theirs.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert ours.public_key == raw
    mine = Identity.generate()
    loaded = serialization.load_pem_private_key(mine.to_pem(), password=None)
    assert loaded.sign(b"m") == mine.sign(b"m")


def test_other_pem_keys_are_refused_with_the_file_named(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "ec.key"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(ValueError, match="ec.key: not an Ed25519 private key"):
        Identity.load_or_create(path)
    with pytest.raises(ValueError):
        Identity(b"\0" * 31)
