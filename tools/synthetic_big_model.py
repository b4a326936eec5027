"""A seeded synthetic model of Llama-3-8B's shape at Q4_0, written tensor by tensor: at no point
does any copy of the model (fp32, fp16 or quantized) sit in memory, only ROWS rows of one tensor
(issue 29: a model whose fp32 form, ~32 GB, exceeds this machine's memory).

  tools/bazel run //tools:synthetic_big_model -- --tokenizer-gguf /abs/smollm2.gguf [--cache DIR] [--seed 0]

The shape (SHAPE below): 32 layers, width 4096, FFN 14336, 32 query heads and 8 KV heads of
128, RoPE base 500000, RMS norm epsilon 1e-5, an untied output head, and the bundled SmolLM2
vocabulary (49152 tokens; every `tokenizer.*` pair of --tokenizer-gguf copied). Weights: N(0,
0.02) (Transformers' initialisation scale), from numpy's PCG64 seeded with (seed, the tensor's
index), generated ROWS rows at a time and quantized to Q4_0 by gguf-py's quantizer; norm weights
are ones (F32). About 8.0B parameters, 4.5 GB.

Written through a temporary file beside the result, then renamed:
`<cache>/synthetic-llama-8b-s<seed>-q4_0.gguf`, with `.json` beside it holding the recipe, the
parameter count and the file's sha256 (tools/synthetic_model.py's cache and record). A later
call whose recipe matches and whose file still hashes to the record reuses it. Progress goes to
stderr; the last stdout line is the JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from synthetic_model import DEFAULT_CACHE, cached_record, log, sha256

RECIPE_NAME = "llama-8b"
SHAPE = {"n_layer": 32, "n_embd": 4096, "n_ff": 14336, "n_head": 32, "n_head_kv": 8, "context_length": 8192,
         "rope_freq_base": 500000.0, "rms_eps": 1e-5, "tied_embeddings": False}
INIT_STD = 0.02
ROWS = 256  # rows of one tensor generated and quantized at a time
Q4_0_FILE_TYPE = 2  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_0


def recipe(seed: int) -> dict:
    return {**SHAPE, "architecture": "llama", "vocabulary": "bundled SmolLM2-135M-Instruct",
            "init": f"normal(0, {INIT_STD}) per tensor from PCG64(seed, tensor index); norms ones",
            "quantization": "Q4_0 (gguf-py), norms F32", "seed": seed}


def tensor_plan(n_vocab: int) -> list[tuple[str, tuple[int, int] | tuple[int], bool]]:
    """(name, numpy shape (rows, columns), quantized) in file order."""
    d, ff, kv = SHAPE["n_embd"], SHAPE["n_ff"], SHAPE["n_embd"] // SHAPE["n_head"] * SHAPE["n_head_kv"]
    plan: list = [("token_embd.weight", (n_vocab, d), True)]
    for i in range(SHAPE["n_layer"]):
        plan += [(f"blk.{i}.attn_norm.weight", (d,), False), (f"blk.{i}.attn_q.weight", (d, d), True),
                 (f"blk.{i}.attn_k.weight", (kv, d), True), (f"blk.{i}.attn_v.weight", (kv, d), True),
                 (f"blk.{i}.attn_output.weight", (d, d), True), (f"blk.{i}.ffn_norm.weight", (d,), False),
                 (f"blk.{i}.ffn_gate.weight", (ff, d), True), (f"blk.{i}.ffn_up.weight", (ff, d), True),
                 (f"blk.{i}.ffn_down.weight", (d, ff), True)]
    plan += [("output_norm.weight", (d,), False), ("output.weight", (n_vocab, d), True)]
    return plan


def write_model(path: Path, tokenizer_gguf: Path, seed: int, started: float) -> int:
    """Writes the GGUF at `path`; the parameter count."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    source = gguf.GGUFReader(tokenizer_gguf)
    n_vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"synthetic Llama-3-8B shape, seed {seed}")
    writer.add_context_length(SHAPE["context_length"])
    writer.add_embedding_length(SHAPE["n_embd"])
    writer.add_block_count(SHAPE["n_layer"])
    writer.add_feed_forward_length(SHAPE["n_ff"])
    writer.add_head_count(SHAPE["n_head"])
    writer.add_head_count_kv(SHAPE["n_head_kv"])
    writer.add_rope_dimension_count(SHAPE["n_embd"] // SHAPE["n_head"])
    writer.add_rope_freq_base(SHAPE["rope_freq_base"])
    writer.add_layer_norm_rms_eps(SHAPE["rms_eps"])
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(Q4_0_FILE_TYPE)
    for name, field in source.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), value_type, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), value_type)
    plan = tensor_plan(n_vocab)
    for name, shape, quantized in plan:
        if quantized:
            byte_shape = quants.quant_shape_to_byte_shape(shape, GGMLQuantizationType.Q4_0)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                   raw_dtype=GGMLQuantizationType.Q4_0)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    parameters, shown = 0, 0.0
    for index, (name, shape, quantized) in enumerate(plan):
        parameters += int(np.prod(shape))
        if not quantized:
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        rng = np.random.Generator(np.random.PCG64([seed, index]))
        chunks = []
        for first in range(0, shape[0], ROWS):
            rows = rng.standard_normal((min(ROWS, shape[0] - first), shape[1]), dtype=np.float32)
            rows *= INIT_STD
            chunks.append(quants.quantize(rows, GGMLQuantizationType.Q4_0))
        writer.write_tensor_data(np.concatenate(chunks))  # one tensor's Q4_0 bytes (at most ~0.2 GB)
        if time.monotonic() - shown > 5 or index + 1 == len(plan):
            shown = time.monotonic()
            log(f"    {index + 1}/{len(plan)} tensors, {parameters / 1e9:.2f}B parameters written", started)
    writer.close()
    return parameters


def build(cache: Path, seed: int, tokenizer_gguf: Path) -> dict:
    """The record of the cached model, writing it first unless a matching one is there."""
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"synthetic-{RECIPE_NAME}-s{seed}-q4_0.gguf"
    record_path = path.with_suffix(".json")
    wanted = recipe(seed)
    cached = cached_record(path, wanted, started)
    if cached is not None:
        return cached
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        log(f"writing {path.name} tensor by tensor (Q4_0, seed {seed})", started)
        parameters = write_model(partial, tokenizer_gguf, seed, started)
        digest = sha256(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    record = {"path": str(path), "bytes": path.stat().st_size, "sha256": digest, "parameters": parameters,
              "recipe": wanted, "build_seconds": round(time.monotonic() - started, 1)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    log(f"wrote {path} ({record['bytes'] / 2**30:.2f} GiB, sha256 {digest[:16]}...)", started)
    return record


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"default: {DEFAULT_CACHE}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-gguf", type=Path, required=True, help="the GGUF whose vocabulary to copy")
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        parser.error("--seed must be in 0..2^32-1")
    if not args.tokenizer_gguf.is_file():
        parser.error(f"--tokenizer-gguf {args.tokenizer_gguf}: no such file")
    print(json.dumps(build(args.cache.resolve(), args.seed, args.tokenizer_gguf.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
