"""Range memory on the bundled SmolLM2 (30 layers, 3 KV heads of 64, tied embeddings) and the tiny fixture."""

from __future__ import annotations

import os

import pytest

from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.recipe.gguf_header import read_header
from meshnet.recipe.range_memory import RangeMemory, range_memory

BUNDLED = os.environ["MESHNET_BUNDLED_GGUF"]


def test_whole_model_is_every_tensor_and_kv_is_k_plus_v_per_layer():
    memory = range_memory(BUNDLED, 0, 30)
    assert memory.weight_bytes == sum(t.n_bytes for t in read_header(BUNDLED).tensors)
    assert memory.kv_bytes_per_token == 30 * (64 + 64) * 3 * 2  # f16 K and V, 3 KV heads of 64
    assert memory.total(1000) == memory.weight_bytes + 1000 * memory.kv_bytes_per_token


def test_ranges_split_the_layers_and_both_ends_hold_the_tied_embeddings():
    header = read_header(BUNDLED)
    embd = next(t.n_bytes for t in header.tensors if t.name == "token_embd.weight")
    parts = [range_memory(BUNDLED, a, b) for a, b in ((0, 10), (10, 20), (20, 30))]
    assert sum(p.weight_bytes for p in parts) == range_memory(BUNDLED, 0, 30).weight_bytes + embd
    assert [p.kv_bytes_per_token for p in parts] == [10 * 768] * 3


def test_quantized_kv_types_use_their_block_bytes():
    assert range_memory(BUNDLED, 0, 2, "q8_0").kv_bytes_per_token == 2 * 128 * 3 * 34 // 32
    assert range_memory(BUNDLED, 0, 2, "f32").kv_bytes_per_token == 2 * 128 * 3 * 4


def test_tiny_fixture(tmp_path):
    memory = range_memory(write_tiny_llama(tmp_path / "tiny.gguf"), 0, 1)
    assert isinstance(memory, RangeMemory) and memory.weight_bytes > 0 and memory.kv_bytes_per_token > 0


@pytest.mark.parametrize("start,end,kv", [(0, 31, "f16"), (3, 3, "f16"), (0, 1, "f64")])
def test_bad_ranges_and_types_are_refused(start, end, kv):
    with pytest.raises(ValueError):
        range_memory(BUNDLED, start, end, kv)
