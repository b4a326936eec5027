"""Transformers fp32 one layer range at a time gives the whole model's logits exactly: a chain of
ranges, each built with only its own layers (and the vocabulary matrices only where it owns
them), from the whole file and from per-range parts cut elsewhere than the chain's boundaries,
on SmolLM2 (tied Llama) and Gemma 3 (sliding-window layers, norm offsets); the one-range command
gives the same bytes; and a range the files do not hold is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from meshnet.recipe.cut_model import cut
from meshnet.recipe.fingerprint import CACHE_ENV
from meshnet.recipe.model_files import open_model_files
from meshnet.reference.model import load_model
from meshnet.reference.range_reference import load_range

SMOLLM2 = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
GEMMA3 = Path(os.environ["MESHNET_GEMMA3_GGUF"]).resolve()
IDS = [int(t) for t in np.random.default_rng(29).integers(0, 49152, 48)]


def chain(model, cuts, ids=IDS) -> torch.Tensor:
    rows = None
    for start, end in cuts:
        reference = load_range(model, start, end)
        assert (reference.model.model.embed_tokens.weight.shape[0] > 8) == (start == 0)  # vocabulary only where owned
        rows = reference.run(ids=ids) if start == 0 else reference.run(rows=rows)
        del reference
    return rows


@pytest.fixture(scope="module")
def whole_smollm2() -> torch.Tensor:
    with torch.no_grad():
        return load_model(SMOLLM2)(torch.tensor([IDS])).logits[0]


def test_a_chain_of_ranges_gives_the_whole_models_logits(whole_smollm2):
    assert torch.equal(chain(open_model_files(SMOLLM2), [(0, 7), (7, 19), (19, 30)]), whole_smollm2)


def test_ranges_from_parts_give_the_same_logits(tmp_path, monkeypatch, whole_smollm2):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "fingerprints.json"))
    cut(SMOLLM2, [(0, 10), (10, 20), (20, 30)], tmp_path)
    parts = open_model_files(tmp_path / f"{SMOLLM2.stem}.parts.json")
    assert torch.equal(chain(parts, [(0, 5), (5, 15), (15, 30)]), whole_smollm2)  # ranges that span two parts
    cut(SMOLLM2, [(0, 10), (20, 30)], tmp_path / "gap")
    with pytest.raises(ValueError, match="holds layer 10"):
        load_range(open_model_files(tmp_path / "gap" / f"{SMOLLM2.stem}.parts.json"), 5, 15)


def test_gemma3_range_by_range():
    ids = [2, *IDS[:40]]
    with torch.no_grad():
        whole = load_model(GEMMA3)(torch.tensor([ids])).logits[0]
    assert torch.equal(chain(open_model_files(GEMMA3), [(0, 5), (5, 11), (11, 18)], ids), whole)


def test_one_range_per_process_gives_the_same_bytes(tmp_path, whole_smollm2):
    given: list[str] = []
    for i, (start, end) in enumerate([(0, 12), (12, 30)]):
        out = tmp_path / f"{i}.f32"
        proc = subprocess.run([sys.executable, "-m", "meshnet.reference.range_reference", "--model", str(SMOLLM2),
                               "--layers", f"{start}:{end}", "--tokens", ",".join(map(str, IDS)), "--out", str(out),
                               *given], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = json.loads(proc.stdout.strip().splitlines()[-1])
        assert line["layers"] == [start, end] and line["peak_rss_bytes"] > 0
        given = ["--input-rows", str(out)]
    logits = np.fromfile(tmp_path / "1.f32", dtype=np.float32).reshape(len(IDS), -1)
    assert np.array_equal(logits, whole_smollm2.numpy())
    refused = subprocess.run([sys.executable, "-m", "meshnet.reference.range_reference", "--model", str(SMOLLM2),
                              "--layers", "12:40", "--tokens", "1,2", "--out", str(tmp_path / "x")],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "not within the model's 30" in refused.stderr
