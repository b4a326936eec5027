"""GBNF text for json_grammar.py: the rules every JSON grammar may use (whitespace, strings,
numbers, formats), string literals that match a text exactly, and the rule for an object key
that is none of a set of names (extra members of an object that lists its properties).

The grammar text stays ASCII: other characters are written as \\u/\\U escapes, which llama.cpp's
parser reads. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Optional

MAX_INDENT = 40  # spaces/tabs after a newline in one whitespace gap
MAX_DIGITS = 20  # integer digits, and fraction digits, of a number

SEP = 'ws "," ws'
QUOTE = r'"\""'
HEX = "[0-9a-fA-F]"
_HOUR, _MINUTE = '( [01] [0-9] | "2" [0-3] )', "[0-5] [0-9]"
# name -> (body, rules it uses); only the ones a grammar uses are written.
BUILTINS = {
    "ws": (f'( " " | "\\n" [ \\t]{{0,{MAX_INDENT}}} )?', ()),
    "char": (r'[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ' + f"{HEX}{{4}} )", ()),
    "string": (f"{QUOTE} char* {QUOTE}", ("char",)),
    "integer": (f'"-"? ( "0" | [1-9] [0-9]{{0,{MAX_DIGITS - 1}}} )', ()),
    "number": (f'integer ( "." [0-9]{{1,{MAX_DIGITS}}} )? ( [eE] [-+]? [0-9]{{1,3}} )?', ("integer",)),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": (f'"{{" ws ( member ( {SEP} member )* ws )? "}}"', ("ws", "member")),
    "member": ('string ws ":" ws value', ("string", "ws", "value")),
    "array": (f'"[" ws ( value ( {SEP} value )* ws )? "]"', ("ws", "value")),
    "key-rest": (f"key-char* {QUOTE}", ("key-char",)),
    "key-char": (r'[^"\\\x00-\x1F] | "\\" key-escape', ("key-escape",)),
    "key-escape": (r'["\\bfnrt] | "u00" ( "0" [0-7bef] | "1" [0-9a-f] )', ()),
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )', ()),
    "time": (f'{_HOUR} ":" {_MINUTE} ":" {_MINUTE} ( "." [0-9]{{1,9}} )? '
             f'( "Z" | [+-] {_HOUR} ":" {_MINUTE} )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "uuid": (f'{HEX}{{8}} "-" {HEX}{{4}} "-" {HEX}{{4}} "-" {HEX}{{4}} "-" {HEX}{{12}}', ()),
}
# Keys of extra members spell a character one way, json.dumps's: these escapes, the rest raw.
_KEY_ESCAPES = tuple(json.dumps(chr(code))[1:-1] for code in range(0x20)) + ('\\"', "\\\\")

def json_text(text: str) -> str:
    """`text` as a JSON string literal; lone surrogates (no UTF-8 for them) as \\u escapes."""
    return "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c
                   for c in json.dumps(text, ensure_ascii=False))


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly; the grammar itself stays ASCII."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}")
    return '"' + "".join(out) + '"'


def other_key(names: Any, limit: int) -> Optional[str]:
    """A JSON string (key-rest's spelling) that is none of `names`, or None past `limit` bytes: a
    trie of the names, each node left by a character none of them has there. Written in one
    iterative pass (nesting = the longest name), so its cost is its size."""
    root: dict = {}
    for name in names:
        if not any(0xD800 <= ord(c) <= 0xDFFF for c in name):  # else no such key can be written
            node = root
            for c in name:
                unit = c if c >= " " and c not in '"\\' else json.dumps(c)[1:-1]
                node = node.setdefault(unit, {})
            node[""] = {}  # a name ends here
    out, size, stack = [QUOTE, " "], 0, [root]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            units = [unit for unit in item if unit]
            parts: list = ["( "]
            for unit in units:
                parts += [f"{literal(unit)} ", item[unit], " | "]
            parts.append(f"( {_other_unit(units)} ) key-rest{'' if '' in item else ' | ' + QUOTE} )")
            stack.extend(reversed(parts))
            continue
        out.append(item)
        size += len(item)
        if size > limit:
            return None
    return "".join(out)


def _other_unit(taken: list[str]) -> str:
    """One character of a key, spelled as key-char spells it, other than the `taken` spellings."""
    raw = "".join("\\" + c if c in "\\[]-" else literal(c)[1:-1] for c in taken if c[0] != "\\")
    escapes = [unit for unit in taken if unit[0] == "\\"]
    escape = " | ".join(literal(unit) for unit in _KEY_ESCAPES if unit not in escapes) if escapes else \
        r'"\\" key-escape'
    return " | ".join(part for part in (f'[^"\\\\\\x00-\\x1F{raw}]', escape) if part)
