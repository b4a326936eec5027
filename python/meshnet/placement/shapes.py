"""Model shapes of dense Llama-style GGUFs at Q4_0, computed from their architecture, for the
simulator and tests (the tracker builds ModelShapes from the GGUF headers it certifies).

Q4_0 stores 32 weights in 18 bytes, Q6_K 256 in 210; norms are F32. K and V caches are F16 (the
nodes' default KV type); the hidden state crosses a hop as F32 (an assumption: the project's
default activation encoding on the wire).
"""

from __future__ import annotations

from meshnet.placement.fleet import ModelShape

Q4_0 = 18 / 32  # bytes per weight
Q6_K = 210 / 256
F32 = 4
F16 = 2


def dense_llama(name: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int,
                tied: bool, embedding_bytes_per_weight: float = Q4_0) -> ModelShape:
    """A dense Llama of that shape, layers at Q4_0. Tied embeddings are the head as well: the
    last stage holds a copy."""
    kv_width = n_embd // n_head * n_head_kv
    weights = 2 * n_embd * n_embd + 2 * kv_width * n_embd + 3 * n_embd * n_ff
    layer = round(weights * Q4_0) + 2 * n_embd * F32  # attention and FFN, plus two norms
    embedding = round(n_vocab * n_embd * embedding_bytes_per_weight)
    head = n_embd * F32 + (embedding if tied else round(n_vocab * n_embd * Q4_0))
    return ModelShape(name, (layer,) * n_layer, (2 * kv_width * F16,) * n_layer, n_embd * F32, embedding, head)


# tools/synthetic_model.py's llama-1.1b (issue 16): 22 layers of width 2048, FFN 5632, 32 query
# and 4 KV heads, SmolLM2's 49152-token vocabulary, tied embeddings; llama-quantize Q4_0 keeps
# the tied embeddings at Q6_K (so the file is 601 MiB, docs/evidence/big-model).
SYNTHETIC_1_07B = dense_llama("synthetic-1.07b", 22, 2048, 5632, 32, 4, 49152, tied=True,
                              embedding_bytes_per_weight=Q6_K)
# Llama-3-8B's shape (tools/synthetic_big_model.py's, with Llama 3's own 128256-token vocabulary).
LLAMA_3_8B = dense_llama("llama-3-8b", 32, 4096, 14336, 32, 8, 128256, tied=False)
# Llama-3-70B's shape: 80 layers of width 8192, FFN 28672, 64 query and 8 KV heads.
LLAMA_3_70B = dense_llama("llama-3-70b", 80, 8192, 28672, 64, 8, 128256, tied=False)


def renamed(shape: ModelShape, name: str) -> ModelShape:
    """The same shape under another name (the simulator's many models)."""
    return ModelShape(name, shape.layer_bytes, shape.kv_bytes_per_token, shape.activation_bytes,
                      shape.embedding_bytes, shape.output_bytes)
