"""Tool calls in a model's output (issue 33): the text a chat model generated, parsed into
OpenAI's `tool_calls` by the syntax of the model's template family.

The gateway's chat route (tool_use.py) picks the family with `detect_family` from the GGUF's chat
template, then parses the whole output with `parse_tool_calls`, or a stream with
`ToolCallStream`. Families:

- hermes (Hermes 2 Pro, Qwen 2.5, Qwen 3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one or more, possibly after some text (the content).
- llama3 (Llama 3.1-3.3): the whole output is `{"name": ..., "parameters": {...}}` ("arguments" is
  accepted too), optionally after `<|python_tag|>`; several are separated by `;`.
- mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`, or the newer
  `[TOOL_CALLS]name[ARGS]{...}`, repeated for several; possibly after some text.
- generic (templates with no tool syntax; the gateway instructs the model): the whole output is
  `{"tool_calls": [{"name", "arguments"}, ...]}` and/or `{"content": "..."}`, exactly.

Invariant: nothing here raises on model output. Output a family's syntax does not make, or makes
badly (broken JSON, a missing or non-string name, arguments that are not a JSON object, an
unterminated call, text after a call, a name not offered, more than MAX_TOOL_CALLS calls), is
returned as content, the whole text unchanged, with no tool calls and `malformed` saying why.
The text's size is bounded by the caller; JSON is scanned with `raw_decode` and the only regexes
have bounded repetitions.

Tool-call ids are "call_" + 24 hex digits of sha256(f"{id_seed}:{index}"): deterministic for a
seed (the gateway passes the completion's id, unique per request, so ids never repeat within a
conversation); with no seed, a random one is drawn.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Optional

MAX_TOOL_CALLS = 16  # in one output; more is malformed

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_CALLS, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's, for names outside JSON
_MENTIONS_TOOLS = re.compile(r"\btools\b")
_MARKUP = re.compile(r"<[^<>\s]{1,64}>|\[[^\[\]\s]{1,64}\]")  # <|token|>, [TOKEN], <tag>


class ToolCallFamily(str, enum.Enum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    GENERIC = "generic"


# The text markers of each family's syntax: models often emit them as single special tokens,
# which a detokenizer must keep for the parser to see them.
MARKERS: dict[ToolCallFamily, tuple[str, ...]] = {
    ToolCallFamily.HERMES: (_HERMES_OPEN, _HERMES_CLOSE),
    ToolCallFamily.LLAMA3: (_PYTHON_TAG,),
    ToolCallFamily.MISTRAL: (_MISTRAL_CALLS, _MISTRAL_ARGS),
    ToolCallFamily.GENERIC: (),
}


class UnsupportedToolTemplate(ValueError):
    """A chat template that supports tools with a syntax this module cannot parse (the gateway
    answers 400 with this message). `found`: the template's tool markup, at most five."""

    def __init__(self, found: tuple[str, ...]):
        self.found = found
        what = "tool markup " + ", ".join(found) if found else "no tool-call markup known here"
        super().__init__(f"this model's chat template takes tools but has {what}; tool calls are parsed for "
                         "<tool_call> (Hermes, Qwen), <|python_tag|>/ipython JSON (Llama 3.x), [TOOL_CALLS] "
                         "(Mistral) and templates without tools")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it


@dataclass(frozen=True)
class ParsedOutput:
    """`content` is None only when there are tool calls and no text; `malformed` is empty
    unless the output was taken as content because its tool-call syntax was broken."""
    content: Optional[str]
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: str = ""


@dataclass(frozen=True)
class Delta:
    """One piece of a stream: `content` text, or `tool_call`, the element of OpenAI's
    `choices[0].delta.tool_calls` for one chunk."""
    content: Optional[str] = None
    tool_call: Optional[dict] = None


class _Malformed(Exception):
    """Internal: the output is taken as content; the message says why."""


def detect_family(chat_template: Optional[str], tools_requested: bool) -> ToolCallFamily:
    """The family whose syntax the template's model emits: by its markers, in this order,
    [TOOL_CALLS], <tool_call>, <|python_tag|> or ipython; a template not mentioning tools is
    generic. A template mentioning tools in another syntax raises UnsupportedToolTemplate when
    tools are requested (a request without tools does not care, and gets generic)."""
    template = chat_template or ""
    if _MISTRAL_CALLS in template:
        return ToolCallFamily.MISTRAL
    if _HERMES_OPEN in template:
        return ToolCallFamily.HERMES
    if _PYTHON_TAG in template or "ipython" in template:
        return ToolCallFamily.LLAMA3
    if not tools_requested or not _MENTIONS_TOOLS.search(template):
        return ToolCallFamily.GENERIC
    found = sorted({m for m in _MARKUP.findall(template) if "tool" in m.lower()})
    raise UnsupportedToolTemplate(tuple(found[:5]))


def parse_tool_calls(family: ToolCallFamily | str, text: str, *, id_seed: Optional[str] = None,
                     allowed_names: Optional[frozenset[str]] = None) -> ParsedOutput:
    """`text`, a whole output, as content and tool calls; never raises on `text` (see the module's
    invariant). `allowed_names`: if given, a call to any other name makes the output malformed."""
    try:
        found = _PARSERS[ToolCallFamily(family)](text)
        if found is None:
            return ParsedOutput(text)
        content, calls = found
        for name, _ in calls:
            if allowed_names is not None and name not in allowed_names:
                raise _Malformed(f"tool {_quote(name)} was not offered")
    except _Malformed as e:
        return ParsedOutput(text, (), str(e))
    seed = secrets.token_hex(16) if id_seed is None else id_seed
    return ParsedOutput(content, tuple(ToolCall(_call_id(seed, i), name, arguments)
                                       for i, (name, arguments) in enumerate(calls)))


class ToolCallStream:
    """`parse_tool_calls` for a stream of text deltas. Invariant: every content delta is final
    (the content emitted is always a prefix of the content `parse_tool_calls` gives for the whole
    text), and at `finish()` the content deltas add up to that content and the tool-call deltas
    to its tool calls. `parsed` holds that ParsedOutput after `finish()`.

    Trade-off: plain text streams as it comes, holding back only trailing whitespace and what
    could still be the start of a marker (hermes, mistral), or a leading `{` / `<|python_tag|>`
    (llama3, generic). Once a call may have begun, the rest is buffered until `finish()`, which
    then sends each call as two deltas (its id and name, then its whole arguments): a call is only
    known well-formed when complete, and a malformed one must come out as content instead.
    In generic mode a `{"content": ...}` answer therefore arrives at the end in one piece.

    Work per `feed` is proportional to its delta (plus a marker's length), not to the text held:
    held text is whitespace, kept as pieces and joined once when sent, then at most a marker's
    or `<|python_tag|>`'s prefix (no marker holds whitespace, so none can begin inside it)."""

    def __init__(self, family: ToolCallFamily | str, *, id_seed: Optional[str] = None,
                 allowed_names: Optional[frozenset[str]] = None):
        self.family = ToolCallFamily(family)
        self.parsed: Optional[ParsedOutput] = None
        self._seed = secrets.token_hex(16) if id_seed is None else id_seed
        self._allowed = allowed_names
        self._parts: list[str] = []
        self._space: list[str] = []  # received, held (whitespace only): pieces, joined when sent
        self._held = ""  # received after `_space`, held: a marker's or the tag's prefix, or ""
        self._mode = "open"  # "open": still deciding; "calls": buffering to finish(); "text": all content
        self._sent = 0  # characters of content sent

    def feed(self, text_delta: str) -> list[Delta]:
        if self.parsed is not None:
            raise RuntimeError("feed() after finish()")
        self._parts.append(text_delta)
        if self._mode == "calls":
            return []
        if self._mode == "text":
            return self._send(text_delta)
        if self.family in (ToolCallFamily.HERMES, ToolCallFamily.MISTRAL):
            return self._scan_marker(self._held + text_delta)
        return self._scan_start(self._held + text_delta)

    def finish(self) -> list[Delta]:
        if self.parsed is not None:
            raise RuntimeError("finish() twice")
        self.parsed = parse_tool_calls(self.family, "".join(self._parts), id_seed=self._seed,
                                       allowed_names=self._allowed)
        out = self._send((self.parsed.content or "")[self._sent:])
        for i, call in enumerate(self.parsed.tool_calls):
            out.append(Delta(tool_call={"index": i, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}))
            out.append(Delta(tool_call={"index": i, "function": {"arguments": call.arguments}}))
        return out

    def _scan_marker(self, text: str) -> list[Delta]:
        """`text`: the held marker prefix and the delta. Sends the text before the marker once it
        is found; until then, all but trailing whitespace and a marker prefix, which it holds."""
        marker = _HERMES_OPEN if self.family == ToolCallFamily.HERMES else _MISTRAL_CALLS
        at = text.find(marker)
        if at >= 0:
            self._mode = "calls"
            words = text[:at].rstrip()
            return self._send("".join(self._space) + words if words else "")
        keep = min(len(marker) - 1, len(text))
        while keep and not text.endswith(marker[:keep]):
            keep -= 1
        ready, self._held = text[:len(text) - keep], text[len(text) - keep:]
        words = ready.rstrip()
        if not words:
            self._space.append(ready)
            return []
        sent, self._space = "".join(self._space) + words, [ready[len(words):]]
        return self._send(sent)

    def _scan_start(self, text: str) -> list[Delta]:
        """`text`: the held tag prefix and the delta. Holds leading whitespace and a prefix of
        `<|python_tag|>` (llama3); a `{` or the tag begins the calls, anything else makes the whole
        text content."""
        head = text.lstrip()  # the held prefix, if any, starts with "<"
        tagged = self.family == ToolCallFamily.LLAMA3
        if head.startswith("{") or (tagged and head.startswith(_PYTHON_TAG)):
            self._mode = "calls"
            return []
        if not head or (tagged and _PYTHON_TAG.startswith(head)):
            self._space.append(text[:len(text) - len(head)])
            self._held = head
            return []
        self._mode = "text"
        return self._send("".join(self._space) + text)

    def _send(self, text: str) -> list[Delta]:
        self._sent += len(text)
        return [Delta(content=text)] if text else []


# The family parsers: None when `text` has none of the family's syntax (it is all content), else
# (content, [(name, arguments JSON)]); _Malformed when the syntax is there but broken.
_Found = Optional[tuple[Optional[str], list[tuple[str, str]]]]


def _parse_hermes(text: str) -> _Found:
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return None
    calls: list[tuple[str, str]] = []
    pos = start
    while pos < len(text):
        if not text.startswith(_HERMES_OPEN, pos):
            raise _Malformed("text after a tool call")
        obj, pos = _json_at(text, _skip_space(text, pos + len(_HERMES_OPEN)))
        _add(calls, _call(obj))
        pos = _skip_space(text, pos)
        if not text.startswith(_HERMES_CLOSE, pos):
            raise _Malformed(f"unterminated {_HERMES_OPEN}")
        pos = _skip_space(text, pos + len(_HERMES_CLOSE))
    return text[:start].rstrip() or None, calls


def _parse_llama3(text: str) -> _Found:
    pos = _skip_space(text, 0)
    if text.startswith(_PYTHON_TAG, pos):
        pos = _skip_space(text, pos + len(_PYTHON_TAG))
    elif not text.startswith("{", pos):
        return None
    calls: list[tuple[str, str]] = []
    while pos < len(text):
        obj, pos = _json_at(text, pos)
        _add(calls, _call(obj))
        pos = _skip_space(text, pos)
        if pos < len(text):
            if text[pos] != ";":
                raise _Malformed("text after a tool call")
            pos = _skip_space(text, pos + 1)
    if not calls:
        raise _Malformed(f"no tool call after {_PYTHON_TAG}")
    return None, calls


def _parse_mistral(text: str) -> _Found:
    start = text.find(_MISTRAL_CALLS)
    if start < 0:
        return None
    calls: list[tuple[str, str]] = []
    pos = _skip_space(text, start + len(_MISTRAL_CALLS))
    if text.startswith("[", pos):
        listed, pos = _json_at(text, pos)
        if not isinstance(listed, list) or not listed:
            raise _Malformed(f"{_MISTRAL_CALLS} is followed by an empty list")
        for obj in listed:
            _add(calls, _call(obj))
        if _skip_space(text, pos) < len(text):
            raise _Malformed("text after a tool call")
        return text[:start].rstrip() or None, calls
    pos = start
    while pos < len(text):
        if not text.startswith(_MISTRAL_CALLS, pos):
            raise _Malformed("text after a tool call")
        args_at = text.find(_MISTRAL_ARGS, pos)
        if args_at < 0:
            raise _Malformed(f"{_MISTRAL_CALLS} without a list or {_MISTRAL_ARGS}")
        name = text[pos + len(_MISTRAL_CALLS):args_at]
        if not _FUNCTION_NAME.fullmatch(name):
            raise _Malformed(f"tool name {_quote(name)} is not a function name")
        obj, pos = _json_at(text, _skip_space(text, args_at + len(_MISTRAL_ARGS)))
        _add(calls, (name, _arguments(obj)))
        pos = _skip_space(text, pos)
    return text[:start].rstrip() or None, calls


def _parse_generic(text: str) -> _Found:
    pos = _skip_space(text, 0)
    if not text.startswith("{", pos):
        return None
    obj, pos = _json_at(text, pos)
    if _skip_space(text, pos) < len(text):
        raise _Malformed("text after the JSON answer")
    if not isinstance(obj, dict) or not obj or not set(obj) <= {"content", "tool_calls"}:
        raise _Malformed('the JSON answer is neither {"tool_calls": [...]} nor {"content": "..."}')
    content, listed = obj.get("content"), obj.get("tool_calls")
    if content is not None and not isinstance(content, str):
        raise _Malformed('"content" is not a string')
    if listed is not None and not isinstance(listed, list):
        raise _Malformed('"tool_calls" is not a list')
    calls: list[tuple[str, str]] = []
    for item in listed or ():
        _add(calls, _call(item))
    if content is None and not calls:
        raise _Malformed("the JSON answer has neither content nor tool calls")
    return content, calls


_PARSERS: dict[ToolCallFamily, Callable[[str], _Found]] = {
    ToolCallFamily.HERMES: _parse_hermes,
    ToolCallFamily.LLAMA3: _parse_llama3,
    ToolCallFamily.MISTRAL: _parse_mistral,
    ToolCallFamily.GENERIC: _parse_generic,
}


def _call(obj: Any) -> tuple[str, str]:
    """(name, arguments JSON) of a JSON call object: "name", and "arguments" or "parameters"."""
    if not isinstance(obj, dict):
        raise _Malformed("a tool call is not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed('a tool call has no "name"' if name is None else '"name" is not a non-empty string')
    keys = [key for key in ("arguments", "parameters") if key in obj]
    if not keys:
        raise _Malformed(f'tool call {_quote(name)} has no "arguments"')
    if len(keys) > 1:
        raise _Malformed(f'tool call {_quote(name)} has both "arguments" and "parameters"')
    return name, _arguments(obj[keys[0]])


def _arguments(value: Any) -> str:
    """A JSON object's text: an object re-serialized, or a string kept as given if it is one."""
    if isinstance(value, str):
        try:
            parsed = _DECODER.decode(value)
        except (ValueError, RecursionError):
            raise _Malformed("arguments given as a string are not JSON") from None
        if isinstance(parsed, dict):
            return value
    elif isinstance(value, dict):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (ValueError, RecursionError):
            raise _Malformed("arguments cannot be serialized") from None
    raise _Malformed("arguments are not a JSON object")


def _add(calls: list[tuple[str, str]], call: tuple[str, str]) -> None:
    if len(calls) == MAX_TOOL_CALLS:
        raise _Malformed(f"more than {MAX_TOOL_CALLS} tool calls")
    calls.append(call)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _json_at(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value starting at `pos` and the index after it."""
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):
        raise _Malformed(f"invalid JSON at character {pos}") from None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _quote(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "...")


def _call_id(seed: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]
