"""Issue 15 acceptance on a live swarm: the OpenAI-compatible gateway in front of three GGUF
nodes (native workers), driven by the official `openai` client and by curl.

- non-streaming and streaming chat give the text of a direct RouteClient greedy generation of
  the same prompt, with correct usage counts;
- 8 concurrent streaming chats give the same text as each alone;
- a client that disconnects mid-stream leaves 0 sessions and 0 KV cells on every hop within 1 s;
- `curl -N` sees SSE framing (data: lines, blank-line separated, a final [DONE]);
- the gateway's /metrics series move during a generation (parsed with the Prometheus parser).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.text.chat import render_chat
from meshnet.text.tokenizer import GgufTokenizer
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.swarm.gateway import GatewayProcess
from meshnet.swarm.local import LocalSwarm
from meshnet.tracker.ledger.ledger import Ledger

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
CUTS = [(0, 10), (10, 20), (20, 30)]
TOKENS = 24
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primes.",
             "¿Qué hora es en Madrid?", "Explain recursion in one sentence.", "def add(a, b):",
             "List two colours.", "Say hello in Japanese."]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("gateway"), GGUF, CUTS, backend="gguf", worker_binary=WORKER,
                    max_sessions=12) as s:
        yield s


@pytest.fixture(scope="module")
def gateway(swarm):
    with GatewayProcess(swarm) as g:
        yield g


@pytest.fixture(scope="module")
def tokenizer():
    return GgufTokenizer.from_gguf(GGUF)


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=120)


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": question}]


def direct(swarm, tokenizer, question: str) -> tuple[str, int, list[int]]:
    """Greedy text, prompt token count and generated ids of a direct RouteClient generation."""
    ids = tokenizer.encode(render_chat(tokenizer.chat_template, messages(question), bos_token=tokenizer.bos_token,
                                       eos_token=tokenizer.eos_token, add_generation_prompt=True))
    with swarm.client() as tracker:
        out = list(RouteClient(tracker, swarm.model).generate(
            ids, GenerationParams(max_tokens=TOKENS, stop_token_ids=tuple(tokenizer.stop_token_ids))))
    text = tokenizer.decode([i for i in out if i not in tokenizer.stop_token_ids])
    return text, len(ids), out


def hops_idle(swarm) -> dict:
    out = {}
    for node_id, channel in swarm.shard_channels().items():
        h = shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(), timeout=2)
        out[node_id] = (h.active_sessions, h.kv_cells_used)
    return out


def test_chat_equals_the_direct_client(swarm, tokenizer, client):
    question = QUESTIONS[0]
    text, prompt_tokens, generated = direct(swarm, tokenizer, question)
    completion_tokens = len(generated)
    assert text.strip()
    reply = client.chat.completions.create(model=swarm.model, messages=messages(question), temperature=0,
                                           max_tokens=TOKENS)
    assert reply.choices[0].message.content == text
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == completion_tokens
    assert reply.choices[0].finish_reason == ("stop" if generated[-1] in tokenizer.stop_token_ids else "length")
    chunks = list(client.chat.completions.create(model=swarm.model, messages=messages(question), temperature=0,
                                                 max_tokens=TOKENS, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.prompt_tokens == prompt_tokens
    assert chunks[-1].usage.completion_tokens == completion_tokens


def test_a_gguf_other_than_the_certified_artifact_is_refused_at_start(swarm, client, tmp_path):
    """Issue 35, finding 11: a gateway handed a GGUF that is not the tracker's certified artifact
    (here the bundled file with one byte of its last tensor changed: the same vocabulary and
    template, another sha256) exits 2 before it listens, naming both fingerprints; the gateway
    beside it still serves."""
    forged = tmp_path / "forged.gguf"
    shutil.copyfile(GGUF, forged)
    with open(forged, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    other = GatewayProcess(swarm, gguf=forged, name="forged-gateway")
    with pytest.raises(RuntimeError, match="did not come up"):
        other.start(timeout=60)
    assert other.proc.returncode == 2
    log = other.log.read_text()
    assert "but the tracker certified sha256:" in log and "serve the certified file" in log
    reply = client.chat.completions.create(model=swarm.model, messages=messages(QUESTIONS[1]), temperature=0,
                                           max_tokens=4)
    assert reply.choices[0].message.content


def test_eight_concurrent_streams_equal_solo(swarm, tokenizer, client):
    solo = {q: direct(swarm, tokenizer, q)[0] for q in QUESTIONS}

    def streamed(question: str) -> str:
        stream = client.chat.completions.create(model=swarm.model, messages=messages(question), temperature=0,
                                                max_tokens=TOKENS, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(max_workers=len(QUESTIONS)) as pool:
        together = dict(zip(QUESTIONS, pool.map(streamed, QUESTIONS)))
    assert together == solo


def test_disconnect_frees_every_hop_within_a_second(swarm, gateway):
    body = json.dumps({"model": swarm.model, "messages": messages("Tell me a very long story about a dragon."),
                       "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + gateway.key.encode() + b"\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while received.count(b"data: ") < 6:  # the stream is flowing: a few tokens in
        received += sock.recv(65536)
    assert any(s != (0, 0) for s in hops_idle(swarm).values())
    sock.close()
    closed = time.monotonic()
    while True:
        state = hops_idle(swarm)
        if all(s == (0, 0) for s in state.values()):
            break
        assert time.monotonic() - closed < 1.0, state
        time.sleep(0.02)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_sees_sse_framing(swarm, gateway):
    body = json.dumps({"model": swarm.model, "messages": messages("Say hi."), "max_tokens": 8, "temperature": 0,
                       "stream": True})
    out = subprocess.run(["curl", "-N", "-sS", "--fail-with-body", f"{gateway.base_url}/chat/completions",
                          "-H", f"Authorization: Bearer {gateway.key}", "-H", "Content-Type: application/json",
                          "-d", body], capture_output=True, text=True, timeout=120, check=True).stdout
    events = out.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", out
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_gateway_metrics_move(swarm, gateway, client):
    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    before = scrape()
    client.chat.completions.create(model=swarm.model, messages=messages("Name a fruit."), temperature=0, max_tokens=6)
    after = scrape()
    for series in ("meshnet_gateway_completion_tokens_total", "meshnet_gateway_prompt_tokens_total",
                   "meshnet_gateway_time_to_first_token_seconds_count", "meshnet_gateway_inter_token_seconds_count",
                   "meshnet_gateway_requests_total"):
        assert after.get(series, 0) > before.get(series, 0), series


def test_ledger_attributes_work_to_the_key(swarm, gateway, client):
    """Every hop's work on the gateway's routes is counted for the key ("key:local")."""
    reply = client.completions.create(model=swarm.model, prompt="One, two, three,", temperature=0, max_tokens=5)
    prompt_tokens, generated = reply.usage.prompt_tokens, reply.usage.completion_tokens
    ledger = Ledger(swarm.tracker.db)
    try:
        deadline = time.monotonic() + 20  # nodes report their work with their heartbeats
        while True:
            by_client = {c.client_id: c for c in ledger.totals_by_client()}
            key = by_client.get("key:local")
            if key is not None and key.prefill_tokens >= 3 * prompt_tokens and key.decode_tokens >= 3 * (generated - 1):
                break
            assert time.monotonic() < deadline, by_client
            time.sleep(0.2)
        assert set(by_client) <= {"key:local", "meshnet-client"}  # the direct client's routes are its own
    finally:
        ledger.close()
