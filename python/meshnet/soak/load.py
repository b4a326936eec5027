"""The chaos soak's client load: requests through the gateway's OpenAI API, mixed as users send
them, each greedy one checked against the same request's solo answer.

Kinds: `stream` (chat, streamed), `plain` (chat, one answer), `completion` (/v1/completions),
`long` (a prompt of a few thousand tokens), `cancel` (streamed, closed after a few chunks: what it
got must be a prefix of the solo answer), `disconnect` (the connection reset before the first
response byte), `sampled` (temperature 0.9: not checked). Greedy answers are deterministic in
Meshnet whatever the batch and across failovers (batch invariance, replay), so a greedy answer
that differs from its solo run is a wrong token, whatever happened to the swarm meanwhile.
Thread-safe: `Load.one` runs on many threads at once; it shares nothing but the client pool.
"""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import time
from typing import Optional
from urllib.parse import urlsplit

import requests

KINDS = ("stream", "plain", "completion", "long", "cancel", "disconnect", "sampled")
WEIGHTS = (30, 22, 10, 5, 13, 8, 12)
CHECKED = frozenset({"stream", "plain", "completion", "long", "cancel"})
PROMPTS = (
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "def fibonacci(n):",
    "Once upon a time, in a village by a river,",
    "What is 17 times 23? Show your steps.",
    "Translate 'good morning' into French, Spanish and German.",
)
LONG_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(60)) + \
    "\nSummarize the list above in one sentence."
MAX_TOKENS = 48
REQUEST_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    ended: float  # monotonic time the request ended
    kind: str
    status: str  # "ok", an HTTP status ("503"), or what broke ("ReadTimeout")
    tokens: int  # completion tokens received
    wrong: bool  # a checked answer that is not its solo answer (or a prefix of it, when cancelled)
    detail: str = ""


def _key(kind: str, prompt: str) -> str:
    return f"{'completion' if kind == 'completion' else 'chat'}:{prompt}"


class Load:
    def __init__(self, base_url: str, api_key: str, model: str) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._client = requests.Session()
        self._client.mount("http://", requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=128))
        self.solo: dict[str, str] = {}  # request key -> its solo greedy answer
        self.last_refusal = ""  # the body of the last refused non-streamed request (for the solo run's error)

    def close(self) -> None:
        self._client.close()

    def prompts_for(self, kind: str) -> tuple[str, ...]:
        return (LONG_PROMPT,) if kind == "long" else PROMPTS

    def record_solo(self) -> None:
        """Every checked request's answer, one at a time on the idle swarm: the reference."""
        for kind in ("plain", "completion", "long"):
            for prompt in self.prompts_for(kind):
                text, _, status = self._answer(kind, prompt, stream=False)
                if status != "ok":
                    raise RuntimeError(f"the solo run of {kind} {prompt[:40]!r} failed: {status} {self.last_refusal}")
                self.solo[_key(kind, prompt)] = text

    def one(self, rng: random.Random) -> Outcome:
        kind = rng.choices(KINDS, WEIGHTS)[0]
        prompt = rng.choice(self.prompts_for(kind))
        try:
            if kind == "disconnect":
                self._disconnect(prompt, rng)
                return Outcome(time.monotonic(), kind, "ok", 0, False)
            cancel_after = rng.randint(1, 6) if kind == "cancel" else None
            text, tokens, status = self._answer(kind, prompt, stream=kind in ("stream", "cancel", "sampled"),
                                                cancel_after=cancel_after, sampled=kind == "sampled",
                                                seed=rng.randrange(1 << 30))
        except (requests.RequestException, OSError, ValueError) as err:
            return Outcome(time.monotonic(), kind, type(err).__name__, 0, False, str(err)[:200])
        wrong, detail = False, ""
        if status == "ok" and kind in CHECKED:
            solo = self.solo[_key(kind, prompt)]
            wrong = not solo.startswith(text) if kind == "cancel" else text != solo
            if wrong:
                detail = json.dumps({"prompt": prompt[:60], "got": text[:200], "solo": solo[:200]})
        return Outcome(time.monotonic(), kind, status, tokens, wrong, detail)

    def _body(self, kind: str, prompt: str, stream: bool, sampled: bool, seed: int) -> tuple[str, dict]:
        body: dict = {"model": self.model, "max_tokens": MAX_TOKENS, "stream": stream,
                      "temperature": 0.9 if sampled else 0.0}
        if sampled:
            body["seed"] = seed
        if kind == "completion":
            return "/completions", {**body, "prompt": prompt}
        return "/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}

    def _answer(self, kind: str, prompt: str, stream: bool, cancel_after: Optional[int] = None,
                sampled: bool = False, seed: int = 0) -> tuple[str, int, str]:
        """(text, completion tokens, status)."""
        path, body = self._body(kind, prompt, stream, sampled, seed)
        if not stream:
            reply = self._client.post(self.base_url + path, json=body, headers=self._headers,
                                      timeout=REQUEST_TIMEOUT_S)
            if reply.status_code != 200:
                self.last_refusal = reply.text[:300]
                return "", 0, str(reply.status_code)
            data = reply.json()
            choice = data["choices"][0]
            text = choice["text"] if kind == "completion" else choice["message"]["content"] or ""
            return text, data["usage"]["completion_tokens"], "ok"
        pieces, chunks = [], 0
        with self._client.post(self.base_url + path, json=body, headers=self._headers, stream=True,
                               timeout=REQUEST_TIMEOUT_S) as reply:
            if reply.status_code != 200:
                return "", 0, str(reply.status_code)
            for line in reply.iter_lines(decode_unicode=True):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    return "".join(pieces), chunks, "stream_error"
                for choice in event.get("choices", ()):
                    piece = choice.get("text") if kind == "completion" else (choice.get("delta") or {}).get("content")
                    if piece:
                        pieces.append(piece)
                        chunks += 1
                if cancel_after is not None and chunks >= cancel_after:
                    break  # leaving the block closes the stream: the gateway must cancel the route
        return "".join(pieces), chunks, "ok"

    def _disconnect(self, prompt: str, rng: random.Random) -> None:
        """A client that sends its request and resets the connection before any answer."""
        _, body = self._body("stream", prompt, True, False, 0)
        raw = json.dumps(body).encode()
        url = urlsplit(self.base_url)
        head = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Authorization: {self._headers['Authorization']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(raw)}\r\n\r\n").encode()
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(head + raw)
            time.sleep(rng.uniform(0.0, 0.3))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
