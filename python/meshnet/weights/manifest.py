"""A model's manifest (issue 50, item 3): what a node needs to fetch its range from anyone and
trust nothing it was not promised. Made from a parts record (`cut_model`), signed by the
tracker's key:

- the source artifact (the whole file's sha256), its layer count and the model's name;
- per part: its layer range, file name, size and sha256, and its pieces (fixed-size chunks,
  `piece_bytes` each, the last shorter) each with its sha256, so a piece is checked alone as it
  arrives, from whichever peer sent it.

The signature covers the manifest's canonical JSON (sorted keys, no spaces) without the
signature itself. `parse` bounds everything before it allocates by it: a manifest is read from
the network. Pure functions except `from_parts_record`, which reads the parts.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

from meshnet.identity.keys import PUBLIC_KEY_BYTES, Identity, verify
from meshnet.recipe.model_files import open_model_files

FORMAT = "meshnet-manifest-v1"
DEFAULT_PIECE_BYTES = 16 << 20
MIN_PIECE_BYTES = 64 << 10
MAX_PIECE_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 8 << 20  # a parsed manifest's JSON, at most
MAX_PARTS = 4096
MAX_PIECES_PER_PART = 1 << 16  # 1 TiB of part at 16 MiB pieces
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_MODEL = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


class ManifestError(ValueError):
    """A manifest that is malformed, past a bound, or not signed by the key it must be."""


@dataclasses.dataclass(frozen=True)
class Part:
    start: int  # first layer
    end: int  # exclusive
    file: str  # a plain file name (the node writes it under its data directory)
    size: int  # bytes
    sha256: str  # "sha256:<hex>" of the whole part
    pieces: tuple[str, ...]  # hex sha256 of each piece, in order

    def piece_span(self, index: int, piece_bytes: int) -> tuple[int, int]:
        """(offset, length) of piece `index` in the part."""
        offset = index * piece_bytes
        return offset, min(piece_bytes, self.size - offset)


@dataclasses.dataclass(frozen=True)
class Manifest:
    model: str  # the name the tracker serves it under
    artifact: str  # "sha256:<hex>" of the whole source GGUF
    n_layer: int
    piece_bytes: int
    parts: tuple[Part, ...]
    signed_by: bytes = b""  # the tracker key that signed it (Ed25519 public key)
    signature: bytes = b""

    def body(self) -> dict[str, Any]:
        """Everything the signature covers."""
        return {"format": FORMAT, "model": self.model, "artifact": self.artifact, "n_layer": self.n_layer,
                "piece_bytes": self.piece_bytes, "signed_by": self.signed_by.hex(),
                "parts": [{"start": p.start, "end": p.end, "file": p.file, "size": p.size, "sha256": p.sha256,
                           "pieces": list(p.pieces)} for p in self.parts]}

    def part(self, start: int, end: int) -> Optional[Part]:
        return next((p for p in self.parts if (p.start, p.end) == (start, end)), None)

    def encode(self) -> bytes:
        return json.dumps({**self.body(), "signature": base64.b64encode(self.signature).decode()},
                          sort_keys=True, separators=(",", ":")).encode()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(manifest: Manifest, key: Identity) -> Manifest:
    unsigned = dataclasses.replace(manifest, signed_by=key.public_key, signature=b"")
    return dataclasses.replace(unsigned, signature=key.sign(_canonical(unsigned.body())))


def piece_hashes(path: Path, piece_bytes: int) -> tuple[str, ...]:
    """The hex sha256 of each `piece_bytes` chunk of the file at `path`."""
    out = []
    with path.open("rb") as f:
        while chunk := f.read(piece_bytes):
            out.append(hashlib.sha256(chunk).hexdigest())
    return tuple(out)


def from_parts_record(record: Path, model: str, piece_bytes: int = DEFAULT_PIECE_BYTES) -> Manifest:
    """The unsigned manifest of the parts a `cut_model` record lists (each checked against the
    record first: open_model_files)."""
    files = open_model_files(record)
    parts = tuple(Part(f.start, f.end, f.path.name, f.path.stat().st_size, f.sha256, piece_hashes(f.path, piece_bytes))
                  for f in files.files)
    return _checked(Manifest(model, files.artifact, files.n_layer, piece_bytes, parts))


def parse(data: bytes, tracker_key: bytes) -> Manifest:
    """The manifest `data` holds, once it is well formed, within every bound, and signed by
    `tracker_key`; ManifestError saying which it is not."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes, not {len(data)}")
    try:
        raw = json.loads(data)
        if raw.get("format") != FORMAT:
            raise ManifestError(f"format {raw.get('format')!r}, not {FORMAT!r}")
        parts_raw = raw["parts"]
        if not isinstance(parts_raw, list) or not 1 <= len(parts_raw) <= MAX_PARTS:
            raise ManifestError(f"a manifest lists 1 to {MAX_PARTS} parts")
        parts = tuple(Part(int(p["start"]), int(p["end"]), str(p["file"]), int(p["size"]), str(p["sha256"]),
                           tuple(str(h) for h in p["pieces"][:MAX_PIECES_PER_PART + 1])) for p in parts_raw)
        manifest = Manifest(str(raw["model"]), str(raw["artifact"]), int(raw["n_layer"]), int(raw["piece_bytes"]),
                            parts, bytes.fromhex(raw["signed_by"]), base64.b64decode(raw["signature"], validate=True))
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as err:
        raise ManifestError(f"not a readable manifest: {type(err).__name__}: {err}") from None
    _checked(manifest)
    if manifest.signed_by != tracker_key:
        raise ManifestError("the manifest is signed by another key than this tracker's")
    if not verify(tracker_key, manifest.signature, _canonical(manifest.body())):
        raise ManifestError("the manifest's signature does not verify")
    return manifest


def _checked(m: Manifest) -> Manifest:
    """`m`, once every field is within its bounds and the parts are consistent; ManifestError."""
    if not _MODEL.fullmatch(m.model) or not _SHA256.fullmatch(m.artifact) or not 1 <= m.n_layer <= 4096:
        raise ManifestError("model, artifact or n_layer out of bounds")
    if not MIN_PIECE_BYTES <= m.piece_bytes <= MAX_PIECE_BYTES:
        raise ManifestError(f"piece_bytes must be in [{MIN_PIECE_BYTES}, {MAX_PIECE_BYTES}]")
    if m.signed_by and len(m.signed_by) != PUBLIC_KEY_BYTES:
        raise ManifestError("signed_by is not an Ed25519 public key")
    for p in m.parts:
        if not 0 <= p.start < p.end <= m.n_layer:
            raise ManifestError(f"part layers [{p.start}, {p.end}) are not within the model's {m.n_layer}")
        if not _FILE.fullmatch(p.file) or p.file in (".", ".."):
            raise ManifestError(f"part file {p.file!r} is not a plain file name")
        if not _SHA256.fullmatch(p.sha256) or not all(_HEX64.fullmatch(h) for h in p.pieces):
            raise ManifestError(f"part {p.file}: a sha256 is malformed")
        if not 0 < p.size <= MAX_PIECES_PER_PART * m.piece_bytes:
            raise ManifestError(f"part {p.file}: size {p.size} out of bounds")
        if len(p.pieces) != -(-p.size // m.piece_bytes):
            raise ManifestError(f"part {p.file}: {len(p.pieces)} pieces for {p.size} bytes of "
                                f"{m.piece_bytes}-byte pieces")
    if len({p.file for p in m.parts}) != len(m.parts):
        raise ManifestError("two parts share a file name")
    return m
