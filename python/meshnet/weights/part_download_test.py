"""A part fetched to disk (issue 50, item 5): nothing unverified under the final name, a restart
resumes from the pieces verified on disk (a torn one fetched again), and a disk that cannot
hold the part refuses the download before writing anything."""

from __future__ import annotations

import dataclasses
import os

import pytest

from meshnet.weights.part_download import DiskFull, PartDownload
from meshnet.weights.sources import DirectorySource
from meshnet.weights.weights_fixtures import published  # noqa: F401


def test_pieces_are_written_only_when_they_match_and_the_part_appears_only_whole(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[0]
    seed = DirectorySource("seed", published.parts_dir, m)
    download = PartDownload(tmp_path / "node", m, part)
    assert download.missing() == list(range(len(part.pieces)))
    good = seed.piece(part, 0)
    assert not download.write(0, b"x" * len(good))  # wrong bytes
    assert not download.write(0, good[:-1])  # truncated
    assert not download.write(0, good + b"x")  # oversized
    assert not download.write(1, good)  # another piece's bytes
    assert download.write(0, good) and download.missing()[0] == 1
    with pytest.raises(ValueError, match="pieces are still missing"):
        download.finish()
    assert not download.final.exists()
    for index in download.missing():
        assert download.write(index, seed.piece(part, index))
    final = download.finish()
    assert final.read_bytes() == (published.parts_dir / part.file).read_bytes()
    assert not download.partial.exists() and not download.state.exists()


def test_a_restart_resumes_from_the_verified_pieces_and_refetches_a_torn_one(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[1]
    seed = DirectorySource("seed", published.parts_dir, m)
    first = PartDownload(tmp_path, m, part)
    for index in range(10):
        first.write(index, seed.piece(part, index))
    first.close()  # the process dies here
    offset, _ = part.piece_span(4, m.piece_bytes)
    with open(first.partial, "r+b") as f:  # a write torn by the crash
        f.seek(offset)
        f.write(b"\0" * 100)
    again = PartDownload(tmp_path, m, part)
    assert sorted(set(range(len(part.pieces))) - set(again.missing())) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert again.resumed_bytes == 9 * m.piece_bytes
    for index in again.missing():
        again.write(index, seed.piece(part, index))
    assert again.finish().read_bytes() == (published.parts_dir / part.file).read_bytes()


def test_a_disk_that_cannot_hold_the_part_refuses_before_anything_is_written(published, tmp_path):
    m = published.manifest
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    pieces = -(-(free + (1 << 30)) // m.piece_bytes)
    huge = dataclasses.replace(m.parts[0], size=free + (1 << 30), pieces=("0" * 64,) * pieces)
    with pytest.raises(DiskFull, match="more bytes, the disk has"):
        PartDownload(tmp_path / "node", m, huge)
    assert list((tmp_path / "node").iterdir()) == []


def test_a_final_file_that_is_not_the_part_is_not_adopted(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[0]
    (tmp_path / part.file).write_bytes(b"something else")
    with pytest.raises(ValueError, match="is not the manifest's part"):
        PartDownload(tmp_path, m, part)
