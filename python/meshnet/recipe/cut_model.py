"""Cuts a GGUF into per-range model files ("parts"), one per layer range, for nodes that must not
need the whole file on disk (docs/operating.md, "Per-range model files").

  tools/bazel run //python:cut_model -- --gguf /abs/MODEL.gguf --nodes 4 --out /abs/DIR
  tools/bazel run //python:cut_model -- --gguf /abs/MODEL.gguf --ranges 0:10,10:20,20:30 --out /abs/DIR

Each part is a valid GGUF: the source's metadata byte for byte plus the `range_part` pairs, then
exactly the tensors `fingerprint.owned_tensor_names` gives a node serving its range (token
embeddings in the first, output norm and head in the last), each tensor's info and bytes as in
the source, in the source's order. Beside the parts, `<stem>.parts.json` records the source's
sha256 and each part's file, range, sha256, size, range fingerprint and tensor list.

Invariants: a part's summary and every tensor digest equal the source's (checked by reading the
written part back before it is renamed into place), so a node serving a range from its part
declares the fingerprints it would declare from the whole file; a cut that fails leaves no part
and no record behind under their final names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Sequence

from meshnet.recipe.fingerprint import (GgufSummary, artifact_fingerprint, combine_digests, file_tensor_digests,
                                        gguf_summary, owned_tensor_names)
from meshnet.recipe.gguf_header import GGUFValueType, GgufHeader, TensorInfo, read_header
from meshnet.recipe.model_files import RECORD_FORMAT
from meshnet.recipe.range_part import KEYS, PartInfo, part_info

COPY_CHUNK = 8 << 20
PROGRESS_SECONDS = 2.0  # at most one progress line per part this often while copying
Progress = Callable[[str], None]


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """"0:10,10:20" -> [(0, 10), (10, 20)]; ValueError naming the bad item."""
    out = []
    for item in text.split(","):
        start, sep, end = item.strip().partition(":")
        if not sep or not start.isdigit() or not end.isdigit():
            raise ValueError(f"range {item!r} is not START:END")
        out.append((int(start), int(end)))
    return out


def even_cuts(n_layer: int, nodes: int) -> list[tuple[int, int]]:
    """[0, n_layer) split into `nodes` contiguous ranges as even as whole layers allow (the local
    swarm's and certification's default split, so `--nodes N` parts fit them)."""
    if not 1 <= nodes <= n_layer:
        raise ValueError(f"cannot split {n_layer} layers into {nodes} ranges")
    bounds = [round(i * n_layer / nodes) for i in range(nodes + 1)]
    return list(zip(bounds, bounds[1:]))


def part_name(source: Path, layer_start: int, layer_end: int) -> str:
    return f"{source.stem}.layers-{layer_start}-{layer_end}.gguf"


def cut(source: Path, ranges: Sequence[tuple[int, int]], out_dir: Path, progress: Progress = lambda _: None) -> dict:
    """Writes one part per range of `source` into `out_dir` and the record beside them; returns
    the record. ValueError for a bad range, a file that is already a part, or a part whose read-back
    differs from the source."""
    header = read_header(source)
    if part_info(header) is not None:
        raise ValueError(f"{source} is already a part; cut the whole file it came from")
    summary = gguf_summary(source)
    if len(set(ranges)) != len(ranges) or not ranges:
        raise ValueError(f"ranges must be non-empty and distinct: {list(ranges)}")
    plans = [(r, owned_tensor_names(summary, (t.name for t in header.tensors), *r, source)) for r in ranges]
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(f"hashing {source.name} ({source.stat().st_size / 1e9:.2f} GB)")
    artifact = artifact_fingerprint(source)
    record = {"format": RECORD_FORMAT,
              "source": {"file": source.name, "artifact_fingerprint": artifact, "size": source.stat().st_size,
                         "architecture": summary.architecture, "n_layer": summary.n_layer},
              "parts": []}
    for i, ((start, end), names) in enumerate(plans):
        info = PartInfo(artifact, start, end, summary.tied_embeddings, summary.file_type)
        final = out_dir / part_name(source, start, end)
        entry = _write_part(header, summary, info, names, final, lambda m: progress(
            f"part {i + 1}/{len(plans)} [{start}, {end}): {m} ({time.monotonic() - started:.0f} s)"))
        record["parts"].append(entry)
    record_path = out_dir / f"{source.stem}.parts.json"
    _replace_atomically(record_path, lambda f: f.write(json.dumps(record, indent=1).encode() + b"\n"))
    progress(f"wrote {len(plans)} parts and {record_path.name} in {time.monotonic() - started:.0f} s")
    return record


def _write_part(header: GgufHeader, summary: GgufSummary, info: PartInfo, names: list[str], final: Path,
                progress: Progress) -> dict:
    """One part, written under a temporary name, read back and checked, then renamed."""
    keep = set(names)
    tensors = [t for t in header.tensors if t.name in keep]  # the source's order
    total = sum(t.n_bytes for t in tensors)
    source_digests: dict[str, str] = {}
    hasher = hashlib.sha256()

    def write(f: BinaryIO) -> None:
        sink = _HashingWriter(f, hasher)
        sink.write(_part_header(header, info, tensors))
        done, shown = 0, 0.0
        with open(header.path, "rb") as src:
            for t in tensors:
                sink.pad(header.alignment)
                source_digests[t.name] = _copy_tensor(src, sink, t)
                done += t.n_bytes
                if time.monotonic() - shown > PROGRESS_SECONDS or done == total:
                    shown = time.monotonic()
                    progress(f"copied {done / 1e6:.0f} of {total / 1e6:.0f} MB")
        progress("checking what was written")

    size = _replace_atomically(final, write, check=lambda path: _check_part(path, summary, source_digests, info))
    return {"file": final.name, "layers": [info.layer_start, info.layer_end], "sha256": "sha256:" + hasher.hexdigest(),
            "size": size, "range_fingerprint": combine_digests(source_digests), "tensors": names}


def _part_header(header: GgufHeader, info: PartInfo, tensors: list[TensorInfo]) -> bytes:
    """Magic, version, counts, the source's metadata bytes as they are, the part's pairs, and the
    kept tensors' infos with offsets laid out afresh at the source's alignment."""
    order = header.byte_order
    with open(header.path, "rb") as f:
        f.seek(4 + 4 + 8 + 8)
        metadata = f.read(header.metadata_end - f.tell())
    out = bytearray(b"GGUF")
    out += struct.pack(order + "IQQ", header.version, len(tensors), len(header.metadata) + len(KEYS))
    out += metadata
    for key, value in info.values().items():
        out += _string(key, order) + struct.pack(order + "I", KEYS[key])
        if KEYS[key] == GGUFValueType.STRING:
            out += _string(value, order)
        else:
            out += struct.pack(order + {GGUFValueType.UINT32: "I", GGUFValueType.BOOL: "?"}[KEYS[key]], value)
    offset = 0
    for t in tensors:
        offset = _align(offset, header.alignment)
        out += _string(t.name, order) + struct.pack(f"{order}I{len(t.shape)}QIQ", len(t.shape), *t.shape,
                                                    int(t.ggml_type), offset)
        offset += t.n_bytes
    return bytes(out)


def _copy_tensor(src: BinaryIO, sink: "_HashingWriter", t: TensorInfo) -> str:
    """Copies `t`'s bytes from the source; returns its digest as `fingerprint` defines it."""
    line = json.dumps([t.name, t.ggml_type.name, list(t.shape), t.n_bytes], separators=(",", ":"))
    digest = hashlib.sha256(line.encode("utf-8") + b"\n")
    src.seek(t.data_offset)
    left = t.n_bytes
    while left:
        chunk = src.read(min(left, COPY_CHUNK))
        if not chunk:
            raise ValueError(f"{src.name}: tensor {t.name} runs past the end of the file")
        digest.update(chunk)
        sink.write(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def _check_part(path: Path, summary: GgufSummary, source_digests: dict[str, str], info: PartInfo) -> None:
    """The written part, read back: its record, its summary and every tensor digest are the source's."""
    written = read_header(path)
    if part_info(written) != info:
        raise ValueError(f"{path}: the part's record reads back as {part_info(written)}, not {info}")
    if gguf_summary(path) != summary:
        raise ValueError(f"{path}: summary {gguf_summary(path)} differs from the source's {summary}")
    digests = file_tensor_digests(path)
    if digests != source_digests:
        differ = sorted(n for n in set(digests) | set(source_digests) if digests.get(n) != source_digests.get(n))
        raise ValueError(f"{path}: tensors differ from the source's after writing: {differ[:8]}")


class _HashingWriter:
    """Writes to `f`, hashing every byte and counting the offset (for alignment padding)."""

    def __init__(self, f: BinaryIO, hasher) -> None:
        self.f, self.hasher, self.offset = f, hasher, 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.hasher.update(data)
        self.offset += len(data)

    def pad(self, alignment: int) -> None:
        self.write(b"\0" * (_align(self.offset, alignment) - self.offset))


def _replace_atomically(final: Path, write: Callable[[BinaryIO], None],
                        check: Optional[Callable[[Path], None]] = None) -> int:
    """Writes `final` through a temporary file in its directory (fsynced, checked, then renamed);
    returns its size. On any failure the temporary file is removed and `final` is untouched."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, final)
        return size
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _string(value: str, order: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack(order + "Q", len(data)) + data


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the whole model file to cut")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--ranges", help="layer ranges START:END[,START:END...], one part each (they may overlap, "
                                      "for replicas)")
    how.add_argument("--nodes", type=int, help="cut into this many contiguous ranges of near-equal size")
    parser.add_argument("--out", type=Path, required=True, help="directory for the parts and their record")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        parser.error(f"no GGUF file at {args.gguf}")
    try:
        ranges = parse_ranges(args.ranges) if args.ranges else even_cuts(gguf_summary(args.gguf).n_layer, args.nodes)
        record = cut(args.gguf.resolve(), ranges, args.out.resolve(), progress=lambda m: print(m, file=sys.stderr))
    except ValueError as err:
        parser.error(str(err))
    for part in record["parts"]:
        print(f"{part['layers'][0]:>4}:{part['layers'][1]:<4} {part['size'] / 1e6:10.1f} MB  {args.out / part['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
