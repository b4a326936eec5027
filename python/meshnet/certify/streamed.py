"""Certification range by range: no process of the suite holds the whole model (issue 29).

Teacher forcing: the Transformers fp32 reference is a chain of `reference.range_reference`
processes, one per reference range (`reference_ranges`: as many layers as `--max-memory` lets
one process dequantize to fp32, or the route's cuts when uncapped), each handing its rows to the
next; the llama.cpp side is a chain of //cpp/engine:dump_boundaries processes over the route's
cuts (verify.boundaries.run_streamed), which gives single-process llama.cpp's logits bit for bit.
Route parity without a whole-model process (`greedy_matches_teacher_forced`): the route's greedy
tokens must be the argmax of the same range chain teacher-forced over prompt + generated tokens
at every generated position, computed as the route computes them (the prompt in one batch, then
one position per step). Every process runs through a `CappedRunner`, so under `--max-memory`
each is in its own capped cgroup and its peak is reported.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from meshnet.memory_cap import CappedRunner
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.gguf_header import read_header
from meshnet.recipe.model_files import ModelFiles
from meshnet.verify import boundaries

MIB = 1 << 20
# What a reference process holds besides its range's fp32 weights (Python with torch and
# Transformers loaded, one tensor being dequantized, activations and logits of a few hundred
# positions), set before any capped run from an uncapped one: SmolLM2's [0, 10) process peaked at
# 743 MB VmHWM with 253 MB of fp32 weights. Ranges are planned with it, never checked against it.
REFERENCE_OVERHEAD = 768 * MIB
_BLOCK = re.compile(r"blk\.(\d+)\.")


def fp32_bytes(gguf: Path) -> tuple[list[int], int]:
    """([fp32 bytes of each layer's tensors], fp32 bytes of one vocabulary matrix)."""
    summary = gguf_summary(gguf)
    layers = [0] * summary.n_layer
    vocab = 0
    for t in read_header(gguf).tensors:
        block = _BLOCK.match(t.name)
        if block:
            layers[int(block[1])] += 4 * int(np.prod(t.shape))
        elif t.name == "token_embd.weight":
            vocab = 4 * int(np.prod(t.shape))
    return layers, vocab


def reference_ranges(gguf: Path, max_memory: Optional[int],
                     default: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The reference's ranges: `default` when uncapped; else consecutive ranges, each as long as
    its fp32 weights (plus a vocabulary matrix for the first and the last) and
    REFERENCE_OVERHEAD fit in `max_memory`. ValueError when one layer alone does not fit."""
    if max_memory is None:
        return list(default)
    layers, vocab = fp32_bytes(gguf)
    out: list[tuple[int, int]] = []
    start = 0
    while start < len(layers):
        end, used = start, REFERENCE_OVERHEAD + (vocab if start == 0 else 0)
        while end < len(layers):
            extra = layers[end] + (vocab if end + 1 == len(layers) else 0)
            if used + extra > max_memory:
                break
            used += extra
            end += 1
        if end == start:
            raise ValueError(f"--max-memory {max_memory / MIB:.0f} MiB cannot hold layer {start} in fp32 "
                             f"({(used + layers[start]) / MIB:.0f} MiB with the process's overhead)")
        out.append((start, end))
        start = end
    return out


def reference_logits(model: ModelFiles, ids: Sequence[int], ranges: Sequence[tuple[int, int]], runner: CappedRunner,
                     threads: int = 0) -> torch.Tensor:
    """[len(ids), n_vocab] Transformers fp32 logits, one process per range (each charged for the
    pages of the files it reads)."""
    with tempfile.TemporaryDirectory(prefix="meshnet-reference-") as tmp:
        given: list[str] = []
        for i, (start, end) in enumerate(ranges):
            out = Path(tmp) / f"{i}.f32"
            proc = runner.run(f"Transformers fp32 layers {start}:{end} ({len(ids)} positions)", [
                sys.executable, "-m", "meshnet.reference.range_reference", "--model", str(model.source),
                "--layers", f"{start}:{end}", "--tokens", ",".join(map(str, ids)), "--out", str(out),
                "--threads", str(threads), *given], reads=[piece.path for piece in model.pieces(start, end)])
            if proc.returncode != 0:
                raise RuntimeError(f"Transformers fp32 layers [{start}, {end}) exited {proc.returncode}"
                                   f"{' (killed: over its memory cap)' if runner.records[-1].oom_killed else ''}: "
                                   f"{proc.stderr.strip()[-800:]}")
            given = ["--input-rows", str(out)]
        return torch.from_numpy(np.fromfile(out, dtype=np.float32).reshape(len(ids), -1))


def llama_cpp_logits(dump_boundaries: Path, model: ModelFiles, ids: Sequence[int], cuts: Sequence[tuple[int, int]],
                     matmul_activations: str, runner: CappedRunner, threads: int = 2,
                     devices: Optional[Sequence[str]] = None) -> torch.Tensor:
    """[len(ids), n_vocab] llama.cpp logits of one teacher-forced prefill, one process per cut
    (`devices`: where each cut computes; the CPU by default)."""
    try:
        result = boundaries.run_streamed(dump_boundaries, model, ids, cuts, str(len(ids)), threads, matmul_activations,
                                         runner, devices)
    except boundaries.BoundariesError as err:
        raise RuntimeError(f"llama.cpp range chain failed: {err}") from None
    return torch.from_numpy(result["logits"])


def greedy_matches_teacher_forced(dump_boundaries: Path, model: ModelFiles, prompt: Sequence[int],
                                  generated: Sequence[int], cuts: Sequence[tuple[int, int]], matmul_activations: str,
                                  runner: CappedRunner, threads: int = 2,
                                  devices: Optional[Sequence[str]] = None) -> dict:
    """{"equal", "first_difference", "positions"}: whether each generated token is the argmax of
    the range chain teacher-forced over prompt + the tokens before it (the prompt as one batch,
    then one position per step, as a route computes them), each cut on its device of `devices`."""
    if not generated:
        return {"equal": True, "first_difference": None, "positions": 0}
    sequence = [*prompt, *generated[:-1]]
    try:
        result = boundaries.run_streamed(dump_boundaries, model, sequence, cuts, f"{len(prompt)}:1", threads,
                                         matmul_activations, runner, devices)
    except boundaries.BoundariesError as err:
        raise RuntimeError(f"llama.cpp range chain failed: {err}") from None
    argmax = result["logits"][len(prompt) - 1:].argmax(axis=1).tolist()
    first = next((i for i, (a, b) in enumerate(zip(argmax, generated)) if a != b), None)
    return {"equal": first is None, "first_difference": first, "positions": len(generated)}
