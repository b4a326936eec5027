"""Fingerprints: whole-file hash and its cache, GGUF summaries, and per-range tensor ownership."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from meshnet.recipe import fingerprint as fp
from meshnet.recipe.fixtures import write_tiny_llama

BUNDLED_ENV = "MESHNET_BUNDLED_GGUF"
LAYER_TENSORS = (
    "attn_k", "attn_norm", "attn_output", "attn_q", "attn_v", "ffn_down", "ffn_gate", "ffn_norm", "ffn_up"
)  # fmt: skip


@pytest.fixture(autouse=True)
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "fingerprints.json"
    monkeypatch.setenv(fp.CACHE_ENV, str(path))
    return path


def _sha256(path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _count_hashes(monkeypatch) -> list:
    calls = []
    real = fp._sha256_file

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(fp, "_sha256_file", counting)
    return calls


def _perturb(path, tensor_name: str) -> None:
    """Adds 1.0 to the first element of an F32 tensor, in place."""
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == tensor_name)
    value = np.float32(t.data.reshape(-1)[0]) + np.float32(1.0)
    with open(path, "r+b") as f:
        f.seek(t.data_offset)
        f.write(value.tobytes())


def _write_gguf(path, tensors: dict, n_layer: int, **keys) -> None:
    """A minimal llama GGUF with these numpy tensors; llama.<key> per keyword (None: absent)."""
    writer = gguf.GGUFWriter(path, "llama")
    defaults = {"block_count": n_layer, "vocab_size": 16, "embedding_length": 8, "context_length": 64}
    for key, value in {**defaults, **keys}.items():
        if isinstance(value, float):
            writer.add_key_value(f"llama.{key}", value, gguf.GGUFValueType.FLOAT32)
        elif value is not None:
            writer.add_key_value(f"llama.{key}", value, gguf.GGUFValueType.UINT32)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _two_layers(*extra_names: str, dtype=np.float32) -> dict:
    """Tensors of a 2-layer model with token_embd, plus a ones(8) F32 tensor per extra name."""
    tensors = {**_layer(0, dtype), **_layer(1, dtype), "token_embd.weight": np.zeros((16, 8), dtype)}
    return tensors | {name: np.ones(8, np.float32) for name in extra_names}


def _layer(i: int, dtype=np.float32) -> dict:
    rng = np.random.default_rng(i)
    out = {}
    for part in LAYER_TENSORS:
        is_norm = part.endswith("norm")
        values = rng.standard_normal((8,) if is_norm else (8, 8))
        out[f"blk.{i}.{part}.weight"] = values.astype(np.float32 if is_norm else dtype)
    return out


# ---- artifact_fingerprint ----------------------------------------------------------------------


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "artifact.bin"
    path.write_bytes(np.random.default_rng(7).bytes(fp.CHUNK_BYTES + 12345))  # two chunks
    return path


def test_artifact_fingerprint_is_sha256_of_whole_file(artifact, cache_file):
    assert fp.artifact_fingerprint(artifact) == _sha256(artifact)
    assert cache_file.exists()


def test_second_call_is_served_from_cache(artifact, monkeypatch):
    first = fp.artifact_fingerprint(artifact)

    def fail(path):
        raise AssertionError("hashed again despite a valid cache entry")

    monkeypatch.setattr(fp, "_sha256_file", fail)
    assert fp.artifact_fingerprint(artifact) == first
    link = artifact.parent / "link.bin"
    link.symlink_to(artifact)
    assert fp.artifact_fingerprint(link) == first  # keyed by realpath


def test_changed_mtime_recomputes(artifact, monkeypatch):
    calls = _count_hashes(monkeypatch)
    first = fp.artifact_fingerprint(artifact)
    st = os.stat(artifact)
    os.utime(artifact, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert fp.artifact_fingerprint(artifact) == first
    assert len(calls) == 2
    with open(artifact, "r+b") as f:  # same size, new content, new mtime
        f.write(b"changed")
    os.utime(artifact, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert fp.artifact_fingerprint(artifact) == _sha256(artifact) != first
    assert len(calls) == 3


def test_changed_size_recomputes(artifact, monkeypatch):
    first = fp.artifact_fingerprint(artifact)
    st = os.stat(artifact)
    with open(artifact, "ab") as f:
        f.write(b"x")
    os.utime(artifact, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: size alone must do
    calls = _count_hashes(monkeypatch)
    assert fp.artifact_fingerprint(artifact) == _sha256(artifact) != first
    assert len(calls) == 1


@pytest.mark.parametrize(
    "content",
    [
        b"{not json", b"", b"[]", b"\xff\xfe",
        b'{"version": 99, "entries": {}}', b'{"version": 1, "entries": []}',
    ],  # fmt: skip
)
def test_corrupt_cache_is_ignored_and_rewritten(artifact, cache_file, content):
    cache_file.parent.mkdir(parents=True)
    cache_file.write_bytes(content)
    assert fp.artifact_fingerprint(artifact) == _sha256(artifact)
    document = json.loads(cache_file.read_text())
    assert document["entries"][os.path.realpath(artifact)]["fingerprint"] == _sha256(artifact)


def test_bad_entry_is_recomputed(artifact, cache_file):
    fp.artifact_fingerprint(artifact)
    document = json.loads(cache_file.read_text())
    document["entries"][os.path.realpath(artifact)]["fingerprint"] = 5
    cache_file.write_text(json.dumps(document))
    assert fp.artifact_fingerprint(artifact) == _sha256(artifact)


def test_explicit_cache_path_and_unwritable_cache(artifact, tmp_path, cache_file):
    explicit = tmp_path / "explicit.json"
    assert fp.artifact_fingerprint(artifact, cache_path=explicit) == _sha256(artifact)
    assert explicit.exists() and not cache_file.exists()
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"")
    assert fp.artifact_fingerprint(artifact, cache_path=blocker / "c.json") == _sha256(artifact)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact.bin", "explicit.json", "not_a_dir"]


# ---- gguf_summary -----------------------------------------------------------------------------


def test_fixture_is_deterministic(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", seed=3)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=3)
    c = write_tiny_llama(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("tied", [True, False])
def test_summary_of_tiny_fixture(tmp_path, tied):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=3, n_embd=16, n_vocab=40, tied=tied)
    assert fp.gguf_summary(path) == fp.GgufSummary(
        architecture="llama",
        name="meshnet-tiny-llama",  # the fixture's metadata: cpp/engine/tiny_llama.cc
        n_layer=3,
        n_embd=16,
        n_vocab=40,
        context_length=4096,
        file_type="F32",
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        tied_embeddings=tied,
    )


@pytest.mark.skipif(BUNDLED_ENV not in os.environ, reason=f"{BUNDLED_ENV} not set")
def test_summary_and_fingerprints_of_bundled_smollm2():
    path = os.environ[BUNDLED_ENV]
    summary = fp.gguf_summary(path)
    assert summary.architecture == "llama"
    assert (summary.n_layer, summary.n_embd, summary.n_vocab) == (30, 576, 49152)
    assert (summary.file_type, summary.tied_embeddings, summary.context_length) == ("Q4_1", True, 8192)
    assert (summary.rope_freq_base, summary.rope_freq_scale) == (100000.0, 1.0)
    # Golden values: the artifact is pinned (third_party/versions.bzl), so these change only if
    # the range stream definition does.
    assert fp.range_fingerprint(path, 0, 30) == SMOLLM2_FULL_RANGE
    assert fp.range_fingerprint(path, 0, 10) == SMOLLM2_FIRST_TEN


# Range fingerprint v2 (per-tensor digests combined; issue 13), recomputed when v1 was replaced.
SMOLLM2_FULL_RANGE = "sha256:9c8e4d339ac7033ff90cd99e5ab016a17f9ca11d5e098a6c472109b40c35827b"
SMOLLM2_FIRST_TEN = "sha256:90e82e82b1f12b239c3438e04e4d218eb4780f38f550e85a6ef216a7790ad418"


def test_summary_reads_rope_scaling_and_guesses_file_type(tmp_path):
    path = tmp_path / "f16.gguf"
    _write_gguf(path, _two_layers(dtype=np.float16), n_layer=2, vocab_size=None, **{"rope.scaling.factor": 4.0})
    summary = fp.gguf_summary(path)
    assert (summary.file_type, summary.rope_freq_scale, summary.rope_freq_base) == ("F16", 0.25, 10000.0)
    assert summary.n_vocab == 16 and summary.tied_embeddings and summary.name == ""


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all", b"GGUF\x03\x00\x00\x00\x05"])
def test_non_gguf_raises_value_error(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        fp.gguf_summary(path)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        fp.range_fingerprint(path, 0, 1)


def test_missing_key_raises_value_error(tmp_path):
    path = tmp_path / "nokeys.gguf"
    _write_gguf(path, _layer(0), n_layer=1, embedding_length=None)
    with pytest.raises(ValueError, match="llama.embedding_length"):
        fp.gguf_summary(path)


# ---- range_fingerprint ------------------------------------------------------------------------

RANGES = [(s, e) for s in range(4) for e in range(s + 1, 5)]


def test_different_ranges_differ_and_equal_files_agree(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", seed=11)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=11)
    c = write_tiny_llama(tmp_path / "c.gguf", seed=12)
    prints_a = [fp.range_fingerprint(a, s, e) for s, e in RANGES]
    assert len(set(prints_a)) == len(RANGES)
    assert prints_a == [fp.range_fingerprint(b, s, e) for s, e in RANGES]
    assert not set(prints_a) & {fp.range_fingerprint(c, s, e) for s, e in RANGES}


def test_range_stream_is_as_documented(tmp_path):
    path = write_tiny_llama(tmp_path / "a.gguf")
    hasher = hashlib.sha256(b"meshnet-range-fingerprint-v2\n")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name in sorted(f"blk.1.{part}.weight" for part in LAYER_TENSORS):
        t = tensors[name]
        shape = ",".join(str(int(d)) for d in t.shape)
        digest = hashlib.sha256(f'["{name}","F32",[{shape}],{t.n_bytes}]\n'.encode() + t.data.tobytes()).hexdigest()
        hasher.update(f"{name}\t{digest}\n".encode())
    assert fp.range_fingerprint(path, 1, 2) == "sha256:" + hasher.hexdigest()


@pytest.mark.parametrize("tied", [True, False])
def test_certified_digests_give_every_ranges_fingerprint_without_the_file(tmp_path, tied):
    path = write_tiny_llama(tmp_path / "a.gguf", tied=tied)
    summary, digests = fp.tensor_digests(path)
    assert summary.tied_embeddings == tied
    for s, e in RANGES:
        assert fp.certified_range_fingerprint(digests, 4, s, e) == fp.range_fingerprint(path, s, e)
    with pytest.raises(ValueError):
        fp.certified_range_fingerprint(digests, 4, 2, 5)


def _changed_ranges(path, tensor_name, ranges=RANGES) -> set:
    before = {r: fp.range_fingerprint(path, *r) for r in ranges}
    _perturb(path, tensor_name)
    return {r for r in ranges if fp.range_fingerprint(path, *r) != before[r]}


def _touching(layers, first=False, last=False) -> set:
    """RANGES holding one of `layers`, or (when asked) the first or the last of the 4 layers."""
    return {(s, e) for s, e in RANGES if set(layers) & set(range(s, e)) or (first and s == 0) or (last and e == 4)}


def test_changing_a_layer_changes_exactly_the_ranges_holding_it(tmp_path):
    path = write_tiny_llama(tmp_path / "a.gguf")
    changed = _changed_ranges(path, "blk.2.attn_q.weight")
    assert changed == _touching({2})
    assert {(0, 3), (2, 4)} <= changed and not {(3, 4), (0, 2)} & changed


@pytest.mark.parametrize(
    "tied, tensor, first, last",
    [
        (True, "token_embd.weight", True, True),  # tied: the last shard's head is token_embd
        (False, "token_embd.weight", True, False),
        (False, "output.weight", False, True),
        (True, "output_norm.weight", False, True),
        (False, "output_norm.weight", False, True),
    ],
)
def test_end_shards_own_embedding_and_head(tmp_path, tied, tensor, first, last):
    path = write_tiny_llama(tmp_path / "a.gguf", tied=tied)
    assert _changed_ranges(path, tensor) == _touching(set(), first=first, last=last)


def test_owned_tensor_names(tmp_path):
    summary = fp.gguf_summary(write_tiny_llama(tmp_path / "a.gguf", tied=True))
    names = [t.name for t in gguf.GGUFReader(tmp_path / "a.gguf").tensors]
    blk = lambda i: [f"blk.{i}.{p}.weight" for p in LAYER_TENSORS]  # noqa: E731
    assert fp.owned_tensor_names(summary, names, 1, 3) == sorted(blk(1) + blk(2))
    assert fp.owned_tensor_names(summary, names, 0, 1) == sorted(blk(0) + ["token_embd.weight"])
    last = sorted(blk(3) + ["output_norm.weight", "token_embd.weight"])
    assert fp.owned_tensor_names(summary, names, 3, 4) == last


def test_rope_freqs_belong_to_every_shard(tmp_path):
    path = tmp_path / "rope.gguf"
    _write_gguf(path, _two_layers("output_norm.weight", "rope_freqs.weight"), n_layer=2)
    ranges = [(0, 1), (1, 2), (0, 2)]
    assert _changed_ranges(path, "rope_freqs.weight", ranges) == set(ranges)
    assert _changed_ranges(path, "blk.1.ffn_norm.weight", ranges) == {(1, 2), (0, 2)}


@pytest.mark.parametrize("extra", ["token_embd_norm.weight", "blk.2.attn_q.weight", "blk.x.attn_q"])
def test_unassignable_tensor_is_refused(tmp_path, extra):
    path = tmp_path / "extra.gguf"
    tensors = _two_layers("output_norm.weight", extra)
    _write_gguf(path, tensors, n_layer=2)
    with pytest.raises(ValueError, match="no range owner"):
        fp.range_fingerprint(path, 1, 2)


def test_missing_end_tensor_or_layer_is_refused(tmp_path):
    path = tmp_path / "holes.gguf"
    _write_gguf(path, {**_layer(0), **_layer(2)}, n_layer=3)
    with pytest.raises(ValueError, match="layer 1 has no tensors"):
        fp.range_fingerprint(path, 1, 2)
    with pytest.raises(ValueError, match="token_embd.weight"):
        fp.range_fingerprint(path, 0, 1)
    with pytest.raises(ValueError, match="output_norm.weight"):
        fp.range_fingerprint(path, 2, 3)


@pytest.mark.parametrize("start, end", [(-1, 2), (2, 2), (3, 2), (0, 5), (4, 5), (True, 2)])
def test_bad_range_raises_value_error(tmp_path, start, end):
    path = write_tiny_llama(tmp_path / "a.gguf")
    with pytest.raises(ValueError):
        fp.range_fingerprint(path, start, end)
