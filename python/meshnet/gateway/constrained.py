"""The grammar a chat request's tokens are sampled under on the last hop (issue 33), or None.

- `response_format` {"type": "json_object"}: any JSON object; {"type": "json_schema",
  "json_schema": {"name", "schema", "strict"?}}: the schema (json_grammar.py's subset; a part it
  cannot honour is a 400 naming `response_format.json_schema.schema` and the part's pointer).
- `tool_choice` "required" or a named function: the answer is tool calls in the model's family
  syntax (tool_calls.py), each call's arguments valid against its function's parameters. A named
  function gets exactly one call of it; "required" gets one call of any offered function, or up
  to MAX_TOOL_CALLS when parallel_tool_calls is not false.
- `tool_choice` "auto" with a JSON response_format is refused (400): the answer would have to be
  either a call or the JSON, and one grammar for both is not built here. "none" leaves the tools
  out, so response_format applies.

Calls are written as the family's parser reads them: hermes `<tool_call>\\n{call}\\n</tool_call>`
blocks separated by a newline; llama3 `{"name", "parameters"}` objects separated by "; "; mistral
`[TOOL_CALLS]` and a JSON list; generic `{"tool_calls": [...]}`. The call objects are one JSON
schema (an anyOf of one object per function, name as a const), converted once; each function's
`$defs`/`definitions` are hoisted under a prefix of its index and the keyword (`f0-defs-A`,
`f0-definitions-A`), so that neither two functions' definitions nor one function's `#/$defs/A` and
`#/definitions/A` can collide.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from meshnet.gateway.errors import bad_request
from meshnet.gateway.grammar.json_grammar import MAX_PROPERTIES, SchemaRefused, json_object_grammar, schema_grammar
from meshnet.gateway.tool_calls import MAX_TOOL_CALLS, ToolCallFamily
from meshnet.gateway.tool_request import MAX_TOOLS

_CALL = "tool-call-json"  # the root of the call objects' grammar, renamed (json_grammar never uses it)
# The call objects together: each function's parameters alone stay within json_grammar's
# MAX_PROPERTIES; together they may hold four times that, plus "name" and "arguments" per
# function (the rules and grammar-size bounds still apply to the whole).
MAX_CALL_PROPERTIES = 4 * MAX_PROPERTIES + 2 * MAX_TOOLS


def response_format_grammar(value: Any) -> Optional[str]:
    """The grammar of a checked response_format (tool_request.check_response_format), None for text."""
    if value is None or value.get("type") == "text":
        return None
    if value["type"] == "json_object":
        return json_object_grammar()
    schema = value["json_schema"].get("schema", {})
    try:
        return schema_grammar(schema)
    except SchemaRefused as err:
        raise bad_request(f"response_format.json_schema.schema: {err.message}", "response_format") from None


def tool_call_grammar(family: ToolCallFamily, tools: tuple[dict, ...], named: Optional[str],
                      parallel: bool) -> str:
    """The grammar of an answer that is only tool calls (see the module)."""
    offered = [tool["function"] for tool in tools if named is None or tool["function"]["name"] == named]
    for function in offered:  # each alone first, so that a refusal names its function and part
        try:
            schema_grammar(function["parameters"])
        except SchemaRefused as err:
            raise bad_request(f"tools: function {function['name']!r} parameters: {err.message}", "tools") from None
    arguments_key = "parameters" if family is ToolCallFamily.LLAMA3 else "arguments"
    defs: dict[str, Any] = {}
    options = []
    for index, function in enumerate(offered):
        parameters = _hoisted(function["parameters"], f"f{index}-", defs)
        options.append({"type": "object", "properties": {"name": {"const": function["name"]},
                                                         arguments_key: parameters},
                        "required": ["name", arguments_key], "additionalProperties": False})
    call: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    most = MAX_TOOL_CALLS if parallel and named is None else 1
    if family is ToolCallFamily.GENERIC:
        answer = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1,
                                                                  "maxItems": most}},
                  "required": ["tool_calls"], "additionalProperties": False}
        return _converted(answer, defs, "root")
    if family is ToolCallFamily.MISTRAL:
        listed = {"type": "array", "items": call, "minItems": 1, "maxItems": most}
        return _converted(listed, defs, _CALL) + f'\nroot ::= "[TOOL_CALLS]" {_CALL}\n'
    grammar = _converted(call, defs, _CALL)
    if family is ToolCallFamily.HERMES:
        block = f'"<tool_call>\\n" {_CALL} "\\n</tool_call>"'
        return grammar + f'\nroot ::= {block}' + (f' ("\\n" {block}){{0,{most - 1}}}\n' if most > 1 else "\n")
    return grammar + f"\nroot ::= {_CALL}" + (f' ("; " {_CALL}){{0,{most - 1}}}\n' if most > 1 else "\n")


def _hoisted(parameters: dict, prefix: str, defs: dict[str, Any]) -> dict:
    """`parameters` without its $defs/definitions, which go into `defs` under `prefix` and the
    keyword, and its local $refs pointed at them. Depth and size were bounded by tool_request."""
    out = copy.deepcopy(parameters)
    for key in ("$defs", "definitions"):
        for name, target in (out.pop(key, None) or {}).items():
            defs[f"{prefix}{key.lstrip('$')}-{name}"] = target
    stack: list[Any] = [out, *(defs[name] for name in defs if name.startswith(prefix))]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                for key in ("$defs", "definitions"):
                    if ref.startswith(f"#/{key}/"):
                        node["$ref"] = f"#/$defs/{prefix}{key.lstrip('$')}-{ref[len(key) + 3:]}"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _converted(schema: dict, defs: dict[str, Any], root: str) -> str:
    whole = dict(schema, **({"$defs": defs} if defs else {}))
    try:
        grammar = schema_grammar(whole, MAX_CALL_PROPERTIES)
    except SchemaRefused as err:  # each function converted alone: the calls together are over a bound
        raise bad_request(f"tools: the calls' grammar together: {err.message}", "tools") from None
    if root == "root":
        return grammar
    lines = grammar.splitlines()
    renamed = [f"{root} ::={line[len('root ::='):]}" if line.startswith("root ::=") else line for line in lines]
    return "\n".join(renamed)


def grammar_for(body: Any, plan: Any) -> str:
    """The grammar of a checked ChatRequest whose tool plan (tool_use.plan_for) is `plan`: tool
    calls when they are forced, else its response_format's; "" when neither constrains it."""
    if plan is not None and plan.request.forced:
        request = plan.request
        return tool_call_grammar(plan.family, request.tools, request.named, request.parallel)
    value = body.response_format if body.response_format not in ([], {}) else None
    grammar = response_format_grammar(value)
    if grammar is not None and plan is not None:
        raise bad_request(f'response_format {{"type": "{value["type"]}"}} with tool_choice "auto" is not served: the '
                          'answer would be either tool calls or that JSON; use tool_choice "required", a named '
                          'function or "none"', "response_format")
    return grammar or ""
