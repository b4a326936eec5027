"""Where a process that works on a model range by range finds each range's tensors: one whole
GGUF, or the per-range parts cut from it (`cut_model`'s `<stem>.parts.json` record).

Used by the verifier's streamed replay and by streamed certification, whose processes each open
one range's file only. Invariant: every file a `ModelFiles` names belongs to one artifact
(`artifact`, the whole file's sha256): a part's own `range_part` record must name it and hold
the layers the parts record says, or `open_model_files` refuses the record. A record is not
trusted (issue 55, finding 15): each part is a plain file name in the record's directory and
has the size and sha256 the record says before anything reads it; `RangeFile.check` checks a
file again before each use.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from meshnet.recipe.fingerprint import PathLike, artifact_fingerprint, gguf_summary
from meshnet.recipe.range_part import part_of

RECORD_FORMAT = "meshnet-gguf-parts-v1"  # cut_model writes it


@dataclasses.dataclass(frozen=True)
class RangeFile:
    start: int
    end: int  # exclusive
    path: Path
    sha256: str  # "sha256:<hex>" its bytes must have: the record's for a part, the artifact for a whole file

    def check(self) -> None:
        """ValueError unless the file's bytes are those `sha256` names (hashed in chunks, cached
        by path, size and mtime: a file checked again unchanged is not read again)."""
        try:
            actual = artifact_fingerprint(self.path)
        except OSError as err:
            raise ValueError(f"{self.path.name} (layers [{self.start}, {self.end})) cannot be read: {err}") from None
        if actual != self.sha256:
            raise ValueError(f"{self.path.name} (layers [{self.start}, {self.end})) has sha256 {actual}, "
                             f"not {self.sha256}")


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
            out.append(RangeFile(at, min(end, best.end), best.path, best.sha256))
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
    n_layer, artifact = gguf_summary(path).n_layer, artifact_fingerprint(path)
    return ModelFiles(artifact, n_layer, (RangeFile(0, n_layer, path, artifact),), path)


def _open_record(path: Path) -> ModelFiles:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {record.get('format')!r}, not {RECORD_FORMAT!r}")
        artifact, n_layer = record["source"]["artifact_fingerprint"], int(record["source"]["n_layer"])
        entries = [(int(p["layers"][0]), int(p["layers"][1]), _part_path(path, p["file"]), int(p["size"]),
                    _digest(p["sha256"])) for p in record["parts"]]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(f"{path}: not a readable parts record: {err}") from None
    files = [_checked_part(path, artifact, *entry) for entry in entries]
    if not files:
        raise ValueError(f"{path}: the record lists no parts")
    return ModelFiles(artifact, n_layer, tuple(files), path)


def _checked_part(record: Path, artifact: str, start: int, end: int, file: Path, size: int, sha256: str) -> RangeFile:
    """The part, once its size and sha256 are the record's (before anything parses it) and its
    own metadata names `artifact` and [start, end); ValueError naming the part otherwise."""
    if not file.is_file():
        raise ValueError(f"{record}: part {file.name} is missing")
    if file.stat().st_size != size:
        raise ValueError(f"{record}: part {file.name} is {file.stat().st_size} bytes, the record says {size}")
    piece = RangeFile(start, end, file, sha256)
    try:
        piece.check()
    except ValueError as err:
        raise ValueError(f"{record}: part {err}") from None
    info = part_of(file)
    if info is None or (info.source_artifact, info.layer_start, info.layer_end) != (artifact, start, end):
        raise ValueError(f"{record}: {file} is not the part of {artifact} holding layers [{start}, {end})")
    return piece


def _part_path(record: Path, name) -> Path:
    """Where the part named `name` is: a plain file name in the record's directory, which it must
    not leave through a symlink either (ValueError otherwise)."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"part file {name!r} is not a plain file name in the record's directory")
    try:
        directory = record.parent.resolve()
        inside = (directory / name).resolve().is_relative_to(directory)
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop
        raise ValueError(f"part file {name!r} cannot be resolved: {err}") from None
    if not inside:
        raise ValueError(f"part file {name!r} leads outside the record's directory {directory}")
    return record.parent / name


def _digest(sha256) -> str:
    if not isinstance(sha256, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", sha256):
        raise ValueError(f"a part's sha256 must be 'sha256:<64 hex digits>', not {sha256!r}")
    return sha256
