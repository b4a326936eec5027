"""The gateway's HTTP API against a test fake of the swarm (FakeSwarmBackend) and a test fake
tokenizer (one token per byte): every error row of issue 15, OpenAI framing, keys and slots.
The live swarm is tests/gateway/gateway_test.py's business; this runs a real uvicorn on a real socket.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import openai
import pytest

from meshnet.gateway.api import Gateway, GatewayConfig, ServedModel
from meshnet.gateway.api_fakes import KEY, OTHER_KEY, FakeSwarmBackend, FakeTokenizer, request, running
from meshnet.gateway.keys import ApiKey, KeyRing, digest
from meshnet.http_bounds import HttpBounds


@pytest.fixture(scope="module")
def served():
    backend = FakeSwarmBackend()
    keys = KeyRing([ApiKey("alice", digest(KEY), 2), ApiKey("bob", digest(OTHER_KEY), 1)])
    models = [ServedModel(name, FakeTokenizer()) for name in ("fake", *FakeSwarmBackend.FAILURES)]
    gateway = Gateway(models, backend, keys, GatewayConfig(default_max_tokens=32, max_body_bytes=4096))
    with running(gateway) as port:
        yield backend, gateway, port


CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
ERRORS = [  # (what, path, body, key, status, param)
    ("no key", "/v1/chat/completions", CHAT, None, 401, None),
    ("wrong key", "/v1/chat/completions", CHAT, "sk-not-a-key-000000000", 401, None),
    ("key on /v1/models", "/v1/models", None, "sk-not-a-key-000000000", 401, None),
    ("unknown model", "/v1/chat/completions", {**CHAT, "model": "gpt-9"}, KEY, 404, "model"),
    ("n > 1", "/v1/chat/completions", {**CHAT, "n": 2}, KEY, 400, "n"),
    ("temperature > 2", "/v1/chat/completions", {**CHAT, "temperature": 2.5}, KEY, 400, "temperature"),
    ("top_p 0", "/v1/chat/completions", {**CHAT, "top_p": 0}, KEY, 400, "top_p"),
    ("max_tokens 0", "/v1/chat/completions", {**CHAT, "max_tokens": 0}, KEY, 400, "max_tokens"),
    ("no messages", "/v1/chat/completions", {**CHAT, "messages": []}, KEY, 400, "messages"),
    ("bad role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, KEY, 400,
     "messages.0.role"),
    ("five stops", "/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, KEY, 400, "stop"),
    ("tools", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, KEY, 400, "tools"),
    ("penalty", "/v1/chat/completions", {**CHAT, "presence_penalty": 1.0}, KEY, 400, "presence_penalty"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**CHAT, "top_logprobs": 2}, KEY, 400, "top_logprobs"),
    ("stream_options without stream", "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}},
     KEY, 400, "stream_options"),
    ("no prompt", "/v1/completions", {"model": "fake"}, KEY, 400, "prompt"),
    ("empty prompt", "/v1/completions", {"model": "fake", "prompt": ""}, KEY, 400, "prompt"),
    ("token out of vocab", "/v1/completions", {"model": "fake", "prompt": [1, 99999]}, KEY, 400, "prompt"),
    ("two prompts", "/v1/completions", {"model": "fake", "prompt": ["a", "b"]}, KEY, 400, "prompt"),
    ("over the route's limit", "/v1/completions", {"model": "long", "prompt": "x"}, KEY, 400, None),
    ("tracker: no capacity", "/v1/chat/completions", {**CHAT, "model": "busy"}, KEY, 429, None),
    ("tracker: no coverage", "/v1/chat/completions", {**CHAT, "model": "uncovered"}, KEY, 503, None),
    ("stream, no coverage", "/v1/chat/completions", {**CHAT, "model": "uncovered", "stream": True}, KEY, 503, None),
    ("route: deadline", "/v1/completions", {"model": "slow", "prompt": "x"}, KEY, 504, None),
]


@pytest.mark.parametrize("what,path,body,key,status,param", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_rows(served, what, path, body, key, status, param):
    backend, gateway, port = served
    before = len(backend.started)
    got, headers, data = request(port, "POST" if body is not None else "GET", path, body, key)
    assert got == status, data
    error = json.loads(data)["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param
    if status == 429:
        assert int(headers["Retry-After"]) >= 1
    if status in (400, 401, 404) and "route" not in what:
        assert len(backend.started) == before  # refused before any route was asked for
    # An honest request right after is unharmed, and every slot was given back.
    ok, _, answer = request(port, "POST", "/v1/chat/completions", CHAT)
    assert ok == 200, answer
    assert gateway.keys.in_use("alice") == 0


def test_bad_json_and_oversized_body(served):
    _, _, port = served
    status, _, data = request(port, "POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and "JSON" in json.loads(data)["error"]["message"]
    status, _, _ = request(port, "POST", "/v1/chat/completions", raw=b"{" + b" " * 5000 + b"}")
    assert status == 413


def test_openai_client_chat_and_completions(served):
    backend, _, port = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="fake", messages=[{"role": "system", "content": "be brief"},
                                                                   {"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello, world!"
    assert reply.choices[0].finish_reason == "stop"
    prompt = "<system>be brief\n<user>hi\n<assistant>"
    assert backend.started[-1] == ("fake", "key:alice", list(prompt.encode()))
    assert reply.usage.prompt_tokens == len(prompt.encode()) and reply.usage.completion_tokens == 14  # 13 + EOS
    cut = client.completions.create(model="fake", prompt="x", max_tokens=5)
    assert cut.choices[0].text == "Hello" and cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 5
    stopped = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}], stop=[", w"])
    assert stopped.choices[0].message.content == "Hello" and stopped.choices[0].finish_reason == "stop"
    assert backend.streams[-1].cancelled  # the swarm stops generating at the stop string
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}], n=3)
    listed = client.models.list()
    assert {m.id for m in listed.data} >= {"fake", "uncovered"}
    models = json.loads(request(port, "GET", "/v1/models")[2])["data"]
    assert {m["id"]: m["meshnet"]["coverage"] for m in models}["uncovered"] == "none"


def test_openai_client_streaming_with_usage_and_logprobs(served):
    _, _, port = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True},
                                                 logprobs=True, top_logprobs=1))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world!"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 14
    assert all(c.usage is None for c in chunks[:-1])
    logprobs = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert logprobs[0].token == "H" and logprobs[0].logprob == -0.5 and len(logprobs[0].top_logprobs) == 1


def test_concurrency_limit_per_key_and_slots_come_back(served):
    backend, gateway, port = served
    backend.gap = 0.05  # slow tokens, so bob's one slot is held while he asks again
    try:
        results = {}

        def first():
            results["first"] = request(port, "POST", "/v1/completions", {"model": "fake", "prompt": "x"}, OTHER_KEY)

        thread = threading.Thread(target=first)
        thread.start()
        deadline = time.monotonic() + 5
        while gateway.keys.in_use("bob") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        status, headers, data = request(port, "POST", "/v1/completions", {"model": "fake", "prompt": "x"}, OTHER_KEY)
        assert status == 429 and json.loads(data)["error"]["code"] == "concurrency_limit"
        assert headers["Retry-After"] == "1"
        # alice, beside him, is unaffected
        assert request(port, "POST", "/v1/completions", {"model": "fake", "prompt": "x"})[0] == 200
        thread.join()
        assert results["first"][0] == 200
        assert gateway.keys.in_use("bob") == 0
    finally:
        backend.gap = 0.0


def test_sse_framing(served):
    _, _, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions", body=json.dumps({"model": "fake", "prompt": "x", "stream": True}),
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    body = response.read().decode()
    events = body.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert "".join(p["choices"][0]["text"] for p in payloads) == "Hello, world!"
    assert all(p["object"] == "text_completion" and p["id"] == payloads[0]["id"] for p in payloads)


def test_requests_past_the_in_flight_limit_are_refused_and_the_held_one_finishes():
    """A server limited to 1 request in flight: a second client gets 503 while the first streams;
    the first is unharmed, and once it is done the next request is served."""
    backend = FakeSwarmBackend()
    backend.gap = 0.05  # the held stream lasts about 0.7 s
    gateway = Gateway([ServedModel("fake", FakeTokenizer())], backend, None, GatewayConfig())
    with running(gateway, HttpBounds(max_in_flight=1)) as port:
        results = {}
        held = threading.Thread(target=lambda: results.setdefault(
            "held", request(port, "POST", "/v1/completions", {"model": "fake", "prompt": "x"}, key=None)))
        held.start()
        deadline = time.monotonic() + 5
        while not backend.started and time.monotonic() < deadline:
            time.sleep(0.005)
        status, _, _ = request(port, "GET", "/healthz", key=None)
        assert status == 503
        held.join()
        status, _, data = results["held"]
        assert status == 200 and json.loads(data)["choices"][0]["text"] == "Hello, world!"
        assert request(port, "GET", "/healthz", key=None)[0] == 200
