"""The pinned llama.cpp alone, single process, for comparison with the swarm's output:

  tools/bazel run //tools:generate -- [--threads N] [--max-tokens 48] [PROMPT]

Tokenizes PROMPT with the GGUF's own tokenizer (as `swarm` does), runs `//cpp/engine:greedy`
(the whole model, upstream behaviour, N compute threads) and prints the text, cut at the end of
generation, then a last line in the swarm's format: tokens, TTFT and decode tok/s. The default
thread count is half the cores (at least 1, at most 8): more threads than cores makes ggml's
spinning barriers crawl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from meshnet.gateway.tokenizer import GgufTokenizer


def default_threads() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="*", default=["The capital of France is"])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--greedy-binary", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= 256:
        parser.error("--threads must be in 1..256")
    if not 1 <= args.max_tokens <= 4096:
        parser.error("--max-tokens must be in 1..4096")
    prompt = " ".join(args.prompt)
    tokenizer = GgufTokenizer.from_gguf(args.gguf)
    ids = tokenizer.encode(prompt)
    proc = subprocess.run([str(args.greedy_binary), str(args.gguf), str(args.max_tokens), *map(str, ids)],
                          capture_output=True, text=True, env=dict(os.environ, MESHNET_THREADS=str(args.threads)))
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr, end="")
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    tokens = result["tokens"]
    stops = set(tokenizer.stop_token_ids)
    shown = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    print(prompt + tokenizer.decode(tokens[:shown]))
    print(f"[{len(tokens)} tokens, single-process llama.cpp, {args.threads} threads | "
          f"TTFT {result['ttft_ms']:.0f} ms | decode {result['decode_tok_s']:.1f} tok/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
