"""Runtime recipes: byte-exact canonical form, fingerprint sensitivity, and validation."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.recipe.recipe import RuntimeRecipe, engine_tool_flags, recipe_for

FIELDS = dict(
    backend="gguf",
    architecture="llama",
    weight_quantization="Q4_1",
    activation_dtype="f32",
    kv_dtype="f16",
    matmul_activations="quantized",
    context_length=8192,
    rope_freq_base=100000.0,
    rope_freq_scale=1.0,
    patch_level="llama.cpp@0c1e570+0/0",
)
EXPECTED_BYTES = (
    b'{"activation_dtype":"f32","architecture":"llama","backend":"gguf","context_length":8192,'
    b'"kv_dtype":"f16","matmul_activations":"quantized","patch_level":"llama.cpp@0c1e570+0/0","recipe_version":2,'
    b'"rope_freq_base":100000.0,"rope_freq_scale":1.0,"weight_quantization":"Q4_1"}'
)
# Another value for every field, each valid on its own.
CHANGES = dict(
    backend="reference",
    architecture="qwen3",
    weight_quantization="Q8_0",
    activation_dtype="bf16",
    kv_dtype="q8_0",
    matmul_activations="f32",
    context_length=8191,
    rope_freq_base=100000.5,
    rope_freq_scale=0.25,
    patch_level="llama.cpp@0c1e570+5/5",
    compute_backend="vulkan",
)


def test_canonical_bytes_are_exact():
    recipe = RuntimeRecipe(**FIELDS)
    assert recipe.canonical_bytes() == EXPECTED_BYTES
    assert recipe.fingerprint() == "sha256:" + hashlib.sha256(EXPECTED_BYTES).hexdigest()


def test_cpu_compute_backend_is_written_as_its_absence():
    """CPU recipes keep the fingerprints they had before devices existed; another backend is named."""
    vulkan = RuntimeRecipe(**FIELDS, compute_backend="vulkan")
    assert RuntimeRecipe(**FIELDS, compute_backend="cpu").canonical_bytes() == EXPECTED_BYTES
    assert b'"compute_backend":"vulkan",' in vulkan.canonical_bytes()
    assert vulkan.fingerprint() != RuntimeRecipe(**FIELDS).fingerprint()


def test_floats_use_shortest_round_trip_and_ints_equal_floats():
    as_int = RuntimeRecipe(**{**FIELDS, "rope_freq_base": 10000, "rope_freq_scale": 0.1})
    as_float = RuntimeRecipe(**{**FIELDS, "rope_freq_base": 10000.0, "rope_freq_scale": 0.1})
    assert b'"rope_freq_base":10000.0,"rope_freq_scale":0.1,' in as_int.canonical_bytes()
    assert as_int.fingerprint() == as_float.fingerprint()


def test_field_order_does_not_matter():
    reordered = dict(reversed(list(FIELDS.items())))
    assert list(reordered) != list(FIELDS)
    assert RuntimeRecipe(**reordered).canonical_bytes() == EXPECTED_BYTES


def test_every_field_changes_the_fingerprint():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(RuntimeRecipe)}
    base = RuntimeRecipe(**FIELDS)
    changed = [dataclasses.replace(base, **{name: value}) for name, value in CHANGES.items()]
    assert len({r.fingerprint() for r in [base, *changed]}) == 1 + len(CHANGES)


def test_recipe_for_tiny_fixture(tmp_path):
    summary = gguf_summary(write_tiny_llama(tmp_path / "tiny.gguf"))
    recipe = recipe_for(summary, "reference", activation_dtype="bf16", patch_level="")
    assert recipe == RuntimeRecipe(
        backend="reference",
        architecture="llama",
        weight_quantization="F32",
        activation_dtype="bf16",
        kv_dtype="f16",
        matmul_activations="quantized",
        context_length=4096,  # the fixture's metadata: cpp/engine/tiny_llama.cc
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        patch_level="",
    )
    assert recipe_for(summary, "gguf").fingerprint() != recipe_for(summary, "reference").fingerprint()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(backend="cuda"),
        dict(backend="GGUF"),
        dict(activation_dtype="q8_0"),
        dict(activation_dtype="float32"),
        dict(kv_dtype="f64"),
        dict(matmul_activations="f16"),
        dict(matmul_activations="F32"),
    ],
)
def test_recipe_for_rejects_bad_backend_or_dtype(tmp_path, kwargs):
    summary = gguf_summary(write_tiny_llama(tmp_path / "tiny.gguf"))
    args = {"backend": "gguf", **kwargs}
    with pytest.raises(ValueError):
        recipe_for(summary, **args)


@pytest.mark.parametrize(
    "field, value",
    [
        ("architecture", ""),
        ("weight_quantization", None),
        ("patch_level", 3),
        ("context_length", 0),
        ("context_length", 8192.0),
        ("context_length", True),
        ("rope_freq_base", float("nan")),
        ("rope_freq_base", float("inf")),
        ("rope_freq_scale", 0.0),
        ("rope_freq_scale", "1.0"),
    ],
)
def test_constructor_rejects_bad_fields(field, value):
    with pytest.raises(ValueError, match=field):
        RuntimeRecipe(**{**FIELDS, field: value})


def test_engine_tool_flags():
    assert engine_tool_flags("quantized") == []
    assert engine_tool_flags("f32") == ["--f32-matmul-activations"]
    with pytest.raises(ValueError, match="matmul_activations 'F32'"):
        engine_tool_flags("F32")
