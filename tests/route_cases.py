"""What both route tests (reference and GGUF) run: the prompts, the token count, and one
greedy generation through a RouteSession."""

from __future__ import annotations

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
