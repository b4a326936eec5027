"""Where pieces come from. `DirectorySource` reads them from complete parts on this machine's
disk (a seed's published parts, or a peer's data directory); the network source, which asks a
peer's piece service, is built on the same `piece` contract (fetcher.PieceSource).

A request names a part only as the manifest does (its plain file name, checked when the
manifest was parsed) and a piece index within it; nothing from a request reaches the file
system otherwise, and the file read must be a regular file inside the directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from meshnet.weights.manifest import Manifest, Part


class DirectorySource:
    def __init__(self, name: str, directory: Path, manifest: Manifest) -> None:
        self.name, self._directory, self._manifest = name, directory.resolve(), manifest

    def has(self, part: Part) -> bool:
        path = self._directory / part.file
        return path.is_file() and path.stat().st_size == part.size

    def piece(self, part: Part, index: int) -> bytes:
        if part not in self._manifest.parts:
            raise KeyError(f"part {part.file} is not in this source's manifest")
        if not 0 <= index < len(part.pieces):
            raise IndexError(f"part {part.file} has {len(part.pieces)} pieces, not {index + 1}")
        path = (self._directory / part.file).resolve()
        if path.parent != self._directory or not path.is_file():
            raise FileNotFoundError(f"{self.name} does not hold {part.file}")
        offset, length = part.piece_span(index, self._manifest.piece_bytes)
        with path.open("rb") as f:
            return os.pread(f.fileno(), length, offset)
