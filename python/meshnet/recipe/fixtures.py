"""Tiny seeded random-weight Llama GGUF files for tests (ADR 0006, "One maker per fact").

Called by tests of fingerprints, recipes and the GGUF header reader. The file is made by the one
maker of the fixture for both languages, //cpp/engine:tiny_llama_writer (cpp/engine/
tiny_llama.h): llama.cpp's tensor names and shapes for the llama architecture, so llama.cpp
loads it as a real model, and the same arguments write a byte-identical file. Under Bazel the
command is in this library's runfiles; elsewhere $MESHNET_TINY_LLAMA_WRITER names it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Union

WRITER_ENV = "MESHNET_TINY_LLAMA_WRITER"
_RUNFILES_PATH = "meshnet/cpp/engine/tiny_llama_writer"


def writer() -> Path:
    """The tiny_llama_writer command; FileNotFoundError naming what to build when it is absent."""
    candidates = [os.environ.get(WRITER_ENV, "")]
    for root in (os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")):
        if root:
            candidates.append(os.path.join(root, _RUNFILES_PATH))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise FileNotFoundError(f"no tiny_llama_writer: build //cpp/engine:tiny_llama_writer and set ${WRITER_ENV}")


def write_tiny_llama(
    path: Union[str, os.PathLike],
    n_layer: int = 4,
    n_embd: int = 32,
    n_vocab: int = 64,
    seed: int = 0,
    tied: bool = True,
) -> Path:
    """Writes an F32 llama GGUF with seeded random weights to `path` and returns the path.

    Feed-forward width is 2 * n_embd, 4 heads and 2 kv heads. With `tied`, there is no
    output.weight and llama.cpp reuses token_embd.weight as the head. ValueError for options
    the writer refuses (n_embd not a positive multiple of 8, n_vocab < 31, n_layer < 1).
    """
    path = Path(path)
    proc = subprocess.run([str(writer()), str(path), f"--n_layer={n_layer}", f"--n_embd={n_embd}",
                           f"--n_vocab={n_vocab}", f"--seed={seed}", f"--tied={int(tied)}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip() or f"tiny_llama_writer exited {proc.returncode}")
    return path
