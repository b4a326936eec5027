"""The 8B writer at a tiny shape (the same code, SHAPE shrunk): every tensor of the plan at its
type and shape, a GGUF the pinned llama.cpp loads and decodes from, the same bytes for the same
seed and other bytes for another, and a cached build reused only while it matches its record."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

import synthetic_big_model as big
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.gguf_header import read_header

TOKENIZER = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(big.SHAPE, "n_layer", 2)
    monkeypatch.setitem(big.SHAPE, "n_embd", 256)
    monkeypatch.setitem(big.SHAPE, "n_ff", 512)
    monkeypatch.setitem(big.SHAPE, "n_head", 4)
    monkeypatch.setitem(big.SHAPE, "n_head_kv", 2)


def test_the_written_model_is_the_plan_and_llama_cpp_runs_it(tmp_path):
    record = big.build(tmp_path, 0, TOKENIZER)
    path = Path(record["path"])
    summary = gguf_summary(path)
    assert (summary.architecture, summary.n_layer, summary.n_embd, summary.file_type) == ("llama", 2, 256, "Q4_0")
    assert not summary.tied_embeddings and summary.n_vocab == 49152
    tensors = {t.name: t for t in read_header(path).tensors}
    plan = big.tensor_plan(49152)
    assert list(tensors) == [name for name, _, _ in plan]
    for name, shape, quantized in plan:
        assert tuple(reversed(tensors[name].shape)) == shape and tensors[name].ggml_type.name == (
            "Q4_0" if quantized else "F32"), name
    assert record["parameters"] == sum(math.prod(s) for _, s, _ in plan)
    proc = subprocess.run([str(GREEDY), str(path), "6", "1", "504", "3458"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads(proc.stdout.strip().splitlines()[-1])["tokens"]) == 6


def test_seeded_cached_and_rebuilt_when_its_record_differs(tmp_path):
    first = big.build(tmp_path / "a", 0, TOKENIZER)
    assert big.build(tmp_path / "b", 0, TOKENIZER)["sha256"] == first["sha256"]
    assert big.build(tmp_path / "c", 1, TOKENIZER)["sha256"] != first["sha256"]
    path = Path(first["path"])
    stamp = path.stat().st_mtime_ns
    assert big.build(tmp_path / "a", 0, TOKENIZER) == first and path.stat().st_mtime_ns == stamp  # reused
    with open(path, "r+b") as f:  # a damaged cache is written again
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0xFF]))
    assert big.build(tmp_path / "a", 0, TOKENIZER)["sha256"] == first["sha256"]
    assert not list((tmp_path / "a").glob(".*partial"))
