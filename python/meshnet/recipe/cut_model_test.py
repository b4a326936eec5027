"""Per-range model files: what a part holds, what it declares, and what a cut refuses.

Parts are read back with the gguf package's own reader (not the header reader the cut uses),
so a writer bug that both sides of the project share would still show."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from meshnet.recipe import cut_model, fingerprint as fp, range_part
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.recipe.gguf_header import read_header

N_LAYER = 4
RANGES = [(0, 1), (1, 3), (3, 4)]


@pytest.fixture(autouse=True)
def cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv(fp.CACHE_ENV, str(tmp_path / "cache" / "fingerprints.json"))


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def source(request, tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny.gguf", n_layer=N_LAYER, seed=3, tied=request.param)


def _cut(source: Path, out: Path, ranges=RANGES) -> dict:
    return cut_model.cut(source, ranges, out)


def test_parts_keep_metadata_and_exactly_their_ranges_tensors(source, tmp_path):
    record = _cut(source, tmp_path / "parts")
    whole = gguf.GGUFReader(source)
    whole_fields = {name: whole.fields[name] for name in whole.fields if not name.startswith("GGUF.")}
    whole_tensors = {t.name: t for t in whole.tensors}
    assert [tuple(p["layers"]) for p in record["parts"]] == RANGES
    for entry, (start, end) in zip(record["parts"], RANGES):
        path = tmp_path / "parts" / entry["file"]
        part = gguf.GGUFReader(path)
        for name, field in whole_fields.items():  # every pair of the source, same type and value
            assert part.fields[name].types == field.types, name
            assert [bytes(p) for p in part.fields[name].parts] == [bytes(p) for p in field.parts], name
        extra = {n: part.fields[n].contents() for n in part.fields
                 if n not in whole_fields and not n.startswith("GGUF.")}
        assert extra == {range_part.SOURCE_ARTIFACT: fp.artifact_fingerprint(source), range_part.LAYER_START: start,
                         range_part.LAYER_END: end, range_part.TIED_EMBEDDINGS: fp.gguf_summary(source).tied_embeddings,
                         range_part.FILE_TYPE: fp.gguf_summary(source).file_type}
        names = sorted(t.name for t in part.tensors)
        assert names == entry["tensors"] == fp.owned_tensor_names(fp.gguf_summary(source), whole_tensors, start, end)
        for t in part.tensors:
            original = whole_tensors[t.name]
            assert (t.tensor_type, list(t.shape)) == (original.tensor_type, list(original.shape))
            assert np.array_equal(t.data, original.data), t.name
        assert entry["sha256"] == fp.artifact_fingerprint(path) and entry["size"] == path.stat().st_size
    assert record["source"]["artifact_fingerprint"] == fp.artifact_fingerprint(source)
    assert (tmp_path / "parts" / "tiny.parts.json").is_file()


def test_a_part_declares_its_sources_fingerprints_for_every_range_it_holds(source, tmp_path):
    record = _cut(source, tmp_path / "parts")
    artifact = fp.artifact_fingerprint(source)
    summary = fp.gguf_summary(source)
    for entry in record["parts"]:
        path = tmp_path / "parts" / entry["file"]
        start, end = entry["layers"]
        assert fp.gguf_summary(path) == summary
        assert entry["range_fingerprint"] == fp.range_fingerprint(source, start, end)
        for s in range(start, end):
            for e in range(s + 1, end + 1):
                assert fp.declared_artifact_fingerprint(path, s, e) == artifact
                assert fp.range_fingerprint(path, s, e) == fp.range_fingerprint(source, s, e), (s, e)
        assert fp.artifact_fingerprint(path) != artifact  # the part's own bytes are another file
    assert fp.declared_artifact_fingerprint(source, 0, N_LAYER) == artifact


def test_a_part_refuses_ranges_it_does_not_hold(source, tmp_path):
    record = _cut(source, tmp_path / "parts")
    middle = tmp_path / "parts" / record["parts"][1]["file"]
    for s, e in [(0, 2), (1, 4), (0, 4), (3, 4)]:
        with pytest.raises(ValueError, match=r"part holding layers \[1, 3\) only"):
            fp.declared_artifact_fingerprint(middle, s, e)
    with pytest.raises(ValueError, match="layer 3 has no tensors"):
        fp.range_fingerprint(middle, 1, 4)
    with pytest.raises(ValueError, match="layer 0 has no tensors"):  # the middle part cannot start a route
        fp.range_fingerprint(middle, 0, 1)


def test_overlapping_ranges_make_replica_parts(source, tmp_path):
    record = _cut(source, tmp_path / "parts", [(0, 2), (1, 3), (0, 4)])
    whole = tmp_path / "parts" / record["parts"][2]["file"]
    assert sorted(t.name for t in read_header(whole).tensors) == sorted(t.name for t in read_header(source).tensors)
    assert fp.range_fingerprint(whole, 0, N_LAYER) == fp.range_fingerprint(source, 0, N_LAYER)


@pytest.mark.parametrize("ranges, message", [
    ([(0, 5)], r"bad layer range \[0, 5\)"),
    ([(2, 2)], r"bad layer range \[2, 2\)"),
    ([(0, 2), (0, 2)], "distinct"),
    ([], "non-empty"),
])
def test_bad_ranges_are_refused_before_anything_is_written(source, tmp_path, ranges, message):
    with pytest.raises(ValueError, match=message):
        _cut(source, tmp_path / "parts", ranges)
    assert not (tmp_path / "parts").exists() or not list((tmp_path / "parts").iterdir())


def test_a_part_is_not_cut_again(source, tmp_path):
    record = _cut(source, tmp_path / "parts")
    with pytest.raises(ValueError, match="already a part"):
        _cut(tmp_path / "parts" / record["parts"][0]["file"], tmp_path / "again", [(0, 1)])


def test_a_part_that_reads_back_wrong_is_never_left_behind(source, tmp_path, monkeypatch):
    """A fault injected into the copy (a unit-test fake): the read-back check refuses the part,
    and neither the part, its temporary file nor the record is left."""
    real = cut_model._copy_tensor

    def corrupting(src, sink, t):
        return real(src, _FlipLastByte(sink), t)

    monkeypatch.setattr(cut_model, "_copy_tensor", corrupting)
    with pytest.raises(ValueError, match="tensors differ from the source's"):
        _cut(source, tmp_path / "parts")
    assert list((tmp_path / "parts").iterdir()) == []


class _FlipLastByte:
    """Passes writes through with the last byte of each chunk inverted."""

    def __init__(self, sink) -> None:
        self.sink = sink

    def write(self, data: bytes) -> None:
        self.sink.write(data[:-1] + bytes([data[-1] ^ 0xFF]))


def test_incomplete_part_metadata_is_refused(source, tmp_path):
    header = read_header(source)
    forged = dataclasses.replace(header, metadata={**header.metadata, range_part.LAYER_START: 0})
    with pytest.raises(ValueError, match="incomplete or unknown"):
        range_part.part_info(forged)
    values = range_part.PartInfo("sha256:" + "0" * 64, 2, 1, True, "F32").values()
    with pytest.raises(ValueError, match="not a range"):
        range_part.part_info(dataclasses.replace(header, metadata={**header.metadata, **values}))
    with pytest.raises(ValueError, match="is str, expected UINT32"):
        range_part.part_info(dataclasses.replace(header, metadata={**header.metadata, **values,
                                                                   range_part.LAYER_END: "4"}))


def test_command_cuts_into_even_ranges(source, tmp_path, capsys):
    assert cut_model.main(["--gguf", str(source), "--nodes", "2", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["0:2", "2:4"]
    assert sorted(os.listdir(tmp_path / "out")) == ["tiny.layers-0-2.gguf", "tiny.layers-2-4.gguf", "tiny.parts.json"]
    with pytest.raises(SystemExit):
        cut_model.main(["--gguf", str(source), "--ranges", "0-2", "--out", str(tmp_path / "bad")])
    assert cut_model.parse_ranges("0:10, 10:30") == [(0, 10), (10, 30)]
    assert cut_model.even_cuts(30, 3) == [(0, 10), (10, 20), (20, 30)]
