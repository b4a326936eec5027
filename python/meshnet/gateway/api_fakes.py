"""Test fakes for the gateway's API tests (api_test.py, hostile_test.py, tool_api_test.py): a
fake swarm backend (FakeSwarmBackend, whose outputs a test can script), a fake tokenizer (one
token per byte) and one with a special token (FakeMarkerTokenizer), the app under uvicorn as
main.py configures it (`running`), and one HTTP request (`request`). Named as fakes: never used
outside tests."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
from typing import Optional, Union

import uvicorn

from meshnet.client.session import MeshnetError
from meshnet.gateway.api import Gateway, create_app
from meshnet.gateway.main import server_config
from meshnet.http_bounds import HttpBounds
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.status import Status, StatusCode

EOS = 256
KEY, OTHER_KEY = "sk-test-alice-0123456789", "sk-test-bob-0123456789ab"


class FakeTokenizer:
    """Test fake: one token per UTF-8 byte, EOS = 256; the chat template joins the turns."""

    chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}")
    bos_token, eos_token, vocab_size, stop_token_ids = "", "</s>", 257, (EOS,)

    def encode(self, text: str, special: bool = True, add_bos=None) -> list[int]:
        return list(text.encode())

    def decode(self, ids, skip_special: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class FakeMarkerTokenizer(FakeTokenizer):
    """Test fake: FakeTokenizer plus one control token, MARKER_ID for MARKER (as Mistral's
    [TOOL_CALLS] is): one id when encoded with special=True, dropped by decode unless
    skip_special=False. Its template renders tools and tool calls Mistral's way, and refuses call
    ids that are not 9 characters long as Mistral's do."""

    MARKER, MARKER_ID = "[TOOL_CALLS]", 257
    vocab_size = 258
    chat_template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% if c.id | length != 9 %}"
                     "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
                     "{% endfor %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}"
                     "{% else %}<{{ m.role }}>{{ m.content }}{% endif %}\n{% endfor %}"
                     "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}")

    def encode(self, text: str, special: bool = True, add_bos=None) -> list[int]:
        if not special:
            return super().encode(text)
        ids: list[int] = []
        for n, part in enumerate(text.split(self.MARKER)):
            ids += ([self.MARKER_ID] if n else []) + super().encode(part)
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        kept = (self.MARKER.encode() if i == self.MARKER_ID else bytes([i]) for i in ids
                if i < 256 or (i == self.MARKER_ID and not skip_special))
        return b"".join(kept).decode(errors="replace")


class FakeStream:
    """Test fake of generation.TokenStream: yields `reply`'s bytes or ids (then EOS), or fails;
    like a last hop, it reports STOP with EOS and LENGTH with the max_tokens-th token."""

    def __init__(self, reply: Union[bytes, list[int]], max_tokens: int, failure: Optional[Status], gap: float) -> None:
        ids = list(reply)[:max_tokens]
        if len(ids) < max_tokens:
            ids.append(EOS)
        self.ids, self.failure, self.gap = ids, failure, gap
        self.cancelled = False
        self.failovers = 0
        self.finish_reason: Optional[t.FinishReason] = None

    async def next(self) -> Optional[t.SampledToken]:
        if self.failure is not None:
            raise MeshnetError(self.failure)
        await asyncio.sleep(self.gap)
        if self.cancelled or not self.ids:
            return None
        token = self.ids.pop(0)
        if token == EOS:
            self.ids, self.finish_reason = [], t.FinishReason.STOP
        elif not self.ids:
            self.finish_reason = t.FinishReason.LENGTH
        return t.SampledToken(token, 0, -0.5, (t.TokenLogprob(token, -0.5),))

    def cancel(self) -> None:
        self.cancelled = True


class FakeSwarmBackend:
    """Test fake of generation.SwarmBackend; the model name picks the behaviour."""

    FAILURES = {"busy": Status(StatusCode.RESOURCE_EXHAUSTED, "all sessions in use", True),
                "uncovered": Status(StatusCode.UNAVAILABLE, "no chain of nodes gets past layer 10", True),
                "slow": Status(StatusCode.DEADLINE_EXCEEDED, "no token for 120s", True),
                "long": Status(StatusCode.INVALID_ARGUMENT, "this route takes at most 64 tokens")}

    def __init__(self) -> None:
        self.started: list[tuple[str, str, list[int]]] = []
        self.params: list = []  # each generation's GenerationParams, in order
        self.streams: list[FakeStream] = []
        self.reply, self.gap = b"Hello, world!", 0.0
        self.scripted: list[Union[bytes, list[int]]] = []  # outputs of the next generations, in order

    def start(self, model, client_id, prompt_ids, params):
        self.started.append((model, client_id, list(prompt_ids)))
        self.params.append(params)
        reply = self.scripted.pop(0) if self.scripted else self.reply
        stream = FakeStream(reply, params.max_tokens, self.FAILURES.get(model), self.gap)
        self.streams.append(stream)
        return stream

    def coverage(self, model):
        gaps = (tt.LayerRange(10, 30),) if model == "uncovered" else ()
        return tt.CoverageReply(Status(StatusCode.OK), 30, (), gaps, (), ())


@contextlib.contextmanager
def running(gateway: Gateway, bounds: HttpBounds = HttpBounds(max_in_flight=64)):
    """The gateway app under uvicorn as main.py configures it, on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    server = uvicorn.Server(server_config(create_app(gateway), bounds))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def request(port: int, method: str, path: str, body=None, key: Optional[str] = KEY, raw: Optional[bytes] = None,
            source: str = "127.0.0.1"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.headers, data  # headers: case-insensitive
