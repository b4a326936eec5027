"""JSON Schema -> GBNF (issue 33): the grammar text is parsed by a recognizer that reads GBNF as
llama.cpp's parser does (json_grammar_matcher), then valid documents (compact, spaced and
indented json.dumps forms) must match `root` and invalid ones must not; pydantic validates what
its models' grammars accept. Unsupported keywords are refused with the exact pointer, and
hostile schemas are refused or converted well within half a second."""

from __future__ import annotations

import json
import re
import time

import pytest

from meshnet.gateway.grammar import json_grammar_matcher as gbnf
from meshnet.gateway.grammar.json_grammar_cases import (NAMES, STRICT, STRICT_INVALID, STRICT_VALID, Ticket, deep_list,
                                                fan_in, fan_out, forms, nested, ticket_invalid, ticket_variants)
from meshnet.gateway.grammar.gbnf_text import MAX_INDENT
from meshnet.gateway.grammar.json_grammar import (
    MAX_ENUM_VALUES,
    MAX_ENUM_WAYS,
    MAX_LEFTMOST_PATHS,
    MAX_PROPERTIES,
    MAX_REPEAT,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    SchemaRefused,
    json_object_grammar,
    schema_grammar,
)
from meshnet.gateway.grammar.worst_cases import enum_ways_schema

HOSTILE_SECONDS = 0.5


def compiled(text: str) -> gbnf.Grammar:
    """The grammar as llama.cpp would read it; its left-recursion check stays cheap."""
    assert text.isascii() and text.endswith("\n")
    grammar = gbnf.parse(text)
    assert grammar.leftmost_visits() <= 4 * MAX_LEFTMOST_PATHS
    return grammar


def accepts(grammar: gbnf.Grammar, doc) -> bool:
    return all(grammar.matches(text) for text in forms(doc))


def test_strict_schema_structure():
    text = schema_grammar(STRICT)
    rules = dict(line.split(" ::= ", 1) for line in text.splitlines())
    assert text.startswith("root ::= ")
    assert rules["priority"] == '"\\"low\\"" | "\\"medium\\"" | "\\"high\\""'
    assert rules["steps"] == '"[" ws ( steps-item steps-next{0,2} ws )? "]"'
    assert rules["due"] == "due-string | null" and rules["due-string"] == '"\\"" date "\\""'
    assert "member" not in rules  # additionalProperties false everywhere: no extra members anywhere
    assert rules["ws"] == f'( " " | "\\n" [ \\t]{{0,{MAX_INDENT}}} )?'


def test_strict_schema_matches():
    grammar = compiled(schema_grammar(STRICT))
    for doc in STRICT_VALID:
        assert accepts(grammar, doc), doc
    for label, doc in STRICT_INVALID:
        assert not any(grammar.matches(text) for text in forms(doc)), label


def test_pydantic_schema_structure():
    text = schema_grammar(Ticket.model_json_schema())
    rules = dict(line.split(" ::= ", 1) for line in text.splitlines())
    assert {"Kind", "Person", "Comment"} <= set(rules)  # one rule per $defs entry, referenced by name
    assert rules["comments"] == '"[" ws ( Comment comments-next* ws )? "]"'
    assert rules["Comment-replies-kv"] == '"\\"replies\\"" ws ":" ws comments'  # recursion through rules
    assert rules["point-0"] == '"[" ws integer point-0-from-1 ws "]"'  # prefixItems, exactly two
    assert rules["assignee"] == "Person | null"
    assert rules["root"].endswith('( ws "," ws extra-kv )* ws "}"')  # no additionalProperties: extras allowed


def test_pydantic_model_accepts_and_validates():
    grammar = compiled(schema_grammar(Ticket.model_json_schema()))
    for text in ticket_variants():
        assert grammar.matches(text), text
        Ticket.model_validate_json(text)
    for label, text in ticket_invalid():
        assert not grammar.matches(text), (label, text)


def test_json_object_mode():
    grammar = compiled(json_object_grammar())
    valid = [{}, {"a": [1, -0.5, 1e-7, True, None, {"b": []}], "": "\u00e9\u2615\U0001F600"}, {"x": {"y": {"z": {}}}}]
    for doc in valid:
        assert accepts(grammar, doc), doc
    gap = " " * MAX_INDENT
    for text in ['{"a":1}', '{\n' + gap + '"a": 1\n}', '{"s":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"}', '{"n":-0}',
                 '{"n":1E+2}', '{"n":12.50e-003}', '{"del":"\x7f"}']:
        assert grammar.matches(text), text
    for text in ["[]", '"s"', "1", "null", '{"a":1,}', '{"a":01}', '{"a":1.}', '{"a":.5}', '{"a":+1}', '{"a":1e}',
                 '{"a":--1}', '{"a":"\\q"}', '{"a":"\\x41"}', '{"a":"\\u00g0"}', '{"a":"tab\there"}', '{"a":"x}',
                 "{'a':1}", '{"a":1}{}', ' {"a":1}', '{"a":1} ', '{\n' + gap + ' "a":1}', '{"a":1  }', '{"a":1e1000}',
                 '{"a":' + "1" * 21 + "}", '{"a":True}']:
        assert not grammar.matches(text), text


@pytest.mark.parametrize("schema", [True, {}, {"description": "anything"}])
def test_empty_schema_is_any_value(schema):
    grammar = compiled(schema_grammar(schema))
    for doc in [None, 1, "s", [1, {"a": None}], {"b": [True]}]:
        assert accepts(grammar, doc)
    assert not grammar.matches("nul")


def test_literals_escaped():
    schema = {"type": "object", "properties": {name: {"enum": [name, 1.5, None, {name: [True]}]} for name in NAMES},
              "required": NAMES, "additionalProperties": False}
    grammar = compiled(schema_grammar(schema))
    doc = {name: name for name in NAMES}
    assert accepts(grammar, doc)
    assert accepts(grammar, {**doc, "[x-y]": {"[x-y]": [True]}, "": None, "#h|(a)": 1.5})
    assert not grammar.matches(json.dumps(doc))  # keys and values in their one spelling: no \u escapes of é, 😀
    assert not accepts(grammar, {**doc, "naïve": "naive"})
    assert not accepts(grammar, {**doc, "[x-y]": {"[x-y]": [False]}})


def test_lone_surrogate_in_a_key_is_matched_as_its_escape():
    grammar = compiled(schema_grammar({"properties": {"a\ud800": {"type": "null"}}, "required": ["a\ud800"]}))
    assert grammar.matches('{"a\\ud800":null}')


def test_optional_members_in_order():
    schema = {"type": "object", "additionalProperties": False, "properties": {k: {"type": "integer"} for k in "abc"}}
    grammar = compiled(schema_grammar(schema))
    for keys in ["", "a", "b", "c", "ab", "ac", "bc", "abc"]:
        assert accepts(grammar, {k: 1 for k in keys}), keys
    for text in ['{"b":1,"a":1}', '{"a":1,"a":1}', '{,"a":1}', '{"a":1,}', '{"a":1"b":1}']:
        assert not grammar.matches(text), text
    required_middle = compiled(schema_grammar({**schema, "required": ["b"]}))
    assert accepts(required_middle, {"a": 1, "b": 2}) and accepts(required_middle, {"b": 2, "c": 3})
    assert not accepts(required_middle, {"a": 1, "c": 3})


def test_extra_members_cannot_stand_in_for_listed_ones():
    names = ["ab", "a", "x\n-]", "é😀", "q\"\\", "-", "z"]  # "q", "-", "z" side by side: no range
    grammar = compiled(schema_grammar({"type": "object", "properties": {name: {"type": "null"} for name in names}}))
    assert accepts(grammar, {name: None for name in names})
    for name in names:  # a listed name as an extra member: its value must still be null
        assert not accepts(grammar, {name: 1}), name
    for key in ["", "r", "-x", "b", "abc", "x", "x\n", "x\n-", "x\n-]]", "é", "é😀😀", "😀", "q\"", "ac", "\x01", "\\"]:
        assert accepts(grammar, {key: 1}), key
    assert not grammar.matches('{"a\\u0062": 1}') and not grammar.matches('{"\\/": 1}')  # keys spelled one way
    assert grammar.matches('{"\\n": 1, "\\u001f": 2, "\\"": 3}')


def test_additional_properties_schema():
    grammar = compiled(schema_grammar({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                                       "additionalProperties": {"type": "string"}}))
    assert accepts(grammar, {"id": 1, "x": "a", "y": "b"})
    assert not accepts(grammar, {"id": 1, "x": 2})
    assert not accepts(grammar, {"x": "a", "id": 1})  # extra members only after the listed ones


def test_array_counts_and_prefix():
    grammar = compiled(schema_grammar({"type": "array", "items": {"type": "null"}, "minItems": 2, "maxItems": 4}))
    assert [accepts(grammar, [None] * n) for n in range(6)] == [False, False, True, True, True, False]
    tuple_ = compiled(schema_grammar({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}))
    assert accepts(tuple_, []) and accepts(tuple_, ["a"]) and accepts(tuple_, ["a", 1])
    assert not accepts(tuple_, ["a", 1, 2]) and not accepts(tuple_, [1])
    tail = compiled(schema_grammar({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "minItems": 3}))
    assert accepts(tail, ["a", 1, 2]) and accepts(tail, ["a", 1, 2, 3])
    assert not accepts(tail, ["a", 1]) and not accepts(tail, ["a", "b", 2])
    widest = compiled(schema_grammar({"type": "array", "maxItems": MAX_REPEAT}))  # under llama.cpp's 2000 rules
    assert widest.matches(json.dumps([0] * MAX_REPEAT)) and not widest.matches(json.dumps([0] * (MAX_REPEAT + 1)))


def test_recursive_defs_and_shared_rules():
    kids = {"type": "array", "items": {"$ref": "#/$defs/node"}}
    node = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": kids}, "required": ["v"],
            "additionalProperties": False}
    grammar = compiled(schema_grammar({"$defs": {"node": node}, "$ref": "#/$defs/node"}))
    assert accepts(grammar, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})
    assert not accepts(grammar, {"v": 1, "kids": [{"kids": []}]})


REFUSED = [  # (schema, pointer, message part)
    ({"type": "object", "properties": {"when": {"type": "string", "pattern": "^a$"}}},
     "#/properties/when/pattern", "schema part #/properties/when: keyword 'pattern' is not supported"),
    ({"type": "string", "format": "email"}, "#/format", "format 'email' is not supported"),
    ({"properties": {"when": {"type": "string", "format": "uri"}}}, "#/properties/when/format", "format 'uri'"),
    *[({"type": "number", key: 1}, f"#/{key}", f"keyword '{key}' is not supported")
      for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")],
    *[({"type": "object", key: {}}, f"#/{key}", f"keyword '{key}' is not supported")
      for key in ("patternProperties", "if", "then", "else", "not", "dependentRequired", "dependentSchemas",
                  "propertyNames", "unevaluatedProperties", "minProperties", "maxProperties")],
    *[({"type": "array", key: 1}, f"#/{key}", f"keyword '{key}' is not supported")
      for key in ("uniqueItems", "contains", "minContains", "additionalItems")],
    ({"type": "string", "nullable": True}, "#/nullable", "keyword 'nullable' is not supported"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "#/allOf", "allOf with more than one schema"),
    ({"anyOf": []}, "#/anyOf", "non-empty list"),
    ({"anyOf": [{"type": "string"}], "properties": {}}, "#/properties", "'properties' cannot be combined with 'anyOf'"),
    ({"enum": ["a"], "maxLength": 3}, "#/maxLength", "cannot be combined with 'enum'"),
    ({"enum": []}, "#/enum", "non-empty list"),
    ({"type": "integer", "enum": ["a", True]}, "#/enum", "no enum value has the schema's type"),
    ({"const": float("nan")}, "#/const", "nan is not a JSON number"),
    ({"type": "date"}, "#/type", "type must be one of"),
    ({"type": []}, "#/type", "type must be one of"),
    ({"$ref": "https://example.com/s.json"}, "#/$ref", "is not supported (only #/$defs/<name>"),
    ({"$ref": "#"}, "#/$ref", "is not supported"),
    ({"$defs": {"A": {"properties": {}}}, "$ref": "#/$defs/A/properties"}, "#/$ref", "is not supported"),
    ({"$ref": "#/$defs/Missing"}, "#/$ref", "points at no schema"),
    ({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}},
      "type": "array", "items": {"$ref": "#/$defs/A"}}, "#/$defs/A", "left recursion"),
    ({"properties": {"a": {"$ref": "#/definitions/L"}}, "definitions": {"L": {"$ref": "#/definitions/L"}}},
     "#/definitions/L", "left recursion"),
    ({"type": "object", "properties": {}, "required": ["x"]}, "#/required/0", "required property 'x' is not in"),
    ({"properties": {"a": False}}, "#/properties/a", "false matches nothing"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "#/minItems", "greater than maxItems"),
    ({"type": "array", "maxItems": -1}, "#/maxItems", "non-negative integer"),
    ({"type": "array", "maxItems": None}, "#/maxItems", "non-negative integer"),
    ({"type": "string", "minLength": 1.0}, "#/minLength", "non-negative integer"),
    ({"type": "array", "items": [{"type": "string"}]}, "#/items", "use prefixItems"),
    ({"prefixItems": [{}, {}], "items": False, "minItems": 3}, "#/minItems", "cannot be met"),
    ({"properties": {"s": {"maxLength": MAX_REPEAT + 1}}}, "#/properties/s/maxLength", "above the limit"),
    ({"type": "string", "format": "date", "maxLength": 10}, "#/format", "cannot be combined with format"),
    ({"type": "string", "minLength": 5, "maxLength": 4}, "#/minLength", "greater than maxLength"),
    ({"properties": {"n" * 257: {}}}, "#/properties/" + "n" * 257, "property name longer than 256 characters"),
    ({"type": "object", "properties": {"a/b~c": {"type": "string", "pattern": "x"}}}, "#/properties/a~1b~0c/pattern",
     "keyword 'pattern'"),
]


@pytest.mark.parametrize("schema,pointer,message", REFUSED, ids=[p + ":" + m[:24] for _, p, m in REFUSED])
def test_refused(schema, pointer, message):
    with pytest.raises(SchemaRefused) as caught:
        schema_grammar(schema)
    assert caught.value.pointer == pointer
    assert message in str(caught.value)
    assert str(caught.value).startswith("schema part #")


def test_leftmost_paths_bounded_as_llama_cpp_walks_them():
    grammar = compiled(schema_grammar(fan_in(9)))  # 1023 ways down D0: converted
    assert grammar.matches('{"x":null}') and grammar.matches('{"x":7}') and not grammar.matches('{"x":"7"}')
    assert 1023 < grammar.leftmost_visits() <= 4 * MAX_LEFTMOST_PATHS
    with pytest.raises(SchemaRefused, match=f"more than {MAX_LEFTMOST_PATHS} ways"):
        schema_grammar(fan_in(10))


def test_enum_values_to_start_from_are_bounded():
    """Issue 55, finding 2: four enums of 250 values (1,000 parse stacks at an item's start) convert;
    four of 256 would pass llama.cpp's bound of 1,024 mid-answer and are refused first."""
    grammar = compiled(schema_grammar(enum_ways_schema(250)))
    assert grammar.matches('["every-value-shares-this-prefix-3249"]')
    assert not grammar.matches('["every-value-shares-this-prefix-3250"]')
    with pytest.raises(SchemaRefused, match=f"more than {MAX_ENUM_WAYS} enum values") as refused:
        schema_grammar(enum_ways_schema(256))
    assert refused.value.pointer == "#/items"


HOSTILE = [  # (label, schema, pointer or None when it converts, message part)
    ("deep nesting", nested(100_000, {"type": "string"}), "#/properties/a/properties/a/properties/a/properties/a/"
     "properties/a/properties/a/properties/a/properties/a", f"nested deeper than {MAX_SCHEMA_DEPTH}"),
    ("deep list", deep_list(100_000), "#/enum" + "/0" * (MAX_SCHEMA_DEPTH - 1), "nested deeper"),
    ("huge enum", {"properties": {"x": {"enum": list(range(1_000_000))}}}, "#/properties/x/enum",
     f"more than {MAX_ENUM_VALUES} values"),
    ("fan-out", fan_out(60), None, ""),
    ("fan-in", fan_in(60), "#/$defs/D", f"more than {MAX_LEFTMOST_PATHS} ways"),
    ("large maxItems", {"type": "array", "maxItems": 10**12}, "#/maxItems", "above the limit"),
    ("large minLength", {"type": "string", "minLength": 10**9}, "#/minLength", "above the limit"),
    ("many properties", {"properties": {f"o{n}": {"properties": {f"p{m}": {} for m in range(50)}} for n in range(6)}},
     "#/properties/o", f"more than {MAX_PROPERTIES} properties"),
    ("large schema", {"type": "string", "description": "x" * MAX_SCHEMA_BYTES}, "#", "larger than"),
    ("wide object", {"properties": {str(n): {} for n in range(10**6)}}, "#/properties", "more than"),
    ("wide annotation", {"default": list(range(10**6))}, "#", "larger than"),
    ("many rules", {"anyOf": [{"const": n} for n in range(4200)]}, "#/anyOf/", "more than 4096 rules"),
    ("large grammar", {"enum": ["\x7f" * 8000 + str(n) for n in range(7)]}, "#", "larger than 262144 bytes"),
    ("long names beside extras", {"properties": {f"{n:03d}" + "x" * 250: {} for n in range(250)}}, "#",
     "larger than 262144 bytes"),
    ("repetition total", {"properties": {f"p{n}": {"maxItems": 1000} for n in range(20)}}, "#/properties/p16",
     "add up to more than"),
    ("not JSON", {"type": "object", "default": object()}, "#/default", "is not a JSON value"),
]


@pytest.mark.parametrize("label,schema,pointer,message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_schema_bounded(label, schema, pointer, message):
    started = time.perf_counter()
    try:
        text, refused = schema_grammar(schema), None
    except SchemaRefused as error:
        text, refused = "", error
    elapsed = time.perf_counter() - started
    assert elapsed < HOSTILE_SECONDS, f"{label}: {elapsed:.3f}s"
    if pointer is None:
        assert refused is None and len(text) < 8000  # 60 rules, not 2**60 copies
        compiled(text)
    else:
        assert refused is not None, label
        assert refused.pointer.startswith(pointer), refused.pointer
        assert message in refused.message


def test_matcher_reads_gbnf_as_llama_cpp():
    grammar = gbnf.parse('root ::= ("a" | [^a\\-z] | "\\x41\\u00e9\\U0001F600")+ x?\n# comment\nx ::= "q" |\n  [-]\n')
    assert grammar.matches("bq") and grammar.matches("b-") and grammar.matches("A\u00e9\U0001F600a")
    assert not any(grammar.matches(text) for text in ["-", "z", "", "qz"])
    assert gbnf.parse('root ::= [\\x00-\\x1F]{2,3}\n').matches("\x01\x02") is True
    for bad, why in [('root ::= "\\q"\n', "unknown escape"), ('root ::= "\\x4"\n', "hex"), ('root ::= "a\n', "end"),
                     ("root ::= x\n", "undefined"), ('root ::= root "a" | "b"\n', "left recursion"),
                     ('root ::= x "a"\nx ::= "b"?\n' + 'x ::= root\n', "left recursion"),
                     ('root ::= ("a" ("b")?){0,1999}\n', "exceeds"), ('root ::= "a"\n"b"\n', "expecting name"),
                     ('root ::= ("a"\n', "expecting ')'"), ('x ::= "a"\n  | "b"\n', "expecting name")]:
        with pytest.raises(gbnf.GrammarError, match=re.escape(why)):
            gbnf.parse(bad)
    assert gbnf.parse('root ::= "a"{0,2000}\n').matches("a" * 2000)
