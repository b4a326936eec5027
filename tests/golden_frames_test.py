"""Python side of the golden-frame contract: every checked-in frame decodes and re-encodes
byte-identical, single-fragment bundles re-encode identically from their tensors, and the
generator still produces exactly the checked-in bytes (the C++ side: //cpp/protocol:golden_test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import make_golden_frames
from meshnet.protocol import bundle, seam
from meshnet.wire import seam as t

GOLDEN = Path(os.environ["MESHNET_GOLDEN_MANIFEST"]).parent


def _manifest() -> list[tuple[str, str]]:
    entries = []
    for line in (GOLDEN / "MANIFEST").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, message = line.split()
            entries.append((name, message))
    return entries


ENTRIES = _manifest()


def test_manifest_covers_every_message_type():
    assert {m for _, m in ENTRIES} == set(seam.MESSAGE_TYPES)
    assert len(ENTRIES) >= 10


@pytest.mark.parametrize("name,message", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_decode_and_reencode_byte_identical(name, message):
    data = (GOLDEN / name).read_bytes()
    cls = seam.MESSAGE_TYPES[message]
    value = seam.decode_seam_frame(data) if cls is t.SeamFrame else seam.decode(cls, data)
    assert seam.encode(value) == data
    fragment = getattr(value, "fragment", None)
    if fragment is not None and fragment.count == 1:
        tensors = bundle.Reassembler().add(fragment)
        (again,) = bundle.encode_bundle(tensors, fragment.bundle_id, compression=fragment.header.compression,
                                        fragment_bytes=len(fragment.data))
        assert again == fragment


def test_multi_fragment_bundle_reassembles():
    frames = [seam.decode_seam_frame((GOLDEN / n).read_bytes()) for n in ("prefill_f16_fragment0.bin", "prefill_f16_fragment1.bin")]
    r = bundle.Reassembler()
    assert r.add(frames[0].fragment) is None
    (hidden,) = r.add(frames[1].fragment)
    assert (hidden.name, hidden.dtype, hidden.shape) == ("hidden_states", t.DType.F16, (6, 16))


def test_generator_reproduces_the_checked_in_frames(tmp_path):
    make_golden_frames.write(tmp_path)
    for name, _ in ENTRIES:
        assert (tmp_path / name).read_bytes() == (GOLDEN / name).read_bytes(), f"{name} drifted; regenerate deliberately"
    assert (tmp_path / "MANIFEST").read_text() == (GOLDEN / "MANIFEST").read_text()
