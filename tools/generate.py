"""The pinned llama.cpp alone, single process, for comparison with the swarm's output:

  tools/bazel run //tools:generate -- [--threads N] [--max-tokens 48] [--device vulkan0] [PROMPT]

Tokenizes PROMPT with the GGUF's own tokenizer (as `swarm` does), runs `//cpp/engine:greedy`
(the whole model, upstream behaviour, N compute threads) and prints the text, cut at the end of
generation, then a last line in the swarm's format: tokens, TTFT and decode tok/s. The default
thread count is half the cores (at least 1, at most 8): more threads than cores makes ggml's
spinning barriers crawl. `--device vulkan0` runs the whole model on Vulkan instead
(//cpp/engine:greedy_vulkan): the reference a `swarm --device vulkan0` must equal (ADR 0014).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from meshnet.text.tokenizer import GgufTokenizer


def default_threads() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="*", default=["The capital of France is"])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--greedy-binary", type=Path, required=True)
    parser.add_argument("--greedy-vulkan-binary", type=Path, help=argparse.SUPPRESS)  # set by bazel run
    parser.add_argument("--device", default="cpu", help="cpu, or a Vulkan device (vulkan0, ...)")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= 256:
        parser.error("--threads must be in 1..256")
    if not 1 <= args.max_tokens <= 4096:
        parser.error("--max-tokens must be in 1..4096")
    greedy, device_flags = args.greedy_binary, []
    if args.device != "cpu":
        if not args.device.startswith("vulkan") or args.greedy_vulkan_binary is None:
            parser.error(f"--device {args.device}: this tool runs cpu or vulkanN (bazel run sets the Vulkan greedy)")
        greedy, device_flags = args.greedy_vulkan_binary, ["--device", args.device]
    prompt = " ".join(args.prompt)
    tokenizer = GgufTokenizer.from_gguf(args.gguf)
    ids = tokenizer.encode(prompt)
    proc = subprocess.run([str(greedy), *device_flags, str(args.gguf), str(args.max_tokens), *map(str, ids)],
                          capture_output=True, text=True, env=dict(os.environ, MESHNET_THREADS=str(args.threads)))
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr, end="")
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    tokens = result["tokens"]
    stops = set(tokenizer.stop_token_ids)
    shown = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    print(prompt + tokenizer.decode(tokens[:shown]))
    where = "" if args.device == "cpu" else f" on {args.device}"
    print(f"[{len(tokens)} tokens, single-process llama.cpp{where}, {args.threads} threads | "
          f"TTFT {result['ttft_ms']:.0f} ms | decode {result['decode_tok_s']:.1f} tok/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
