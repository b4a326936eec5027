"""Audits replayed range by range (one dump_boundaries process per range, each handed the rows
the one before it wrote) give the whole chain's bytes, from the whole file and from per-range
parts cut elsewhere than the route's boundaries, for both matmul recipes and for a prefill
followed by decode steps; and the tool refuses input rows it cannot use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from meshnet.recipe.cut_model import cut
from meshnet.recipe.fingerprint import CACHE_ENV
from meshnet.recipe.model_files import open_model_files
from meshnet.verify import boundaries

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
BINARY = Path(os.environ["MESHNET_DUMP_BOUNDARIES"]).resolve()
TOKENS = [int(t) for t in np.random.default_rng(29).integers(0, 49152, 40)]
ROUTE = [(0, 10), (10, 20), (20, 30)]
PART_RANGES = [(0, 7), (7, 19), (19, 30)]  # a route range spans two parts


@pytest.fixture(scope="module")
def parts_record(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parts")
    os.environ[CACHE_ENV] = str(out / "fingerprints.json")
    cut(GGUF, PART_RANGES, out)
    return out / f"{GGUF.stem}.parts.json"


@pytest.mark.parametrize("matmul_activations,batch", [("quantized", "40"), ("quantized", "12:1"), ("f32", "40")])
def test_range_by_range_gives_the_whole_chains_bytes(parts_record, matmul_activations, batch):
    whole = boundaries.run_chain(BINARY, GGUF, TOKENS, ",".join(f"{a}:{b}" for a, b in ROUTE), batch, 2,
                                 matmul_activations)
    assert len(whole["rows"]) == 2 and whole["logits"].shape == (len(TOKENS), 49152)
    for model in (open_model_files(GGUF), open_model_files(parts_record)):
        streamed = boundaries.run_streamed(BINARY, model, TOKENS, ROUTE, batch, 2, matmul_activations)
        assert len(streamed["rows"]) == 2
        for a, b in zip(whole["rows"], streamed["rows"]):
            assert np.array_equal(a, b)
        assert np.array_equal(whole["logits"], streamed["logits"])


def test_a_chain_that_is_not_one_route_is_refused():
    model = open_model_files(GGUF)
    for ranges in ([(0, 10), (11, 30)], [(0, 10), (10, 20)]):
        with pytest.raises(boundaries.BoundariesError, match="not a contiguous chain"):
            boundaries.run_streamed(BINARY, model, TOKENS, ranges, "40", 2)


def test_input_rows_the_tool_cannot_use_are_refused(tmp_path):
    rows = tmp_path / "rows.f32"
    np.zeros((len(TOKENS), 576), dtype=np.float32)[:-1].tofile(rows)  # one row short

    def run(chain: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BINARY), "--input-rows", str(rows), str(GGUF), str(tmp_path / "out"), chain,
                               "40", "1", *map(str, TOKENS)], capture_output=True, text=True)

    short = run("10:30")
    assert short.returncode == 1 and "does not hold exactly" in short.stderr
    first = run("0:30")
    assert first.returncode == 1 and "past layer 0" in first.stderr
    np.zeros((len(TOKENS), 576), dtype=np.float32).tofile(rows)
    assert run("10:30").returncode == 0 and (tmp_path / "out.logits.f32").stat().st_size == len(TOKENS) * 49152 * 4
