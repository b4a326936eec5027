"""Tensor bundles on the wire: canonical encoding into bounded fragments, and reassembly.

Follows docs/adr/0002-seam-protocol-v1.md exactly (the C++ codec in cpp/protocol/ does too).
`encode_bundle` is pure; a `Reassembler` belongs to one seam stream (not thread-safe) and holds
at most one bundle in progress. Invariant: the reassembler never allocates more than the
declared, limit-checked wire size, and every bad input raises ProtocolError with a Status.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Optional, Sequence

import numpy as np

from meshnet.protocol.errors import ProtocolError, exhausted, invalid
from meshnet.protocol.tensors import Tensor
from meshnet.wire.seam import BundleHeader, ByteOrder, Compression, DType, TensorFragment, TensorSpec
from meshnet.wire.status import StatusCode

ZLIB_LEVEL = 1
_KNOWN_DTYPES = (DType.F32, DType.F16, DType.BF16)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_fragment_bytes: int = 1 << 20  # data bytes in one fragment
    max_bundle_bytes: int = 256 << 20  # uncompressed payload and wire payload
    max_tensors: int = 16
    max_rank: int = 4
    max_name_bytes: int = 128

    @property
    def max_fragments(self) -> int:
        return -(-self.max_bundle_bytes // self.max_fragment_bytes)


DEFAULT_LIMITS = Limits()


def encode_bundle(
    tensors: Sequence[Tensor],
    bundle_id: int,
    *,
    compression: Compression = Compression.NONE,
    fragment_bytes: Optional[int] = None,
    limits: Limits = DEFAULT_LIMITS,
) -> list[TensorFragment]:
    """Encodes `tensors` (in order) as fragments of at most `fragment_bytes` data each."""
    fragment_bytes = limits.max_fragment_bytes if fragment_bytes is None else fragment_bytes
    if not 0 < fragment_bytes <= limits.max_fragment_bytes:
        raise ValueError(f"fragment_bytes {fragment_bytes} outside (0, {limits.max_fragment_bytes}]")
    specs, offset = [], 0
    for t in tensors:
        view = memoryview(t.data).cast("B")
        specs.append(TensorSpec(t.name, t.dtype, tuple(t.shape), ByteOrder.LITTLE, offset, view.nbytes, zlib.crc32(view)))
        offset += view.nbytes
    payload = b"".join(memoryview(t.data).cast("B") for t in tensors)
    if compression == Compression.ZLIB:
        wire = zlib.compress(payload, ZLIB_LEVEL)
    elif compression == Compression.NONE:
        wire = payload
    else:
        raise ValueError(f"unsupported compression {compression!r}")
    header = BundleHeader(tuple(specs), compression, len(payload), len(wire))
    # The encoder refuses what a decoder with the same limits would refuse.
    _validate_header(header, max(1, -(-len(wire) // fragment_bytes)), limits)
    count = max(1, -(-len(wire) // fragment_bytes))
    view = memoryview(wire)
    return [
        TensorFragment(bundle_id, i, count, header if i == 0 else None, bytes(view[i * fragment_bytes:(i + 1) * fragment_bytes]))
        for i in range(count)
    ]


def _validate_header(header: BundleHeader, count: int, limits: Limits) -> None:
    n = len(header.tensors)
    if n == 0:
        raise invalid("bundle has no tensors")
    if n > limits.max_tensors:
        raise exhausted(f"bundle has {n} tensors; the limit is {limits.max_tensors}")
    if header.compression not in (Compression.NONE, Compression.ZLIB):
        raise invalid(f"unknown compression {int(header.compression)}")
    offset = 0
    for spec in header.tensors:
        _validate_spec(spec, offset, limits)
        offset += spec.length
    if header.payload_bytes != offset:
        raise invalid(f"payload_bytes {header.payload_bytes} != sum of tensor lengths {offset}")
    for what, size in (("payload", header.payload_bytes), ("wire payload", header.wire_bytes)):
        if size > limits.max_bundle_bytes:
            raise exhausted(f"bundle {what} of {size} bytes exceeds the limit of {limits.max_bundle_bytes}")
    if header.wire_bytes == 0:
        raise invalid("bundle has an empty wire payload")
    if header.compression == Compression.NONE and header.wire_bytes != header.payload_bytes:
        raise invalid(f"uncompressed bundle: wire_bytes {header.wire_bytes} != payload_bytes {header.payload_bytes}")
    if count > limits.max_fragments:
        raise exhausted(f"bundle of {count} fragments exceeds the limit of {limits.max_fragments}")
    if count * limits.max_fragment_bytes < header.wire_bytes:
        raise invalid(f"{count} fragments cannot carry {header.wire_bytes} bytes within the fragment limit")


def _validate_spec(spec: TensorSpec, offset: int, limits: Limits) -> None:
    name = spec.name.encode("utf-8", "surrogatepass")
    if not 0 < len(name) <= limits.max_name_bytes:
        raise invalid(f"tensor name of {len(name)} bytes (allowed 1..{limits.max_name_bytes})")
    if spec.dtype not in _KNOWN_DTYPES:
        raise invalid(f"tensor {spec.name!r}: unknown dtype {int(spec.dtype)}")
    if spec.byte_order not in (ByteOrder.LITTLE, ByteOrder.BIG):
        raise invalid(f"tensor {spec.name!r}: unknown byte order {int(spec.byte_order)}")
    if not 0 < len(spec.shape) <= limits.max_rank:
        raise invalid(f"tensor {spec.name!r}: rank {len(spec.shape)} (allowed 1..{limits.max_rank})")
    if any(d < 1 for d in spec.shape):
        raise invalid(f"tensor {spec.name!r}: shape {spec.shape} has a dimension < 1")
    elements = 1
    for d in spec.shape:
        elements *= d
        if elements * DType(spec.dtype).itemsize > limits.max_bundle_bytes:
            raise exhausted(f"tensor {spec.name!r}: shape {spec.shape} exceeds the bundle limit")
    if spec.length != elements * DType(spec.dtype).itemsize:
        raise invalid(f"tensor {spec.name!r}: {spec.length} bytes for shape {spec.shape} {DType(spec.dtype).name}")
    if spec.offset != offset:
        raise invalid(f"tensor {spec.name!r}: offset {spec.offset}, expected {offset} (contiguous from 0)")


class Reassembler:
    """Collects one bundle's fragments (any order after fragment 0) and returns its tensors."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self.reset()

    def reset(self) -> None:
        self._bundle_id: Optional[int] = None
        self._header: Optional[BundleHeader] = None
        self._count = 0
        self._slice = 0
        self._seen: set[int] = set()
        self._wire: Optional[bytearray] = None

    @property
    def in_progress(self) -> bool:
        return self._bundle_id is not None

    def add(self, fragment: TensorFragment) -> Optional[list[Tensor]]:
        """Takes one fragment; returns the bundle's tensors once its last fragment arrived."""
        if self._bundle_id is not None and fragment.bundle_id != self._bundle_id:
            bundle, have, count = self._bundle_id, len(self._seen), self._count
            self.reset()
            raise invalid(f"missing fragments: bundle {bundle} had {have} of {count} fragments "
                          f"when bundle {fragment.bundle_id} started")
        try:
            if self._bundle_id is None:
                self._start(fragment)
            self._store(fragment)
        except ProtocolError:
            self.reset()
            raise
        if len(self._seen) < self._count:
            return None
        try:
            return self._complete()
        finally:
            self.reset()

    def finish(self) -> None:
        """Call at the end of a step: an unfinished bundle is an error."""
        if self._bundle_id is not None:
            bundle, have, count = self._bundle_id, len(self._seen), self._count
            self.reset()
            raise invalid(f"missing fragments: bundle {bundle} ended with {have} of {count} fragments")

    def _start(self, fragment: TensorFragment) -> None:
        if fragment.index != 0 or fragment.header is None:
            raise invalid(f"bundle {fragment.bundle_id} starts with fragment {fragment.index} "
                          f"{'without' if fragment.header is None else 'with'} a header; fragment 0 must come first")
        if fragment.count < 1:
            raise invalid(f"bundle {fragment.bundle_id}: fragment count {fragment.count}")
        _validate_header(fragment.header, fragment.count, self._limits)
        self._header = fragment.header
        self._bundle_id = fragment.bundle_id
        self._count = fragment.count
        self._slice = len(fragment.data)
        if self._slice == 0 or fragment.count != -(-fragment.header.wire_bytes // self._slice):
            raise invalid(f"bundle {fragment.bundle_id}: {fragment.count} fragments of {self._slice} bytes do not "
                          f"slice {fragment.header.wire_bytes} wire bytes canonically (truncated or overrun)")
        self._wire = bytearray(fragment.header.wire_bytes)

    def _store(self, fragment: TensorFragment) -> None:
        assert self._header is not None and self._wire is not None
        if fragment.count != self._count:
            raise invalid(f"bundle {self._bundle_id}: fragment {fragment.index} says count {fragment.count}, "
                          f"fragment 0 said {self._count}")
        if not 0 <= fragment.index < self._count:
            raise invalid(f"bundle {self._bundle_id}: fragment index {fragment.index} outside 0..{self._count - 1}")
        if fragment.index in self._seen:
            raise invalid(f"bundle {self._bundle_id}: duplicate fragment {fragment.index}")
        if fragment.index > 0 and fragment.header is not None:
            raise invalid(f"bundle {self._bundle_id}: fragment {fragment.index} carries a second header")
        if len(fragment.data) > self._limits.max_fragment_bytes:
            raise exhausted(f"fragment of {len(fragment.data)} bytes exceeds the limit of {self._limits.max_fragment_bytes}")
        start = fragment.index * self._slice
        last = fragment.index == self._count - 1
        expected = len(self._wire) - start if last else self._slice
        if len(fragment.data) != expected or expected <= 0:
            raise invalid(f"bundle {self._bundle_id}: fragment {fragment.index} has {len(fragment.data)} bytes, "
                          f"expected {max(expected, 0)} (truncated or overrun)")
        self._wire[start:start + expected] = fragment.data
        self._seen.add(fragment.index)

    def _complete(self) -> list[Tensor]:
        header, wire = self._header, self._wire
        assert header is not None and wire is not None
        if header.compression == Compression.ZLIB:
            payload = _inflate(bytes(wire), header.payload_bytes)
        else:
            payload = wire
        view = memoryview(payload)
        out = []
        for spec in header.tensors:
            data = view[spec.offset:spec.offset + spec.length]
            crc = zlib.crc32(data)
            if crc != spec.crc32:
                raise ProtocolError(StatusCode.CHECKSUM_MISMATCH,
                                    f"tensor {spec.name!r}: CRC-32 {crc:#010x}, header says {spec.crc32:#010x}")
            if spec.byte_order == ByteOrder.BIG:
                width = DType(spec.dtype).itemsize
                data = memoryview(np.frombuffer(data, dtype=f">u{width}").astype(f"<u{width}")).cast("B")
            out.append(Tensor(spec.name, DType(spec.dtype), tuple(spec.shape), data))
        return out


def _inflate(wire: bytes, payload_bytes: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(wire, payload_bytes)
    except zlib.error as err:
        raise invalid(f"compressed payload is corrupt: {err}") from err
    if len(payload) != payload_bytes or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise invalid(f"compressed payload inflates to {len(payload)}+ bytes, header says {payload_bytes}")
    return payload
