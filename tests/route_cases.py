"""What the route tests (reference and GGUF, faults) share: the prompts, the token count, one
greedy generation through a RouteSession, and single-process llama.cpp's greedy tokens."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Sequence

from meshnet.client.session import GenerationParams, RouteSession

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Water boils at",
    "List three primary colors:",
]
MORE_PROMPTS = ["Once upon a time", "The largest planet is", "1, 2, 3, 4,"]  # for 8 concurrent sessions
TOKENS = 64  # greedy tokens per parity prompt


def generate(tracker, tokenizer, prompt: str, tokens: int = TOKENS) -> list[int]:
    session = RouteSession(tracker, "smollm2")
    return list(session.generate(tokenizer(prompt)["input_ids"], GenerationParams(max_tokens=tokens)))


def llama_cpp_greedy(greedy_binary: Path, gguf: Path, prompt_ids: Sequence[int], tokens: int) -> list[int]:
    """The whole model's greedy tokens in one llama.cpp process (//cpp/engine:greedy: no layer
    range, upstream behaviour), the baseline a route must match token for token."""
    proc = subprocess.run([str(greedy_binary), str(gguf), str(tokens), *map(str, prompt_ids)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["tokens"]
