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
