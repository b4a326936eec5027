"""Where a process that works on a model range by range finds each range's tensors: one whole
GGUF, or the per-range parts cut from it (`cut_model`'s `<stem>.parts.json` record).

Used by the verifier's streamed replay and by streamed certification, whose processes each open
one range's file only. Invariant: every file a `ModelFiles` names belongs to one artifact
(`artifact`, the whole file's sha256): a part's own `range_part` record must name it and hold
the layers the parts record says, or `open_model_files` refuses the record.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from meshnet.recipe.fingerprint import PathLike, artifact_fingerprint, gguf_summary
from meshnet.recipe.range_part import part_of

RECORD_FORMAT = "meshnet-gguf-parts-v1"  # cut_model writes it


@dataclasses.dataclass(frozen=True)
class RangeFile:
    start: int
    end: int  # exclusive
    path: Path


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    artifact: str  # "sha256:<hex>" of the whole model file
    n_layer: int
    files: tuple[RangeFile, ...]  # a whole file: one, [0, n_layer)
    source: Path  # what it was opened from: the GGUF or the parts record

    def pieces(self, start: int, end: int) -> list[RangeFile]:
        """[start, end) as consecutive pieces, each within one file, as few as the files allow
        (at each layer, the file holding the most layers from there). Chaining ranges at exact
        layer boundaries computes the same bytes as the whole range (the engine's parity), so a
        range split across parts replays as it ran. ValueError for a layer no file holds."""
        if not 0 <= start < end <= self.n_layer:
            raise ValueError(f"layers [{start}, {end}) are not within the model's {self.n_layer}")
        out, at = [], start
        while at < end:
            holding = [f for f in self.files if f.start <= at < f.end]
            if not holding:
                raise ValueError(f"no file of this model holds layer {at} (files: "
                                 f"{[(f.start, f.end) for f in self.files]})")
            best = max(holding, key=lambda f: f.end)
            out.append(RangeFile(at, min(end, best.end), best.path))
            at = out[-1].end
        return out


def open_model_files(path: PathLike) -> ModelFiles:
    """A whole GGUF, or a parts record (`.json`); ValueError for a part given alone (its record
    says where the other layers are), a record of another format, or parts that do not match it."""
    path = Path(path)
    if path.suffix == ".json":
        return _open_record(path)
    if part_of(path) is not None:
        raise ValueError(f"{path} is a per-range part: give its parts record (<stem>.parts.json) instead")
    n_layer = gguf_summary(path).n_layer
    return ModelFiles(artifact_fingerprint(path), n_layer, (RangeFile(0, n_layer, path),), path)


def _open_record(path: Path) -> ModelFiles:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {record.get('format')!r}, not {RECORD_FORMAT!r}")
        artifact, n_layer = record["source"]["artifact_fingerprint"], int(record["source"]["n_layer"])
        entries = [(int(p["layers"][0]), int(p["layers"][1]), path.parent / p["file"], int(p["size"]))
                   for p in record["parts"]]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{path}: not a readable parts record: {err}") from None
    files = []
    for start, end, file, size in entries:
        if not file.is_file() or file.stat().st_size != size:
            raise ValueError(f"{path}: part {file} is missing or not the {size} bytes the record says")
        info = part_of(file)
        if info is None or (info.source_artifact, info.layer_start, info.layer_end) != (artifact, start, end):
            raise ValueError(f"{path}: {file} is not the part of {artifact} holding layers [{start}, {end})")
        files.append(RangeFile(start, end, file))
    if not files:
        raise ValueError(f"{path}: the record lists no parts")
    return ModelFiles(artifact, n_layer, tuple(files), path)
