"""Chat templates: OpenAI-style messages rendered into one prompt string with a GGUF's template.

The gateway calls `render_chat` with `tokenizer.chat_template` from the GGUF; the result is
tokenized with special tokens parsed (GgufTokenizer.encode(..., special=True)).

Invariant: for well-formed messages the output equals HF transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for the same
template: the same jinja2 sandbox and settings, filters and globals (chat_test.py checks it).
Messages are checked first; a malformed message or a failing template raises ChatTemplateError
(the gateway answers 400), never another exception type.

A template is untrusted code from a model file, so rendering is bounded (issue 35, finding 11):
at most RENDER_SECONDS of the rendering thread (a trace function checks the clock on every line
the template runs, loops included, and stops it), strings and lists that `*`, `%`, `+`, `~`,
block sets and macros (issue 55, finding 17) and the growing str methods would make past
MAX_RENDER_CHARS refused before they are made, and the output cut at MAX_RENDER_CHARS.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from datetime import datetime
from typing import Any, Optional

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool")
MAX_TOOL_CALLS = 64  # of one assistant message
RENDER_SECONDS = 1.0  # of the rendering thread's time for one prompt
MAX_RENDER_CHARS = 4 << 20  # of any string or list a template makes, and of its output


class ChatTemplateError(ValueError):
    """A message the template cannot take, or a template that fails to compile or render."""


def render_chat(template: str, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, **extra: Any) -> str:
    """The prompt `template` makes of `messages`; `extra` goes to the template as variables
    (tools and documents are None unless given, as in transformers)."""
    checked = _checked_messages(messages)
    compiled = _compile(template)
    extra.setdefault("tools", None)
    extra.setdefault("documents", None)
    deadline = _Deadline(RENDER_SECONDS)
    out: list[str] = []
    size = 0
    try:
        with deadline:
            for chunk in compiled.generate(messages=checked, bos_token=bos_token, eos_token=eos_token,
                                           add_generation_prompt=add_generation_prompt, **extra):
                size += len(chunk)
                if size > MAX_RENDER_CHARS:
                    raise _Bound(f"its output passed {MAX_RENDER_CHARS} characters")
                out.append(chunk)
    except _Bound as bound:
        raise ChatTemplateError(f"chat template stopped: {bound}") from None
    except Exception as err:  # a template is untrusted code: any failure of it is the template's
        if deadline.expired:
            raise ChatTemplateError(f"chat template stopped: it ran past {RENDER_SECONDS:g} s") from None
        raise ChatTemplateError(f"chat template failed: {type(err).__name__}: {err}") from None
    return "".join(out)


class _Bound(Exception):
    """A template past one of the rendering bounds."""


class _Deadline:
    """While entered, the current thread stops with _Bound once `seconds` have passed: a trace
    function checks the clock on every line of Python run (the compiled template's included).
    Any other trace function of the thread (a debugger, coverage) is put back on exit."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.expired = seconds, False
        self._until = 0.0
        self._previous: Optional[Any] = None

    def __enter__(self) -> "_Deadline":
        self._until = time.monotonic() + self.seconds
        self._previous = sys.gettrace()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > self._until:
            self.expired = True
            raise _Bound(f"it ran past {self.seconds:g} s")
        return self._trace


def _checked_messages(messages: Any) -> list[dict]:
    """Copies of the messages with content flattened to a string and None values dropped. Only an
    assistant message has `tool_calls` (a list of at most MAX_TOOL_CALLS objects, whose shape is
    the template's business) and may then omit content; `tool_call_id`, if any, is a string."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    checked = []
    for n, message in enumerate(messages):
        where = f"messages[{n}]"
        if not isinstance(message, dict):
            raise ChatTemplateError(f"{where} is not an object")
        role = message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        copy = {key: value for key, value in message.items() if value is not None}
        calls = message.get("tool_calls")
        if calls is not None and role != "assistant":
            raise ChatTemplateError(f"{where}: only assistant messages have tool_calls")
        if calls is not None and not (isinstance(calls, list) and len(calls) <= MAX_TOOL_CALLS
                                      and all(isinstance(call, dict) for call in calls)):
            raise ChatTemplateError(f"{where}: tool_calls must be a list of at most {MAX_TOOL_CALLS} objects")
        if not isinstance(message.get("tool_call_id", ""), str):
            raise ChatTemplateError(f"{where}: tool_call_id must be a string")
        content = message.get("content")
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise ChatTemplateError(f"{where}: content is missing")
        if content is not None:
            copy["content"] = _flat_content(content, where)
        checked.append(copy)
    return checked


def _flat_content(content: Any, where: str) -> str:
    """A string, or text parts joined with newlines as llama.cpp's server joins them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"{where}: content must be a string or a list of text parts")
    text = ""
    for n, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise ChatTemplateError(f'{where}.content[{n}] is not a {{"type": "text", "text": ...}} part')
        text += ("\n" if text else "") + part["text"]
    return text


# ---- the jinja2 environment, as transformers' chat_template_utils builds it -----------------

def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
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


_WIDE_FORMAT = re.compile(r"%[-+ #0]*(\d{6,}|\*)|\.(\d{6,}|\*)")  # a printf width or precision of a million or more
_GROWING_METHODS = {"center", "ljust", "rjust", "zfill"}  # str methods whose first argument is the result's width


def _check_size(n: int) -> None:
    if n > MAX_RENDER_CHARS:
        raise _Bound(f"it would make a value of {n} characters (at most {MAX_RENDER_CHARS})")


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
    """The sandbox, with the sizes of what `*`, `%`, `+`, `~`, block output, str.replace and the
    padding methods make checked before they are made, and of anything any call returns after."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])
    code_generator_class = _BoundedCodeGenerator
    concat = staticmethod(_bounded_concat)

    @staticmethod
    def concat_parts(parts: tuple) -> tuple:
        """The parts of `a ~ b ~ ...` as strings, as str_join and markup_join make them (str() of
        what is not a str), refused when together they would pass MAX_RENDER_CHARS."""
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
            raise _Bound(f"an exponent of {right}")
        elif operator == "%" and isinstance(left, str) and _WIDE_FORMAT.search(left):
            raise _Bound("a printf width or precision of a million or more")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, str):
            if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                _check_size(len(owner) + owner.count(args[0]) * max(0, len(args[1]) - len(args[0])) if args[0]
                            else len(owner) * (len(args[1]) + 1))
            elif name in _GROWING_METHODS and args and isinstance(args[0], int):
                _check_size(args[0])
            elif name == "expandtabs":
                _check_size(len(owner) * max([8, *(a for a in args if isinstance(a, int))]))
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _check_size(len(result))
        return result


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
                       namespace=_Namespace)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as err:
        raise ChatTemplateError(f"chat template does not compile: {err}") from None
