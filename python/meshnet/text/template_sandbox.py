"""The jinja2 sandbox a chat template renders in (chat.py's render_chat), with every value a
template makes bounded before it is made.

A template is untrusted code from a model file (issue 35, finding 11; issue 55, finding 17):
strings and lists that `*`, `%`, `+`, `~`, block sets and macros, the growing str methods
(str.format included), the filters and tests that can grow a value (_FILTER_GROWTH,
_TEST_GROWTH) and the text that str(), repr() and json.dumps would make of nested lists and
dicts (`{{ x }}`, `~`, `%s`, error messages) would make past MAX_RENDER_CHARS are refused
(RenderBound) before they are made. Growth by a small constant factor (HTML escapes, case
mapping, repr escapes) is checked after, on the result. The clock (chat.py) cannot stop C code:
comparing or hashing nested values a template shares many times over is not bounded here.
Invariant: within the bounds, the environment renders as transformers' does (chat_test.py).
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import re
import types
from collections.abc import Iterator, Mapping, MappingView, Set as AbstractSet
from datetime import datetime
from typing import Any, Callable, NamedTuple, Optional

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.filters
import jinja2.nodes
import jinja2.utils
import markupsafe
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter

MAX_RENDER_CHARS = 4 << 20  # of any string or list a template makes, and of its output


class RenderBound(Exception):
    """A template past one of the rendering bounds."""


# ---- the jinja2 environment, as transformers' chat_template_utils builds it -----------------

def _raise_exception(message: str) -> None:
    _check_size(_text_size(message))  # the error's text is str(message)
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    if isinstance(format, str):  # time.strftime grows its buffer up to 256 times the format (%f: 3 times)
        _check_size(256 * (len(format) + 4 * format.count("%")))
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} (marks assistant text for training masks): renders
    its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore-prefixed attributes (no reaching CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `self` may be a key
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")


class _Dict:
    """dict() and dict.fromkeys() for templates, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


# ---- sizes, counted before a value is made ----------------------------------------------------

_GROWING_METHODS = {"center", "ljust", "rjust", "zfill"}  # str methods whose first argument is the result's width


def _check_size(n: int) -> None:
    if n > MAX_RENDER_CHARS:
        raise RenderBound(f"it would make a value of {n} characters (at most {MAX_RENDER_CHARS})")


def _number(value: Any) -> int:
    """`value` if it is an int (a width, a count), else 0: what is given it fails before growing anything."""
    return value if isinstance(value, int) else 0


def _digits(text: Optional[str]) -> int:
    """A width or precision written in a format; past 19 digits formatting refuses it ("too big")."""
    return int(text) if text and len(text) <= 19 else 0


def _text_size(value: Any, indent: Optional[int] = None, sep: int = 4, keyed: bool = False) -> int:
    """About len(str(value)), counted without making it: a string's length, an int's digits, and for lists,
    tuples, sets, dicts and namespaces their items' sizes and `sep` more characters each (quotes and a
    separator). With `indent`, each item also starts a line indented `indent` more than its container's, as
    json.dumps lays them out; with `keyed` too, a dict's value is indented past its key, as pprint does. An item
    that recurs is counted each time, as str() writes it each time; what repr and JSON escapes add to a string
    (at most 12 times it) is not. The count stops soon after it passes MAX_RENDER_CHARS: at most about that
    many steps in C, and one step in Python for each distinct item counted."""
    return _size(value, (indent, sep, keyed), 0, frozenset())


def _size(value: Any, style: tuple, prefix: int, open_: frozenset) -> int:
    """_text_size of `value` whose lines (with an indent) start `prefix` characters in; `open_` holds the
    containers it is inside, which str() writes as [...] when they recur within themselves."""
    if isinstance(value, str):
        if style[2] and len(value) + prefix > 70:  # pprint breaks a long string into quoted words, one a line
            return len(value) + (len(value) - len("".join(value.split())) + 1) * (prefix + 4)
        return len(value)
    if isinstance(value, int):
        return value.bit_length() * 3 // 10 + 5  # its digits and sign, or True and False
    if isinstance(value, jinja2.utils.Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")  # written as <Namespace {...}>
    if not isinstance(value, (list, tuple, Mapping, AbstractSet, MappingView)):
        return 24 if isinstance(value, float) else 64  # a number, None, or an object named by its type
    if id(value) in open_:
        return 5
    indent, sep, keyed = style
    line = 0 if indent is None else 1 + prefix + indent  # a new line and its indent, before each item
    total, inner = 16 + (0 if indent is None else 1 + prefix), open_ | {id(value)}  # brackets, the last line
    if isinstance(value, Mapping):
        for key, item in list(value.items()):
            key_size = _size(key, style, prefix + (indent or 0), inner)
            item_prefix = prefix + (indent or 0) + (key_size + 2 if keyed else 0)
            total += line + sep + key_size + _size(item, style, item_prefix, inner)
            if total > MAX_RENDER_CHARS:
                break
        return total
    items = value if isinstance(value, (list, tuple)) else list(value)
    return total + _items_size(items, line + sep, style, prefix + (indent or 0), inner)


def _items_size(items: Any, each: int, style: tuple, prefix: int, open_: frozenset) -> int:
    """The sizes of `items` (a list or tuple) and `each` more characters for each; an item the list holds
    many times is sized once."""
    total = len(items) * each
    kinds = set(map(type, items))
    if all(issubclass(kind, str) for kind in kinds) and not style[2]:
        return total + sum(map(len, items))
    if kinds <= {int, bool}:
        return total + sum(map(int.bit_length, items)) * 3 // 10 + 5 * len(items)
    firsts = dict(zip(map(id, items), items))
    for key, times in collections.Counter(map(id, items)).items():
        total += times * _size(firsts[key], style, prefix, open_)
        if total > MAX_RENDER_CHARS:
            break
    return total


def _text(value: Any) -> str:
    """str(value), refused first when it would pass MAX_RENDER_CHARS."""
    if isinstance(value, str):
        return value
    _check_size(_text_size(value))
    return str(value)


def _joined_size(items: Any, separator: Any) -> int:
    """len(str(separator).join(map(str, items))), about; `items` is a string or a sized collection."""
    if isinstance(items, str):
        count, size = len(items), len(items)
    else:
        items = items if isinstance(items, (list, tuple)) else list(items)
        count, size = len(items), _items_size(items, 0, (None, 4, False), 0, frozenset())
    return size + max(count - 1, 0) * _text_size(separator)


def _replaced_size(text: str, old: str, new: str, count: Any = -1) -> int:
    """len(text.replace(old, new, count)): an empty `old` matches before each character and at the end."""
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


_LINE_BREAKS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")  # str.splitlines'


def _line_breaks(text: str) -> int:
    """How many lines text.splitlines() ends, or more (\\r\\n counts twice)."""
    return sum(map(text.count, _LINE_BREAKS))


_PRINTF_SPEC = re.compile(r"[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.?)", re.S)  # after "%" and any "(key)"


def _printf_size(template: str, values: Any) -> int:
    """len(template % values) or more, counted without making it: the template's text outside conversions
    and, for each conversion, the larger of its width and its value's text (and precision, for a number), as
    far as `%` would get before failing."""
    positional = values if isinstance(values, tuple) else (values,)
    mapping = values if isinstance(values, Mapping) else {}
    total, taken, at = len(template), 0, template.find("%")
    while at >= 0:
        key, start, at = None, at, at + 1
        if template.startswith("(", at):  # a mapping key, parentheses nested as CPython counts them
            depth, end = 1, at + 1
            while depth and end < len(template):
                depth += {"(": 1, ")": -1}.get(template[end], 0)
                end += 1
            key, at = template[at + 1:end - 1], end
        spec = _PRINTF_SPEC.match(template, at)
        numbers = []
        for part in spec.group(1, 2):
            if part == "*":
                if taken >= len(positional) or not isinstance(positional[taken], int):
                    return total
                numbers.append(abs(positional[taken]))
                taken += 1
            else:
                numbers.append(_digits(part))
        (width, precision), kind, at = numbers, spec.group(3), spec.end()
        total -= at - start  # the conversion's own characters are replaced
        if kind == "%":
            total += 1
        elif kind:
            if key is None and taken >= len(positional):
                return total
            value = mapping.get(key) if key is not None else positional[taken]
            taken += key is None
            size = 1 if kind == "c" else _text_size(value) + (0 if kind in "rsa" else precision + 330)
            total += max(width, size)
        at = template.find("%", at)
    return total


_FORMAT_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d*))?", re.S)  # str.format's


class _BoundedFormatter(SandboxedFormatter):
    """The sandbox's str.format formatter, refusing a field before it is formatted when the fields so far
    would pass MAX_RENDER_CHARS: each counts the larger of its width and its value's text (and precision,
    for a number), and a !r, !s or !a conversion counts its value's text before converting it."""

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self.made = sum(len(literal) for literal, *_ in self.parse(format_string))  # the text between fields
        return super().vformat(format_string, args, kwargs)

    def convert_field(self, value: Any, conversion: Optional[str]) -> Any:
        if conversion is not None:
            _check_size(_text_size(value))
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> str:
        width, precision = _FORMAT_SPEC.match(format_spec).groups()
        text = _text_size(value) + (0 if isinstance(value, str) else _digits(precision) + 330)
        self.made += max(_digits(width), text)
        _check_size(self.made)
        return super().format_field(value, format_spec)


class _BoundedEscapeFormatter(_BoundedFormatter, SandboxedEscapeFormatter):
    """_BoundedFormatter for Markup.format, which escapes each field."""


def _finalized(value: Any) -> Any:
    """environment.finalize: `{{ value }}` unchanged, refused first when str() of it would pass
    MAX_RENDER_CHARS (a list holding one long string many times)."""
    if not isinstance(value, str):
        _check_size(_text_size(value))
    return value


class _Undefined(jinja2.Undefined):
    """jinja2's Undefined, whose error message (it quotes the missing key: `d[[s, s]].x`) is refused first
    when the key's text would pass MAX_RENDER_CHARS."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        _check_size(_text_size(self._undefined_name))
        return super()._undefined_message


def _bounded_concat(parts: Any) -> str:
    """environment.concat: joins a block's output (`{% set %}...{% endset %}`, a macro's body,
    a caller's), refused first when it would pass MAX_RENDER_CHARS."""
    strings = list(parts)
    _check_size(sum(map(len, strings)))
    return "".join(strings)


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """jinja2's code generator, but `a ~ b` (a Concat node, which the sandbox's binop hook never
    sees) is compiled to `str_join(environment.concat_parts((a, b, )))`, so that the parts' size
    is checked before they are joined. The join is the one jinja2 3.1's visit_Concat picks."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"{join}(environment.concat_parts((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write(")))")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with the sizes of what `*`, `%`, `+`, `~`, `{{ }}`, block output, str.replace, str.join,
    str.translate, str.format and the padding methods make checked before they are made, and of anything
    any call returns after."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])
    code_generator_class = _BoundedCodeGenerator
    concat = staticmethod(_bounded_concat)

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalized, undefined=_Undefined, **options)

    @staticmethod
    def concat_parts(parts: tuple) -> tuple:
        """The parts of `a ~ b ~ ...` as strings, as str_join and markup_join make them (str() of
        what is not a str), refused when together they would pass MAX_RENDER_CHARS."""
        _check_size(sum(map(_text_size, parts)))
        strings = tuple(part if isinstance(part, str) else str(part) for part in parts)
        _check_size(sum(map(len, strings)))
        return strings

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _check_size(len(left) + len(right))
        elif operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                    _check_size(len(seq) * max(times, 0))
        elif operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise RenderBound(f"an exponent of {right}")
        elif operator == "%" and isinstance(left, str):
            _check_size(_printf_size(left, right))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, str):
            if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                _check_size(_replaced_size(owner, *args[:3]))
            elif name in _GROWING_METHODS and args and isinstance(args[0], int):
                _check_size(args[0])
            elif name == "expandtabs":
                _check_size(len(owner) * max([8, *(a for a in args if isinstance(a, int))]))
            elif name == "join" and len(args) == 1:
                args = (args[0] if isinstance(args[0], (str, list, tuple)) else list(args[0]),)
                _check_size(_joined_size(args[0], owner))
            elif name == "translate" and args:  # a table maps characters to strings of any length
                table = args[0]
                values = (table.values() if isinstance(table, Mapping)
                          else table if isinstance(table, (list, tuple)) else ())
                _check_size(len(owner) * max([1, *(len(v) for v in values if isinstance(v, str))]))
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _check_size(len(result))
        return result

    def wrap_str_format(self, value: Any) -> Optional[Callable[..., str]]:
        """str.format and str.format_map as jinja2 3.1's sandbox wraps them, formatting with
        _BoundedFormatter (jinja2's wrap_str_format picks its formatter inside)."""
        if not (isinstance(value, (types.MethodType, types.BuiltinMethodType))
                and value.__name__ in ("format", "format_map") and isinstance(value.__self__, str)):
            return None
        text, by_map = value.__self__, value.__name__ == "format_map"
        formatter = (_BoundedEscapeFormatter(self, escape=text.escape) if isinstance(text, markupsafe.Markup)
                     else _BoundedFormatter(self))

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if by_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                args, kwargs = (), args[0]
            return type(text)(formatter.vformat(text, args, kwargs))

        return functools.update_wrapper(wrapper, value)


# ---- filters and tests that can grow a value ----------------------------------------------------
# Each size function takes the filter's own arguments (its context, eval context or environment
# first, where jinja2 passes one: `slice` and `list` take an eval context for their async variants).

class _Growth(NamedTuple):
    size: Callable[..., int]  # what the filter would make, from its arguments, before it runs
    why: str
    lists_iterators: bool = False  # it iterates its value: an iterator is listed first, for both to see


def _value_size(value: Any, *_: Any, **__: Any) -> int:
    return _text_size(value)


def _center_size(value: Any, width: Any = 80) -> int:
    return max(_text_size(value), _number(width))


def _indent_size(s: Any, width: Any = 4, first: Any = False, blank: Any = False) -> int:
    if not isinstance(s, str):
        return _text_size(s)
    step = len(width) if isinstance(width, str) else max(_number(width), 0)
    return len(s) + 1 + (_line_breaks(s) + 1) * step


def _join_size(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> int:
    if attribute is not None:
        value = list(map(jinja2.filters.make_attrgetter(eval_ctx.environment, attribute), value))
    return _joined_size(value, d)


def _format_size(value: Any, *args: Any, **kwargs: Any) -> int:
    return _printf_size(_text(value), kwargs or args)


def _replace_size(eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> int:
    return _replaced_size(_text(s), _text(old), _text(new), -1 if count is None else count)


def _wordwrap_size(environment: Any, s: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None,
                   break_on_hyphens: Any = True) -> int:
    separator = _text(environment.newline_sequence if wrapstring is None else wrapstring)
    if not isinstance(s, str) or len(separator) <= 1:  # a one-character separator replaces at most one
        return _text_size(s)
    return len(s) * (1 + len(separator))  # at most one separator after each character


def _batch_size(value: Any, linecount: Any, fill_with: Any = None) -> int:
    return _number(linecount) if fill_with is not None else 0


def _slice_size(eval_ctx: Any, value: Any, slices: Any, fill_with: Any = None) -> int:
    return _number(slices)


def _tojson_size(value: Any, ensure_ascii: Any = False, indent: Any = None, separators: Any = None,
                 sort_keys: Any = False) -> int:
    step = len(indent) if isinstance(indent, str) else None if indent is None else max(_number(indent), 0)
    given = separators if isinstance(separators, (list, tuple)) else ()
    sep = 2 + max([2, *(len(s) for s in given if isinstance(s, str))])
    return max(step or 0, _text_size(value, indent=step, sep=sep))  # json.dumps makes the indent first


def _pprint_size(value: Any) -> int:
    return _text_size(value, indent=1, keyed=True)


def _urlize_size(eval_ctx: Any, value: Any, trim_url_limit: Any = None, nofollow: Any = False, target: Any = None,
                 rel: Any = None, extra_schemes: Any = None) -> int:
    text = _text(value)  # a link is at least 4 characters ("ab:x"), its target and rel escaped 5 times over
    return len(text) + (len(text) // 4 + 1) * 5 * (_text_size(target or "") + _text_size(rel or ""))


def _xmlattr_size(eval_ctx: Any, d: Any, autospace: Any = True) -> int:
    return _text_size(d)


def _printf_test_size(value: Any, num: Any = 2) -> int:
    return _printf_size(value, num) if isinstance(value, str) else 0


_TEXT = "writes its value as text: str() of nested lists repeats what they share"
_FILTER_GROWTH = {  # filters whose result can be much larger than their arguments
    "batch": _Growth(_batch_size, "fill_with pads the last batch to any length"),
    "capitalize": _Growth(_value_size, _TEXT),
    "center": _Growth(_center_size, "pads to any width"),
    "e": _Growth(_value_size, _TEXT),
    "escape": _Growth(_value_size, _TEXT),
    "forceescape": _Growth(_value_size, _TEXT),
    "format": _Growth(_format_size, "printf formatting: widths, precisions, a value's text many times"),
    "indent": _Growth(_indent_size, "adds a width or string of any length to every line"),
    "join": _Growth(_join_size, "a separator of any length between items; items' text", lists_iterators=True),
    "lower": _Growth(_value_size, _TEXT),
    "pprint": _Growth(_pprint_size, "repr of nested values, indented past every key"),
    "replace": _Growth(_replace_size, "a longer string for every occurrence"),
    "safe": _Growth(_value_size, _TEXT),
    "slice": _Growth(_slice_size, "makes as many lists as asked, empty ones included"),
    "string": _Growth(_value_size, _TEXT),
    "striptags": _Growth(_value_size, _TEXT),
    "title": _Growth(_value_size, _TEXT),
    "tojson": _Growth(_tojson_size, "JSON of nested values; an indent or separator of any length per item"),
    "trim": _Growth(_value_size, _TEXT),
    "upper": _Growth(_value_size, _TEXT),
    "urlencode": _Growth(_value_size, _TEXT, lists_iterators=True),
    "urlize": _Growth(_urlize_size, "a target or rel of any length in every link"),
    "wordcount": _Growth(_value_size, _TEXT),
    "wordwrap": _Growth(_wordwrap_size, "a separator of any length between wrapped lines"),
    "xmlattr": _Growth(_xmlattr_size, _TEXT),
}  # and sum is replaced (_sum); the others' results are parts of their arguments, or numbers
_TEST_GROWTH = {  # tests that can make a large value on the way to their answer
    "divisibleby": _Growth(_printf_test_size, "`value % num`: printf formatting when value is a string"),
    "even": _Growth(_printf_test_size, "`value % 2`: printf formatting when value is a string"),
    "lower": _Growth(_value_size, _TEXT),
    "odd": _Growth(_printf_test_size, "`value % 2`: printf formatting when value is a string"),
    "upper": _Growth(_value_size, _TEXT),
}


def _bounded(functions: dict, growth: dict) -> dict:
    """Each function named in `growth`, wrapped to check the size its arguments say it would make before it
    runs (_check_size), and the size of what it returns after."""
    return {name: _bounded_call(functions[name], grows) for name, grows in growth.items()}


def _bounded_call(function: Callable[..., Any], grows: _Growth) -> Callable[..., Any]:
    @functools.wraps(function)  # keeps jinja2's jinja_pass_arg, so it is passed the same arguments
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if grows.lists_iterators:
            args = tuple(list(arg) if isinstance(arg, Iterator) else arg for arg in args)
        _check_size(grows.size(*args, **kwargs))
        result = function(*args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _check_size(len(result))
        return result

    return bounded


@jinja2.pass_environment
def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """jinja2's sum filter, but lists and tuples are joined in one step, refused first past MAX_RENDER_CHARS:
    sum() adds them one at a time, copying all so far each time, in C where the clock cannot stop it."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    items = list(iterable)
    for kind in (list, tuple):
        if type(start) is kind and all(map(isinstance, items, itertools.repeat(kind))):
            _check_size(len(start) + sum(map(len, items)))
            return kind(itertools.chain(start, itertools.chain.from_iterable(items)))
    return sum(items, start)


def environment() -> jinja2.Environment:
    """A fresh sandbox as transformers' chat_template_utils builds it, every bound in place."""
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
                       namespace=_Namespace)
    env.filters.update(_bounded(env.filters, _FILTER_GROWTH), sum=_sum)
    env.tests.update(_bounded(env.tests, _TEST_GROWTH))
    return env
