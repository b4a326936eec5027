"""Issue 33: the grammars a request is sampled under (constrained.py), read by the test-only GBNF
recognizer. Forced tool calls in each family's syntax match what that family's parser reads as
calls of the offered functions with valid arguments, and nothing else; a named function admits
only itself; $defs of two functions do not collide, nor one function's $defs and definitions;
response formats map to their grammars; refusals name the field and the part."""

from __future__ import annotations

import json

import pytest

from meshnet.gateway.grammar import json_grammar_matcher as gbnf
from meshnet.gateway.constrained import grammar_for, response_format_grammar, tool_call_grammar
from meshnet.gateway.errors import ApiError
from meshnet.gateway.grammar.json_grammar import json_object_grammar
from meshnet.gateway.tool_calls import ToolCallFamily, parse_tool_calls

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}}
ROUTE = {"type": "function", "function": {"name": "plan_route", "parameters": {
    "type": "object", "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"}, "maxItems": 3}},
    "required": ["stops"], "additionalProperties": False,
    "$defs": {"Stop": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                       "additionalProperties": False}}}}}
# The same $defs name with another meaning: hoisting must keep the two apart.
SCORE = {"type": "function", "function": {"name": "score", "parameters": {
    "type": "object", "properties": {"stop": {"$ref": "#/$defs/Stop"}}, "required": ["stop"],
    "additionalProperties": False, "$defs": {"Stop": {"type": "integer"}}}}}
TOOLS = (WEATHER, ROUTE, SCORE)

PARIS = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
TRIP = {"name": "plan_route", "arguments": {"stops": [{"name": "Lyon"}, {"name": "Nice"}]}}
RATED = {"name": "score", "arguments": {"stop": 4}}


def rendered(family: ToolCallFamily, calls: list[dict]) -> str:
    """Calls as the family writes them (what its parser reads)."""
    if family is ToolCallFamily.LLAMA3:
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)
    if family is ToolCallFamily.HERMES:
        return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
    if family is ToolCallFamily.MISTRAL:
        return "[TOOL_CALLS]" + json.dumps(calls)
    return json.dumps({"tool_calls": calls})


@pytest.mark.parametrize("family", list(ToolCallFamily), ids=[f.value for f in ToolCallFamily])
def test_forced_calls_match_what_the_family_parser_reads(family):
    grammar = gbnf.parse(tool_call_grammar(family, TOOLS, None, parallel=True))
    for calls in ([PARIS], [TRIP], [RATED], [PARIS, TRIP, RATED]):
        text = rendered(family, calls)
        assert grammar.matches(text), text
        parsed = parse_tool_calls(family, text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == \
            [(c["name"], c["arguments"]) for c in calls]
    wrong = [
        [{"name": "get_time", "arguments": {}}],  # not offered
        [{"name": "get_weather", "arguments": {"town": "Paris"}}],  # not its parameter
        [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "k"}}],  # outside the enum
        [{"name": "get_weather", "arguments": {"city": "P" * 21}}],  # over maxLength
        [{"name": "score", "arguments": {"stop": {"name": "Lyon"}}}],  # the other function's Stop
        [{"name": "plan_route", "arguments": {"stops": [{"name": "a"}] * 4}}],  # over maxItems
    ]
    for calls in wrong:
        assert not grammar.matches(rendered(family, calls)), calls
    assert not grammar.matches("The weather is fine.")  # forced: no answer in text
    assert not grammar.matches(rendered(family, []))


@pytest.mark.parametrize("family", list(ToolCallFamily), ids=[f.value for f in ToolCallFamily])
def test_a_named_function_admits_one_call_of_itself_only(family):
    grammar = gbnf.parse(tool_call_grammar(family, TOOLS, "plan_route", parallel=True))
    assert grammar.matches(rendered(family, [TRIP]))
    assert not grammar.matches(rendered(family, [PARIS]))
    assert not grammar.matches(rendered(family, [TRIP, TRIP]))
    single = gbnf.parse(tool_call_grammar(family, TOOLS, None, parallel=False))
    assert single.matches(rendered(family, [RATED]))
    assert not single.matches(rendered(family, [RATED, PARIS]))


# Review finding 13: `$defs/A` and `definitions/A` of one function are two schemas.
BOTH_KEYWORDS = {"type": "function", "function": {"name": "pair", "parameters": {
    "type": "object", "properties": {"n": {"$ref": "#/$defs/A"}, "s": {"$ref": "#/definitions/A"}},
    "required": ["n", "s"], "additionalProperties": False,
    "$defs": {"A": {"type": "integer"}}, "definitions": {"A": {"type": "string"}}}}}


@pytest.mark.parametrize("family", list(ToolCallFamily), ids=[f.value for f in ToolCallFamily])
def test_defs_and_definitions_of_one_function_stay_apart(family):
    grammar = gbnf.parse(tool_call_grammar(family, (BOTH_KEYWORDS, SCORE), None, parallel=True))
    honest = [{"name": "pair", "arguments": {"n": 7, "s": "seven"}}]
    assert grammar.matches(rendered(family, honest))
    assert grammar.matches(rendered(family, [RATED, *honest]))  # SCORE's $defs/Stop beside them
    for arguments in ({"n": "seven", "s": "seven"}, {"n": 7, "s": 7}, {"n": "seven", "s": 7}):
        assert not grammar.matches(rendered(family, [{"name": "pair", "arguments": arguments}])), arguments


def test_response_formats():
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_object"}) == json_object_grammar()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    grammar = gbnf.parse(response_format_grammar({"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": schema}}))
    assert grammar.matches('{"n": 3}') and not grammar.matches('{"n": "3"}') and not grammar.matches("3")
    with pytest.raises(ApiError) as refused:
        response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"n": {"type": "string", "pattern": "^a"}}}}})
    assert (refused.value.http_status, refused.value.param) == (400, "response_format")
    assert "schema part #/properties/n: keyword 'pattern' is not supported" in str(refused.value)


def test_a_function_the_converter_cannot_honour_is_named():
    bad = {"type": "function", "function": {"name": "when", "parameters": {
        "type": "object", "properties": {"at": {"type": "string", "format": "email"}}}}}
    with pytest.raises(ApiError) as refused:
        tool_call_grammar(ToolCallFamily.HERMES, (WEATHER, bad), None, parallel=True)
    assert refused.value.param == "tools"
    assert "function 'when' parameters: schema part #/properties/at" in str(refused.value)
    # named: only the named function is converted, so the other one does not stand in the way
    assert tool_call_grammar(ToolCallFamily.HERMES, (WEATHER, bad), "get_weather", parallel=True)


class _Body:
    def __init__(self, response_format=None):
        self.response_format = response_format


class _Plan:
    def __init__(self, choice: str, named=None):
        from meshnet.gateway.tool_request import ToolRequest
        self.family = ToolCallFamily.GENERIC
        self.request = ToolRequest(TOOLS, choice, True, named)


def test_which_grammar_a_request_gets():
    assert grammar_for(_Body(), None) == ""
    assert grammar_for(_Body({"type": "json_object"}), None) == json_object_grammar()
    assert grammar_for(_Body(), _Plan("auto")) == ""
    forced = grammar_for(_Body(), _Plan("named", "score"))
    assert gbnf.parse(forced).matches(rendered(ToolCallFamily.GENERIC, [RATED]))
    with pytest.raises(ApiError) as refused:
        grammar_for(_Body({"type": "json_object"}), _Plan("auto"))
    assert refused.value.param == "response_format"


def test_the_most_tools_convert_together():
    """64 functions of 4 parameters: 384 properties with names and arguments, over one schema's
    256 but within what the calls together may hold."""
    many = tuple({"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "integer"} for j in range(4)}, "required": ["p0"],
        "additionalProperties": False}}} for i in range(64))
    grammar = gbnf.parse(tool_call_grammar(ToolCallFamily.GENERIC, many, None, parallel=True))
    assert grammar.matches('{"tool_calls": [{"name": "f63", "arguments": {"p0": 1, "p3": 2}}]}')
    assert not grammar.matches('{"tool_calls": [{"name": "f64", "arguments": {"p0": 1}}]}')
