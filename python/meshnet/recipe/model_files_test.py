"""Where range-by-range processes find each range: a whole file, or a parts record whose parts
are checked against it; a range split where the parts split. A record is not trusted (issue 55,
finding 15): its parts are plain names in its directory, of the size and sha256 it says."""

from __future__ import annotations

import json
import os
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
    assert model.pieces(2, 5) == [RangeFile(2, 5, source, model.artifact)]
    for start, end in [(0, 0), (3, 2), (0, N_LAYER + 1), (-1, 2)]:
        with pytest.raises(ValueError, match="not within"):
            model.pieces(start, end)


def test_a_parts_record_splits_ranges_where_its_parts_split(source, tmp_path):
    # [0, 2), [2, 6) and a replica [1, 4): at layer 1 the replica holds more layers than [0, 2)
    cut_model.cut(source, [(0, 2), (2, 6), (1, 4)], tmp_path / "parts")
    model = open_model_files(tmp_path / "parts" / "tiny.parts.json")
    assert model.artifact == fp.artifact_fingerprint(source) and model.n_layer == N_LAYER
    part = {(f.start, f.end): f for f in model.files}

    def piece(start: int, end: int, of: tuple[int, int]) -> RangeFile:
        return RangeFile(start, end, part[of].path, part[of].sha256)

    assert model.pieces(0, 6) == [piece(0, 2, (0, 2)), piece(2, 6, (2, 6))]
    assert model.pieces(1, 4) == [piece(1, 4, (1, 4))]
    assert model.pieces(0, 3) == [piece(0, 2, (0, 2)), piece(2, 3, (2, 6))]
    assert part[0, 2].sha256 == fp.artifact_fingerprint(part[0, 2].path)


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
    refused(lambda r: r["parts"][0].update(size=1), r"part tiny.layers-0-3.gguf is \d+ bytes, the record says 1$")
    refused(lambda r: r["parts"][0].pop("sha256"), "not a readable parts record: 'sha256'")
    refused(lambda r: r["parts"][0].update(sha256="md5:1"), "a part's sha256 must be 'sha256:<64 hex digits>'")
    refused(lambda r: r["parts"][0].update(layers=[0, 2]), r"not the part of .* holding layers \[0, 2\)")
    refused(lambda r: r["source"].update(artifact_fingerprint="sha256:" + "0" * 64), "is not the part of sha256:0")
    refused(lambda r: r.update(parts=[]), "lists no parts")
    refused(lambda r: r.pop("source"), "not a readable parts record")
    assert open_model_files(record_path).files[0].path == first  # the refusals changed nothing


def cut_record(source: Path, tmp_path: Path) -> tuple[Path, dict]:
    record = cut_model.cut(source, [(0, 3), (3, 6)], tmp_path / "parts")
    return tmp_path / "parts" / "tiny.parts.json", record


def rewritten(record_path: Path, edit) -> Path:
    record = json.loads(record_path.read_text())
    edit(record)
    path = record_path.with_name("edited.parts.json")
    path.write_text(json.dumps(record))
    return path


def test_a_part_whose_bytes_differ_from_its_record_is_refused_before_it_is_read(source, tmp_path):
    record_path, record = cut_record(source, tmp_path)
    part = record_path.parent / "tiny.layers-0-3.gguf"
    assert open_model_files(record_path).files[0] == RangeFile(0, 3, part, record["parts"][0]["sha256"])  # honest
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF  # a weight's last byte: same size, same header, other arithmetic
    part.write_bytes(bytes(data))
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))  # as a later rewrite would
    with pytest.raises(ValueError) as refused:
        open_model_files(record_path)
    assert str(refused.value) == (f"{record_path}: part tiny.layers-0-3.gguf (layers [0, 3)) has sha256 "
                                  f"{fp.artifact_fingerprint(part)}, not {record['parts'][0]['sha256']}")


def test_a_part_named_outside_its_records_directory_is_refused(source, tmp_path):
    record_path, record = cut_record(source, tmp_path)
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes((record_path.parent / record["parts"][0]["file"]).read_bytes())  # the same bytes
    (record_path.parent / "escape.gguf").symlink_to(elsewhere)
    (record_path.parent / "inside.gguf").symlink_to(record_path.parent / record["parts"][0]["file"])
    plain = "is not a plain file name in the record's directory"
    for name, reason in [(str(elsewhere), plain), ("../elsewhere.gguf", plain), ("sub/tiny.layers-0-3.gguf", plain),
                         ("..", plain), ("", plain), (7, plain),
                         ("escape.gguf", f"leads outside the record's directory {record_path.parent.resolve()}")]:
        path = rewritten(record_path, lambda r: r["parts"][0].update(file=name))
        with pytest.raises(ValueError) as refused:
            open_model_files(path)
        assert str(refused.value) == f"{path}: not a readable parts record: part file {name!r} {reason}"
    inside = open_model_files(rewritten(record_path, lambda r: r["parts"][0].update(file="inside.gguf")))
    assert inside.files[0].path == record_path.parent / "inside.gguf"  # a link that stays inside is a plain name
