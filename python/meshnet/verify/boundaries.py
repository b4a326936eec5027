"""Runs //cpp/engine:dump_boundaries and reads what it writes: the hidden rows at every boundary
of a shard chain and the last range's logits, for every position of a teacher-forced sequence.
The one reader of that tool's output (audits replay with it, range by range; the calibration runs
it many ways)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from meshnet.memory_cap import CappedRunner
from meshnet.recipe.model_files import ModelFiles
from meshnet.recipe.recipe import engine_tool_flags


class BoundariesError(RuntimeError):
    """The tool failed; the message ends with its stderr."""


def run_chain(binary: Path, gguf: Path, tokens: Sequence[int], chain: str, batch: str, threads: int,
              matmul_activations: str = "quantized", device: str = "cpu") -> dict:
    """{"rows": [float32 [n, n_embd] after each range but the last], "logits": float32 [n, n_vocab]}.
    `chain`: RANGES as the tool takes them (0:10,10:20@OTHER.gguf,...); `batch`: its BATCH;
    `matmul_activations`: the certified recipe's ("f32": the tool's --f32-matmul-activations);
    `device`: where every range computes (a GPU device needs a `binary` linked with its backend).
    One process holds every range of the chain."""
    n = len(tokens)
    with tempfile.TemporaryDirectory(prefix="meshnet-boundaries-") as tmp:
        prefix = Path(tmp) / "run"
        _run(binary, matmul_activations, ["--device", device] if device != "cpu" else [], gguf, prefix, chain, batch,
             threads, tokens)
        rows = [np.fromfile(f"{prefix}.{i}.f32", dtype=np.float32).reshape(n, -1) for i in range(chain.count(","))]
        logits = np.fromfile(f"{prefix}.logits.f32", dtype=np.float32).reshape(n, -1)
    return {"rows": rows, "logits": logits}


def run_streamed(binary: Path, model: ModelFiles, tokens: Sequence[int], ranges: Sequence[tuple[int, int]],
                 batch: str, threads: int, matmul_activations: str | Sequence[str] = "quantized",
                 runner: Optional[CappedRunner] = None, devices: Optional[Sequence[str]] = None) -> dict:
    """`run_chain`'s result for the chain `ranges` (contiguous, the last owning the output), computed
    one process per piece (`ModelFiles.pieces`: a range split where the model's files split), each
    taking the previous piece's rows (--input-rows) and opening only its own range's file: no
    process holds more than one piece of the model. Same bytes as `run_chain` (each piece's
    process runs the same chunks as that range does in the whole chain). `runner`: where each
    process runs (certification caps and measures them); plain subprocesses when None.
    `devices`: where each range computes (the tool's --device; default the CPU): a GPU device
    needs a `binary` linked with its backend (//cpp/engine:dump_boundaries_vulkan, ADR 0014).
    `matmul_activations`: one for every range, or one per range (a route mixing backends whose
    recipes differ, ADR 0015). BoundariesError, before its process starts, for a piece whose file
    no longer has the sha256 it was opened with (`RangeFile.check`)."""
    if any(a[1] != b[0] for a, b in zip(ranges, ranges[1:])) or ranges[-1][1] != model.n_layer:
        raise BoundariesError(f"ranges {list(ranges)} are not a contiguous chain ending at layer {model.n_layer}")
    devices = list(devices) if devices is not None else ["cpu"] * len(ranges)
    if len(devices) != len(ranges):
        raise BoundariesError(f"{len(devices)} devices for {len(ranges)} ranges")
    activations = [matmul_activations] * len(ranges) if isinstance(matmul_activations, str) else list(matmul_activations)
    if len(activations) != len(ranges):
        raise BoundariesError(f"{len(activations)} matmul activations for {len(ranges)} ranges")
    n = len(tokens)
    rows: list[np.ndarray] = []
    with tempfile.TemporaryDirectory(prefix="meshnet-streamed-") as tmp:
        given: list[str] = []
        for i, (start, end) in enumerate(ranges):
            try:
                pieces = model.pieces(start, end)
            except ValueError as err:
                raise BoundariesError(str(err)) from None
            for j, piece in enumerate(pieces):
                try:
                    piece.check()  # the bytes opened as this model's, not a file changed since
                except ValueError as err:
                    raise BoundariesError(str(err)) from None
                prefix = Path(tmp) / f"range{i}.piece{j}"
                on_device = ["--device", devices[i]] if devices[i] != "cpu" else []
                _run(binary, activations[i], [*on_device, *given], piece.path, prefix, f"{piece.start}:{piece.end}",
                     batch, threads, tokens, runner)
                given = ["--input-rows", f"{prefix}.0.f32"]
            if end < model.n_layer:
                rows.append(np.fromfile(given[1], dtype=np.float32).reshape(n, -1))
        logits = np.fromfile(f"{prefix}.logits.f32", dtype=np.float32).reshape(n, -1)
    return {"rows": rows, "logits": logits}


def _run(binary: Path, matmul_activations: str, flags: list[str], gguf: Path, prefix: Path, chain: str, batch: str,
         threads: int, tokens: Sequence[int], runner: Optional[CappedRunner] = None) -> None:
    command = [str(binary), *engine_tool_flags(matmul_activations), *flags, str(gguf), str(prefix), chain, batch,
               str(threads), *map(str, tokens)]
    if runner is not None:
        where = f" on {flags[flags.index('--device') + 1]}" if "--device" in flags else ""
        proc = runner.run(f"llama.cpp layers {chain}{where} ({len(tokens)} positions)", command, reads=[gguf])
    else:
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BoundariesError(f"dump_boundaries exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
