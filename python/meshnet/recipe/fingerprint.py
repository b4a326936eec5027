"""Fingerprints of GGUF artifacts: whole-file, per-layer-range, and a metadata summary.

Called by a node before it registers (to declare what it serves) and by the tracker's
certification tooling (to record what a certified recipe was measured on). Invariants: a
fingerprint is a pure function of bytes (whole file, or the canonical stream of the tensors a
range owns), so two nodes agree on it without talking; the on-disk cache only ever saves work
and is never trusted past a change of path, size or mtime.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from meshnet.recipe.gguf_header import GgufArray, GgufHeader, LlamaFileType, read_header
from meshnet.recipe.range_part import part_info

PathLike = Union[str, os.PathLike]

CHUNK_BYTES = 8 << 20  # streaming read size for whole-file hashing
CACHE_ENV = "MESHNET_FINGERPRINT_CACHE"
CACHE_VERSION = 1  # bump when the cache layout or the hash definition changes
RANGE_STREAM_MAGIC = b"meshnet-range-fingerprint-v2\n"  # prefixes the range stream
DEFAULT_ROPE_FREQ_BASE = 10000.0  # llama.cpp's default when {arch}.rope.freq_base is absent
GUESSED_FILE_TYPE_FLAG = 1024  # LLAMA_FTYPE_GUESSED, or-ed into general.file_type

# Top-level (non-blk) tensors and who owns them; any other top-level tensor is refused by
# range_fingerprint, so a fingerprint never silently skips weights a node would load.
ROPE_FREQS = "rope_freqs.weight"  # every shard
TOKEN_EMBD = "token_embd.weight"  # first shard; also the last one when embeddings are tied
OUTPUT_NORM = "output_norm.weight"  # last shard
OUTPUT = "output.weight"  # last shard (absent when tied)
_TOP_LEVEL = (ROPE_FREQS, TOKEN_EMBD, OUTPUT_NORM, OUTPUT)

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Whole-file fingerprint with a stat-keyed cache.


def artifact_fingerprint(path: PathLike, cache_path: Optional[PathLike] = None) -> str:
    """Returns "sha256:<hex>" of the whole file at `path`.

    Served from the JSON cache when (realpath, size, mtime_ns) match an entry; otherwise the
    file is hashed and the entry rewritten atomically. A file whose stat changes while it is
    hashed is hashed correctly for the bytes read but not cached.
    """
    real = os.path.realpath(path)
    cache_file = Path(cache_path) if cache_path is not None else _default_cache_path()
    before = os.stat(real)
    entries = _load_cache(cache_file)
    hit = entries.get(real)
    stamp = {"size": before.st_size, "mtime_ns": before.st_mtime_ns}
    if isinstance(hit, dict) and {k: hit.get(k) for k in stamp} == stamp:
        fingerprint = hit.get("fingerprint")
        if isinstance(fingerprint, str) and fingerprint.startswith("sha256:"):
            return fingerprint
    fingerprint = "sha256:" + _sha256_file(real)
    after = os.stat(real)
    if {"size": after.st_size, "mtime_ns": after.st_mtime_ns} == stamp:
        entries[real] = {**stamp, "fingerprint": fingerprint}
        _store_cache(cache_file, entries)
    return fingerprint


def declared_artifact_fingerprint(path: PathLike, layer_start: int, layer_end: int) -> str:
    """The artifact fingerprint a node serving [layer_start, layer_end) from `path` declares.

    For a whole file, its own sha256 (`artifact_fingerprint`). For a per-range part
    (`range_part`), the sha256 of the file it was cut from, which the tracker's certified entry
    names; ValueError when the part does not hold the range. The tracker still checks the range
    fingerprint, computed from the part's own tensor bytes, so a part that lies about its source
    is refused there.
    """
    part = part_info(_open_reader(path))
    if part is None:
        return artifact_fingerprint(path)
    if not part.holds(layer_start, layer_end):
        raise ValueError(f"{path} is a part holding layers [{part.layer_start}, {part.layer_end}) only; "
                         f"layers [{layer_start}, {layer_end}) need another part or the whole file")
    return part.source_artifact


def _default_cache_path() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "meshnet" / "fingerprints.json"


def _sha256_file(path: str) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()


def _load_cache(cache_file: Path) -> dict[str, Any]:
    """The cache's entries, or {} when it is missing, corrupt or of another version."""
    try:
        document = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict) or document.get("version") != CACHE_VERSION:
        return {}
    entries = document.get("entries")
    return entries if isinstance(entries, dict) else {}


def _store_cache(cache_file: Path, entries: dict[str, Any]) -> None:
    """Writes the cache atomically (temp file in the same directory, then os.replace).

    Concurrent writers may drop each other's new entries (last one wins); that only costs a
    rehash. A cache that cannot be written is logged and otherwise ignored.
    """
    document = {"version": CACHE_VERSION, "entries": entries}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=cache_file.name + ".", suffix=".tmp", dir=cache_file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(document, f, sort_keys=True, indent=1)
            os.replace(tmp, cache_file)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        _log.warning("fingerprint cache %s not written: %s", cache_file, e)


# ---------------------------------------------------------------------------------------------
# GGUF metadata summary.


@dataclasses.dataclass(frozen=True)
class GgufSummary:
    architecture: str  # general.architecture, e.g. "llama"
    name: str  # general.name ("" when absent)
    n_layer: int  # {arch}.block_count
    n_embd: int  # {arch}.embedding_length
    n_vocab: int  # {arch}.vocab_size, else tokenizer token count, else token_embd rows
    context_length: int  # {arch}.context_length (training context)
    file_type: str  # weight quantization name, e.g. "Q4_1", "F32"
    rope_freq_base: float  # {arch}.rope.freq_base, 10000.0 when absent (as llama.cpp)
    rope_freq_scale: float  # 1 / {arch}.rope.scaling.factor (as llama.cpp), 1.0 when absent
    tied_embeddings: bool  # no output.weight: the head reuses token_embd.weight


def gguf_summary(path: PathLike) -> GgufSummary:
    """Reads the summary of the GGUF at `path`; ValueError if it is not GGUF or lacks keys."""
    return _summarize(_open_reader(path), path)


def _open_reader(path: PathLike) -> GgufHeader:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return read_header(path)
    except ValueError as e:
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _field(reader: GgufHeader, key: str, kind: type, path: PathLike, required: bool = True) -> Any:
    if key not in reader.metadata:
        if required:
            raise ValueError(f"{path}: GGUF lacks required metadata key {key!r}")
        return None
    value = reader.metadata[key]
    if kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        found = "list" if isinstance(value, GgufArray) else type(value).__name__
        raise ValueError(f"{path}: GGUF key {key!r} is {found}, expected {kind.__name__}")
    return value


def _summarize(reader: GgufHeader, path: PathLike) -> GgufSummary:
    arch = _field(reader, "general.architecture", str, path)
    tensors = {t.name: t for t in reader.tensors}
    n_layer = _field(reader, f"{arch}.block_count", int, path)
    n_embd = _field(reader, f"{arch}.embedding_length", int, path)
    context_length = _field(reader, f"{arch}.context_length", int, path)
    if min(n_layer, n_embd, context_length) <= 0:
        raise ValueError(f"{path}: block_count, embedding_length and context_length must be positive")
    freq_base = _field(reader, f"{arch}.rope.freq_base", float, path, required=False)
    scaling = _field(reader, f"{arch}.rope.scaling.factor", float, path, required=False)
    part = part_info(reader)  # a part's summary is its source's: what its tensors alone cannot say, it records
    if part is not None and part.layer_end > n_layer:
        raise ValueError(f"{path}: part layers [{part.layer_start}, {part.layer_end}) exceed {n_layer} layers")
    return GgufSummary(
        architecture=arch,
        name=_field(reader, "general.name", str, path, required=False) or "",
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=_vocab_size(reader, arch, tensors, path),
        context_length=context_length,
        file_type=part.file_type if part else _file_type(reader, tensors, path),
        rope_freq_base=DEFAULT_ROPE_FREQ_BASE if freq_base is None else freq_base,
        rope_freq_scale=1.0 if not scaling else 1.0 / scaling,
        tied_embeddings=part.tied_embeddings if part else OUTPUT not in tensors,
    )


def _vocab_size(reader: GgufHeader, arch: str, tensors: dict, path: PathLike) -> int:
    declared = _field(reader, f"{arch}.vocab_size", int, path, required=False)
    if declared is not None:
        return declared
    tokens = reader.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, GgufArray):
        return tokens.length
    if tokens is not None:
        raise ValueError(f"{path}: GGUF key 'tokenizer.ggml.tokens' is not an array")
    if TOKEN_EMBD in tensors:
        return int(tensors[TOKEN_EMBD].shape[1])
    raise ValueError(f"{path}: GGUF has no vocab size, tokenizer tokens or {TOKEN_EMBD}")


def _file_type(reader: GgufHeader, tensors: dict, path: PathLike) -> str:
    """general.file_type's name without its ALL_/MOSTLY_ prefix; else the commonest blk matrix type.

    The fallback counts only 2-D blk.* weights (norms are F32 in every quantization), ties
    broken by type name so the answer is deterministic.
    """
    declared = _field(reader, "general.file_type", int, path, required=False)
    if declared is not None:
        try:
            name = LlamaFileType(declared & ~GUESSED_FILE_TYPE_FLAG).name
        except ValueError:
            raise ValueError(f"{path}: unknown general.file_type {declared}") from None
        return name.removeprefix("ALL_").removeprefix("MOSTLY_")
    counts = collections.Counter(
        t.ggml_type.name for t in tensors.values() if t.name.startswith("blk.") and len(t.shape) >= 2
    )
    if not counts:
        raise ValueError(f"{path}: GGUF has neither general.file_type nor blk weight matrices")
    return min(counts, key=lambda type_name: (-counts[type_name], type_name))


# ---------------------------------------------------------------------------------------------
# Layer-range fingerprint.


def range_fingerprint(path: PathLike, layer_start: int, layer_end: int) -> str:
    """Returns "sha256:<hex>" of the tensors a node serving [layer_start, layer_end) owns.

    Each owned tensor has a digest: sha256 of a header line `json.dumps([name, ggml_type_name,
    shape, n_bytes])` + "\\n" (shape in ggml ne order, as the file stores it) followed by
    exactly n_bytes raw tensor bytes. The range fingerprint is sha256 of RANGE_STREAM_MAGIC, then
    a line `name\\tdigest_hex\\n` per owned tensor in name order (`combine_digests`), so anyone
    holding the certified per-tensor digests (the tracker) computes any range's fingerprint
    without the file. Ownership is in `owned_tensor_names`; nothing else of the file enters.
    """
    return summarize_range(path, layer_start, layer_end)[1]


def summarize_range(path: PathLike, layer_start: int, layer_end: int) -> tuple[GgufSummary, str]:
    """(gguf_summary, range_fingerprint) from one parse of the file's header, which a node
    starting up asks for together."""
    reader = _open_reader(path)
    summary = _summarize(reader, path)
    names = owned_tensor_names(summary, (t.name for t in reader.tensors), layer_start, layer_end, path)
    return summary, combine_digests(_tensor_digests(reader, path, names))


def tensor_digests(path: PathLike) -> tuple[GgufSummary, dict[str, str]]:
    """(gguf_summary, {tensor name: digest hex}) for every tensor of the file (certification:
    `combine_digests` over a range's owned names then gives that range's fingerprint)."""
    reader = _open_reader(path)
    summary = _summarize(reader, path)
    owned_tensor_names(summary, (t.name for t in reader.tensors), 0, summary.n_layer, path)  # all assignable
    return summary, _tensor_digests(reader, path, sorted(t.name for t in reader.tensors))


def file_tensor_digests(path: PathLike) -> dict[str, str]:
    """{tensor name: digest hex} for every tensor the file holds, whole file or part, with no
    check of which ranges they serve (cut_model compares a written part with its source)."""
    reader = _open_reader(path)
    return _tensor_digests(reader, path, sorted(t.name for t in reader.tensors))


@dataclasses.dataclass(frozen=True)
class _Ownership:
    """What `owned_tensor_names` reads of a summary, when only tensor names are at hand."""

    n_layer: int
    tied_embeddings: bool


def certified_range_fingerprint(digests: dict[str, str], n_layer: int, layer_start: int, layer_end: int) -> str:
    """The fingerprint a node serving [layer_start, layer_end) of the certified model must
    declare, from the certified per-tensor digests (ValueError for a range they cannot serve)."""
    owners = _Ownership(n_layer, OUTPUT not in digests)
    names = owned_tensor_names(owners, digests, layer_start, layer_end, "<certified digests>")  # type: ignore[arg-type]
    return combine_digests({n: digests[n] for n in names})


def combine_digests(digests: dict[str, str]) -> str:
    """The range fingerprint of the tensors in `digests` (name -> digest hex)."""
    hasher = hashlib.sha256(RANGE_STREAM_MAGIC)
    for name in sorted(digests):
        hasher.update(f"{name}\t{digests[name]}\n".encode("utf-8"))
    return "sha256:" + hasher.hexdigest()


def _tensor_digests(reader: GgufHeader, path: PathLike, names: Iterable[str]) -> dict[str, str]:
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    # Tensor bytes are streamed through the page cache, never mapped: a node's control
    # process hashes its range at start-up and must not keep those pages resident.
    with open(path, "rb") as f:
        for name in names:
            t = tensors[name]
            header = [name, t.ggml_type.name, list(t.shape), t.n_bytes]
            hasher = hashlib.sha256(json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n")
            f.seek(t.data_offset)
            left = int(t.n_bytes)
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    raise ValueError(f"{path}: tensor {name} runs past the end of the file")
                hasher.update(chunk)
                left -= len(chunk)
            out[name] = hasher.hexdigest()
    return out


def owned_tensor_names(
    summary: GgufSummary,
    names: Iterable[str],
    layer_start: int,
    layer_end: int,
    path: PathLike = "<gguf>",
) -> list[str]:
    """Sorted names of the tensors a node serving [layer_start, layer_end) loads.

    ValueError for a bad range, a layer without tensors, a missing end-shard tensor, or a
    tensor this module does not know how to assign (an unknown top-level name, or a blk.{i}
    with i outside [0, n_layer)).
    """
    if isinstance(layer_start, bool) or isinstance(layer_end, bool):
        raise ValueError("layer bounds must be integers")
    if not (0 <= layer_start < layer_end <= summary.n_layer):
        raise ValueError(
            f"bad layer range [{layer_start}, {layer_end}) for {summary.n_layer} layers; "
            "need 0 <= start < end <= n_layer"
        )
    names = set(names)
    layers = range(summary.n_layer)
    unknown = sorted(n for n in names if _block_index(n) not in layers and n not in _TOP_LEVEL)
    if unknown:
        raise ValueError(f"{path}: tensors with no range owner: {unknown}")
    owned = {n for n in names if _block_index(n) in range(layer_start, layer_end)}
    for i in range(layer_start, layer_end):
        if not any(_block_index(n) == i for n in owned):
            raise ValueError(f"{path}: layer {i} has no tensors")
    required = []
    if layer_start == 0:
        required.append(TOKEN_EMBD)
    if layer_end == summary.n_layer:
        required += [OUTPUT_NORM, TOKEN_EMBD if summary.tied_embeddings else OUTPUT]
    missing = sorted(set(required) - names)
    if missing:
        raise ValueError(f"{path}: GGUF lacks {missing} needed by layers [{layer_start}, {layer_end})")
    owned.update(required)
    if ROPE_FREQS in names:
        owned.add(ROPE_FREQS)
    return sorted(owned)


def _block_index(name: str) -> Optional[int]:
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None
