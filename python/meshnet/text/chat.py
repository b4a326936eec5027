"""Chat templates: OpenAI-style messages rendered into one prompt string with a GGUF's template.

The gateway calls `render_chat` with `tokenizer.chat_template` from the GGUF; the result is
tokenized with special tokens parsed (GgufTokenizer.encode(..., special=True)).

Invariant: for well-formed messages the output equals HF transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for the same
template: the same jinja2 sandbox and settings, filters and globals (chat_test.py checks it).
Messages are checked first; a malformed message or a failing template raises ChatTemplateError
(the gateway answers 400), never another exception type.

A template is untrusted code from a model file, so rendering is bounded (issue 35, finding 11;
issue 55, finding 17): at most RENDER_SECONDS of the rendering thread (a trace function checks the
clock on every line the template runs, loops included, and stops it), every value the template
makes bounded before it is made in the sandbox it renders in (template_sandbox.py), and the output
cut at MAX_RENDER_CHARS.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Optional

import jinja2

from meshnet.text import template_sandbox
from meshnet.text.template_sandbox import MAX_RENDER_CHARS, RenderBound

ROLES = ("system", "user", "assistant", "tool")
MAX_TOOL_CALLS = 64  # of one assistant message
RENDER_SECONDS = 1.0  # of the rendering thread's time for one prompt


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
                    raise RenderBound(f"its output passed {MAX_RENDER_CHARS} characters")
                out.append(chunk)
    except RenderBound as bound:
        raise ChatTemplateError(f"chat template stopped: {bound}") from None
    except Exception as err:  # a template is untrusted code: any failure of it is the template's
        if deadline.expired:
            raise ChatTemplateError(f"chat template stopped: it ran past {RENDER_SECONDS:g} s") from None
        raise ChatTemplateError(f"chat template failed: {type(err).__name__}: {err}") from None
    return "".join(out)


class _Deadline:
    """While entered, the current thread stops with RenderBound once `seconds` have passed: a trace
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
            raise RenderBound(f"it ran past {self.seconds:g} s")
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


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return template_sandbox.environment().from_string(template)
    except jinja2.exceptions.TemplateError as err:
        raise ChatTemplateError(f"chat template does not compile: {err}") from None
