"""The gateway's grammars through llama.cpp's own grammar parser and sampler (issue 33), as the
last hop runs them: //cpp/engine/sampler:grammar_check over the bundled model's vocabulary.

- Every grammar json_grammar writes for the shared cases parses; each valid document, tokenized
  by the model's tokenizer, is accepted token by token and leaves the grammar complete; no
  invalid document is both (a truncated one is accepted but incomplete, others are refused).
- The forced tool-call grammars of every family accept what the family's parser reads.
- Grammars at the converter's bounds (a $ref fan-out, 1024-item arrays, 256-value enums, awkward
  and long property names beside extra members, 64 tools) compile and sample without stalling
  the last hop: the figures are printed, and a stall guard (seconds, not a performance claim)
  fails the test if one hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from meshnet.gateway.constrained import tool_call_grammar
from meshnet.gateway.grammar.json_grammar import json_object_grammar, schema_grammar
from meshnet.gateway.grammar.json_grammar_cases import (NAMES, STRICT, STRICT_INVALID, STRICT_VALID, Ticket, fan_out, forms,
                                                ticket_invalid, ticket_variants)
from meshnet.gateway.grammar.worst_cases import enum_ways_schema
from meshnet.text.tokenizer import GgufTokenizer
from meshnet.gateway.tool_calls import ToolCallFamily

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"])
TOOL = Path(os.environ["MESHNET_GRAMMAR_CHECK"])
STALL_MS = 20_000  # a guard against a hang, far above any figure seen; never a performance claim


@pytest.fixture(scope="module")
def tokenizer():
    return GgufTokenizer.from_gguf(GGUF)


def check(grammar: str, texts: list[str], tokenizer, draws: int = 0) -> tuple[dict, list[dict], dict]:
    """grammar_check's compile line, one result per text, and the draws line (when asked)."""
    with tempfile.NamedTemporaryFile("w", suffix=".gbnf") as f:
        f.write(grammar)
        f.flush()
        lines = "".join(" ".join(map(str, tokenizer.encode(text, add_bos=False, special=False))) + "\n"
                        for text in texts)
        proc = subprocess.run([str(TOOL), str(GGUF), f.name, f"--draws={draws}", "--seed=7"], input=lines,
                              capture_output=True, text=True, timeout=STALL_MS / 1000 * 3)
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, (proc.stderr[-2000:], out[:1])
    compiled, results = out[0], out[1:1 + len(texts)]
    assert compiled["compile_ms"] < STALL_MS
    return compiled, results, (out[1 + len(texts)] if draws else {})


def passes(result: dict) -> bool:
    return result["accepted"] and result["complete"]


def test_llama_cpp_enforces_the_strict_schema(tokenizer):
    valid = [text for doc in STRICT_VALID for text in forms(doc)]
    invalid = [(label, text) for label, doc in STRICT_INVALID for text in forms(doc)]
    _, results, _ = check(schema_grammar(STRICT), valid + [text for _, text in invalid], tokenizer)
    for text, result in zip(valid, results):
        assert passes(result), (text, result)
    for (label, text), result in zip(invalid, results[len(valid):]):
        assert not passes(result), (label, text)


def test_llama_cpp_enforces_a_pydantic_model(tokenizer):
    valid = ticket_variants()
    invalid = ticket_invalid()
    _, results, _ = check(schema_grammar(Ticket.model_json_schema()), valid + [t for _, t in invalid], tokenizer)
    for text, result in zip(valid, results):
        assert passes(result), (text, result)
    for (label, text), result in zip(invalid, results[len(valid):]):
        assert not passes(result), (label, text)
    truncated = valid[0][:-1]
    _, [cut], _ = check(schema_grammar(Ticket.model_json_schema()), [truncated], tokenizer)
    assert cut["accepted"] and not cut["complete"]


def test_literals_and_json_object(tokenizer):
    schema = {"type": "object", "properties": {name: {"const": name} for name in NAMES},
              "required": NAMES, "additionalProperties": False}
    doc = {name: name for name in NAMES}
    _, results, _ = check(schema_grammar(schema), forms(doc) + [json.dumps({**doc, "x": 1})], tokenizer)
    assert [passes(r) for r in results] == [True, True, True, False]
    _, results, draws = check(json_object_grammar(), ['{"a": [1, {"b": null}], "c": "d"}', "[1]", '{"a": 1'],
                              tokenizer, draws=64)
    assert [passes(r) for r in results] == [True, False, False]
    assert draws["choose_ms_max"] < STALL_MS


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("family,text", [
    (ToolCallFamily.GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'),
    (ToolCallFamily.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    (ToolCallFamily.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (ToolCallFamily.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
], ids=[f.value for f in ToolCallFamily])
def test_llama_cpp_takes_the_forced_call_grammars(tokenizer, family, text):
    _, [result, prose], _ = check(tool_call_grammar(family, (WEATHER,), None, True), [text, "It is sunny."],
                                  tokenizer)
    assert passes(result) and not prose["accepted"]


def tools(n: int) -> tuple[dict, ...]:
    return tuple({"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": ["string", "integer", "null"]} for j in range(3)},
        "required": ["p0"], "additionalProperties": False}}} for i in range(n))


AT_THE_BOUNDS = [
    ("$ref fan-out, 60 levels", lambda: schema_grammar(fan_out(60))),
    ("1024 items of 1024-character strings",
     lambda: schema_grammar({"type": "array", "maxItems": 1024, "items": {"type": "string", "maxLength": 1024}})),
    ("256-value enum", lambda: schema_grammar({"enum": [f"value-{n}" for n in range(256)]})),
    # Issue 55: MAX_ENUM_WAYS values to start an array's every item from (1,000 parse stacks).
    ("1,000 enum values sharing a prefix, per item", lambda: schema_grammar(enum_ways_schema(250))),
    ("long names beside extra members", lambda: schema_grammar(
        {"type": "object", "properties": {f"{n:03d}" + "x" * 200: {"type": "integer"} for n in range(16)}})),
    ("awkward names beside extra members",
     lambda: schema_grammar({"type": "object", "properties": {name: {} for name in NAMES}})),
    ("64 tools, required", lambda: tool_call_grammar(ToolCallFamily.HERMES, tools(64), None, True)),
]


@pytest.mark.parametrize("label,make", AT_THE_BOUNDS, ids=[a[0] for a in AT_THE_BOUNDS])
def test_grammars_at_the_bounds_compile_and_sample(tokenizer, label, make):
    grammar = make()
    compiled, _, draws = check(grammar, [], tokenizer, draws=48)
    print(f"{label}: {len(grammar)} bytes, compiled in {compiled['compile_ms']:.1f} ms, slowest of "
          f"{len(draws['tokens'])} draws {draws['choose_ms_max']:.1f} ms")
    assert draws["choose_ms_max"] < STALL_MS
