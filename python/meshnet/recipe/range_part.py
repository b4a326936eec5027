"""What a per-range model file (a "part", made by `cut_model`) says of itself.

A part is a valid GGUF holding only the tensors a node serving its layer range loads, with the
source file's metadata kept byte for byte plus the `meshnet.part.*` pairs below. Called by
`fingerprint` (a part's summary and declared artifact are its source's) and by `cut_model`
(which writes these pairs). Invariant: the pairs are claims, never proof; what a tracker trusts
is the range fingerprint, computed from the part's tensor bytes, which equals the source's for
every range the part holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from meshnet.recipe.gguf_header import GgufHeader, GGUFValueType, PathLike, read_header

PREFIX = "meshnet.part."
SOURCE_ARTIFACT = PREFIX + "source_artifact"  # "sha256:<hex>" of the whole source file
LAYER_START = PREFIX + "layer_start"  # the repeating layers [start, end) the part holds
LAYER_END = PREFIX + "layer_end"
TIED_EMBEDDINGS = PREFIX + "tied_embeddings"  # the source has no output.weight (the head reuses token_embd)
FILE_TYPE = PREFIX + "file_type"  # the source's weight quantization name (fingerprint.GgufSummary.file_type)

# Each pair's GGUF value type, in the order a part carries them.
KEYS = {
    SOURCE_ARTIFACT: GGUFValueType.STRING,
    LAYER_START: GGUFValueType.UINT32,
    LAYER_END: GGUFValueType.UINT32,
    TIED_EMBEDDINGS: GGUFValueType.BOOL,
    FILE_TYPE: GGUFValueType.STRING,
}


@dataclasses.dataclass(frozen=True)
class PartInfo:
    source_artifact: str  # "sha256:<hex>" of the file the part was cut from
    layer_start: int
    layer_end: int
    tied_embeddings: bool
    file_type: str

    def holds(self, layer_start: int, layer_end: int) -> bool:
        """Whether a node serving [layer_start, layer_end) finds all its layers here."""
        return self.layer_start <= layer_start < layer_end <= self.layer_end

    def values(self) -> dict[str, Any]:
        """The part's pairs, keyed as in KEYS."""
        return {SOURCE_ARTIFACT: self.source_artifact, LAYER_START: self.layer_start, LAYER_END: self.layer_end,
                TIED_EMBEDDINGS: self.tied_embeddings, FILE_TYPE: self.file_type}


def part_info(header: GgufHeader) -> Optional[PartInfo]:
    """The part's record, or None for a whole file; ValueError for a file that carries some of
    the pairs but not all, or carries them with the wrong types or values."""
    present = {k for k in header.metadata if k.startswith(PREFIX)}
    if not present:
        return None
    if present != set(KEYS):
        raise ValueError(f"{header.path}: incomplete or unknown {PREFIX}* metadata: has {sorted(present)}, "
                         f"a part has {sorted(KEYS)}")
    values = {k: header.metadata[k] for k in KEYS}
    expected_python = {GGUFValueType.STRING: str, GGUFValueType.UINT32: int, GGUFValueType.BOOL: bool}
    for key, value_type in KEYS.items():
        kind = expected_python[value_type]
        if not isinstance(values[key], kind) or (kind is int and isinstance(values[key], bool)):
            raise ValueError(f"{header.path}: {key} is {type(values[key]).__name__}, expected {value_type.name}")
    info = PartInfo(values[SOURCE_ARTIFACT], values[LAYER_START], values[LAYER_END], values[TIED_EMBEDDINGS],
                    values[FILE_TYPE])
    if not info.source_artifact.startswith("sha256:") or len(info.source_artifact) != len("sha256:") + 64:
        raise ValueError(f"{header.path}: {SOURCE_ARTIFACT} {info.source_artifact!r} is not sha256:<64 hex>")
    if not 0 <= info.layer_start < info.layer_end:
        raise ValueError(f"{header.path}: part layers [{info.layer_start}, {info.layer_end}) are not a range")
    return info


def part_of(path: PathLike) -> Optional[PartInfo]:
    """`part_info` of the GGUF at `path` (ValueError if it is not a readable GGUF)."""
    return part_info(read_header(path))
