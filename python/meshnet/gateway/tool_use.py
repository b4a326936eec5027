"""A chat request's tool calling (issue 33), from its checked tools (tool_request.py) to its
answer: the model's template family, the conversation as the template gets it, the instruction
for templates without tool syntax, a detokenizer that keeps the family's markers, and the
output's tool calls, whole (`answer`) or streamed (`ToolDeltas`).

A request gets a ToolPlan only when it offers tools and tool_choice is not "none"; without one
the prompt and the answer are exactly what they were before tools were served (tool turns in
the conversation aside: tool messages were refused before, and assistant tool_calls ignored).

Families (tool_calls.py): hermes, llama3 and mistral templates render the tools themselves
(`tools` passed to the template as transformers passes it); a generic template (no tool syntax,
such as SmolLM2's) gets the tools and the JSON answer form in a system instruction written here.
With parallel_tool_calls false, only the first call of an answer is kept. Call ids are
tool_calls.py's, except for mistral: its templates refuse a conversation whose call ids are not 9
alphanumeric characters, so there they are 9 hex digits of sha256 of tool_calls.py's id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Optional, Sequence

from meshnet.gateway.errors import bad_request
from meshnet.gateway.tool_calls import (
    MARKERS,
    ParsedOutput,
    ToolCallFamily,
    ToolCallStream,
    UnsupportedToolTemplate,
    detect_family,
    parse_tool_calls,
)
from meshnet.gateway.tool_request import ToolRequest, template_arguments


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """Tool calling for one request on one model: `family` from the model's chat template,
    `request` the request's checked tools, active (tool_choice "auto")."""

    family: ToolCallFamily
    request: ToolRequest

    @property
    def template_tools(self) -> list[dict]:
        """The `tools` variable of the chat template (a template without tools ignores it)."""
        return list(self.request.tools)

    def parse(self, text: str, ident: str) -> ParsedOutput:
        """The whole output's content and calls (the first only unless parallel); call ids from
        the completion's id."""
        parsed = parse_tool_calls(self.family, text, id_seed=ident, allowed_names=self.request.names)
        calls = parsed.tool_calls if self.request.parallel else parsed.tool_calls[:1]
        calls = tuple(dataclasses.replace(call, id=self.call_id(call.id)) for call in calls)
        return dataclasses.replace(parsed, tool_calls=calls)

    def call_id(self, parsed_id: str) -> str:
        """The id the answer gives a call tool_calls.py named `parsed_id` (see the module)."""
        if self.family is ToolCallFamily.MISTRAL:
            return hashlib.sha256(parsed_id.encode()).hexdigest()[:9]
        return parsed_id

    def answer(self, text: str, ident: str, finish_reason: str) -> tuple[dict, str]:
        """The chat completion's message and finish_reason for the generated `text`: with
        tool_calls and "tool_calls" when the model called tools, else the content (the whole
        text when its tool-call syntax was malformed) and `finish_reason` unchanged."""
        parsed = self.parse(text, ident)
        if not parsed.tool_calls:
            return {"role": "assistant", "content": parsed.content}, finish_reason
        calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                 for call in parsed.tool_calls]
        return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"


def plan_for(body: Any, served: Any) -> Optional[ToolPlan]:
    """The plan of a checked ChatRequest on `served`'s model; None without active tools. A
    template with a tool syntax tool_calls.py cannot parse is a 400 naming its markup."""
    tools = body.checked_tools
    if tools is None or not tools.active:
        return None
    try:
        family = detect_family(served.tokenizer.chat_template, True)
    except UnsupportedToolTemplate as err:
        raise bad_request(f"model {served.name!r}: {err}", "tools") from None
    return ToolPlan(family, tools)


def template_messages(messages: Sequence[Any], template: str, plan: Optional[ToolPlan]) -> list[dict]:
    """The conversation (checked ChatMessage objects) as the chat template gets it: {"role",
    "content"} per message, developer as system, as always. Assistant tool calls are structured
    (`tool_calls`, arguments as a dict when they are a JSON object, content None when absent) for
    a template that reads `tool_calls`; a template that does not gets them in its content, in the
    generic JSON answer form (what the model is asked to write). A tool message keeps its
    `tool_call_id` and gets `name`, the called function's. With a generic plan the tool
    instruction opens the first message if it is a system message, else comes first as one."""
    structured = "tool_calls" in template
    called: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        message: dict = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            called.update((call.id, call.function.name) for call in m.tool_calls)
            if structured:
                message["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                    "name": call.function.name, "arguments": template_arguments(call.function.arguments)}}
                    for call in m.tool_calls]
                if m.content is None:
                    message["content"] = None
            else:
                message["content"] = generic_answer(m.text(), m.tool_calls)
        if m.role == "tool":
            message["tool_call_id"] = m.tool_call_id
            message["name"] = m.name or called.get(m.tool_call_id)
        out.append(message)
    if plan is not None and plan.family is ToolCallFamily.GENERIC:
        instruction = generic_instruction(plan.request)
        if out[0]["role"] == "system":
            first = out[0]["content"]
            out[0]["content"] = f"{instruction}\n\n{first}" if first else instruction
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def generic_answer(content: str, calls: Sequence[Any]) -> str:
    """An earlier assistant turn's calls in the generic JSON answer form (tool_calls.py)."""
    listed = [{"name": call.function.name, "arguments": template_arguments(call.function.arguments)}
              for call in calls]
    answer = {"content": content, "tool_calls": listed} if content else {"tool_calls": listed}
    return json.dumps(answer, ensure_ascii=False)


def generic_instruction(request: ToolRequest) -> str:
    """The system instruction for a template without tool syntax: each tool as JSON, and the
    exact answer form the generic parser reads."""
    lines = ["You can call tools. Each line below is one tool as JSON: its name, what it does and its parameters "
             "(a JSON schema)."]
    lines += [json.dumps(tool["function"], ensure_ascii=False) for tool in request.tools]
    lines += ["To call a tool, answer with only this JSON, with nothing before or after it:",
              '{"tool_calls": [{"name": "<the tool\'s name>", "arguments": {"<parameter>": <value>}}]}',
              "To call several tools at once, put one object per call in that list." if request.parallel
              else "Call one tool at a time.",
              'Each result comes back in a message with the role "tool". To answer without calling a tool, write '
              "your answer as plain text."]
    return "\n".join(lines)


def decoder(tok: Any, family: ToolCallFamily) -> Callable[[list[int]], str]:
    """`tok.decode`, except that the family's markers that are special tokens of the vocabulary
    (which decode drops: [TOOL_CALLS] and <|python_tag|> usually are) come out as their text.
    Every other special token is still dropped. The text between markers is decoded as usual, so
    a multi-byte character split around a marker token comes out as U+FFFD (it is not valid
    UTF-8 in any order)."""
    markers: dict[int, str] = {}
    for marker in MARKERS[family]:
        ids = tok.encode(marker, add_bos=False, special=True)
        if len(ids) == 1 and tok.decode(ids) != marker and tok.decode(ids, skip_special=False) == marker:
            markers[ids[0]] = marker
    if not markers:
        return tok.decode

    def decode(ids: list[int]) -> str:
        out, start = [], 0
        for n, token_id in enumerate(ids):
            if token_id in markers:
                out += [tok.decode(ids[start:n]), markers[token_id]]
                start = n + 1
        out.append(tok.decode(ids[start:]))
        return "".join(out)

    return decode


class ToolDeltas:
    """A streamed answer's `choices[0].delta` objects: {"content": text} and {"tool_calls":
    [call delta]} in OpenAI's chunk format, from ToolCallStream (its invariant: content deltas
    are never taken back; calls come whole at finish()). Calls past the first are dropped when
    parallel_tool_calls is false."""

    def __init__(self, plan: ToolPlan, ident: str) -> None:
        self._stream = ToolCallStream(plan.family, id_seed=ident, allowed_names=plan.request.names)
        self._plan = plan
        self.called = False

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self._stream.feed(text))

    def finish(self) -> list[dict]:
        return self._deltas(self._stream.finish())

    def finish_reason(self, finish_reason: str) -> str:
        """The stream's finish_reason: "tool_calls" once a call was sent, else the generation's."""
        return "tool_calls" if self.called else finish_reason

    def _deltas(self, deltas: list) -> list[dict]:
        out = []
        for delta in deltas:
            if delta.tool_call is None:
                out.append({"content": delta.content})
            elif self._plan.request.parallel or delta.tool_call["index"] == 0:
                self.called = True
                call = delta.tool_call
                if "id" in call:
                    call = {**call, "id": self._plan.call_id(call["id"])}
                out.append({"tool_calls": [call]})
        return out
