"""JSON Schema -> GBNF, the grammar llama.cpp's sampler enforces on the last hop (issue 33).

The gateway calls `schema_grammar` for response_format json_schema and for tool-call arguments
(tool_choice "required" or a named function), and `json_object_grammar` for json_object; the
text goes to `llama_sampler_init_grammar(vocab, text, "root")`. Pure functions, no I/O.

Invariant: `root` matches only JSON texts valid against the schema, in the subset below; what
the converter cannot honour is a SchemaRefused naming the part (the gateway's 400), never
silently loosened. The size, depth, property and enum bounds are checked before anything
recursive touches the schema; the others while the grammar is built, which they keep small.

Choices a reader should know:
- Whitespace: none before or after the value; between tokens one `ws`: nothing, one space, or a
  newline and at most gbnf_text.MAX_INDENT spaces/tabs. Compact, `json.dumps` and `indent=2` texts match.
- Numbers: at most gbnf_text.MAX_DIGITS integer and fraction digits, exponents up to 3 digits; integers
  have no fraction or exponent. Keys, enum and const values are matched in one spelling: their
  `json.dumps(ensure_ascii=False)` text (not a `\\u`-escaped variant).
- Objects: properties in the schema's order; optional ones may be left out. Unless
  additionalProperties is false (absent allows them, as JSON Schema says), extra members may
  follow the listed ones; their keys are spelled as json.dumps spells them and are none of the
  listed names, so an extra member cannot stand in for a listed one (two extra members may
  still share a key: a grammar cannot rule that out).
- Keywords of another type than the declared one do not apply and are ignored.
- `oneOf` is treated as `anyOf` (exclusivity is not enforced). `allOf` takes one schema only.
- No `type` but keywords of one kind (properties, items, minLength, ...): that type is meant.
  `enum`/`const` keep only values of the schema's `type`; other keywords cannot sit beside them,
  nor beside anyOf/oneOf/allOf/$ref (annotations can).
- String lengths count JSON characters: an escape is one (a surrogate-pair escape is two).
- Formats (RFC 3339 with "T" and "Z" upper case, an offset required): date, time, date-time,
  uuid. Every other format, and pattern, minimum/maximum/multipleOf, patternProperties,
  if/then/else, not, dependent*, min/maxProperties, uniqueItems, contains: refused.
- `$ref` only to `#/$defs/<name>` or `#/definitions/<name>`: each target is one rule, never
  inlined, so recursion stays recursion; a $ref cycle that consumes no text is refused, and so
  is a rule with more than MAX_LEFTMOST_PATHS ways down its anyOf/$ref alternatives.
"""

from __future__ import annotations

import collections
import json
import math
import re
from typing import Any, Optional, Union

from meshnet.gateway.grammar.gbnf_text import BUILTINS, QUOTE, SEP, json_text, literal, other_key

MAX_SCHEMA_BYTES = 64 << 10  # the schema as compact UTF-8 JSON
MAX_SCHEMA_DEPTH = 16  # objects and arrays nested, the schema itself depth 1 (as tool_request's)
MAX_PROPERTIES = 256  # entries of all `properties` objects together
MAX_ENUM_VALUES = 256  # values of one `enum`
MAX_REPEAT = 1024  # minItems/maxItems/minLength/maxLength (llama.cpp's parser stops at 2000)
MAX_REPEAT_TOTAL = 16384  # summed over the grammar: llama.cpp's parser makes a rule per count
MAX_RULES = 4096  # rules of the output (a property takes up to about four)
MAX_GRAMMAR_BYTES = 256 << 10  # the output text
MAX_NAME_CHARS = 256  # a property name (nesting of the grammar that excludes names from extras)
# Enum values one rule may start as, through anyOf/$ref alternatives: llama.cpp holds a parse
# stack per value while they share a prefix and refuses a step past 1024 (patch 0013); the
# whitespace and closing bracket beside an array's item hold a few more (1,024 values failed there,
# 1,000 sample).
MAX_ENUM_WAYS = 1000
MAX_LEFTMOST_PATHS = 1024  # from one rule through anyOf/$ref alternatives to text: llama.cpp's
# left-recursion check (llama_grammar_init) walks each of them, unmemoised

ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly",
                         "discriminator",  # pydantic's tagged unions: oneOf already says it all
                         "$defs", "definitions"})  # containers: read where a $ref points
OBJECT_KEYWORDS = ("properties", "required", "additionalProperties")
ARRAY_KEYWORDS = ("items", "prefixItems", "minItems", "maxItems")
STRING_KEYWORDS = ("minLength", "maxLength", "format")
COMBINATORS = ("enum", "const", "anyOf", "oneOf", "allOf", "$ref")
KEYWORDS = frozenset({"type", *COMBINATORS, *OBJECT_KEYWORDS, *ARRAY_KEYWORDS, *STRING_KEYWORDS})
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
FORMATS = ("date", "time", "date-time", "uuid")

_REF = re.compile(r"#/(\$defs|definitions)/([^/]+)")


class SchemaRefused(ValueError):
    """A schema this converter does not honour. `pointer`: JSON pointer to the part (the keyword
    where one is at fault); the message names the part and why."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(message)
        self.pointer, self.message = pointer, message


def schema_grammar(schema: Union[dict, bool], max_properties: int = MAX_PROPERTIES) -> str:
    """GBNF whose `root` matches the JSON texts valid against `schema` (see the module notes).
    `max_properties`: a caller that bounded the parts of `schema` alone may allow their sum."""
    _check_bounds(schema, max_properties)
    return _Converter(schema).grammar()


def json_object_grammar() -> str:
    """GBNF whose `root` matches any JSON object, whitespace bounded as in schema_grammar."""
    return _Converter({"type": "object"}).grammar()


def _refused(ptr: str, why: str, key: Any = None) -> SchemaRefused:
    return SchemaRefused(ptr if key is None else _child(ptr, key), f"schema part {ptr}: {why}")


def _child(ptr: str, key: Any) -> str:
    return f"{ptr}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _check_bounds(schema: Any, max_properties: int = MAX_PROPERTIES) -> None:
    """Depth, JSON types, node count, enum lengths and property count without recursion; then
    the compact size (json.dumps recurses, so only once the depth is known)."""
    stack, nodes, properties = [(schema, "#", 1)], 0, 0
    while stack:
        node, ptr, depth = stack.pop()
        nodes += 1
        if isinstance(node, (dict, list)):
            if depth > MAX_SCHEMA_DEPTH:
                raise _refused(ptr, f"nested deeper than {MAX_SCHEMA_DEPTH} objects and arrays")
            if nodes + len(stack) + len(node) > MAX_SCHEMA_BYTES:
                raise _refused("#", f"larger than {MAX_SCHEMA_BYTES} bytes as JSON")
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                raise _refused(ptr, "object keys must be strings")
            if isinstance(node.get("properties"), dict):
                properties += len(node["properties"])
                if properties > max_properties:
                    raise _refused(ptr, f"more than {max_properties} properties in the schema", "properties")
            if isinstance(node.get("enum"), list) and len(node["enum"]) > MAX_ENUM_VALUES:
                raise _refused(ptr, f"enum has more than {MAX_ENUM_VALUES} values", "enum")
            stack.extend((child, _child(ptr, key), depth + 1) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, _child(ptr, n), depth + 1) for n, child in enumerate(node))
        elif not isinstance(node, (str, int, float, bool, type(None))):
            raise _refused(ptr, f"{type(node).__name__} is not a JSON value")
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
        raise _refused("#", f"larger than {MAX_SCHEMA_BYTES} bytes as JSON")


def _seq(parts: list[str]) -> str:
    return " ".join(part for part in parts if part)


def _join(*parts: str) -> str:
    return "-".join(part for part in parts if part)


def _has_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}[kind]
    return isinstance(value, python)


class _Converter:
    """One schema's rules. $ref targets are converted from a queue, not recursively, so Python's
    stack depth follows the schema's nesting only."""

    def __init__(self, schema: Union[dict, bool]) -> None:
        self._root = schema if isinstance(schema, dict) else {}
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._bytes = self._repeats = 0
        self._used = set(BUILTINS) | {"root"}
        self._suffix: collections.Counter = collections.Counter()
        self._defs: dict[str, str] = {}  # pointer of a $ref target -> its rule
        self._pending: collections.deque = collections.deque()
        self._alternatives: dict[str, tuple[list[str], str]] = {}  # rule -> (the rules it may start as, ptr)
        self._enum_values: dict[str, int] = {}  # an enum/const rule -> its literals: each a way to start
        self._schema = schema

    def grammar(self) -> str:
        root = self._expr(self._schema, "#", "", "root")
        if "root" not in self._rules:
            self._alternation("", [root], "#", "root")
        while self._pending:
            schema, ptr, rule = self._pending.popleft()
            body = self._expr(schema, ptr, rule, rule)
            if rule not in self._rules:
                self._alternation("", [body], ptr, rule)
        self._check_leftmost_paths()
        names = ["root"] + [name for name in self._rules if name != "root"]
        return "".join(f"{name} ::= {self._rules[name]}\n" for name in names)

    # Rules

    def _add(self, name: str, body: str, ptr: str) -> None:
        self._rules[name] = body
        self._bytes += len(name) + len(body) + 6
        if len(self._rules) > MAX_RULES:
            raise _refused(ptr, f"the grammar would need more than {MAX_RULES} rules")
        if self._bytes > MAX_GRAMMAR_BYTES:
            raise _refused(ptr, f"the grammar would be larger than {MAX_GRAMMAR_BYTES} bytes")

    def _name(self, hint: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint)[-48:].strip("-") or "part"
        name = base
        while name in self._used:
            self._suffix[base] += 1
            name = f"{base}-{self._suffix[base] + 1}"
        self._used.add(name)
        return name

    def _rule(self, hint: str, body: str, ptr: str, fixed: Optional[str] = None) -> str:
        """A rule for `body` (`fixed` names it; otherwise an identical earlier rule is shared)."""
        if fixed is None and body in self._by_body:
            return self._by_body[body]
        name = fixed or self._name(hint)
        self._add(name, body, ptr)
        self._by_body.setdefault(body, name)
        return name

    def _alternation(self, hint: str, parts: list[str], ptr: str, fixed: Optional[str]) -> str:
        """A rule that is one of the rules `parts` (anyOf, a list of types, a $ref alias)."""
        name = self._rule(hint, " | ".join(parts), ptr, fixed)
        self._alternatives[name] = (parts, ptr)
        return name

    def _builtin(self, name: str) -> str:
        if name not in self._rules:
            body, uses = BUILTINS[name]
            self._add(name, body, "#")
            for used in uses:
                self._builtin(used)
        return name

    def _repeat(self, rule: str, low: int, high: Optional[int], ptr: str) -> str:
        if high == 0:
            return ""
        self._repeats += high if high is not None else low + 1
        if self._repeats > MAX_REPEAT_TOTAL:
            raise _refused(ptr, f"repetition counts add up to more than {MAX_REPEAT_TOTAL}")
        if high is None:
            return {0: f"{rule}*", 1: f"{rule}+"}.get(low, f"{rule}{{{low},}}")
        if (low, high) == (0, 1):
            return f"{rule}?"
        return f"{rule}{{{low}}}" if low == high else f"{rule}{{{low},{high}}}"

    # Schemas

    def _expr(self, schema: Any, ptr: str, hint: str, fixed: Optional[str] = None) -> str:
        """The name of a rule matching `schema`'s values (`fixed` names it when it is a new rule)."""
        if schema is True:
            return self._builtin("value")
        if not isinstance(schema, dict):
            raise _refused(ptr, "false matches nothing" if schema is False else "a schema must be an object or true")
        for key in schema:
            if key not in KEYWORDS and key not in ANNOTATIONS:
                raise _refused(ptr, f"keyword {key!r} is not supported", key)
        used = [key for key in schema if key in KEYWORDS]
        combinator = next((key for key in used if key in COMBINATORS), None)
        if combinator is not None:
            allowed = (combinator, "type") if combinator in ("enum", "const") else (combinator,)
            for key in used:
                if key not in allowed:
                    raise _refused(ptr, f"keyword {key!r} cannot be combined with {combinator!r}", key)
            return self._combined(combinator, schema, ptr, hint, fixed)
        kinds = self._types(schema, ptr)
        if kinds is None:
            return self._builtin("value")
        if len(kinds) == 1:
            return self._typed(kinds[0], schema, ptr, hint, fixed)
        parts = [self._typed(kind, schema, ptr, _join(hint, kind), None) for kind in kinds]
        return self._alternation(hint, parts, ptr, fixed)

    def _types(self, schema: dict, ptr: str) -> Optional[list[str]]:
        declared = schema.get("type")
        if declared is None:
            families = (("object", OBJECT_KEYWORDS), ("array", ARRAY_KEYWORDS), ("string", STRING_KEYWORDS))
            return [kind for kind, keys in families if any(key in schema for key in keys)] or None
        kinds = [declared] if isinstance(declared, str) else declared
        if not isinstance(kinds, list) or not kinds or any(kind not in TYPES for kind in kinds):
            raise _refused(ptr, f"type must be one of {', '.join(TYPES)} or a non-empty list of them", "type")
        kinds = list(dict.fromkeys(kinds))
        return [kind for kind in kinds if kind != "integer" or "number" not in kinds]

    def _typed(self, kind: str, schema: dict, ptr: str, hint: str, fixed: Optional[str]) -> str:
        if kind == "object":
            return self._object(schema, ptr, hint, fixed)
        if kind == "array":
            return self._array(schema, ptr, hint, fixed)
        if kind == "string":
            return self._string(schema, ptr, hint, fixed)
        return self._builtin(kind)

    def _combined(self, key: str, schema: dict, ptr: str, hint: str, fixed: Optional[str]) -> str:
        value, where = schema[key], _child(ptr, key)
        if key == "$ref":
            return self._ref(value, ptr)
        if key in ("enum", "const"):
            if key == "enum" and (not isinstance(value, list) or not value):
                raise _refused(ptr, "enum must be a non-empty list", key)
            values = [value] if key == "const" else value
            return self._enum(values, self._types(schema, ptr), ptr, key, hint, fixed)
        if not isinstance(value, list) or not value:
            raise _refused(ptr, f"{key} must be a non-empty list of schemas", key)
        if key == "allOf":
            if len(value) != 1:
                raise _refused(ptr, "allOf with more than one schema is not supported", key)
            return self._expr(value[0], _child(where, 0), hint, fixed)
        parts = [self._expr(sub, _child(where, n), _join(hint, str(n))) for n, sub in enumerate(value)]
        parts = list(dict.fromkeys(parts))
        return parts[0] if len(parts) == 1 and fixed is None else self._alternation(hint, parts, ptr, fixed)

    def _ref(self, ref: Any, ptr: str) -> str:
        match = _REF.fullmatch(ref) if isinstance(ref, str) else None
        if match is None:
            raise _refused(ptr, f"$ref {ref!r} is not supported (only #/$defs/<name> or #/definitions/<name>)",
                           "$ref")
        target = f"#/{match.group(1)}/{match.group(2)}"
        rule = self._defs.get(target)
        if rule is None:
            name = match.group(2).replace("~1", "/").replace("~0", "~")
            defs = self._root.get(match.group(1))
            if not isinstance(defs, dict) or name not in defs:
                raise _refused(ptr, f"$ref {ref!r} points at no schema", "$ref")
            rule = self._defs[target] = self._name(name)
            self._pending.append((defs[name], target, rule))
        return rule

    def _check_leftmost_paths(self) -> None:
        """Walks the rules that are alternatives of other rules (all a rule can start as without
        writing text, since every other rule starts with a literal): a cycle is left recursion,
        which llama.cpp refuses; more than MAX_LEFTMOST_PATHS ways down one rule is refused too (a
        chain of anyOf/$ref links each offering two ways to the next doubles them per link). The
        enum values reached through those alternatives are counted too (MAX_ENUM_WAYS): each holds
        a parse stack of its own while they share a prefix, and llama.cpp refuses a step past 1024
        stacks (patch 0013), so a schema that would reach that bound mid-answer is refused here,
        before any token (issue 55, finding 2)."""
        paths: dict[str, int] = {}
        values: dict[str, int] = {}  # enum values reached through anyOf/$ref alternatives
        expanded: set[str] = set()
        for start in self._alternatives:
            stack = [start]
            while stack:
                name = stack[-1]
                parts, ptr = self._alternatives[name]
                todo = [part for part in parts if part in self._alternatives and part not in paths]
                if todo and name not in expanded:
                    expanded.add(name)
                    stack.extend(todo)
                    continue
                if todo:  # back on top before its alternatives are done: it leads to itself
                    raise _refused(ptr, "$ref reaches itself before any text is written (left recursion)")
                stack.pop()
                paths[name] = sum(paths.get(part, 1) for part in parts)
                if paths[name] > MAX_LEFTMOST_PATHS:
                    raise _refused(ptr, f"more than {MAX_LEFTMOST_PATHS} ways through anyOf/$ref alternatives")
                values[name] = sum(values.get(part, self._enum_values.get(part, 0)) for part in parts)
                if values[name] > MAX_ENUM_WAYS:
                    raise _refused(ptr, f"more than {MAX_ENUM_WAYS} enum values to start from at once "
                                        "(each holds a parse stack of its own)")

    def _enum(self, values: list, kinds: Optional[list[str]], ptr: str, key: str, hint: str,
              fixed: Optional[str]) -> str:
        kept = [value for value in values if kinds is None or any(_has_type(value, kind) for kind in kinds)]
        if not kept:
            raise _refused(ptr, f"no {key} value has the schema's type", key)
        literals = list(dict.fromkeys(self._value_literal(value, _child(ptr, key)) for value in kept))
        name = self._rule(hint, " | ".join(literals), ptr, fixed)
        self._enum_values[name] = len(literals)
        return name

    def _value_literal(self, value: Any, ptr: str) -> str:
        """A sequence matching exactly `value` (an enum or const value), whitespace as elsewhere."""
        if isinstance(value, (dict, list)):
            opening, closing = ('"{"', '"}"') if isinstance(value, dict) else ('"["', '"]"')
            parts = ([f'{literal(json_text(key))} ws ":" ws {self._value_literal(item, ptr)}'
                      for key, item in value.items()] if isinstance(value, dict)
                     else [self._value_literal(item, ptr) for item in value])
            self._builtin("ws")
            return _seq([opening, "ws", f" {SEP} ".join(parts), "ws" if parts else "", closing])
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaRefused(ptr, f"schema part {ptr}: {value} is not a JSON number")
        return literal(json_text(value) if isinstance(value, str) else json.dumps(value))

    def _count(self, schema: dict, key: str, ptr: str, default: Optional[int]) -> Optional[int]:
        if key not in schema:
            return default
        value = schema[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _refused(ptr, f"{key} must be a non-negative integer", key)
        if value > MAX_REPEAT:
            raise _refused(ptr, f"{key} {value} is above the limit of {MAX_REPEAT}", key)
        return value

    def _object(self, schema: dict, ptr: str, hint: str, fixed: Optional[str]) -> str:
        properties, required = schema.get("properties", {}), schema.get("required", [])
        if not isinstance(properties, dict):
            raise _refused(ptr, "properties must be an object", "properties")
        if not isinstance(required, list):
            raise _refused(ptr, "required must be a list of property names", "required")
        for n, name in enumerate(required):
            if not isinstance(name, str) or name not in properties:
                raise _refused(_child(ptr, "required"), f"required property {name!r} is not in properties", n)
        members = []
        for name, sub in properties.items():
            where = _child(_child(ptr, "properties"), name)
            if len(name) > MAX_NAME_CHARS:
                raise _refused(where, f"property name longer than {MAX_NAME_CHARS} characters")
            value = self._expr(sub, where, _join(hint, name))
            kv = self._rule(_join(hint, name, "kv"), f'{literal(json_text(name))} ws ":" ws {value}', where)
            members.append((kv, name in required))
        extra = schema.get("additionalProperties", True)
        extra_kv = None
        if extra is True and not properties:
            extra_kv = self._builtin("member")
        elif extra is not False:
            where = _child(ptr, "additionalProperties")
            value = self._builtin("value") if extra is True else self._expr(extra, where, _join(hint, "extra"))
            key = self._builtin("string")
            if properties:
                self._builtin("key-rest")
                body = other_key(properties, MAX_GRAMMAR_BYTES - self._bytes)
                if body is None:
                    raise _refused(ptr, f"the grammar would be larger than {MAX_GRAMMAR_BYTES} bytes")
                key = self._rule(_join(hint, "extra-key"), body, ptr)
            extra_kv = self._rule(_join(hint, "extra-kv"), f'{key} ws ":" ws {value}', ptr)
        self._builtin("ws")
        content, optional = self._members(members, extra_kv, ptr, hint)
        if not content:
            body = '"{" ws "}"'
        elif optional:
            body = f'"{{" ws ( {content} ws )? "}}"'
        else:
            body = f'"{{" ws {content} ws "}}"'
        return self._rule(hint or "object", body, ptr, fixed)

    def _members(self, members: list[tuple[str, bool]], extra_kv: Optional[str], ptr: str,
                 hint: str) -> tuple[str, bool]:
        """The members in order, each after the first behind a comma; (expression, may be empty).
        With a required member the optional ones before it carry their comma after them; with
        none, one alternative per possible first member, sharing chains of optional rests."""
        tail = f"( {SEP} {extra_kv} )*" if extra_kv else ""
        first = next((n for n, (_, needed) in enumerate(members) if needed), None)
        if first is not None:
            parts = [f"( {kv} {SEP} )?" for kv, _ in members[:first]] + [members[first][0]]
            parts += [f"{SEP} {kv}" if needed else f"( {SEP} {kv} )?" for kv, needed in members[first + 1:]]
            return _seq(parts + [tail]), False
        starts, rest = [], tail
        for n in reversed(range(len(members))):
            kv = members[n][0]
            starts.append(_seq([kv, rest]))
            if n > 0:
                rest = self._rule(_join(hint, f"after-{n - 1}"), _seq([f"( {SEP} {kv} )?", rest]), ptr)
        starts.reverse()
        if extra_kv:
            starts.append(_seq([extra_kv, tail]))
        if len(starts) > 1:
            return f"( {' | '.join(starts)} )", True
        return (starts[0] if starts else ""), True

    def _array(self, schema: dict, ptr: str, hint: str, fixed: Optional[str]) -> str:
        low, high = self._count(schema, "minItems", ptr, 0), self._count(schema, "maxItems", ptr, None)
        if high is not None and low > high:
            raise _refused(ptr, "minItems is greater than maxItems", "minItems")
        prefix, items = schema.get("prefixItems", []), schema.get("items", True)
        if not isinstance(prefix, list):
            raise _refused(ptr, "prefixItems must be a list of schemas", "prefixItems")
        if isinstance(items, list):
            raise _refused(ptr, "items as a list is not supported (use prefixItems)", "items")
        where = _child(ptr, "prefixItems")
        positions = [self._expr(sub, _child(where, n), _join(hint, str(n))) for n, sub in enumerate(prefix)]
        positions = positions[:high] if high is not None else positions
        item = None if items is False else self._expr(items, _child(ptr, "items"), _join(hint, "item"))
        self._builtin("ws")
        if item is not None and (high is None or high > len(positions)):
            before = len(positions) or 1  # items ahead of the repeated tail (the first item, lacking a prefix)
            top = None if high is None else high - before
            after = self._rule(_join(hint, "next"), f"{SEP} {item}", ptr) if top != 0 else ""
            rest = self._repeat(after, max(low - before, 0), top, ptr)
            positions = positions or [item]
        elif low > len(positions):
            raise _refused(ptr, f"minItems {low} cannot be met: at most {len(positions)} items", "minItems")
        else:
            rest = ""
        if not positions:
            return self._rule(hint or "array", '"[" ws "]"', ptr, fixed)
        for n in range(len(positions) - 1, 0, -1):
            rule = self._rule(_join(hint, f"from-{n}"), _seq([f"{SEP} {positions[n]}", rest]), ptr)
            rest = rule if n < low else f"{rule}?"
        content = _seq([positions[0], rest])
        body = f'"[" ws {content} ws "]"' if low > 0 else f'"[" ws ( {content} ws )? "]"'
        return self._rule(hint or "array", body, ptr, fixed)

    def _string(self, schema: dict, ptr: str, hint: str, fixed: Optional[str]) -> str:
        low, high = self._count(schema, "minLength", ptr, 0), self._count(schema, "maxLength", ptr, None)
        form = schema.get("format")
        if form is not None:
            if form not in FORMATS:
                raise _refused(ptr, f"format {form!r} is not supported (only {', '.join(FORMATS)})", "format")
            if "minLength" in schema or "maxLength" in schema:
                raise _refused(ptr, "minLength/maxLength cannot be combined with format", "format")
            return self._rule(hint or form, f"{QUOTE} {self._builtin(form)} {QUOTE}", ptr, fixed)
        if high is not None and low > high:
            raise _refused(ptr, "minLength is greater than maxLength", "minLength")
        if low == 0 and high is None:
            return self._builtin("string")
        chars = self._repeat(self._builtin("char"), low, high, ptr)
        return self._rule(hint or "string", _seq([QUOTE, chars, QUOTE]), ptr, fixed)
