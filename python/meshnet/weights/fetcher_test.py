"""Fetching a part from several sources at once (issue 50, item 5): every piece checked against
the manifest; a source sending corrupted, truncated or oversized pieces is reported and dropped,
a failing or stalled one dropped, and the part still arrives whole from the honest ones."""

from __future__ import annotations

import threading
import time

import pytest

from meshnet.weights.fetcher import MAX_BAD_PIECES, FetchError, fetch
from meshnet.weights.manifest import Part
from meshnet.weights.part_download import PartDownload
from meshnet.weights.sources import DirectorySource
from meshnet.weights.weights_fixtures import published  # noqa: F401


class Lying:
    """A source whose pieces are damaged by `damage` (named as such: a fake inside a test)."""

    def __init__(self, name: str, honest: DirectorySource, damage) -> None:
        self.name, self._honest, self._damage, self.asked = name, honest, damage, 0

    def piece(self, part: Part, index: int) -> bytes:
        self.asked += 1
        return self._damage(self._honest.piece(part, index))


class Failing:
    def __init__(self, name: str, error: Exception, delay: float = 0.0) -> None:
        self.name, self._error, self._delay, self.asked = name, error, delay, 0

    def piece(self, part: Part, index: int) -> bytes:
        self.asked += 1
        time.sleep(self._delay)
        raise self._error


@pytest.mark.parametrize("damage", [lambda b: b[:-1], lambda b: b + b"!", lambda b: b"\x01" + b[1:]],
                         ids=["truncated", "oversized", "corrupted"])
def test_a_lying_source_is_reported_and_dropped_and_the_part_arrives_whole(published, tmp_path, damage):
    m, part = published.manifest, published.manifest.parts[0]
    honest = [DirectorySource(f"peer{i}", published.parts_dir, m) for i in range(2)]
    liar = Lying("liar", honest[0], damage)
    reported: list[tuple[str, int]] = []
    lock = threading.Lock()

    def on_bad(name: str, index: int) -> None:
        with lock:
            reported.append((name, index))

    progress = fetch(PartDownload(tmp_path, m, part), [liar, *honest], parallel=3, on_bad=on_bad)
    assert (tmp_path / part.file).read_bytes() == (published.parts_dir / part.file).read_bytes()
    # Each wrong piece is reported; after the first the liar is asked only while the honest
    # sources are busy, and never past MAX_BAD_PIECES (then dropped).
    assert {name for name, _ in reported} == {"liar"} and 1 <= len(reported) <= MAX_BAD_PIECES
    assert progress.dropped == ({"liar": f"{MAX_BAD_PIECES} pieces did not match the manifest"}
                                if len(reported) == MAX_BAD_PIECES else {})
    assert "liar" not in progress.per_source
    assert sum(progress.per_source.values()) == part.size
    assert set(progress.per_source) == {"peer0", "peer1"}  # several pieces at once, from both


def test_failing_and_stalled_sources_are_passed_over_and_the_part_arrives(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[1]
    gone = Failing("gone", ConnectionRefusedError("connection refused"))
    stalled = Failing("stalled", TimeoutError("no piece within its deadline"), delay=0.05)
    honest = DirectorySource("seed", published.parts_dir, m)
    progress = fetch(PartDownload(tmp_path, m, part), [gone, stalled, honest], parallel=4)
    assert progress.per_source == {"seed": part.size}
    assert gone.asked >= 1 and stalled.asked >= 1  # each tried, then asked only while the seed is busy
    assert gone.asked <= 3 and stalled.asked <= 3  # and never past MAX_FAILURES
    for name, why in progress.dropped.items():
        assert why.startswith("failed 3 times, last: ") and name in ("gone", "stalled")


def test_a_source_that_keeps_failing_is_dropped_and_the_fetch_says_so(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[1]
    gone = Failing("gone", ConnectionRefusedError("connection refused"))
    with pytest.raises(FetchError, match="sources dropped: {'gone': 'failed 3 times, last: ConnectionRefusedError"):
        fetch(PartDownload(tmp_path, m, part), [gone], parallel=1)
    assert gone.asked == 3


def test_a_piece_no_source_gives_fails_the_fetch_and_nothing_is_final(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[0]
    liar = Lying("liar", DirectorySource("x", published.parts_dir, m), lambda b: b[::-1])
    download = PartDownload(tmp_path, m, part)
    with pytest.raises(FetchError, match=f"pieces no source gave .*sources dropped: {{'liar': '{MAX_BAD_PIECES} "
                                         "pieces did not match the manifest'}"):
        fetch(download, [liar], parallel=1)
    assert liar.asked == MAX_BAD_PIECES  # dropped after its third wrong piece, asked nothing more
    assert not download.final.exists()


def test_progress_is_reported_with_bytes_rate_and_sources(published, tmp_path):
    m, part = published.manifest, published.manifest.parts[0]
    seen = []
    fetch(PartDownload(tmp_path, m, part), [DirectorySource("seed", published.parts_dir, m)],
          on_progress=seen.append, progress_seconds=0.0)
    assert seen[-1].done_bytes == part.size and seen[-1].per_source == {"seed": part.size}
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)
    assert seen[-1].rate > 0
