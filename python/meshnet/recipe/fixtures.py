"""Tiny seeded random-weight Llama GGUF files for tests (DESIGN.md section 7).

Called by tests of fingerprints and recipes, and later by parity tests that load the same
file in llama.cpp. Invariant: the same arguments write a byte-identical file, with llama.cpp's
tensor names and shapes for the llama architecture, so llama.cpp loads it as a real model.
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Union

import gguf
import numpy as np

N_HEAD = 4  # attention heads; head_dim = n_embd / N_HEAD
N_HEAD_KV = 2  # grouped-query attention: two query heads per kv head
CONTEXT_LENGTH = 128
ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-5
WEIGHT_STD = 0.02  # N(0, WEIGHT_STD) matrices; norm weights are N(1, WEIGHT_STD)

# SentencePiece ("llama") vocabulary: control tokens, the newline byte token llama.cpp looks up,
# the word-boundary marker, then single characters so any ASCII prompt tokenizes.
_SPECIAL = ("<unk>", "<s>", "</s>")
_LINEFEED = "<0x0A>"
_WORD_BOUNDARY = "\u2581"
_CHARS = string.ascii_lowercase + string.digits + string.punctuation + string.ascii_uppercase + " "
_MIN_VOCAB = len(_SPECIAL) + 2 + len(string.ascii_lowercase)
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_BYTE = 1, 2, 3, 6


def write_tiny_llama(
    path: Union[str, os.PathLike],
    n_layer: int = 4,
    n_embd: int = 32,
    n_vocab: int = 64,
    seed: int = 0,
    tied: bool = True,
) -> Path:
    """Writes an F32 llama GGUF with seeded random weights to `path` and returns the path.

    Feed-forward width is 2 * n_embd, N_HEAD heads and N_HEAD_KV kv heads. With `tied`, there
    is no output.weight and llama.cpp reuses token_embd.weight as the head.
    """
    if n_layer < 1 or n_embd % (2 * N_HEAD) != 0 or n_embd <= 0:
        raise ValueError(f"need n_layer >= 1 and n_embd a positive multiple of {2 * N_HEAD}")
    if n_vocab < _MIN_VOCAB:
        raise ValueError(f"need n_vocab >= {_MIN_VOCAB}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    _add_metadata(writer, n_layer, n_embd, n_vocab)
    for name, shape in _tensor_shapes(n_layer, n_embd, n_vocab, tied):
        if name.endswith("norm.weight"):
            values = 1.0 + WEIGHT_STD * rng.standard_normal(shape, dtype=np.float32)
        else:
            values = WEIGHT_STD * rng.standard_normal(shape, dtype=np.float32)
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_metadata(writer: gguf.GGUFWriter, n_layer: int, n_embd: int, n_vocab: int) -> None:
    writer.add_name(f"meshnet-tiny-llama-{n_layer}x{n_embd}")
    writer.add_block_count(n_layer)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = _vocabulary(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(n_vocab)])
    writer.add_token_types([_token_type(t) for t in tokens])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)


def _vocabulary(n_vocab: int) -> list[str]:
    tokens = list(_SPECIAL) + [_LINEFEED, _WORD_BOUNDARY] + list(_CHARS)
    tokens += [f"{_WORD_BOUNDARY}t{i}" for i in range(len(tokens), n_vocab)]
    return tokens[:n_vocab]


def _token_type(token: str) -> int:
    if token == "<unk>":
        return _TOKEN_UNKNOWN
    if token in _SPECIAL:
        return _TOKEN_CONTROL
    return _TOKEN_BYTE if token == _LINEFEED else _TOKEN_NORMAL


def _tensor_shapes(n_layer: int, n_embd: int, n_vocab: int, tied: bool) -> list[tuple[str, tuple]]:
    """(name, numpy shape) in writing order; numpy shapes are ggml ne reversed (row-major)."""
    n_ff = 2 * n_embd
    n_embd_kv = n_embd // N_HEAD * N_HEAD_KV
    shapes: list[tuple[str, tuple]] = [("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layer):
        shapes += [
            (f"blk.{i}.attn_norm.weight", (n_embd,)),
            (f"blk.{i}.attn_q.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_k.weight", (n_embd_kv, n_embd)),
            (f"blk.{i}.attn_v.weight", (n_embd_kv, n_embd)),
            (f"blk.{i}.attn_output.weight", (n_embd, n_embd)),
            (f"blk.{i}.ffn_norm.weight", (n_embd,)),
            (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_up.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_down.weight", (n_embd, n_ff)),
        ]
    shapes.append(("output_norm.weight", (n_embd,)))
    if not tied:
        shapes.append(("output.weight", (n_vocab, n_embd)))
    return shapes
