"""Native tensors of a bundle, and zero-copy bridges to numpy and torch.

A `Tensor` holds little-endian, row-major bytes plus name, dtype and shape. Conversions avoid
copies where the memory layout allows (contiguous little-endian arrays, CPU torch tensors);
f32 -> bf16 rounds to nearest even, like torch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Union

import numpy as np

from meshnet.wire.seam import DType

if TYPE_CHECKING:
    import torch

Buffer = Union[bytes, bytearray, memoryview]

_NUMPY_DTYPES = {DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"), DType.BF16: np.dtype("<u2")}


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    data: Buffer  # little-endian, row-major; len == product(shape) * itemsize

    def __post_init__(self) -> None:
        if self.dtype not in _NUMPY_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        expected = math.prod(self.shape) * self.dtype.itemsize
        if memoryview(self.data).nbytes != expected:
            raise ValueError(f"tensor {self.name!r}: {memoryview(self.data).nbytes} bytes for shape {self.shape} {self.dtype.name}")

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Rounds float32 values to bfloat16 (nearest even), returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def from_numpy(name: str, array: np.ndarray, dtype: DType | None = None) -> Tensor:
    """Wraps a float32/float16 array (no copy when contiguous little-endian); `dtype` converts."""
    array = np.asarray(array)
    if dtype is None:
        dtype = {np.dtype("float32"): DType.F32, np.dtype("float16"): DType.F16}.get(array.dtype.newbyteorder("="))
        if dtype is None:
            raise ValueError(f"no wire dtype for numpy {array.dtype}; pass dtype=")
    if dtype == DType.BF16:
        data = f32_to_bf16_bits(array.astype(np.float32, copy=False))
    else:
        data = np.ascontiguousarray(array, dtype=_NUMPY_DTYPES[dtype])
    return Tensor(name, dtype, tuple(int(d) for d in array.shape), memoryview(data).cast("B"))


def to_numpy(tensor: Tensor) -> np.ndarray:
    """F32/F16 as a read-only view of the tensor's bytes; BF16 widened to float32."""
    raw = np.frombuffer(tensor.data, dtype=_NUMPY_DTYPES[tensor.dtype]).reshape(tensor.shape)
    return bf16_bits_to_f32(raw).reshape(tensor.shape) if tensor.dtype == DType.BF16 else raw


def from_torch(name: str, value: "torch.Tensor") -> Tensor:
    """Wraps a CPU float32/float16/bfloat16 tensor; no copy when it is already contiguous."""
    import torch

    dtypes = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}
    if value.dtype not in dtypes:
        raise ValueError(f"no wire dtype for torch {value.dtype}")
    flat = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return Tensor(name, dtypes[value.dtype], tuple(value.shape), memoryview(flat.numpy()))


def to_torch(tensor: Tensor) -> "torch.Tensor":
    """A torch tensor over the bundle's bytes (no copy; read-only memory is copied once)."""
    import torch

    dtypes = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    buf = tensor.data if not memoryview(tensor.data).readonly else bytearray(tensor.data)
    return torch.frombuffer(buf, dtype=dtypes[tensor.dtype]).reshape(tensor.shape)
