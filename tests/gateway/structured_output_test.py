"""Issue 33 acceptance on a live swarm: tool calls and structured output through the gateway in
front of three GGUF nodes, sampled under a grammar on the last hop, driven by the official
`openai` client.

- `beta.chat.completions.parse` with a pydantic model returns the parsed object;
- json_schema output validates against its schema for 20 seeded sampled generations;
- a named tool_choice always yields one call of that function with schema-valid arguments;
- a tool-calling loop (a forced call, the result as a tool message, the answer), whole and
  streamed;
- kill -9 of the last hop's worker mid-generation: the grammar, fed the tokens of the first epoch
  on the new one, gives the tokens of an undisturbed run;
- ring decode with speculative drafts under a grammar gives plain decoding's tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Literal

import openai
import psutil
import pytest
from pydantic import BaseModel, Field

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.text.chat import render_chat
from meshnet.gateway.constrained import response_format_grammar
from meshnet.text.tokenizer import GgufTokenizer
from meshnet.swarm.gateway import GatewayProcess
from meshnet.swarm.local import LocalSwarm

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
CUTS = [(0, 10), (10, 20), (20, 30)]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                   "required": ["timezone"], "additionalProperties": False}}}


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int
    capital: bool


class Review(BaseModel):
    verdict: Literal["good", "bad", "mixed"]
    stars: int
    summary: str = Field(max_length=24)
    recommended: bool


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("structured"), GGUF, CUTS, backend="gguf", worker_binary=WORKER,
                    max_sessions=8) as s:
        s.add_node("node-2b", (20, 30))  # a second last range: a failover of the last hop goes there
        yield s


@pytest.fixture(scope="module")
def client(swarm):
    with GatewayProcess(swarm) as gateway:
        yield openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=120)


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": text}]


def test_parse_returns_the_pydantic_object(swarm, client):
    reply = client.beta.chat.completions.parse(model=swarm.model, messages=ask("Describe Paris as JSON."),
                                               response_format=City, temperature=0, max_tokens=96)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City), choice.message
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_schema_output_validates_for_20_seeded_sampled_generations(swarm, client):
    schema = {"name": "review", "strict": True, "schema": Review.model_json_schema() | {"additionalProperties": False}}
    texts = []
    for seed in range(20):
        reply = client.chat.completions.create(
            model=swarm.model, messages=ask("Review the film Metropolis in JSON."), temperature=0.9, seed=seed,
            max_tokens=160, response_format={"type": "json_schema", "json_schema": schema})
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (seed, choice.message.content)
        Review.model_validate_json(choice.message.content)  # raises on anything the schema does not allow
        texts.append(choice.message.content)
    assert len(set(texts)) > 1, texts  # sampled: the seeds gave different answers
    # json_object has no schema to end it: greedy (the same answer every run), and room for it
    question = 'What colour is the sky? Answer with {"colour": "..."} only.'
    reply = client.chat.completions.create(model=swarm.model, messages=ask(question), temperature=0, max_tokens=160,
                                           response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_a_named_tool_choice_always_calls_that_function_with_valid_arguments(swarm, client):
    for seed in range(5):
        reply = client.chat.completions.create(
            model=swarm.model, messages=ask("What is the weather in Lyon?"), tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0.9, seed=seed,
            max_tokens=64)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice.message)
        [call] = choice.message.tool_calls
        assert call.function.name == "get_time"
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == {"timezone"} and isinstance(arguments["timezone"], str)
        assert len(arguments["timezone"]) <= 40


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_calling_loop(swarm, client, stream):
    messages = ask("What is the weather in Paris?")
    first = client.chat.completions.create(model=swarm.model, messages=messages, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_tokens=64, stream=stream)
    if stream:
        chunks = [c for c in first if c.choices]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
        call_id, name = deltas[0].id, deltas[0].function.name
        arguments = "".join(d.function.arguments or "" for d in deltas)
    else:
        assert first.choices[0].finish_reason == "tool_calls", first.choices[0].message
        [call] = first.choices[0].message.tool_calls
        call_id, name, arguments = call.id, call.function.name, call.function.arguments
    assert name == "get_weather"
    assert set(json.loads(arguments)) == {"city"}
    messages += [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                                       "function": {"name": name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": '{"temperature_c": 18, "sky": "clear"}'}]
    answer = client.chat.completions.create(model=swarm.model, messages=messages, tools=[WEATHER],
                                            tool_choice="none", temperature=0, max_tokens=32, stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert not answer.choices[0].message.tool_calls
        text = answer.choices[0].message.content
    assert text.strip()


def test_grammar_state_survives_a_kill_9_failover_of_the_last_hop(swarm):
    tokenizer = GgufTokenizer.from_gguf(GGUF)
    prompt = tokenizer.encode(render_chat(tokenizer.chat_template, ask("Describe Rome as JSON."),
                                          bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                                          add_generation_prompt=True))
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {
        "name": "city", "schema": City.model_json_schema() | {"additionalProperties": False}}})
    params = GenerationParams(max_tokens=64, stop_token_ids=tuple(tokenizer.stop_token_ids), grammar=grammar)
    with swarm.client() as tracker:
        undisturbed = list(RouteClient(tracker, swarm.model).generate(prompt, params))
        session = RouteClient(tracker, swarm.model)
        got, killed = [], ""
        for token in session.generate(prompt, params):
            got.append(token)
            if len(got) == 6:
                killed = session._connection.hops[-1].node.node_id
                [worker] = psutil.Process(swarm.nodes[killed].proc.pid).children()
                worker.kill()  # kill -9; its node restarts it
    assert len(undisturbed) > 6 and undisturbed[-1] in tokenizer.stop_token_ids
    City.model_validate_json(tokenizer.decode(undisturbed[:-1]))
    assert got == undisturbed
    assert session.failovers and session.failovers[0][1] == killed


def test_speculative_drafts_are_checked_against_the_grammar(swarm):
    """Ring decode with prompt-lookup drafts under a grammar gives the tokens of plain decoding
    under it: the last hop samples each drafted row under the grammar, so a draft the grammar
    refuses cannot match and is dropped like any other mismatch. Drafts were both accepted and
    rejected (the Health counters moved)."""
    tokenizer = GgufTokenizer.from_gguf(GGUF)
    text = "Copy this list as JSON: red, green, blue, red, green, blue, red, green, blue."
    prompt = tokenizer.encode(render_chat(tokenizer.chat_template, ask(text), bos_token=tokenizer.bos_token,
                                          eos_token=tokenizer.eos_token, add_generation_prompt=True))
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"name": "colours", "schema": {
        "type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 12}}})
    params = GenerationParams(max_tokens=64, stop_token_ids=tuple(tokenizer.stop_token_ids), grammar=grammar)

    def drafts() -> tuple[int, int]:
        replies = swarm.health().values()
        return sum(h.drafted_tokens for h in replies), sum(h.accepted_drafts for h in replies)

    with swarm.client() as tracker:
        plain = list(RouteClient(tracker, swarm.model).generate(prompt, params))
        before = drafts()
        drafted = list(RouteClient(tracker, swarm.model).generate(prompt, dataclasses.replace(params, speculate=8)))
    made, accepted = (a - b for a, b in zip(drafts(), before))
    assert drafted == plain
    assert made > 0 and 0 < accepted < made, (made, accepted)
    assert isinstance(json.loads(tokenizer.decode(plain[:-1])), list)
