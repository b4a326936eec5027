"""Token ids of a request's prompt: chat messages through the GGUF's chat template, or a
completion's text or ids. `served` is the gateway's ServedModel (its name and tokenizer).

Chat: the template's own text is tokenized with control tokens parsed, as llama.cpp's server
does, but a message's content never is (issue 35, finding 15): a user who types
"<|im_start|>system" must not forge a system turn. When no content spells a control token, the
rendered prompt is tokenized whole (the common case, and exactly what llama.cpp does); when one
does, the template is rendered again with a placeholder for each content, its text tokenized
with control tokens, and each content as plain text in its place. A template that changes its
contents (the placeholders filled in do not give the rendered prompt back) cannot be split so:
such a request is refused (400) rather than tokenized unsafely. Tool turns and tools (issue 33,
tool_use.py) are text the client sends outside contents: where a template renders them itself
(structured tool calls, tools of a hermes/llama3/mistral template) and they spell a control
token, the request is refused (400) too; a generic template gets them inside contents.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from meshnet.gateway import schema
from meshnet.text.chat import ChatTemplateError, render_chat
from meshnet.gateway.errors import bad_request
from meshnet.gateway.tool_calls import ToolCallFamily
from meshnet.gateway.tool_use import ToolPlan, template_messages

_PLACEHOLDER = "\ue000{}\ue001"  # Unicode private-use code points around the message's index
_PLACEHOLDERS = re.compile("(\ue000[0-9]+\ue001)")


def prompt_chars(body) -> int:
    """The prompt's size before it is rendered or tokenized: its characters (a token id counts
    one); a chat's tool calls (names and arguments) and active tools (as JSON) count too."""
    if isinstance(body, schema.ChatRequest):
        calls = sum(len(c.function.name) + len(c.function.arguments) for m in body.messages for c in m.tool_calls or ())
        tools = body.checked_tools.chars() if body.checked_tools is not None else 0
        return sum(len(m.text()) for m in body.messages) + calls + tools
    prompt = body.prompt
    return len(prompt) if isinstance(prompt, str) else sum(len(p) if isinstance(p, str) else 1 for p in prompt)


def chat_prompt(served, body: schema.ChatRequest, plan: Optional[ToolPlan] = None) -> list[int]:
    """`plan`: the request's tool plan (tool_use.plan_for), None without active tools."""
    tok = served.tokenizer
    if not tok.chat_template:
        raise bad_request(f"model {served.name!r} has no chat template; use /v1/completions", "messages")
    messages = template_messages(body.messages, tok.chat_template, plan)
    extra = {"tools": plan.template_tools} if plan is not None else {}
    _refuse_control_tokens_outside_contents(tok, messages, body.messages, plan)
    text = _render(tok, messages, extra)
    texts = [i for i, m in enumerate(messages) if isinstance(m["content"], str)]  # None: a call without content
    spelled = [i for i in texts if _spells_control_tokens(tok, messages[i]["content"])]
    if not spelled:
        return tok.encode(text, special=True)
    skeleton = _render(tok, [dict(m, content=_PLACEHOLDER.format(i)) if isinstance(m["content"], str) else m
                             for i, m in enumerate(messages)], extra)
    pieces = _PLACEHOLDERS.split(skeleton)
    filled = "".join(messages[int(p[1:-1])]["content"] if n % 2 else p for n, p in enumerate(pieces))
    if pieces[1::2] != [_PLACEHOLDER.format(i) for i in texts] or filled != text:
        first = spelled[0] - (len(messages) - len(body.messages))  # -1: the tool instruction put first
        where = f"messages[{first}].content" if first >= 0 else "the tool instruction (tools)"
        raise bad_request(f"{where} spells a control token, and this model's chat template "
                          "changes message contents, so it cannot be kept as plain text", "messages")
    ids: list[int] = []
    for n, piece in enumerate(pieces):
        if not piece:
            continue
        content = n % 2 == 1
        text = messages[int(piece[1:-1])]["content"] if content else piece
        ids += tok.encode(text, add_bos=None if not ids else False, special=not content)
    return ids


def _render(tok, messages: list[dict], extra: dict) -> str:
    try:
        return render_chat(tok.chat_template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token,
                           add_generation_prompt=True, **extra)
    except ChatTemplateError as err:
        raise bad_request(str(err), "messages") from None


def _refuse_control_tokens_outside_contents(tok, messages: list[dict], body_messages: list,
                                            plan: Optional[ToolPlan]) -> None:
    """A 400 when text the template renders itself, outside contents, spells a control token:
    structured tool calls and tool_call_ids, and tools unless the template is generic (its tools
    are in the instruction, a content)."""
    shift = len(messages) - len(body_messages)
    for n, m in enumerate(messages):
        fields = {key: m[key] for key in ("tool_calls", "tool_call_id") if key in m}
        if fields and _spells_control_tokens(tok, json.dumps(fields, ensure_ascii=False)):
            raise bad_request(f"{' or '.join(f'messages[{n - shift}].{key}' for key in fields)} spells a control "
                              "token of this model, which cannot be kept as plain text there", "messages")
    if plan is not None and plan.family is not ToolCallFamily.GENERIC and _spells_control_tokens(
            tok, json.dumps(plan.template_tools, ensure_ascii=False)):
        raise bad_request("tools spell a control token of this model, which cannot be kept as plain text there",
                          "tools")


def _spells_control_tokens(tok, text: str) -> bool:
    """Whether `text` holds the text of a control token (it tokenizes differently with them parsed)."""
    return tok.encode(text, add_bos=False, special=True) != tok.encode(text, add_bos=False, special=False)


def completion_prompt(served, body: schema.CompletionRequest) -> list[int]:
    prompt = body.prompt
    tok = served.tokenizer
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise bad_request("one prompt per request (a list of several is like n > 1)", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tok.encode(prompt, special=False)
    else:
        ids = list(prompt)
        if any(not 0 <= i < tok.vocab_size for i in ids):
            raise bad_request(f"token ids must be in 0..{tok.vocab_size - 1}", "prompt")
    if not ids:
        raise bad_request("the prompt is empty", "prompt")
    return ids
