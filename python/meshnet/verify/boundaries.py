"""Runs //cpp/engine:dump_boundaries and reads what it writes: the hidden rows at every boundary
of a shard chain and the last range's logits, for every position of a teacher-forced sequence.
The one reader of that tool's output (audits replay with it; the calibration runs it many ways)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from meshnet.recipe.recipe import engine_tool_flags


class BoundariesError(RuntimeError):
    """The tool failed; the message ends with its stderr."""


def run_chain(binary: Path, gguf: Path, tokens: Sequence[int], chain: str, batch: str, threads: int,
              matmul_activations: str = "quantized") -> dict:
    """{"rows": [float32 [n, n_embd] after each range but the last], "logits": float32 [n, n_vocab]}.
    `chain`: RANGES as the tool takes them (0:10,10:20@OTHER.gguf,...); `batch`: its BATCH;
    `matmul_activations`: the certified recipe's ("f32": the tool's --f32-matmul-activations)."""
    n = len(tokens)
    with tempfile.TemporaryDirectory(prefix="meshnet-boundaries-") as tmp:
        prefix = Path(tmp) / "run"
        proc = subprocess.run([str(binary), *engine_tool_flags(matmul_activations), str(gguf), str(prefix), chain,
                               batch, str(threads), *map(str, tokens)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BoundariesError(f"dump_boundaries exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        rows = [np.fromfile(f"{prefix}.{i}.f32", dtype=np.float32).reshape(n, -1) for i in range(chain.count(","))]
        logits = np.fromfile(f"{prefix}.logits.f32", dtype=np.float32).reshape(n, -1)
    return {"rows": rows, "logits": logits}
