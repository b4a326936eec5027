"""What a layer range of a GGUF needs in memory: its tensors, and its KV cache per token.

A node sizes its KV budget from these and its device's free memory (ADR 0014); the capped
tests size their memory caps from them. Weight bytes are every tensor the range loads
(fingerprint.owned_tensor_names), the token embeddings of a first range included although
llama.cpp keeps those on the host: an overestimate of the device's share, never an
underestimate. KV bytes are K and V of every layer of the range at the KV element type, as
llama.cpp allocates them (`n_embd_k_gqa` and `n_embd_v_gqa` per layer and cell).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from meshnet.recipe.fingerprint import PathLike, gguf_summary, owned_tensor_names
from meshnet.recipe.gguf_header import GgufArray, read_header

# Bytes per element of each KV type (KV_DTYPES in recipe.py): ggml's block size over its count.
KV_ELEMENT_BYTES = {
    "f32": Fraction(4), "f16": Fraction(2), "bf16": Fraction(2),
    "q8_0": Fraction(34, 32), "q4_0": Fraction(18, 32), "q4_1": Fraction(20, 32),
    "iq4_nl": Fraction(18, 32), "q5_0": Fraction(22, 32), "q5_1": Fraction(24, 32),
}


@dataclasses.dataclass(frozen=True)
class RangeMemory:
    weight_bytes: int  # the tensors the range loads
    kv_bytes_per_token: int  # K and V of one KV cell over the range's layers

    def total(self, kv_tokens: int) -> int:
        """Weights plus a KV cache of `kv_tokens` cells."""
        return self.weight_bytes + kv_tokens * self.kv_bytes_per_token


def range_memory(path: PathLike, layer_start: int, layer_end: int, kv_dtype: str = "f16") -> RangeMemory:
    """The memory of layers [layer_start, layer_end) of the GGUF at `path` (a whole file or a
    per-range part). ValueError for a bad range or an unknown KV type."""
    if kv_dtype not in KV_ELEMENT_BYTES:
        raise ValueError(f"kv_dtype {kv_dtype!r} not in {sorted(KV_ELEMENT_BYTES)}")
    summary = gguf_summary(path)
    header = read_header(path)
    sizes = {t.name: t.n_bytes for t in header.tensors}
    owned = owned_tensor_names(summary, sizes, layer_start, layer_end, path)
    arch = summary.architecture

    def largest(key: str, fallback: int) -> int:  # some architectures give one value per layer
        value = header.metadata.get(f"{arch}.{key}", fallback)
        return max(header.array_values(f"{arch}.{key}")) if isinstance(value, GgufArray) else int(value)

    heads = largest("attention.head_count", 0)
    heads_kv = largest("attention.head_count_kv", heads)
    key_length = largest("attention.key_length", summary.n_embd // heads)
    value_length = largest("attention.value_length", key_length)
    per_layer = (key_length + value_length) * heads_kv * KV_ELEMENT_BYTES[kv_dtype]
    return RangeMemory(sum(sizes[name] for name in owned), math.ceil(per_layer * (layer_end - layer_start)))
