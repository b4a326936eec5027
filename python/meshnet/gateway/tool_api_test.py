"""Issue 33's tool calls through the HTTP API, with the real `openai` client against a real
uvicorn, a test fake of the swarm whose outputs are scripted and test fake tokenizers: the
calling loop (call, result as a tool message, answer), the same streamed, malformed output as
content, marker tokens kept, the refusals (exact status, param and message, each followed by an
honest request that succeeds), and requests without tools answered exactly as before."""

from __future__ import annotations

import json

import openai
import pytest

from meshnet.gateway.api import Gateway, GatewayConfig, ServedModel
from meshnet.gateway.api_fakes import FakeMarkerTokenizer, FakeSwarmBackend, FakeTokenizer, request, running
from meshnet.gateway.tool_request import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, MAX_TOOLS


class HermesTokenizer(FakeTokenizer):
    """Test fake: FakeTokenizer with a Hermes/Qwen-style template (tools in a <tools> block,
    calls as <tool_call> JSON, results as <tool_response>)."""

    chat_template = (
        "{% if tools %}<system># Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
        "{% endif %}{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<assistant>"
        "{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}\n"
        "{% elif m.role == 'tool' %}<user><tool_response>\n{{ m.content }}\n</tool_response>\n"
        "{% else %}<{{ m.role }}>{{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


class GraniteTokenizer(FakeTokenizer):
    """Test fake: a template taking tools in a syntax the gateway cannot parse."""

    chat_template = ("{% if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson }}{% endif %}"
                     "{% for m in messages %}{% if m.tool_calls %}<|tool_call|>{{ m.tool_calls | tojson }}"
                     "{% else %}<{{ m.role }}>{{ m.content }}{% endif %}\n{% endfor %}")


@pytest.fixture(scope="module")
def served():
    backend = FakeSwarmBackend()
    models = [ServedModel("fake", FakeTokenizer()), ServedModel("hermes", HermesTokenizer()),
              ServedModel("mistral", FakeMarkerTokenizer()), ServedModel("granite", GraniteTokenizer())]
    gateway = Gateway(models, backend, None, GatewayConfig(default_max_tokens=512))
    with running(gateway) as port:
        yield backend, port


@pytest.fixture
def backend(served):
    backend, _ = served
    backend.scripted.clear()
    yield backend
    backend.scripted.clear()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served[1]}/v1", api_key="unused", max_retries=0)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
GENERIC_CALL = b'{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
GENERIC_TWO = (b'{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               b'{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]}')
HERMES_CALL = b'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def prompt_of(backend) -> str:
    return bytes(i for i in backend.started[-1][2] if i < 256).decode()


def test_tool_calling_loop(backend, client):
    """Generic family (no tool syntax in the template): the instruction lists the tools; the
    model calls one; its result goes back as a tool message; the model answers."""
    backend.scripted += [GENERIC_CALL, "It is 21 °C in Paris.".encode()]
    first = client.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_") and len(call.id) == 29
    prompt = prompt_of(backend)
    assert prompt.startswith("<system>You can call tools.") and prompt.endswith("<user>Weather in Paris?\n<assistant>")
    assert json.dumps(WEATHER["function"]) in prompt and '{"tool_calls": [{"name": ' in prompt

    conversation = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    second = client.chat.completions.create(model="fake", messages=conversation, tools=[WEATHER])
    assert second.choices[0].message.content == "It is 21 °C in Paris."
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    assert prompt_of(backend).endswith(
        "<user>Weather in Paris?\n"
        '<assistant>{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}\n'
        '<tool>{"temp_c": 21}\n<assistant>')


def test_tool_calls_streamed(backend, client):
    """Hermes family, streamed: content first, then the call whole in OpenAI's delta format,
    finish_reason tool_calls; the openai client's stream helper assembles the same message."""
    backend.scripted += [HERMES_CALL, HERMES_CALL]
    with client.chat.completions.stream(model="hermes", messages=ASK, tools=[WEATHER]) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
    assert "<tools>" + json.dumps(WEATHER) + "</tools>" in prompt_of(backend)  # trim_blocks ate the newlines

    chunks = list(client.chat.completions.create(model="hermes", messages=ASK, tools=[WEATHER], stream=True,
                                                 stream_options={"include_usage": True}, logprobs=True))
    usage = chunks.pop().usage
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert [(c.index, c.id is not None, c.function.name) for c in calls] == [(0, True, "get_weather"), (0, False, None)]
    assert "".join(c.function.arguments for c in calls) == '{"city": "Paris"}'
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    logprobs = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert len(logprobs) == usage.completion_tokens == len(HERMES_CALL) + 1  # every token once, EOS included


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parallel,names", [(None, ["get_weather", "get_time"]), (True, ["get_weather", "get_time"]),
                                            (False, ["get_weather"])])
def test_parallel_tool_calls(backend, client, stream, parallel, names):
    backend.scripted.append(GENERIC_TWO)
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    if stream:
        with client.chat.completions.stream(model="fake", messages=ASK, tools=[WEATHER, TIME], **extra) as events:
            message = events.get_final_completion().choices[0].message
    else:
        message = client.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER, TIME],
                                                 **extra).choices[0].message
    assert [c.function.name for c in message.tool_calls] == names
    assert len({c.id for c in message.tool_calls}) == len(names)
    assert ("Call one tool at a time." in prompt_of(backend)) is (parallel is False)


MALFORMED = [  # (model, output): broken tool-call syntax, answered as content
    ("hermes", b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),
    ("hermes", b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> and more'),
    ("fake", b'{"tool_calls": [{"name": "delete_everything", "arguments": {}}]}'),  # not offered
    ("fake", b'{"tool_calls": [{"name": "get_weather"}]}'),
    ("mistral", [FakeMarkerTokenizer.MARKER_ID, *b"[not json"]),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model,output", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_tool_calls_are_content(backend, client, stream, model, output):
    text = (FakeMarkerTokenizer().decode(output, skip_special=False) if isinstance(output, list)
            else output.decode())
    backend.scripted.append(output)
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
        assert not any(c.choices[0].delta.tool_calls for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        choice = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER]).choices[0]
        assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (text, None, "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_a_marker_that_is_a_special_token_is_kept(backend, client, stream):
    """Mistral's [TOOL_CALLS] is a control token: decode drops it, the tool parser must see it."""
    output = [FakeMarkerTokenizer.MARKER_ID, *b'[{"name": "get_weather", "arguments": {"city": "Paris"}}]']
    backend.scripted += [output, output]
    if stream:
        with client.chat.completions.stream(model="mistral", messages=ASK, tools=[WEATHER]) as events:
            choice = events.get_final_completion().choices[0]
    else:
        choice = client.chat.completions.create(model="mistral", messages=ASK, tools=[WEATHER]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    assert "[AVAILABLE_TOOLS]" + json.dumps([WEATHER]) in prompt_of(backend)
    plain = client.chat.completions.create(model="mistral", messages=ASK).choices[0]  # no tools: as before
    assert plain.message.content == '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'

    call_id = choice.message.tool_calls[0].id  # 9 characters, as Mistral's templates require
    assert len(call_id) == 9 and call_id.isalnum()
    backend.scripted.append(b"Sunny.")
    answer = client.chat.completions.create(model="mistral", tools=[WEATHER], messages=ASK + [
        choice.message, {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]).choices[0]
    assert answer.message.content == "Sunny."
    past = backend.started[-1][2]
    assert past.count(FakeMarkerTokenizer.MARKER_ID) == 1 and f'"id": "{call_id}"' in prompt_of(backend)


def test_the_conversation_reaches_a_template_with_tool_calls_structured(backend, client):
    backend.scripted.append(b"Sunny.")
    conversation = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    reply = client.chat.completions.create(model="hermes", messages=conversation, tools=[WEATHER])
    assert reply.choices[0].message.content == "Sunny."
    assert prompt_of(backend).endswith(
        '<assistant><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<user><tool_response>\nsunny\n</tool_response>\n<assistant>")


def test_without_tools_nothing_changes(backend, served):
    """A request without tools, or with tool_choice "none", gets the prompt and the answer it got
    before tools were served, byte for byte, even when the output looks like a tool call."""
    _, port = served

    def ask(body: dict, stream: bool = False) -> tuple[bytes, str]:
        backend.scripted.append(GENERIC_CALL)
        status, _, data = request(port, "POST", "/v1/chat/completions", {**body, "stream": stream}, key=None)
        assert status == 200, data
        first = json.loads(data.split(b"\n\n")[0][len("data: "):] if stream else data)
        return (data.replace(first["id"].encode(), b"ID").replace(b'"created":%d' % first["created"], b'"created":T'),
                prompt_of(backend))

    plain = {"model": "fake", "messages": ASK}
    body, prompt = ask(plain)
    assert prompt == "<user>Weather in Paris?\n<assistant>"
    usage = '"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d' % (
        len(prompt), len(GENERIC_CALL) + 1, len(prompt) + len(GENERIC_CALL) + 1)  # + EOS
    assert body.decode() == (
        '{"id":"ID","object":"chat.completion","created":T,"model":"fake","choices":[{"index":0,"message":'
        f'{{"role":"assistant","content":{json.dumps(GENERIC_CALL.decode())}}},"logprobs":null,'
        f'"finish_reason":"stop"}}],"usage":{{{usage}}}}}')
    for same in ({**plain, "tools": [WEATHER], "tool_choice": "none"}, {**plain, "tools": []},
                 {**plain, "response_format": {"type": "text"}}, {**plain, "parallel_tool_calls": False}):
        assert ask(same) == (body, prompt)
    streamed = ask(plain, stream=True)
    assert ask({**plain, "tools": [WEATHER], "tool_choice": "none"}, stream=True) == streamed
    events = [json.loads(e[len("data: "):]) for e in streamed[0].decode().split("\n\n")[:-2]]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == GENERIC_CALL.decode()
    assert all(set(e["choices"][0]["delta"]) <= {"role", "content"} for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def nested(depth: int) -> dict:
    """A parameters schema `depth` JSON objects deep (a property's schema and the properties map
    each count, as every object does)."""
    node: dict = {"type": "string" if depth > 1 else "object"}
    for level in range(depth - 1, 0, -1):
        node = {"type": "object", "properties": node} if level % 2 else {"x": node}
    return node


def tool(name: str = "get_weather", **function) -> dict:
    return {"type": "function", "function": {"name": name, **function}}


def call_msg(name: str = "get_weather") -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": name, "arguments": "{}"}}]}


TOOLS = {"model": "fake", "messages": ASK, "tools": [WEATHER]}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
# (what, body, param, message); each refused 400 before a route is asked for
REFUSALS = [
    ("too many tools", {**TOOLS, "tools": [tool(f"f{i}") for i in range(MAX_TOOLS + 1)]}, "tools",
     "at most 64 tools (got 65)"),
    ("tools not a list", {**TOOLS, "tools": {"type": "function"}}, "tools",
     'tools must be a list of {"type": "function", "function": {...}} objects'),
    ("not a function", {**TOOLS, "tools": [{"type": "retrieval"}]}, "tools", 'tools[0].type must be "function"'),
    ("no function", {**TOOLS, "tools": [{"type": "function"}]}, "tools",
     "tools[0].function must be an object with a name"),
    ("bad name", {**TOOLS, "tools": [tool("get weather")]}, "tools",
     "tools[0].function.name must match ^[a-zA-Z0-9_-]{1,64}$"),
    ("long name", {**TOOLS, "tools": [tool("f" * 65)]}, "tools",
     "tools[0].function.name must match ^[a-zA-Z0-9_-]{1,64}$"),
    ("duplicate names", {**TOOLS, "tools": [WEATHER, TIME, tool()]}, "tools",
     "tools[2].function.name 'get_weather' is also the name of tools[0]"),
    ("long description", {**TOOLS, "tools": [tool(description="d" * 8193)]}, "tools",
     "tools[0].function.description must be a string of at most 8192 characters"),
    ("parameters not an object", {**TOOLS, "tools": [tool(parameters=["city"])]}, "tools",
     "tools[0].function.parameters must be a JSON object (a JSON schema)"),
    ("deep parameters", {**TOOLS, "tools": [tool(parameters=nested(MAX_SCHEMA_DEPTH + 1))]}, "tools",
     "tools[0].function.parameters nests deeper than 16 levels"),
    ("huge parameters", {**TOOLS, "tools": [tool(parameters={"type": "object",
                                                             "description": "x" * MAX_SCHEMA_BYTES})]},
     "tools", "tools[0].function.parameters is over 65536 bytes as JSON"),
    ("strict under auto", {**TOOLS, "tools": [tool(parameters=nested(1), strict=True)]}, "tools",
     'tools[0].function.strict: true is enforced with tool_choice "required" or a named function; with "auto" the '
     "model may answer in text and its arguments are not constrained, so set tool_choice or leave strict out"),
    ("parameters the converter cannot honour, forced", {**TOOLS, "tool_choice": "required", "tools": [tool(parameters={
        "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}})]}, "tools",
     "tools: function 'get_weather' parameters: schema part #/properties/city: keyword 'pattern' is not supported"),
    ("tool_choice without tools", {"model": "fake", "messages": ASK, "tool_choice": "auto"}, "tool_choice",
     "tool_choice is only allowed when tools are given"),
    ("tool_choice unknown", {**TOOLS, "tool_choice": "sometimes"}, "tool_choice",
     'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
    ("tool_choice not offered", {**TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "tool_choice names function 'nope', which is not in tools"),
    ("parallel_tool_calls not a boolean", {**TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "parallel_tool_calls must be true or false"),
    ("response_format json_object with tool_choice auto", {**TOOLS, "response_format": {"type": "json_object"}},
     "response_format", 'response_format {"type": "json_object"} with tool_choice "auto" is not served: the answer '
     'would be either tool calls or that JSON; use tool_choice "required", a named function or "none"'),
    ("response_format json_schema with tool_choice auto", {**TOOLS, "response_format": JSON_SCHEMA},
     "response_format", 'response_format {"type": "json_schema"} with tool_choice "auto" is not served: the answer '
     'would be either tool calls or that JSON; use tool_choice "required", a named function or "none"'),
    ("response_format other", {**TOOLS, "response_format": {"type": "xml"}}, "response_format",
     'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
     '{...}}'),
    ("json_schema without a name", {**TOOLS, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object"}}}}, "response_format",
     "response_format.json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$"),
    ("json_schema not an object", {**TOOLS, "response_format": {"type": "json_schema"}}, "response_format",
     "response_format.json_schema must be an object with a name and a schema"),
    ("json_schema schema not an object", {**TOOLS, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": ["type"]}}}, "response_format",
     "response_format.json_schema.schema must be a JSON object (a JSON schema)"),
    ("json_schema too deep", {**TOOLS, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": nested(MAX_SCHEMA_DEPTH + 1)}}}, "response_format",
     "response_format.json_schema.schema nests deeper than 16 levels"),
    ("json_schema the converter cannot honour", {"model": "fake", "messages": ASK, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 3}}}}}}, "response_format",
     "response_format.json_schema.schema: schema part #/properties/n: keyword 'minimum' is not supported"),
    ("functions", {"model": "fake", "messages": ASK, "functions": [WEATHER["function"]]}, "functions",
     "functions is not supported by this gateway"),
    ("function_call", {"model": "fake", "messages": ASK, "function_call": "auto"}, "function_call",
     "function_call is not supported by this gateway"),
    ("tool message without tool_call_id", {**TOOLS, "messages": ASK + [call_msg(), {"role": "tool", "content": "x"}]},
     "messages.2.tool_call_id", "messages[2]: a tool message needs the tool_call_id of the call it answers"),
    ("tool message answering nothing", {**TOOLS, "messages": ASK + [{"role": "tool", "tool_call_id": "c1",
                                                                      "content": "x"}]},
     "messages.1.tool_call_id", "messages[1].tool_call_id 'c1' answers no tool call of an earlier assistant message"),
    ("tool message without content", {**TOOLS, "messages": ASK + [call_msg(), {"role": "tool", "tool_call_id": "c1"}]},
     "messages.2.content", "messages[2]: a tool message needs content (the call's result)"),
    ("tool_calls on a user message", {**TOOLS, "messages": [{**call_msg(), "role": "user", "content": "x"}]},
     "messages.0.tool_calls", "messages[0]: only assistant messages have tool_calls"),
    ("tool_call_id on a user message", {**TOOLS, "messages": [{**ASK[0], "tool_call_id": "c1"}]},
     "messages.0.tool_call_id", "messages[0]: only tool messages have a tool_call_id"),
    ("bad name in a past call", {**TOOLS, "messages": ASK + [call_msg("no spaces please")]},
     "messages.1.tool_calls.0.function.name", None),
    ("unknown tool syntax", {**TOOLS, "model": "granite"}, "tools",
     "model 'granite': this model's chat template takes tools but has tool markup <|tool_call|>; tool calls are "
     "parsed for <tool_call> (Hermes, Qwen), <|python_tag|>/ipython JSON (Llama 3.x), [TOOL_CALLS] (Mistral) and "
     "templates without tools"),
    ("tools on completions", {"model": "fake", "prompt": "x", "tools": [WEATHER]}, "tools",
     "tools is not supported by this gateway"),
]
HONEST = {  # the honest request after a refusal, when it is not TOOLS (200 with a tool call)
    "tool_choice without tools": {"model": "fake", "messages": ASK},
    "unknown tool syntax": {"model": "granite", "messages": ASK},
    "tools on completions": {"model": "fake", "prompt": "x"},
}


@pytest.mark.parametrize("what,body,param,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(backend, served, what, body, param, message):
    _, port = served
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    before = len(backend.started)
    status, _, data = request(port, "POST", path, body, key=None)
    assert status == 400, data
    error = json.loads(data)["error"]
    assert (error["param"], error["type"], error["code"]) == (param, "invalid_request_error", "invalid_request")
    if message is not None:
        assert error["message"] == message
    else:
        assert error["message"].startswith(f"invalid parameter {param}: ")
    assert len(backend.started) == before  # refused before any route was asked for
    honest = HONEST.get(what, TOOLS)
    backend.scripted.append(GENERIC_CALL)
    status, _, data = request(port, "POST", path, honest, key=None)
    assert status == 200, data
    if honest is TOOLS:
        assert json.loads(data)["choices"][0]["finish_reason"] == "tool_calls"


ACCEPTED = [  # at the bounds, and the forms that are served
    ("64 tools", {"tools": [tool(f"f{i}") for i in range(MAX_TOOLS - 1)] + [WEATHER]}),
    ("parameters 16 deep", {"tools": [tool(parameters=nested(MAX_SCHEMA_DEPTH))]}),
    ("parameters omitted", {"tools": [tool()]}),
    ("strict false", {"tools": [tool(parameters=nested(1), strict=False)]}),
    ("tool_choice auto", {"tool_choice": "auto"}),
    ("tool_choice required", {"tool_choice": "required"}),
    ("tool_choice named", {"tool_choice": NAMED}),
    ("strict, forced", {"tool_choice": NAMED, "tools": [{**WEATHER, "function": {**WEATHER["function"],
                                                                                 "strict": True}}]}),
    ("response_format text", {"response_format": {"type": "text"}}),
    ("developer message", {"messages": [{"role": "developer", "content": "Be brief."}, *ASK]}),
]


@pytest.mark.parametrize("what,extra", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted_at_the_bounds(backend, served, what, extra):
    backend.scripted.append(GENERIC_CALL)
    status, _, data = request(served[1], "POST", "/v1/chat/completions", {**TOOLS, **extra}, key=None)
    assert status == 200, data
    choice = json.loads(data)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    forced = extra.get("tool_choice", "auto") != "auto"
    grammar = backend.params[-1].grammar
    assert bool(grammar) == forced  # forced calls are sampled under the calls' grammar
    if forced:
        assert grammar.startswith("root ::=") and '"\\"tool_calls\\""' in grammar, grammar[:200]
    prompt = prompt_of(backend)
    assert prompt.startswith("<system>You can call tools.") and prompt.count("<system>") == 1
    if what == "developer message":
        assert prompt.endswith("as plain text.\n\nBe brief.\n<user>Weather in Paris?\n<assistant>")


@pytest.mark.parametrize("response_format,tools", [
    ({"type": "json_object"}, None), (JSON_SCHEMA, None), (JSON_SCHEMA, {"tools": [WEATHER], "tool_choice": "none"})],
    ids=["json_object", "json_schema", "json_schema beside tool_choice none"])
def test_json_response_formats_are_sampled_under_a_grammar(backend, served, response_format, tools):
    """The JSON goes back as the content; the grammar went with the generation's parameters."""
    backend.scripted.append(b'{"a": 1}')
    body = {"model": "fake", "messages": ASK, "response_format": response_format, **(tools or {})}
    status, _, data = request(served[1], "POST", "/v1/chat/completions", body, key=None)
    assert status == 200, data
    assert json.loads(data)["choices"][0]["message"]["content"] == '{"a": 1}'
    grammar = backend.params[-1].grammar
    assert grammar.startswith("root ::=") and "ws" in grammar, grammar[:200]
    backend.scripted.append(b"plain")
    status, _, data = request(served[1], "POST", "/v1/chat/completions", {"model": "fake", "messages": ASK}, key=None)
    assert status == 200 and backend.params[-1].grammar == ""
