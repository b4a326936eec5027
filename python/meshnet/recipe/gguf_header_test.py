"""The lean GGUF header reader: agrees with gguf.GGUFReader (the reference) on real files, and
refuses malformed or hostile headers with ValueError without allocating what they declare."""

from __future__ import annotations

import os
import struct
import tracemalloc

import gguf
import numpy as np
import pytest

from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.recipe.gguf_header import GgufArray, read_header

BUNDLED_ENV = "MESHNET_BUNDLED_GGUF"
STRING, ARRAY, UINT32, INT32, FLOAT32 = (gguf.GGUFValueType[n] for n in ("STRING", "ARRAY", "UINT32", "INT32", "FLOAT32"))
HUGE = 1 << 60
ALLOCATION_LIMIT = 1 << 20  # bytes a refused header may make the reader allocate at peak


def _assert_matches_reference(path) -> None:
    """Every header fact read_header gives equals what gguf.GGUFReader reports for `path`."""
    header = read_header(path)
    reference = gguf.GGUFReader(path)
    assert header.data_start == reference.data_offset
    assert header.alignment == reference.alignment
    assert header.version == reference.fields["GGUF.version"].contents()
    assert len(header.tensors) == reference.fields["GGUF.tensor_count"].contents()
    assert len(header.metadata) == reference.fields["GGUF.kv_count"].contents()
    assert list(header.metadata) == [k for k in reference.fields if not k.startswith("GGUF.")]
    for key, value in header.metadata.items():
        field = reference.fields[key]
        if isinstance(value, GgufArray):
            assert value.length == len(field.data)
            assert value.element_type == field.types[-1]
            assert header.array_values(key) == field.contents()
        else:
            assert value == field.contents() and type(value) is type(field.contents()), key
    got = [(t.name, t.ggml_type, list(t.shape), t.n_elements, t.n_bytes, t.data_offset) for t in header.tensors]
    want = [
        (t.name, t.tensor_type, [int(d) for d in t.shape], t.n_elements, t.n_bytes, t.data_offset)
        for t in reference.tensors
    ]
    assert got == want


@pytest.mark.skipif(BUNDLED_ENV not in os.environ, reason=f"{BUNDLED_ENV} not set")
def test_bundled_model_matches_reference():
    path = os.environ[BUNDLED_ENV]
    _assert_matches_reference(path)
    header = read_header(path)
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert (tokens.element_type, tokens.length) == (STRING, 49152)
    assert (len(header.tensors), header.metadata["llama.block_count"]) == (272, 30)


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_fixture_matches_reference(tmp_path, tied):
    _assert_matches_reference(write_tiny_llama(tmp_path / "tiny.gguf", tied=tied))


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_arrays_alignment_and_byte_order_match_reference(tmp_path, endianess):
    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=endianess)
    writer.add_custom_alignment(64)
    writer.add_array("test.ints", [3, -1, 7])
    writer.add_array("test.floats", [0.5, 1.25])
    writer.add_array("test.strings", ["a", "", "héllo"])
    writer.add_bool("test.flag", True)
    writer.add_float32("test.scale", 0.1)
    writer.add_tensor("a.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.add_tensor("b.weight", np.ones((4, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _assert_matches_reference(path)
    header = read_header(path)
    assert (header.alignment, header.data_start % 64) == (64, 0)
    assert header.byte_order == ("<" if endianess == gguf.GGUFEndian.LITTLE else ">")
    assert header.array_values("test.strings") == ["a", "", "héllo"]
    assert (header.metadata["test.ints"].length, header.array_values("test.ints")) == (3, [3, -1, 7])
    assert [t.shape for t in header.tensors] == [(3, 2), (32, 4)]  # ggml ne order
    with pytest.raises(ValueError, match="not an array"):
        header.array_values("test.flag")


# ---- malformed and hostile headers -------------------------------------------------------------


def _str(text: bytes, length=None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


def _kv(key: bytes, value_type: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", value_type) + payload


def _gguf(kvs=(), tensors=(), n_kv=None, n_tensors=None, version=3, tail=b"\0" * 64) -> bytes:
    counts = struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    return b"GGUF" + struct.pack("<I", version) + counts + b"".join(kvs) + b"".join(tensors) + tail


def _tensor(name=b"t", dims=(8,), ggml_type=0, offset=0, n_dims=None) -> bytes:
    n = len(dims) if n_dims is None else n_dims
    return _str(name) + struct.pack(f"<I{len(dims)}QIQ", n, *dims, ggml_type, offset)


def _array(element_type: int, length: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IQ", element_type, length) + payload


def _nested(depth: int) -> bytes:
    return _array(UINT32, 0) if depth == 0 else _array(ARRAY, 1, _nested(depth - 1))


HOSTILE = {
    "empty file": (b"", "magic"),
    "bad magic": (b"GGML" + b"\0" * 40, "magic"),
    "version 1": (_gguf(version=1), "version 1"),
    "version 4": (_gguf(version=4), "version 4"),
    "truncated counts": (b"GGUF\x03\x00\x00\x00\x05", "truncated"),
    "huge kv count": (_gguf(n_kv=HUGE), "metadata key count"),
    "huge tensor count": (_gguf(n_tensors=HUGE), "tensor count"),
    "huge key length": (_gguf([_str(b"k", length=HUGE)], n_kv=1), "truncated"),
    "huge string value": (_gguf([_kv(b"k", STRING, _str(b"v", length=HUGE))]), "truncated"),
    "huge array length": (_gguf([_kv(b"k", ARRAY, _array(UINT32, HUGE))]), "array length"),
    "huge string in array": (_gguf([_kv(b"k", ARRAY, _array(STRING, 2, _str(b"v", length=HUGE)))]), "string length"),
    "deep nesting": (_gguf([_kv(b"k", ARRAY, _nested(100))]), "nested"),
    "unknown value type": (_gguf([_kv(b"k", 99, b"")]), "value type 99"),
    "unknown array type": (_gguf([_kv(b"k", ARRAY, _array(99, 1))]), "value type 99"),
    "duplicate key": (_gguf([_kv(b"k", UINT32, b"\1\0\0\0")] * 2), "duplicate"),
    "bad utf-8 key": (_gguf([_kv(b"\xff", UINT32, b"\1\0\0\0")]), "UTF-8"),
    "alignment not a power of two": (_gguf([_kv(b"general.alignment", UINT32, b"\3\0\0\0")]), "power of two"),
    "alignment of another type": (_gguf([_kv(b"general.alignment", INT32, b"\x20\0\0\0")]), "uint32"),
    "too many dims": (_gguf(tensors=[_tensor(dims=(1,) * 5)]), "dims"),
    "huge n_dims": (_gguf(tensors=[_tensor(dims=(), n_dims=1 << 31)]), "dims"),
    "unknown ggml type": (_gguf(tensors=[_tensor(ggml_type=999)]), "ggml type 999"),
    "partial quant block": (_gguf(tensors=[_tensor(dims=(16,), ggml_type=2)]), "blocks of 32"),
    "tensor past the end": (_gguf(tensors=[_tensor(dims=(HUGE, HUGE))]), "past the end"),
    "tensor offset past the end": (_gguf(tensors=[_tensor(offset=HUGE)]), "past the end"),
    "duplicate tensor name": (_gguf(tensors=[_tensor(), _tensor()]), "duplicated tensor"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_is_refused_without_large_allocation(tmp_path, case):
    content, message = HOSTILE[case]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=message):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT


def test_handcrafted_valid_header_is_read(tmp_path):  # the builders above are sound
    path = tmp_path / "valid.gguf"
    path.write_bytes(_gguf([_kv(b"k", ARRAY, _nested(3)), _kv(b"s", STRING, _str(b"v"))], tensors=[_tensor()]))
    header = read_header(path)
    assert header.array_values("k") == [[[[]]]] and header.metadata["s"] == "v"
    assert [(t.name, t.shape, t.n_bytes) for t in header.tensors] == [("t", (8,), 32)]


def test_every_truncation_of_a_real_header_is_refused(tmp_path):
    whole = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()
    header = read_header(tmp_path / "tiny.gguf")
    last = max(header.tensors, key=lambda t: t.data_offset)
    assert last.data_offset + last.n_bytes == len(whole)
    cut = tmp_path / "cut.gguf"
    for size in [*range(0, header.data_start, 7), header.data_start, len(whole) - 1]:
        cut.write_bytes(whole[:size])
        with pytest.raises(ValueError):
            read_header(cut)
