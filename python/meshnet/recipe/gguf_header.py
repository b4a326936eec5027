"""A lean reader of a GGUF file's header: version, metadata and tensor infos, never the data.

Called by `fingerprint` (summaries and range fingerprints at node start-up) in place of
gguf.GGUFReader, which maps the whole file and turns every metadata array element (the
tokenizer's ~50k strings) into numpy objects. Here the header is read with `struct` from a
buffered file; metadata arrays are only walked past, and come back as `GgufArray` (element
type and length) until `GgufHeader.array_values` reads one.

Invariant: a malformed or hostile file raises ValueError before anything is allocated from
a count or length it declares: every string, array, key count, tensor count and tensor
extent is checked against the bytes the file actually has.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import struct
import sys
from typing import Any, BinaryIO, Union


def _gguf_constants():
    """The gguf package's `constants` module (the format's enums and block sizes) without the
    package's __init__, which imports numpy, yaml and every writer: a node's control process
    reads headers and must stay small (issue 14: no numpy or GGUF reader in steady state).
    constants.py imports only the standard library; when gguf is already imported, its own
    module is used."""
    if "gguf.constants" in sys.modules:
        return sys.modules["gguf.constants"]
    name = "meshnet_gguf_constants"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("gguf")  # finds, does not import
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    path = os.path.join(list(package.submodule_search_locations)[0], "constants.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_constants = _gguf_constants()
GGML_QUANT_SIZES = _constants.GGML_QUANT_SIZES
GGUF_DEFAULT_ALIGNMENT = _constants.GGUF_DEFAULT_ALIGNMENT
GGMLQuantizationType = _constants.GGMLQuantizationType
GGUFValueType = _constants.GGUFValueType
LlamaFileType = _constants.LlamaFileType

PathLike = Union[str, os.PathLike]

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses tensors with more
MAX_ARRAY_NESTING = 8  # arrays of arrays deeper than this are refused, not recursed into
ALIGNMENT_KEY = "general.alignment"
_READ_BUFFER = 1 << 16

# struct format of each fixed-size value type (byte order prefixed when read).
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
    GGUFValueType.BOOL: "?",
}
# Fewest bytes one element of each type occupies (a string: its length; an array: type + count).
_MIN_ELEMENT_BYTES = {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}
_MIN_ELEMENT_BYTES[GGUFValueType.STRING] = 8
_MIN_ELEMENT_BYTES[GGUFValueType.ARRAY] = 12
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, ggml type, offset


@dataclasses.dataclass(frozen=True)
class GgufArray:
    """A metadata array left unread: `GgufHeader.array_values` reads it when asked."""

    element_type: GGUFValueType
    length: int  # number of elements (of the outer array, for arrays of arrays)
    offset: int  # file offset of the first element


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # dims in ggml ne order (ne[0] first, as stored)
    ggml_type: GGMLQuantizationType
    offset: int  # relative to the data section, as stored
    data_offset: int  # absolute file offset of the tensor's first byte
    n_elements: int
    n_bytes: int


@dataclasses.dataclass(frozen=True)
class GgufHeader:
    path: str
    version: int
    byte_order: str  # struct prefix: "<" little-endian, ">" big-endian
    metadata: dict[str, Any]  # key -> int | float | bool | str | GgufArray, in file order
    tensors: tuple[TensorInfo, ...]  # in file order; names are unique
    alignment: int  # general.alignment, else 32
    data_start: int  # absolute offset of the (aligned) tensor data section
    metadata_end: int  # absolute offset just past the last metadata pair (the tensor infos follow)

    def array_values(self, key: str) -> list:
        """The elements of the metadata array `key`, read from the file now (nested arrays
        as nested lists). KeyError when absent; ValueError when `key` is not an array."""
        value = self.metadata[key]
        if not isinstance(value, GgufArray):
            raise ValueError(f"{self.path}: GGUF key {key!r} is not an array")
        with open(self.path, "rb", buffering=_READ_BUFFER) as f:
            reader = _Reader(f, os.fstat(f.fileno()).st_size, self.path, self.byte_order)
            f.seek(value.offset)
            return reader.array_elements(value.element_type, value.length, depth=1)


def read_header(path: PathLike) -> GgufHeader:
    """Parses the header of the GGUF at `path`; ValueError if it is not a well-formed GGUF."""
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(4) != MAGIC:
            raise ValueError(f"{path}: GGUF magic invalid")
        reader = _Reader(f, size, str(path), "<")
        (version,) = reader.unpack("I")
        if version & 0xFFFF == 0:  # written for the other byte order (as GGUFReader detects it)
            reader.byte_order = ">"
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        tensor_count, kv_count = reader.unpack("QQ")
        reader.check_count(kv_count, _MIN_KV_BYTES, "metadata key count")
        metadata: dict[str, Any] = {}
        alignment_type = None
        for _ in range(kv_count):
            key = reader.string()
            if key in metadata:
                raise ValueError(f"{path}: duplicate GGUF metadata key {key!r}")
            (raw_type,) = reader.unpack("I")
            value_type = _value_type(raw_type, path)
            alignment_type = value_type if key == ALIGNMENT_KEY else alignment_type
            metadata[key] = reader.value(value_type, depth=0)
        metadata_end = f.tell()
        reader.check_count(tensor_count, _MIN_TENSOR_INFO_BYTES, "tensor count")
        raw_tensors = [reader.tensor_info() for _ in range(tensor_count)]
        alignment = _alignment(metadata.get(ALIGNMENT_KEY), alignment_type, path)
        data_start = -(-f.tell() // alignment) * alignment
    tensors = tuple(_tensor(raw, data_start, size, path) for raw in raw_tensors)
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError(f"{path}: GGUF has duplicated tensor names")
    return GgufHeader(str(path), version, reader.byte_order, metadata, tensors, alignment, data_start, metadata_end)


class _Reader:
    """Bounded struct reads from a buffered file; every length is checked before reading."""

    def __init__(self, f: BinaryIO, size: int, path: str, byte_order: str):
        self.f, self.size, self.path, self.byte_order = f, size, path, byte_order

    def remaining(self) -> int:
        return self.size - self.f.tell()

    def read(self, n: int) -> bytes:
        if n > self.remaining():
            raise ValueError(f"{self.path}: GGUF header truncated (needs {n} bytes at offset {self.f.tell()})")
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError(f"{self.path}: GGUF file shrank while its header was read")
        return data

    def unpack(self, fmt: str) -> tuple:
        fmt = self.byte_order + fmt
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))

    def check_count(self, count: int, min_bytes: int, what: str) -> None:
        if count * min_bytes > self.remaining():
            raise ValueError(f"{self.path}: GGUF {what} {count} exceeds what the file can hold")

    def string(self) -> str:
        (length,) = self.unpack("Q")
        try:
            return self.read(length).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: GGUF string at offset {self.f.tell() - length} is not UTF-8") from e

    def value(self, value_type: GGUFValueType, depth: int) -> Any:
        """One value; an array is skipped over and returned as a GgufArray."""
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type != GGUFValueType.ARRAY:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        element_type, length = self.array_header(depth)
        array = GgufArray(element_type, length, self.f.tell())
        self.skip_elements(element_type, length, depth + 1)
        return array

    def array_header(self, depth: int) -> tuple[GGUFValueType, int]:
        if depth >= MAX_ARRAY_NESTING:
            raise ValueError(f"{self.path}: GGUF arrays nested deeper than {MAX_ARRAY_NESTING}")
        raw_type, length = self.unpack("IQ")
        element_type = _value_type(raw_type, self.path)
        self.check_count(length, _MIN_ELEMENT_BYTES[element_type], "array length")
        return element_type, length

    def skip_elements(self, element_type: GGUFValueType, length: int, depth: int) -> None:
        if element_type in _SCALAR_FORMATS:
            self.f.seek(length * _MIN_ELEMENT_BYTES[element_type], os.SEEK_CUR)  # bounded above
        elif element_type == GGUFValueType.STRING:
            length_format = struct.Struct(self.byte_order + "Q")
            for _ in range(length):
                (n,) = length_format.unpack(self.read(8))
                if n > self.remaining():
                    raise ValueError(f"{self.path}: GGUF string length {n} runs past the end of the file")
                self.f.seek(n, os.SEEK_CUR)
        else:
            for _ in range(length):
                self.skip_elements(*self.array_header(depth), depth + 1)

    def array_elements(self, element_type: GGUFValueType, length: int, depth: int) -> list:
        if element_type in _SCALAR_FORMATS:
            fmt = f"{self.byte_order}{length}{_SCALAR_FORMATS[element_type]}"
            return list(struct.unpack(fmt, self.read(length * _MIN_ELEMENT_BYTES[element_type])))
        if element_type == GGUFValueType.STRING:
            return [self.string() for _ in range(length)]
        return [self.array_elements(*self.array_header(depth), depth + 1) for _ in range(length)]

    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string()
        (n_dims,) = self.unpack("I")
        if n_dims > MAX_DIMS:
            raise ValueError(f"{self.path}: tensor {name!r} has {n_dims} dims (at most {MAX_DIMS})")
        shape = self.unpack(f"{n_dims}Q")
        raw_type, offset = self.unpack("IQ")
        return name, shape, raw_type, offset


def _value_type(raw: int, path: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ValueError(f"{path}: unknown GGUF value type {raw}") from None


def _alignment(alignment: Any, value_type: Any, path: str) -> int:
    """general.alignment: a uint32 power of two (as GGUFReader and llama.cpp require), else 32."""
    if value_type is None:
        return GGUF_DEFAULT_ALIGNMENT
    if value_type != GGUFValueType.UINT32:
        raise ValueError(f"{path}: {ALIGNMENT_KEY} must be a uint32, not {value_type.name}")
    if alignment == 0 or alignment & (alignment - 1):
        raise ValueError(f"{path}: {ALIGNMENT_KEY} must be a non-zero power of two, not {alignment}")
    return alignment


def _tensor(raw: tuple[str, tuple[int, ...], int, int], data_start: int, size: int, path: str) -> TensorInfo:
    name, shape, raw_type, offset = raw
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise ValueError(f"{path}: tensor {name!r} has unknown ggml type {raw_type}") from None
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if block_size > 1 and (not shape or shape[0] % block_size):
        raise ValueError(f"{path}: tensor {name!r} shape {list(shape)} is not in blocks of {block_size}")
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    n_bytes = n_elements * type_size // block_size
    data_offset = data_start + offset
    if data_offset + n_bytes > size:
        raise ValueError(f"{path}: tensor {name!r} runs past the end of the file")
    return TensorInfo(name, tuple(shape), ggml_type, offset, data_offset, n_elements, n_bytes)
