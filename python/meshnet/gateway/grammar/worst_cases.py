"""The worst grammars the bounds admit (issue 55), shared by the bench's lanes that measure what
they cost an honest neighbour, the chaos soak's attacker and the tests that reproduce the attacks.

- `EXPONENTIAL_GBNF`: what a client-role ticket holder can send as raw GBNF. 300 one-character
  alternatives, repeated (6 KB, inside every bound of llama.cpp patch 0013): masking a token tries
  each stack against what the others rejected at every character, so a draw's work grows as
  300^(token length); every draw runs to the last hop's sampling budget (patch 0014).
- `enum_ways_schema(each)`: what an API key can send through the JSON-schema converter. An array
  whose every item starts as one of 4 x `each` enum values sharing a long prefix, each holding a
  parse stack of its own: `each=250` is the converter's bound (MAX_ENUM_WAYS, 1,000),
  `each=256` is past it and refused.
"""

from __future__ import annotations

_ALTERNATIVES = 300
EXPONENTIAL_GBNF = ("root ::= (" + " | ".join(f"a{i}" for i in range(_ALTERNATIVES)) + ")*\n" +
                    "".join(f"a{i} ::= [ -~]\n" for i in range(_ALTERNATIVES)))


def enum_ways_schema(each: int = 250, min_items: int = 0) -> dict:
    """An array of items that are each one of 4 enums of `each` values sharing a prefix."""
    schema: dict = {"type": "array", "items": {"anyOf": [
        {"enum": [f"every-value-shares-this-prefix-{k}{i:03d}" for i in range(each)]} for k in range(4)]}}
    if min_items:
        schema["minItems"] = min_items
    return schema
