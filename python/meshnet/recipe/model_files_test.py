"""Where range-by-range processes find each range: a whole file, or a parts record whose parts
are checked against it; a range split where the parts split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshnet.recipe import cut_model, fingerprint as fp
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.recipe.model_files import RangeFile, open_model_files

N_LAYER = 6


@pytest.fixture(autouse=True)
def cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv(fp.CACHE_ENV, str(tmp_path / "cache" / "fingerprints.json"))


@pytest.fixture
def source(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny.gguf", n_layer=N_LAYER, seed=5)


def test_a_whole_file_holds_every_range_in_one_piece(source):
    model = open_model_files(source)
    assert model.artifact == fp.artifact_fingerprint(source) and model.n_layer == N_LAYER
    assert model.pieces(2, 5) == [RangeFile(2, 5, source)]
    for start, end in [(0, 0), (3, 2), (0, N_LAYER + 1), (-1, 2)]:
        with pytest.raises(ValueError, match="not within"):
            model.pieces(start, end)


def test_a_parts_record_splits_ranges_where_its_parts_split(source, tmp_path):
    # [0, 2), [2, 6) and a replica [1, 4): at layer 1 the replica holds more layers than [0, 2)
    cut_model.cut(source, [(0, 2), (2, 6), (1, 4)], tmp_path / "parts")
    model = open_model_files(tmp_path / "parts" / "tiny.parts.json")
    assert model.artifact == fp.artifact_fingerprint(source) and model.n_layer == N_LAYER
    part = {(f.start, f.end): f.path for f in model.files}
    assert model.pieces(0, 6) == [RangeFile(0, 2, part[0, 2]), RangeFile(2, 6, part[2, 6])]
    assert model.pieces(1, 4) == [RangeFile(1, 4, part[1, 4])]
    assert model.pieces(0, 3) == [RangeFile(0, 2, part[0, 2]), RangeFile(2, 3, part[2, 6])]


def test_a_record_missing_layers_names_the_first_one_no_part_holds(source, tmp_path):
    cut_model.cut(source, [(0, 2), (3, 6)], tmp_path / "parts")
    model = open_model_files(tmp_path / "parts" / "tiny.parts.json")
    assert model.pieces(3, 6)[0].start == 3
    with pytest.raises(ValueError, match="holds layer 2"):
        model.pieces(0, 6)


def test_a_part_alone_or_a_record_that_does_not_match_its_parts_is_refused(source, tmp_path):
    record = cut_model.cut(source, [(0, 3), (3, 6)], tmp_path / "parts")
    record_path = tmp_path / "parts" / "tiny.parts.json"
    first = tmp_path / "parts" / record["parts"][0]["file"]
    with pytest.raises(ValueError, match="give its parts record"):
        open_model_files(first)

    def refused(edit, message: str) -> None:
        bad = json.loads(record_path.read_text())
        edit(bad)
        path = tmp_path / "parts" / "bad.parts.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            open_model_files(path)

    refused(lambda r: r.update(format="other"), "not a readable parts record")
    refused(lambda r: r["parts"][0].update(size=1), "missing or not the 1 bytes")
    refused(lambda r: r["parts"][0].update(layers=[0, 2]), r"not the part of .* holding layers \[0, 2\)")
    refused(lambda r: r["source"].update(artifact_fingerprint="sha256:" + "0" * 64), "is not the part of sha256:0")
    refused(lambda r: r.update(parts=[]), "lists no parts")
    refused(lambda r: r.pop("source"), "not a readable parts record")
    assert open_model_files(record_path).files[0].path == first  # the refusals changed nothing
