"""Seeded random-weight GGUF models made with the pinned converter, built once and cached outside
the repository: a ~1.1B dense Llama (issue 16: a model no single node can hold, on a machine
without one) and tiny Qwen3 and Qwen3-MoE fixtures (issue 18: the architecture adapters' parity).

  tools/bazel run //tools:synthetic_model -- [--recipe llama-1.1b] [--cache DIR] [--seed 0] [--json]

Recipes (RECIPES below, the chosen one recorded beside the file):
  1. A Transformers config of the recipe's shape, the bundled SmolLM2's vocabulary (49152 tokens;
     its tokenizer is saved with the model), tied embeddings, random weights from
     `torch.manual_seed(seed)` with Transformers' initialisation (its default scale for
     llama-1.1b, a wider one for the tiny fixtures), saved in the recipe's dtype.
  2. The pinned llama.cpp's `convert_hf_to_gguf.py` to a GGUF of the recipe's `outtype`.
  3. Where the recipe quantizes: the pinned `llama-quantize` (llama-1.1b: Q4_0, about 600 MiB).
     The tiny fixtures stay F32 (about 55 MiB), so Transformers fp32 runs the very weights.
The result is `<cache>/synthetic-<recipe>-s<seed>-<type>.gguf`, with `.json` beside it holding
the recipe and the file's sha256. A later call whose recipe matches and whose file still hashes
to the recorded sha256 reuses it; anything else rebuilds. Intermediate files go to a temporary
folder that is removed. Progress goes to stderr; the last stdout line is the JSON record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

_SMOLLM2_VOCABULARY = "bundled SmolLM2-135M-Instruct"
# The tiny fixtures draw weights from N(0, 0.1) rather than Transformers' default N(0, 0.02): at
# 0.02 a 6-layer model of width 256 greedily repeats one token whatever the prompt, which would
# make parity checks blind; at 0.1 its greedy continuations are all different tokens.
_WIDE_INIT = {"initializer_range": 0.1, "init": "normal(0, initializer_range)"}
RECIPES = {
    "llama-1.1b": {
        "architecture": "llama", "num_hidden_layers": 22, "hidden_size": 2048, "intermediate_size": 5632,
        "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
        "tie_word_embeddings": True, "vocabulary": _SMOLLM2_VOCABULARY, "init": "transformers default",
        "saved_dtype": "float16", "converter": "convert_hf_to_gguf.py (pinned llama.cpp) --outtype f16",
        "quantization": "Q4_0",
    },
    # Qwen3 dense: Llama's layer with RMS norms on the per-head queries and keys.
    "qwen3-tiny": {
        "architecture": "qwen3", "num_hidden_layers": 6, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
        "tie_word_embeddings": True, "vocabulary": _SMOLLM2_VOCABULARY, **_WIDE_INIT,
        "saved_dtype": "float32", "converter": "convert_hf_to_gguf.py (pinned llama.cpp) --outtype f32",
        "quantization": "none",
    },
    # Qwen3-MoE: 8 routed experts per layer, 2 used per token, every layer sparse.
    "qwen3moe-tiny": {
        "architecture": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": 4096, "tie_word_embeddings": True, "vocabulary": _SMOLLM2_VOCABULARY,
        **_WIDE_INIT, "saved_dtype": "float32",
        "converter": "convert_hf_to_gguf.py (pinned llama.cpp) --outtype f32", "quantization": "none",
    },
}
# Config fields of each recipe (the rest describe how it is made).
_DESCRIPTIVE = {"architecture", "vocabulary", "init", "saved_dtype", "converter", "quantization"}
RECIPE = RECIPES["llama-1.1b"]  # the default (issue 16's model)
# The user's cache, from the password database: tests run with HOME pointing elsewhere.
DEFAULT_CACHE = Path(os.environ.get("MESHNET_MODEL_CACHE") or
                     Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "meshnet" / "models")


def log(message: str, started: float) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_record(path: Path, recipe: dict, started: float) -> Optional[dict]:
    """The record beside `path` when it names `recipe` and the file still hashes to its sha256;
    None (after saying why) when the model must be built."""
    record_path = path.with_suffix(".json")
    if not (path.exists() and record_path.exists()):
        return None
    record = json.loads(record_path.read_text())
    if record.get("recipe") == recipe:
        log(f"checking the cached {path.name}", started)
        if sha256(path) == record.get("sha256"):
            log("cached model matches its recorded sha256", started)
            return record
    log("cached model does not match its record: rebuilding", started)
    return None


def write_hf_model(out: Path, tokenizer_gguf: Path, seed: int, recipe: dict) -> int:
    """Step 1; the parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from meshnet.reference.model import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_gguf)
    tokenizer.save_pretrained(out)
    shape = {k: v for k, v in recipe.items() if k not in _DESCRIPTIVE}
    config = AutoConfig.for_model(recipe["architecture"], vocab_size=len(tokenizer),
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, recipe["saved_dtype"]))
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def convert(hf_dir: Path, out: Path, converter: Path, outtype: str) -> None:
    """Step 2: the pinned converter, with its own conversion/ and gguf-py on the path."""
    repo = converter.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(repo / "gguf-py"), *sys.path]))
    proc = subprocess.run([sys.executable, str(converter), str(hf_dir), "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def quantize(quantizer: Path, f16: Path, out: Path, kind: str, threads: int) -> None:
    """Step 3."""
    proc = subprocess.run([str(quantizer), str(f16), str(out), kind, str(threads)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def file_type(recipe: dict) -> str:
    """The GGUF's weight type as the file name spells it (q4_0, f32, ...)."""
    if recipe["quantization"] != "none":
        return recipe["quantization"].lower()
    return recipe["converter"].rsplit("--outtype ", 1)[1]


def writable(cache: Path) -> bool:
    """Whether this process may create files in `cache`, or, before it exists, in its nearest
    existing parent (Bazel's sandbox shows the home folder read-only: tests build elsewhere)."""
    folder = cache
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def build(cache: Path, seed: int, tokenizer_gguf: Path, converter: Path, quantizer: Optional[Path],
          recipe_name: str = "llama-1.1b") -> dict:
    """The record of the cached model, building it first unless a matching one is there."""
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    base = RECIPES[recipe_name]
    kind = file_type(base)
    path = cache / f"synthetic-{recipe_name}-s{seed}-{kind}.gguf"
    record_path = path.with_suffix(".json")
    recipe = dict(base, seed=seed)
    cached = cached_record(path, recipe, started)
    if cached is not None:
        return cached
    quantized = base["quantization"] != "none"
    steps = 3 if quantized else 2
    with tempfile.TemporaryDirectory(prefix="meshnet-synthetic-", dir=cache) as tmp:
        work = Path(tmp)
        log(f"1/{steps} random {base['architecture']} weights (Transformers, seeded)", started)
        params = write_hf_model(work / "hf", tokenizer_gguf, seed, base)
        outtype = base["converter"].rsplit("--outtype ", 1)[1]
        log(f"    {params / 1e9:.3f}B parameters written; 2/{steps} convert_hf_to_gguf.py to {outtype}", started)
        partial = work / path.name
        converted = work / f"model-{outtype}.gguf" if quantized else partial
        convert(work / "hf", converted, converter, outtype)
        if quantized:
            if quantizer is None:
                raise ValueError(f"recipe {recipe_name} quantizes: it needs llama-quantize")
            log(f"3/3 llama-quantize to {base['quantization']}", started)
            quantize(quantizer, converted, partial, base["quantization"], max(1, os.cpu_count() or 1))
        digest = sha256(partial)
        os.replace(partial, path)  # same filesystem (the temporary folder is inside the cache)
    record = {"path": str(path), "bytes": path.stat().st_size, "sha256": digest, "parameters": params,
              "recipe": recipe, "build_seconds": round(time.monotonic() - started, 1)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    log(f"wrote {path} ({record['bytes'] / 2**20:.0f} MiB, sha256 {digest[:16]}...)", started)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"default: {DEFAULT_CACHE}")
    parser.add_argument("--recipe", default="llama-1.1b", choices=sorted(RECIPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-gguf", type=Path, required=True, help="the GGUF whose vocabulary to use")
    parser.add_argument("--converter", type=Path, required=True, help="the pinned convert_hf_to_gguf.py")
    parser.add_argument("--quantize", type=Path, required=True, help="the pinned llama-quantize")
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        parser.error("--seed must be in 0..2^32-1")
    record = build(args.cache.resolve(), args.seed, args.tokenizer_gguf.resolve(), args.converter.resolve(),
                   args.quantize.resolve(), args.recipe)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
