"""The signed manifest (issue 50, item 3): made from a parts record, it verifies with the tracker's
key only; a changed byte, another key, or a field past its bound is refused with the reason."""

from __future__ import annotations

import hashlib
import json

import pytest

from meshnet.identity.keys import Identity
from meshnet.weights.manifest import MAX_MANIFEST_BYTES, ManifestError, parse
from meshnet.weights.weights_fixtures import RANGES, published  # noqa: F401


def test_a_manifest_lists_every_part_and_piece_and_verifies_with_the_trackers_key(published):
    m = parse(published.manifest.encode(), published.key.public_key)
    assert m == published.manifest
    assert [(p.start, p.end) for p in m.parts] == RANGES
    for part in m.parts:
        data = (published.parts_dir / part.file).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == part.sha256 and len(data) == part.size
        assert len(part.pieces) > 10  # small pieces: a part has many
        offset, length = part.piece_span(3, m.piece_bytes)
        assert hashlib.sha256(data[offset:offset + length]).hexdigest() == part.pieces[3]


def edited(published, change) -> bytes:
    raw = json.loads(published.manifest.encode())
    change(raw)
    return json.dumps(raw).encode()


@pytest.mark.parametrize("change, message", [
    (lambda r: r["parts"][0]["pieces"].__setitem__(0, "0" * 64), "signature does not verify"),
    (lambda r: r["parts"][0].__setitem__("file", "../../etc/passwd"), "not a plain file name"),
    (lambda r: r["parts"][0].__setitem__("end", 99), "not within the model's"),
    (lambda r: r["parts"][0].__setitem__("size", 1), "pieces for 1 bytes"),
    (lambda r: r.__setitem__("piece_bytes", 1), "piece_bytes must be in"),
    (lambda r: r.__setitem__("format", "other"), "format 'other'"),
    (lambda r: r.__setitem__("parts", []), "1 to 4096 parts"),
    (lambda r: r.__setitem__("signature", "!!"), "not a readable manifest"),
    (lambda r: r["parts"].append(dict(r["parts"][0])), "share a file name"),
])
def test_a_changed_or_unbounded_manifest_is_refused(published, change, message):
    with pytest.raises(ManifestError, match=message):
        parse(edited(published, change), published.key.public_key)


def test_a_manifest_signed_by_another_key_is_refused(published):
    with pytest.raises(ManifestError, match="signed by another key"):
        parse(published.manifest.encode(), Identity.generate().public_key)


def test_an_oversized_manifest_is_refused_before_it_is_parsed(published):
    with pytest.raises(ManifestError, match="at most"):
        parse(b" " * (MAX_MANIFEST_BYTES + 1), published.key.public_key)
