"""Bundle codec: round trips for every dtype and size, fragment limits, and every error class."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch

from meshnet.protocol import bundle, tensors
from meshnet.protocol.errors import ProtocolError
from meshnet.wire.seam import ByteOrder, Compression, DType
from meshnet.wire.status import StatusCode

SHAPES = [(1, 576), (7, 576), (128, 2048), (4096, 8192)]
RNG = np.random.default_rng(1234)


def _values(shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def _reassemble(fragments, limits=bundle.DEFAULT_LIMITS):
    r = bundle.Reassembler(limits)
    out = None
    for i, f in enumerate(fragments):
        out = r.add(f)
        assert (out is None) == (i < len(fragments) - 1)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16], ids=lambda d: d.name)
def test_round_trip_every_dtype_and_size(dtype, shape):
    values = _values(shape)
    source = values.astype(np.float16) if dtype == DType.F16 else values
    tensor = tensors.from_numpy("hidden_states", source, dtype)
    fragments = bundle.encode_bundle([tensor], bundle_id=7)
    limit = bundle.DEFAULT_LIMITS.max_fragment_bytes
    assert all(len(f.data) <= limit for f in fragments)
    assert len(fragments) == max(1, -(-tensor.nbytes // limit))
    assert fragments[0].header is not None and all(f.header is None for f in fragments[1:])
    (back,) = _reassemble(fragments)
    assert (back.name, back.dtype, back.shape) == ("hidden_states", dtype, shape)
    assert bytes(back.data) == bytes(tensor.data)
    if dtype != DType.BF16:
        np.testing.assert_array_equal(tensors.to_numpy(back), source)


def test_several_tensors_small_fragments_and_zlib():
    parts = [tensors.from_numpy("a", _values((3, 5))), tensors.from_numpy("b", _values((2, 2, 2)).astype(np.float16)),
             tensors.from_numpy("c", np.zeros((64, 64), np.float32), DType.BF16)]
    for compression in (Compression.NONE, Compression.ZLIB):
        fragments = bundle.encode_bundle(parts, 3, compression=compression, fragment_bytes=100)
        assert all(len(f.data) <= 100 for f in fragments)
        back = _reassemble(fragments)
        assert [bytes(t.data) for t in back] == [bytes(t.data) for t in parts]
        assert [t.shape for t in back] == [(3, 5), (2, 2, 2), (64, 64)]


def test_zlib_shrinks_a_compressible_bundle():
    t = tensors.from_numpy("zeros", np.zeros((128, 576), np.float32))
    (fragment,) = bundle.encode_bundle([t], 1, compression=Compression.ZLIB)
    assert fragment.header.wire_bytes < fragment.header.payload_bytes // 50


def test_bf16_rounding_matches_torch():
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.00390625, 1.01171875], np.float32)
    values = np.concatenate([special, _values((4096,))])
    ours = tensors.f32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    assert tensors.f32_to_bf16_bits(np.array([np.nan], np.float32))[0] == 0x7FC0


def test_torch_bridge_shares_memory():
    value = torch.randn(4, 576, dtype=torch.bfloat16)
    t = tensors.from_torch("h", value)
    assert np.frombuffer(t.data, np.uint8).ctypes.data == value.data_ptr()
    (back,) = _reassemble(bundle.encode_bundle([t], 1))
    assert torch.equal(tensors.to_torch(back), value)


def test_big_endian_tensors_are_swapped():
    values = _values((3, 4))
    big = values.astype(">f4").tobytes()
    spec = bundle.TensorSpec("h", DType.F32, (3, 4), ByteOrder.BIG, 0, len(big), zlib.crc32(big))
    header = bundle.BundleHeader((spec,), Compression.NONE, len(big), len(big))
    (back,) = _reassemble([bundle.TensorFragment(1, 0, 1, header, big)])
    np.testing.assert_array_equal(tensors.to_numpy(back), values)


# ---- errors ---------------------------------------------------------------------------------

def _one(shape=(4, 8), **kw):
    return bundle.encode_bundle([tensors.from_numpy("h", _values(shape))], 9, **kw)


def _fails(fragments, code, match, limits=bundle.DEFAULT_LIMITS, finish=False):
    r = bundle.Reassembler(limits)
    with pytest.raises(ProtocolError, match=match) as err:
        for f in fragments:
            r.add(f)
        if finish:
            r.finish()
    assert err.value.code == code
    assert not r.in_progress


def _with_spec(fragment, **changes):
    header = fragment.header
    spec = dataclasses.replace(header.tensors[0], **changes)
    return dataclasses.replace(fragment, header=dataclasses.replace(header, tensors=(spec,) + header.tensors[1:]))


def test_truncated_fragment():
    f0, f1 = _one(fragment_bytes=64)[:2]
    _fails([f0, dataclasses.replace(f1, data=f1.data[:-1])], StatusCode.INVALID_ARGUMENT, "truncated")


def test_shape_byte_count_mismatch():
    (f,) = _one()
    _fails([_with_spec(f, shape=(4, 9))], StatusCode.INVALID_ARGUMENT, "bytes for shape")


def test_unknown_dtype():
    (f,) = _one()
    _fails([_with_spec(f, dtype=9)], StatusCode.INVALID_ARGUMENT, "unknown dtype")


def test_checksum_mismatch():
    (f,) = _one()
    data = bytearray(f.data)
    data[5] ^= 0x10
    _fails([dataclasses.replace(f, data=bytes(data))], StatusCode.CHECKSUM_MISMATCH, "CRC-32")


def test_oversized_bundle():
    (f,) = _one()
    limits = bundle.Limits(max_bundle_bytes=64)
    _fails([f], StatusCode.RESOURCE_EXHAUSTED, "exceeds", limits=limits)
    with pytest.raises(ProtocolError) as err:
        _one(limits=limits)
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED


def test_too_many_tensors_and_rank():
    many = [tensors.from_numpy(f"t{i}", np.ones(1, np.float32)) for i in range(17)]
    with pytest.raises(ProtocolError) as err:
        bundle.encode_bundle(many, 1)
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED
    (f,) = _one()
    _fails([_with_spec(f, shape=(1, 1, 1, 4, 8), length=128)], StatusCode.INVALID_ARGUMENT, "rank")


def test_missing_fragments():
    fragments = _one(fragment_bytes=32)
    _fails(fragments[:-1], StatusCode.INVALID_ARGUMENT, "missing fragments", finish=True)
    other = _one(fragment_bytes=32)
    other = [dataclasses.replace(f, bundle_id=10) for f in other]
    _fails(fragments[:2] + other[:1], StatusCode.INVALID_ARGUMENT, "missing fragments")


def test_duplicate_fragment():
    f0, f1 = _one(fragment_bytes=32)[:2]
    _fails([f0, f1, f1], StatusCode.INVALID_ARGUMENT, "duplicate")


def test_fragment_order_and_header_rules():
    f0, f1 = _one(fragment_bytes=32)[:2]
    _fails([f1], StatusCode.INVALID_ARGUMENT, "fragment 0 must come first")
    _fails([f0, dataclasses.replace(f1, header=f0.header)], StatusCode.INVALID_ARGUMENT, "second header")
    _fails([f0, dataclasses.replace(f1, index=f0.count)], StatusCode.INVALID_ARGUMENT, "outside")
    _fails([f0, dataclasses.replace(f1, count=f0.count + 1)], StatusCode.INVALID_ARGUMENT, "says count")
    _fails([dataclasses.replace(f0, count=10_000)], StatusCode.RESOURCE_EXHAUSTED, "fragments exceeds")


def test_corrupt_compressed_payload():
    (f,) = _one(compression=Compression.ZLIB)
    _fails([dataclasses.replace(f, data=f.data[:-4] + b"\0\0\0\0")], StatusCode.INVALID_ARGUMENT, "compressed")


def test_reassembler_recovers_after_an_error():
    good = _one()
    r = bundle.Reassembler()
    with pytest.raises(ProtocolError):
        r.add(_with_spec(good[0], dtype=9))
    assert r.add(good[0]) is not None
