"""The one adapter list, as the tracker reads it (adapters.json made from the patched llama.cpp's
table by //python/meshnet/recipe:adapters), and the extraction's refusals."""

import adapters as extraction  # tools/llama_cpp/adapters.py
import pytest

from meshnet.recipe.adapters import has_adapter, layer_range_adapters


def test_the_built_list_is_the_series_adapters():
    # the same names, in the same order, as the engine test expects from llama.cpp itself
    assert list(layer_range_adapters()) == ["llama", "qwen3", "qwen3moe", "gemma3"]
    assert has_adapter("qwen3moe", 8) and has_adapter("gemma3") and has_adapter("llama")
    assert not has_adapter("llama", 8)  # llama's row allows no experts
    assert not has_adapter("bloom") and not has_adapter("")


RANGE = """
static const llama_layer_range_adapter LLAMA_LAYER_RANGE_ADAPTERS[] = {
    { LLM_ARCH_LLAMA, false },
    { LLM_ARCH_QWEN3MOE, true },
};
"""
ARCH = '{ LLM_ARCH_LLAMA, "llama" },\n    { LLM_ARCH_QWEN3MOE,        "qwen3moe"         },'


def test_extraction_reads_rows_and_names():
    assert extraction.adapters(RANGE, ARCH) == {"llama": {"experts": False}, "qwen3moe": {"experts": True}}


@pytest.mark.parametrize("range_source, arch_source, message", [
    ("int x;", ARCH, "no LLAMA_LAYER_RANGE_ADAPTERS table"),
    ("LLAMA_LAYER_RANGE_ADAPTERS[] = {\n};", ARCH, "has no rows"),
    (RANGE, '{ LLM_ARCH_LLAMA, "llama" },', "LLM_ARCH_QWEN3MOE has no name"),
])
def test_extraction_refuses_what_it_cannot_read(range_source, arch_source, message):
    with pytest.raises(ValueError, match=message):
        extraction.adapters(range_source, arch_source)
