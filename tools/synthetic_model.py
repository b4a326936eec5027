"""A synthetic dense Llama of about 1.1B parameters as a Q4_0 GGUF, seeded, built once and cached
outside the repository (issue 16: a model no single node can hold, on a machine without one).

  tools/bazel run //tools:synthetic_model -- [--cache DIR] [--seed 0] [--json]

Recipe (RECIPE below, recorded beside the file):
  1. Transformers `LlamaConfig` of TinyLlama-1.1B's shape (22 layers, hidden 2048, MLP 5632, 32
     heads, 4 KV heads), the bundled SmolLM2's vocabulary (49152 tokens; its tokenizer is saved
     with the model), tied embeddings, random weights from `torch.manual_seed(seed)`, saved f16.
  2. The pinned llama.cpp's `convert_hf_to_gguf.py` to an f16 GGUF.
  3. The pinned `llama-quantize` to Q4_0 (about 600 MiB).
The result is `<cache>/synthetic-llama-1.1b-s<seed>-q4_0.gguf`, with `.json` beside it holding
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

RECIPE = {
    "architecture": "llama", "num_hidden_layers": 22, "hidden_size": 2048, "intermediate_size": 5632,
    "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
    "tie_word_embeddings": True, "vocabulary": "bundled SmolLM2-135M-Instruct", "init": "transformers default",
    "saved_dtype": "float16", "converter": "convert_hf_to_gguf.py (pinned llama.cpp) --outtype f16",
    "quantization": "Q4_0",
}
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


def write_hf_model(out: Path, tokenizer_gguf: Path, seed: int) -> int:
    """Step 1; the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from meshnet.reference.model import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_gguf)
    tokenizer.save_pretrained(out)
    shape = {k: RECIPE[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings")}
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **shape)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def convert(hf_dir: Path, out: Path, converter: Path) -> None:
    """Step 2: the pinned converter, with its own conversion/ and gguf-py on the path."""
    repo = converter.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(repo / "gguf-py"), *sys.path]))
    proc = subprocess.run([sys.executable, str(converter), str(hf_dir), "--outfile", str(out), "--outtype", "f16"],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def quantize(quantizer: Path, f16: Path, out: Path, threads: int) -> None:
    """Step 3."""
    proc = subprocess.run([str(quantizer), str(f16), str(out), "Q4_0", str(threads)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def build(cache: Path, seed: int, tokenizer_gguf: Path, converter: Path, quantizer: Path) -> dict:
    """The record of the cached model, building it first unless a matching one is there."""
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"synthetic-llama-1.1b-s{seed}-q4_0.gguf"
    record_path = path.with_suffix(".json")
    recipe = dict(RECIPE, seed=seed)
    if path.exists() and record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("recipe") == recipe:
            log(f"checking the cached {path.name}", started)
            if sha256(path) == record.get("sha256"):
                log("cached model matches its recorded sha256", started)
                return record
        log("cached model does not match its record: rebuilding", started)
    with tempfile.TemporaryDirectory(prefix="meshnet-synthetic-", dir=cache) as tmp:
        work = Path(tmp)
        log("1/3 random Llama weights (Transformers, seeded)", started)
        params = write_hf_model(work / "hf", tokenizer_gguf, seed)
        log(f"    {params / 1e9:.3f}B parameters written; 2/3 convert_hf_to_gguf.py to f16", started)
        convert(work / "hf", work / "model-f16.gguf", converter)
        log("3/3 llama-quantize to Q4_0", started)
        partial = work / path.name
        quantize(quantizer, work / "model-f16.gguf", partial, max(1, os.cpu_count() or 1))
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-gguf", type=Path, required=True, help="the GGUF whose vocabulary to use")
    parser.add_argument("--converter", type=Path, required=True, help="the pinned convert_hf_to_gguf.py")
    parser.add_argument("--quantize", type=Path, required=True, help="the pinned llama-quantize")
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        parser.error("--seed must be in 0..2^32-1")
    record = build(args.cache.resolve(), args.seed, args.tokenizer_gguf.resolve(), args.converter.resolve(),
                   args.quantize.resolve())
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
