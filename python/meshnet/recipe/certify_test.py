"""Certification entries agree with what a node computes, and differ per backend."""

import json
import os
import subprocess
import sys

import pytest

from meshnet.recipe import certify, fingerprint, fixtures


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHNET_FINGERPRINT_CACHE", str(tmp_path / "cache.json"))
    return fixtures.write_tiny_llama(tmp_path / "tiny.gguf")


def test_entry_matches_node_fingerprints(gguf):
    entry = certify.certify(gguf, "tiny", "reference")
    summary, artifact, recipe = certify.node_fingerprints(gguf, "reference")
    digests = entry.pop("tensor_digests")
    assert entry == {"model": "tiny", "architecture": "llama", "n_layer": summary.n_layer,
                     "artifact_fingerprint": artifact, "recipe_fingerprint": recipe, "matmul_activations": "f32"}
    for start, end in ((0, 1), (1, 3), (0, summary.n_layer)):  # what a node serving them declares
        assert fingerprint.certified_range_fingerprint(digests, summary.n_layer, start, end) == \
            fingerprint.range_fingerprint(gguf, start, end)
    assert certify.certify(gguf, "tiny", "gguf")["recipe_fingerprint"] != recipe
    with pytest.raises(ValueError):
        certify.certify(gguf, "tiny", "tensorrt")


def test_matmul_activations_are_part_of_the_recipe(gguf):
    """A GGUF model certified with F32 matmul activations (ADR 0012) has another recipe than with
    quantized ones, so the tracker refuses a node that computes the other way; the reference
    backend only computes in F32."""
    default = certify.certify(gguf, "tiny", "gguf")
    quantized = certify.certify(gguf, "tiny", "gguf", "quantized")
    f32 = certify.certify(gguf, "tiny", "gguf", "f32")
    assert default["matmul_activations"] == "quantized" and f32["matmul_activations"] == "f32"
    assert default["recipe_fingerprint"] == quantized["recipe_fingerprint"] != f32["recipe_fingerprint"]
    assert f32["recipe_fingerprint"] == certify.node_fingerprints(gguf, "gguf", "f32")[2]
    assert certify.certify(gguf, "tiny", "reference", "f32")["recipe_fingerprint"] == \
        certify.certify(gguf, "tiny", "reference")["recipe_fingerprint"]
    with pytest.raises(ValueError, match="reference backend computes matmuls with f32 activations"):
        certify.certify(gguf, "tiny", "reference", "quantized")
    with pytest.raises(ValueError, match="matmul_activations 'bf16'"):
        certify.certify(gguf, "tiny", "gguf", "bf16")


def test_cli_appends_and_replaces(gguf, tmp_path):
    models = tmp_path / "models.json"
    models.write_text(json.dumps([{"model": "other"}, {"model": "tiny", "stale": True}]))
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "meshnet.recipe.certify", "--gguf", str(gguf), "--model", "tiny",
                        "--backend", "reference", "--append", str(models)], check=False, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
                                MESHNET_FINGERPRINT_CACHE=str(tmp_path / "c.json")))
        assert proc.returncode == 0, proc.stderr
    entries = json.loads(models.read_text())
    assert [e["model"] for e in entries] == ["other", "tiny"] and "stale" not in entries[1]


def test_summarize_range_is_the_summary_and_the_range_fingerprint(gguf):
    from meshnet.recipe.fingerprint import gguf_summary, range_fingerprint, summarize_range

    assert summarize_range(gguf, 1, 3) == (gguf_summary(gguf), range_fingerprint(gguf, 1, 3))


def test_the_gguf_recipe_names_the_pin_of_versions_bzl():
    """The pin is written once, in third_party/versions.bzl; the recipe gets it through the
    build (pins.json beside certify.py under Bazel)."""
    import os
    import re
    from pathlib import Path

    text = Path(os.environ["MESHNET_VERSIONS_BZL"]).read_text()
    pinned = re.search(r'^LLAMA_CPP_COMMIT = "([0-9a-f]{40})"$', text, re.MULTILINE).group(1)
    assert certify.llama_cpp_commit() == pinned
    assert certify.BACKEND_DEFAULTS["gguf"]["patch_level"] == f"llama.cpp@{pinned[:7]}"
    if "TEST_SRCDIR" in os.environ:  # under Bazel: through the build, not by reading the .bzl
        assert Path(certify.__file__).with_name("pins.json").exists()


def _passed(entry: dict) -> dict:
    return {**entry, "certification": {"passed": True}}


def test_one_entry_keeps_every_certified_backend_of_one_artifact(gguf, tmp_path):
    """ADR 0015: a pass on another backend joins the entry; a new pass on a backend replaces only
    its recipe; a mix survives only while its backends' recipes do; another artifact starts over."""
    cpu = _passed(certify.certify(gguf, "tiny", "gguf"))
    vulkan = _passed(certify.certify(gguf, "tiny", "gguf", compute_backend="vulkan"))
    both = certify.merge_entry(certify.merge_entry(None, cpu), vulkan)
    assert both["recipe_fingerprint"] == cpu["recipe_fingerprint"] and "compute_backend" not in both
    assert [b["compute_backend"] for b in both["other_backends"]] == ["vulkan"]
    assert both["other_backends"][0]["recipe_fingerprint"] == vulkan["recipe_fingerprint"] != cpu["recipe_fingerprint"]
    assert sorted(certify.certified_backends(both)) == ["cpu", "vulkan"]
    mixed = {**both, "mixed_backends": {"backends": ["cpu", "vulkan"], "certification": {"passed": True}}}
    again = certify.merge_entry(mixed, vulkan)  # the same recipe certified again: the mix stays
    assert again["mixed_backends"] == mixed["mixed_backends"] and len(again["other_backends"]) == 1
    f32 = _passed(certify.certify(gguf, "tiny", "gguf", "f32"))  # the CPU's recipe changes: the mix goes
    changed = certify.merge_entry(mixed, f32)
    assert changed["recipe_fingerprint"] == f32["recipe_fingerprint"] and "mixed_backends" not in changed
    assert [b["compute_backend"] for b in changed["other_backends"]] == ["vulkan"]
    other = fixtures.write_tiny_llama(tmp_path / "other.gguf", seed=7)
    fresh = _passed(certify.certify(other, "tiny", "gguf"))
    assert certify.merge_entry(mixed, fresh) == fresh


def test_a_local_swarm_entry_names_each_backend_and_their_mix_without_a_certification(gguf):
    entry = certify.uncertified_entry(gguf, "tiny", "gguf", None, ["cpu", "vulkan0", "cpu"])
    assert "certification" not in entry and entry["mixed_backends"] == {"backends": ["cpu", "vulkan"]}
    assert [b["compute_backend"] for b in entry["other_backends"]] == ["vulkan"]
    assert certify.certified_backends(entry) == {}
    assert "other_backends" not in certify.uncertified_entry(gguf, "tiny", "gguf", None, ["vulkan0"] * 3)
