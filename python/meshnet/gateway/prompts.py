"""Token ids of a request's prompt: chat messages through the GGUF's chat template, or a
completion's text or ids. `served` is the gateway's ServedModel (its name and tokenizer).

Chat: the template's own text is tokenized with control tokens parsed, as llama.cpp's server
does, but a message's content never is (issue 35, finding 15): a user who types
"<|im_start|>system" must not forge a system turn. When no content spells a control token, the
rendered prompt is tokenized whole (the common case, and exactly what llama.cpp does); when one
does, the template is rendered again with a placeholder for each content, its text tokenized
with control tokens, and each content as plain text in its place. A template that changes its
contents (the placeholders filled in do not give the rendered prompt back) cannot be split so:
such a request is refused (400) rather than tokenized unsafely.
"""

from __future__ import annotations

import re

from meshnet.gateway import schema
from meshnet.gateway.chat import ChatTemplateError, render_chat
from meshnet.gateway.errors import bad_request

_PLACEHOLDER = "\ue000{}\ue001"  # Unicode private-use code points around the message's index
_PLACEHOLDERS = re.compile("(\ue000[0-9]+\ue001)")


def prompt_chars(body) -> int:
    """The prompt's size before it is rendered or tokenized: its characters (a token id counts one)."""
    if isinstance(body, schema.ChatRequest):
        return sum(len(m.text()) for m in body.messages)
    prompt = body.prompt
    return len(prompt) if isinstance(prompt, str) else sum(len(p) if isinstance(p, str) else 1 for p in prompt)


def chat_prompt(served, body: schema.ChatRequest) -> list[int]:
    messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in body.messages]
    tok = served.tokenizer
    if not tok.chat_template:
        raise bad_request(f"model {served.name!r} has no chat template; use /v1/completions", "messages")
    text = _render(tok, messages)
    spelled = [i for i, m in enumerate(messages) if _spells_control_tokens(tok, m["content"])]
    if not spelled:
        return tok.encode(text, special=True)
    skeleton = _render(tok, [dict(m, content=_PLACEHOLDER.format(i)) for i, m in enumerate(messages)])
    pieces = _PLACEHOLDERS.split(skeleton)
    filled = "".join(messages[int(p[1:-1])]["content"] if n % 2 else p for n, p in enumerate(pieces))
    if pieces[1::2] != [_PLACEHOLDER.format(i) for i in range(len(messages))] or filled != text:
        raise bad_request(f"messages[{spelled[0]}].content spells a control token, and this model's chat template "
                          "changes message contents, so it cannot be kept as plain text", "messages")
    ids: list[int] = []
    for n, piece in enumerate(pieces):
        if not piece:
            continue
        content = n % 2 == 1
        text = messages[int(piece[1:-1])]["content"] if content else piece
        ids += tok.encode(text, add_bos=None if not ids else False, special=not content)
    return ids


def _render(tok, messages: list[dict]) -> str:
    try:
        return render_chat(tok.chat_template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token,
                           add_generation_prompt=True)
    except ChatTemplateError as err:
        raise bad_request(str(err), "messages") from None


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
