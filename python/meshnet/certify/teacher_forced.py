"""Teacher-forced agreement of llama.cpp with Transformers fp32 on the same weights.

The same token sequence goes to HF Transformers (fp32, weights dequantized from the GGUF) and to
llama.cpp (//cpp/engine:dump_logits: the whole model, which a shard chain reproduces bit-exactly);
per position, the two argmaxes are compared and KL(Transformers || llama.cpp) is taken over the
full vocabulary. What differs is the runtime against fp32 math: quantized matmuls, for which
llama.cpp quantizes the activations too (Q8_K rows against Q4_K weights).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from meshnet.certify.prompts import BENCH_TEXT
from meshnet.text.llama_cpp_tokenizer import LlamaCppTokenizer
from meshnet.reference.model import load_model

POSITIONS = 256


def sequence(tokenizer: LlamaCppTokenizer, positions: int = POSITIONS) -> list[int]:
    """The certification's teacher-forced tokens: the first `positions` of BENCH_TEXT."""
    ids = tokenizer.encode(BENCH_TEXT)[:positions]
    if len(ids) < positions:
        raise ValueError(f"the teacher-forcing text gives only {len(ids)} tokens")
    return ids


def llama_cpp_logits(dump_logits: Path, gguf: Path, ids: Sequence[int], flags: Sequence[str] = ()) -> torch.Tensor:
    """[len(ids), n_vocab] float32 logits of the whole model in one llama.cpp process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.f32"
        subprocess.run([str(Path(dump_logits).resolve()), *flags, str(gguf), str(out), *map(str, ids)], check=True,
                       capture_output=True)
        return torch.from_numpy(np.fromfile(out, dtype=np.float32).reshape(len(ids), -1))


def agreement(gguf: Path, dump_logits: Path, ids: Sequence[int], flags: Sequence[str] = ()) -> dict:
    """{"positions", "top1_agreement", "mean_kl_transformers_to_gguf", "max_kl"} over `ids`;
    `flags` go to dump_logits (its diagnostics)."""
    return agreements(gguf, dump_logits, ids, [flags])[0]


def agreements(gguf: Path, dump_logits: Path, ids: Sequence[int], flag_sets: Sequence[Sequence[str]]) -> list[dict]:
    """agreement() for each dump_logits flag set, with the Transformers reference computed once."""
    gguf = Path(gguf).resolve()
    with torch.no_grad():
        reference = load_model(gguf)(torch.tensor([list(ids)])).logits[0].float()
    return [compare(reference, llama_cpp_logits(dump_logits, gguf, ids, flags)) for flags in flag_sets]


def compare(reference: torch.Tensor, gguf_logits: torch.Tensor) -> dict:
    """Per position, argmax agreement and KL(reference || llama.cpp) over the full vocabulary."""
    if gguf_logits.shape != reference.shape:
        raise ValueError(f"logit shapes differ: Transformers {tuple(reference.shape)}, "
                         f"llama.cpp {tuple(gguf_logits.shape)}")
    p = torch.log_softmax(reference, dim=-1)
    q = torch.log_softmax(gguf_logits, dim=-1)
    kl = (p.exp() * (p - q)).sum(dim=-1)
    top1 = (reference.argmax(-1) == gguf_logits.argmax(-1)).float()
    return {"positions": reference.shape[0], "top1_agreement": round(float(top1.mean()), 4),
            "mean_kl_transformers_to_gguf": round(float(kl.mean()), 6) + 0.0, "max_kl": round(float(kl.max()), 4)}

