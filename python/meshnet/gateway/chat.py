"""Chat templates: OpenAI-style messages rendered into one prompt string with a GGUF's template.

The gateway calls `render_chat` with `tokenizer.chat_template` from the GGUF; the result is
tokenized with special tokens parsed (GgufTokenizer.encode(..., special=True)).

Invariant: for well-formed messages the output equals HF transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for the same
template: the same jinja2 sandbox and settings, filters and globals (chat_test.py checks it).
Messages are checked first; a malformed message or a failing template raises ChatTemplateError
(the gateway answers 400), never another exception type.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool")


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
    try:
        return compiled.render(messages=checked, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt, **extra)
    except Exception as err:  # a template is untrusted code: any failure of it is the template's
        raise ChatTemplateError(f"chat template failed: {type(err).__name__}: {err}") from None


def _checked_messages(messages: Any) -> list[dict]:
    """Copies of the messages with content flattened to a string and None values dropped."""
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


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
                       namespace=_Namespace)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as err:
        raise ChatTemplateError(f"chat template does not compile: {err}") from None
