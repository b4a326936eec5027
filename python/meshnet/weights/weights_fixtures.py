"""What the weights room's tests share: a tiny GGUF cut into two parts and the manifest a
tracker key signed for them, with small pieces so that a part has dozens. Test-only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshnet.identity.keys import Identity
from meshnet.recipe import cut_model
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.weights.manifest import MIN_PIECE_BYTES, Manifest, from_parts_record, sign

RANGES = [(0, 2), (2, 4)]


@dataclasses.dataclass(frozen=True)
class Published:
    parts_dir: Path  # where the cut parts and their record are (a seed serves from here)
    record: Path
    manifest: Manifest  # signed by `key`
    key: Identity  # the tracker's


@pytest.fixture
def published(tmp_path) -> Published:
    source = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=128, n_vocab=512, seed=5)
    parts_dir = tmp_path / "seed"
    cut_model.cut(source, RANGES, parts_dir)
    (record,) = parts_dir.glob("*.parts.json")
    key = Identity.generate()
    return Published(parts_dir, record, sign(from_parts_record(record, "tiny", MIN_PIECE_BYTES), key), key)
