"""One part being fetched to disk, piece by piece, resumable (issue 50, item 5).

Invariants:
- nothing unverified is ever under the part's final name: pieces go into `<file>.partial` at
  their offsets, each only once its sha256 is the manifest's, and the file is renamed to its
  final name only when every piece is in and the whole file's sha256 is the part's;
- the space is taken before the first piece (`posix_fallocate`), so a disk that cannot hold the
  part refuses the download at once (`DiskFull`) instead of filling mid-way; a write that still
  fails (another process filled the disk) raises, and the partial file is never loaded;
- `<file>.pieces` lists the verified pieces (replaced atomically after each write); a download
  opened again hashes those pieces again before trusting them (a crash may have torn a write),
  then fetches only what is missing.

Not thread-safe by itself: the fetcher (fetcher.py) serializes `write`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from meshnet.weights.manifest import Manifest, Part

PARTIAL_SUFFIX = ".partial"
STATE_SUFFIX = ".pieces"


class DiskFull(OSError):
    def __init__(self, path: Path, needed: int, free: int) -> None:
        super().__init__(errno.ENOSPC, f"{path} needs {needed} more bytes, the disk has {free} free")


class PartDownload:
    def __init__(self, directory: Path, manifest: Manifest, part: Part) -> None:
        self.manifest, self.part = manifest, part
        self.final = directory / part.file
        self.partial = directory / (part.file + PARTIAL_SUFFIX)
        self.state = directory / (part.file + STATE_SUFFIX)
        self.verified: set[int] = set()
        self.resumed_bytes = 0  # bytes found verified on disk when opened
        if self.final.exists():
            self._adopt_final()
            return
        directory.mkdir(parents=True, exist_ok=True)
        held = self.partial.stat().st_size if self.partial.exists() else 0
        needed = max(0, part.size - held)
        free = shutil.disk_usage(directory).free
        if needed > free:
            raise DiskFull(self.partial, needed, free)
        self._fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(self._fd, 0, part.size)
        except OSError as err:
            os.close(self._fd)
            if err.errno == errno.ENOSPC:
                raise DiskFull(self.partial, needed, shutil.disk_usage(directory).free) from None
            raise
        self.verified = self._still_verified()
        self.resumed_bytes = sum(self.span(i)[1] for i in self.verified)

    def _adopt_final(self) -> None:
        """A final file is there from before: it is complete only if it is the part's bytes."""
        digest = hashlib.sha256()
        with self.final.open("rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        if "sha256:" + digest.hexdigest() != self.part.sha256:
            raise ValueError(f"{self.final} is there but is not the manifest's part (sha256 differs): move it away")
        self._fd = -1
        self.verified = set(range(len(self.part.pieces)))
        self.resumed_bytes = self.part.size

    def span(self, index: int) -> tuple[int, int]:
        return self.part.piece_span(index, self.manifest.piece_bytes)

    def _still_verified(self) -> set[int]:
        try:
            listed = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return set()
        if not isinstance(listed, list):
            return set()
        good = set()
        for index in listed:
            if isinstance(index, int) and 0 <= index < len(self.part.pieces) and self._matches(index):
                good.add(index)
        return good

    def _matches(self, index: int) -> bool:
        offset, length = self.span(index)
        return hashlib.sha256(os.pread(self._fd, length, offset)).hexdigest() == self.part.pieces[index]

    @property
    def complete(self) -> bool:
        return self.final.exists() and self._fd == -1

    def missing(self) -> list[int]:
        return [i for i in range(len(self.part.pieces)) if i not in self.verified]

    def accepts(self, index: int, data: bytes) -> bool:
        """Whether `data` is piece `index` as the manifest says (length and sha256)."""
        return (0 <= index < len(self.part.pieces) and len(data) == self.span(index)[1]
                and hashlib.sha256(data).hexdigest() == self.part.pieces[index])

    def write(self, index: int, data: bytes) -> bool:
        """Writes piece `index` if it is the manifest's (False, nothing written, otherwise)."""
        if not self.accepts(index, data):
            return False
        offset, _ = self.span(index)
        written = os.pwrite(self._fd, data, offset)
        if written != len(data):
            raise OSError(errno.EIO, f"{self.partial}: wrote {written} of {len(data)} bytes")
        os.fdatasync(self._fd)
        self.verified.add(index)
        tmp = self.state.with_suffix(self.state.suffix + ".tmp")
        tmp.write_text(json.dumps(sorted(self.verified)))
        os.replace(tmp, self.state)
        return True

    def finish(self) -> Path:
        """Renames the complete part to its final name once its whole sha256 is the part's."""
        if self.complete:
            return self.final
        if self.missing():
            raise ValueError(f"{self.partial}: {len(self.missing())} pieces are still missing")
        digest = hashlib.sha256()
        for index in range(len(self.part.pieces)):
            offset, length = self.span(index)
            digest.update(os.pread(self._fd, length, offset))
        if "sha256:" + digest.hexdigest() != self.part.sha256:
            raise ValueError(f"{self.partial}: every piece matches but the whole is not the part's sha256")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        os.replace(self.partial, self.final)
        self.state.unlink(missing_ok=True)
        return self.final

    def close(self) -> None:
        if self._fd != -1:
            os.close(self._fd)
            self._fd = -1
