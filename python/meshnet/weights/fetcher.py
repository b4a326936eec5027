"""Fetching a part from every source that has it, several pieces at once (issue 50, item 5).

Each missing piece is asked of one source at a time, the least used healthy one first; a piece
that does not match the manifest is dropped (never written), its sender reported through
`on_bad`, and the piece asked of another source. A source that sends `MAX_BAD_PIECES` bad pieces,
or fails `MAX_FAILURES` times (unreachable, refused, stalled past its own deadline), is dropped
for the rest of the fetch. The fetch fails, naming every source's fate, only when some piece is
left that no remaining source can give. Progress (bytes, rate, bytes per source) is reported
through `on_progress` at most every `progress_seconds`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Protocol, Sequence

from meshnet.weights.manifest import Part
from meshnet.weights.part_download import PartDownload

MAX_BAD_PIECES = 3
MAX_FAILURES = 3
DEFAULT_PARALLEL = 4


class PieceSource(Protocol):
    name: str  # for reports: a peer's node id or address, "seed", ...

    def piece(self, part: Part, index: int) -> bytes:
        """Piece `index` of `part`; OSError (or any Exception) when it cannot give it."""
        ...


class FetchError(RuntimeError):
    pass


@dataclasses.dataclass
class Progress:
    part: str  # the part's file name
    total_bytes: int
    done_bytes: int  # verified on disk, the resumed ones included
    resumed_bytes: int
    seconds: float
    per_source: dict[str, int]  # bytes each source gave that were written
    dropped: dict[str, str]  # sources dropped, and why

    @property
    def rate(self) -> float:
        """Bytes per second fetched (not counting resumed ones)."""
        return (self.done_bytes - self.resumed_bytes) / self.seconds if self.seconds > 0 else 0.0


class _Sources:
    """Which sources are healthy and how used; one lock (the fetch's threads)."""

    def __init__(self, sources: Sequence[PieceSource]) -> None:
        self.all = {s.name: s for s in sources}
        self.in_use: collections.Counter = collections.Counter()
        self.bad: collections.Counter = collections.Counter()
        self.failures: collections.Counter = collections.Counter()
        self.dropped: dict[str, str] = {}
        self.lock = threading.Lock()

    def take(self, tried: set[str]) -> Optional[PieceSource]:
        with self.lock:
            healthy = [n for n in self.all if n not in self.dropped and n not in tried]
            if not healthy:
                return None
            name = min(healthy, key=lambda n: (self.in_use[n], self.bad[n] + self.failures[n], n))
            self.in_use[name] += 1
            return self.all[name]

    def give_back(self, name: str, bad: bool = False, failed: Optional[str] = None) -> None:
        with self.lock:
            self.in_use[name] -= 1
            if bad:
                self.bad[name] += 1
                if self.bad[name] >= MAX_BAD_PIECES:
                    self.dropped.setdefault(name, f"{self.bad[name]} pieces did not match the manifest")
            if failed is not None:
                self.failures[name] += 1
                if self.failures[name] >= MAX_FAILURES:
                    self.dropped.setdefault(name, f"failed {self.failures[name]} times, last: {failed}")


def fetch(download: PartDownload, sources: Sequence[PieceSource], parallel: int = DEFAULT_PARALLEL,
          on_bad: Callable[[str, int], None] = lambda name, index: None,
          on_progress: Callable[[Progress], None] = lambda p: None, progress_seconds: float = 2.0) -> Progress:
    """Fetches every missing piece of `download` and finishes it (final name, whole sha256);
    returns the last progress. FetchError when a piece is left that no source gave."""
    if not sources:
        raise FetchError(f"{download.part.file}: no source to fetch it from")
    pool, write_lock, started = _Sources(sources), threading.Lock(), time.monotonic()
    written: collections.Counter = collections.Counter()
    failed_pieces: dict[int, str] = {}
    last_report = [0.0]

    done = [sum(download.span(i)[1] for i in download.verified)]  # bytes verified, counted once each

    def report(force: bool = False) -> Progress:
        with write_lock:
            progress = Progress(download.part.file, download.part.size, done[0], download.resumed_bytes,
                                time.monotonic() - started, dict(written), dict(pool.dropped))
        if force or progress.seconds - last_report[0] >= progress_seconds:
            last_report[0] = progress.seconds
            on_progress(progress)
        return progress

    def one(index: int) -> None:
        tried: set[str] = set()
        while (source := pool.take(tried)) is not None:  # ends: every failure counts toward a drop
            try:
                data = source.piece(download.part, index)
            except Exception as err:  # a source's failure is its own: the least failed source next
                pool.give_back(source.name, failed=f"{type(err).__name__}: {err}"[:200])
                continue
            if not download.accepts(index, data):
                tried.add(source.name)  # never asked for this piece again
                pool.give_back(source.name, bad=True)
                on_bad(source.name, index)
                continue
            with write_lock:
                download.write(index, data)
                written[source.name] += len(data)
                done[0] += len(data)
            pool.give_back(source.name)
            report()
            return
        failed_pieces[index] = f"sent wrong bytes: {sorted(tried) or 'none'}"

    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="fetch") as executor:
        for future in [executor.submit(one, index) for index in download.missing()]:
            future.result()
    if failed_pieces:
        first = min(failed_pieces)
        raise FetchError(f"{download.part.file}: {len(failed_pieces)} pieces no source gave (piece {first}: "
                         f"{failed_pieces[first]}); sources dropped: {pool.dropped or 'none'}")
    download.finish()
    return report(force=True)
