"""Issue 33: tool calls parsed from model output per template family. Recorded outputs of each
form a model of the family emits, malformed ones returned as content with a reason (never an
exception), the family detected from template excerpts, and streaming in chunks of 1, 3 and 7
characters giving what the whole text gives, never sending content it takes back."""

from __future__ import annotations

import json
import random
import re

import pytest

from meshnet.gateway.tool_calls import (
    MAX_TOOL_CALLS,
    Delta,
    ParsedOutput,
    ToolCall,
    ToolCallFamily,
    ToolCallStream,
    UnsupportedToolTemplate,
    detect_family,
    parse_tool_calls,
)

HERMES, LLAMA3, MISTRAL, GENERIC = (ToolCallFamily.HERMES, ToolCallFamily.LLAMA3, ToolCallFamily.MISTRAL,
                                    ToolCallFamily.GENERIC)
SEED = "chatcmpl-abc"
IDS = ("call_fbd8022a43ef29741b37bc03", "call_9d2863bd3c88c5939ef625ea")  # sha256("chatcmpl-abc:0"), ":1"

PARIS = ("get_weather", '{"city": "Paris"}')
TIME = ("get_time", '{"timezone": "Europe/Paris"}')
EVENT_ARGS = ('{"title": "Café ☕ avec Zoë", "when": {"date": "2025-03-14", "times": ["09:00", "10:30"]}, '
              '"attendees": [{"name": "李雷", "optional": false}]}')
EVENT = ("create_event", EVENT_ARGS)
EVENT_JSON = ('{"title": "Caf\\u00e9 \\u2615 avec Zo\\u00eb", "when": {"date": "2025-03-14", "times": ["09:00", '
              '"10:30"]}, "attendees": [{"name": "李雷", "optional": false}]}')  # escaped as some models write it
SEARCH = ("search", '{"query":"meshnet","limit":5}')  # given as a string: kept as written
SEARCH_STRING = '"{\\"query\\":\\"meshnet\\",\\"limit\\":5}"'

# (family, label, output, content, [(name, arguments)])
RECORDED = [
    (HERMES, "one call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     None, [PARIS]),
    (HERMES, "two calls", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>', None, [PARIS, TIME]),
    (HERMES, "text before", "I'll look that up for you.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     '{"city": "Paris"}}\n</tool_call>', "I'll look that up for you.", [PARIS]),
    (HERMES, "qwen3 thinking", "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n"
     '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "<think>\nThe user wants the weather in Paris.\n</think>", [PARIS]),
    (HERMES, "nested unicode", f'<tool_call>\n{{"name": "create_event", "arguments": {EVENT_JSON}}}\n</tool_call>',
     None, [EVENT]),
    (HERMES, "arguments string", f'<tool_call>\n{{"name": "search", "arguments": {SEARCH_STRING}}}\n</tool_call>',
     None, [SEARCH]),
    (HERMES, "closing tag inside arguments", '<tool_call>\n{"name": "echo", "arguments": {"text": "</tool_call>"}}'
     '\n</tool_call>', None, [("echo", '{"text": "</tool_call>"}')]),
    (HERMES, "plain text", "The capital of France is Paris. Use <b>bold</b> [1].", None, []),
    (LLAMA3, "one call", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    (LLAMA3, "python tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    (LLAMA3, "two calls", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}', None, [PARIS, TIME]),
    (LLAMA3, "arguments key", '\n\n{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [PARIS]),
    (LLAMA3, "3.2 with type", '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
     None, [PARIS]),
    (LLAMA3, "nested unicode", f'{{"name": "create_event", "parameters": {EVENT_JSON}}}', None, [EVENT]),
    (LLAMA3, "parameters string", f'{{"name": "search", "parameters": {SEARCH_STRING}}}', None, [SEARCH]),
    (LLAMA3, "plain text", "Paris is the capital of France.", None, []),
    (LLAMA3, "json not first", 'Here it is: {"name": "get_weather", "parameters": {"city": "Paris"}}', None, []),
    (MISTRAL, "v0.3 list", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
    (MISTRAL, "v0.3 two with ids", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, '
     '"id": "a1b2c3d4e"}, {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}, "id": "f5g6h7i8j"}]',
     None, [PARIS, TIME]),
    (MISTRAL, "name args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', None, [PARIS]),
    (MISTRAL, "name args two", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]'
     '{"timezone": "Europe/Paris"}', None, [PARIS, TIME]),
    (MISTRAL, "text before", 'Let me check the weather.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
     "Let me check the weather.", [PARIS]),
    (MISTRAL, "nested unicode", f'[TOOL_CALLS]create_event[ARGS]{EVENT_JSON}', None, [EVENT]),
    (MISTRAL, "arguments string", f'[TOOL_CALLS] [{{"name": "search", "arguments": {SEARCH_STRING}}}]',
     None, [SEARCH]),
    (MISTRAL, "plain text", "See [1] and [TOOL] for details.", None, []),
    (GENERIC, "one call", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', None, [PARIS]),
    (GENERIC, "two calls", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]}', None, [PARIS, TIME]),
    (GENERIC, "content", '{"content": "The capital of France is Paris."}', "The capital of France is Paris.", []),
    (GENERIC, "content and call", '{"content": "Checking.", "tool_calls": [{"name": "get_weather", '
     '"arguments": {"city": "Paris"}}]}', "Checking.", [PARIS]),
    (GENERIC, "nested unicode", f' {{"tool_calls": [{{"name": "create_event", "arguments": {EVENT_JSON}}}]}}\n',
     None, [EVENT]),
    (GENERIC, "arguments string", f'{{"tool_calls": [{{"name": "search", "arguments": {SEARCH_STRING}}}]}}',
     None, [SEARCH]),
    (GENERIC, "plain text", "Paris.", None, []),
    (GENERIC, "json list", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, []),
]

HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# (family, label, output, reason)
MALFORMED = [
    (HERMES, "broken json", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
     "invalid JSON at character 12"),
    (HERMES, "cut by max_tokens", 'Sure.\n<tool_call>\n{"name": "get_weather", "argu', "invalid JSON at character 18"),
    (HERMES, "missing name", '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
     'a tool call has no "name"'),
    (HERMES, "name not a string", '<tool_call>\n{"name": 42, "arguments": {"city": "Paris"}}\n</tool_call>',
     '"name" is not a non-empty string'),
    (HERMES, "unterminated", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
     "unterminated <tool_call>"),
    (HERMES, "arguments a list", '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
     "arguments are not a JSON object"),
    (HERMES, "arguments string not json", '<tool_call>\n{"name": "get_weather", "arguments": "city=Paris"}\n'
     '</tool_call>', "arguments given as a string are not JSON"),
    (HERMES, "arguments string a list", '<tool_call>\n{"name": "get_weather", "arguments": "[1, 2]"}\n</tool_call>',
     "arguments are not a JSON object"),
    (HERMES, "no arguments", '<tool_call>\n{"name": "get_time"}\n</tool_call>',
     "tool call 'get_time' has no \"arguments\""),
    (HERMES, "NaN", '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>',
     "invalid JSON at character 12"),
    (HERMES, "text after", HERMES_CALL + "\nLet me know if you need more.", "text after a tool call"),
    (HERMES, "text between", HERMES_CALL + "\nAnd also:\n" + HERMES_CALL, "text after a tool call"),
    (HERMES, "marker in prose", "Wrap calls in <tool_call> tags.", "invalid JSON at character 26"),
    (LLAMA3, "text after", '{"name": "get_weather", "parameters": {"city": "Paris"}} I hope this helps.',
     "text after a tool call"),
    (LLAMA3, "truncated", '{"name": "get_weather", "parameters": {"city": "Par', "invalid JSON at character 0"),
    (LLAMA3, "builtin tool", '<|python_tag|>brave_search.call(query="weather in Paris")',
     "invalid JSON at character 14"),
    (LLAMA3, "a json answer", '{"answer": 42}', 'a tool call has no "name"'),
    (LLAMA3, "no parameters", '{"name": "get_weather"}', "tool call 'get_weather' has no \"arguments\""),
    (LLAMA3, "both keys", '{"name": "f", "parameters": {}, "arguments": {}}',
     "tool call 'f' has both \"arguments\" and \"parameters\""),
    (LLAMA3, "parameters a word", '{"name": "get_weather", "parameters": "Paris"}',
     "arguments given as a string are not JSON"),
    (LLAMA3, "tag alone", "<|python_tag|>\n", "no tool call after <|python_tag|>"),
    (LLAMA3, "bad separator", '{"name": "f", "parameters": {}}, {"name": "g", "parameters": {}}',
     "text after a tool call"),
    (MISTRAL, "unterminated list", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}',
     "invalid JSON at character 13"),
    (MISTRAL, "empty list", "[TOOL_CALLS] []", "[TOOL_CALLS] is followed by an empty list"),
    (MISTRAL, "text after list", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}] Done.',
     "text after a tool call"),
    (MISTRAL, "list of strings", '[TOOL_CALLS] ["get_weather"]', "a tool call is not a JSON object"),
    (MISTRAL, "bad name", '[TOOL_CALLS]get weather[ARGS]{"city": "Paris"}',
     "tool name 'get weather' is not a function name"),
    (MISTRAL, "no args marker", '[TOOL_CALLS]get_weather{"city": "Paris"}', "[TOOL_CALLS] without a list or [ARGS]"),
    (MISTRAL, "truncated args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', "invalid JSON at character 29"),
    (MISTRAL, "args a list", '[TOOL_CALLS]get_weather[ARGS]["Paris"]', "arguments are not a JSON object"),
    (MISTRAL, "text after args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} ok', "text after a tool call"),
    (GENERIC, "truncated", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}',
     "invalid JSON at character 0"),
    (GENERIC, "calls not a list", '{"tool_calls": {"name": "get_weather", "arguments": {}}}',
     '"tool_calls" is not a list'),
    (GENERIC, "other keys", '{"answer": "Paris"}',
     'the JSON answer is neither {"tool_calls": [...]} nor {"content": "..."}'),
    (GENERIC, "openai shape", '{"tool_calls": [{"function": "get_weather", "arguments": {}}]}',
     'a tool call has no "name"'),
    (GENERIC, "content a number", '{"content": 42}', '"content" is not a string'),
    (GENERIC, "empty", '{"tool_calls": []}', "the JSON answer has neither content nor tool calls"),
    (GENERIC, "text after", '{"content": "Paris."}\nHope that helps!', "text after the JSON answer"),
]


def calls_of(parsed: ParsedOutput) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


@pytest.mark.parametrize("family,text,content,calls", [pytest.param(*r[:1], *r[2:], id=f"{r[0].value}-{r[1]}")
                                                       for r in RECORDED])
def test_recorded_outputs(family, text, content, calls):
    parsed = parse_tool_calls(family, text, id_seed=SEED)
    assert parsed.malformed == ""
    assert calls_of(parsed) == calls
    assert parsed.content == (content if calls or content is not None else text)
    for call in parsed.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    assert tuple(c.id for c in parsed.tool_calls) == IDS[:len(calls)]


@pytest.mark.parametrize("family,text,reason", [pytest.param(*r[:1], *r[2:], id=f"{r[0].value}-{r[1]}")
                                                for r in MALFORMED])
def test_malformed_outputs_are_content(family, text, reason):
    assert parse_tool_calls(family, text) == ParsedOutput(text, (), reason)


def test_ids_are_deterministic_per_seed_and_random_without():
    text = RECORDED[1][2]
    assert parse_tool_calls(HERMES, text, id_seed=SEED).tool_calls == (
        ToolCall(IDS[0], *PARIS), ToolCall(IDS[1], *TIME))
    other = [c.id for c in parse_tool_calls(HERMES, text, id_seed="chatcmpl-def").tool_calls]
    assert other[0] not in IDS and other[1] not in IDS
    drawn = [c.id for c in parse_tool_calls(HERMES, text).tool_calls + parse_tool_calls(HERMES, text).tool_calls]
    assert len(set(drawn)) == 4 and all(re.fullmatch("call_[0-9a-f]{24}", i) for i in drawn)


def test_a_name_not_offered_is_malformed():
    text = '<tool_call>\n{"name": "delete_all_files", "arguments": {}}\n</tool_call>'
    assert parse_tool_calls(HERMES, text, allowed_names=frozenset({"get_weather"})) == ParsedOutput(
        text, (), "tool 'delete_all_files' was not offered")
    offered = parse_tool_calls(HERMES, text, allowed_names=frozenset({"delete_all_files"}), id_seed=SEED)
    assert offered == ParsedOutput(None, (ToolCall(IDS[0], "delete_all_files", "{}"),))


def many(family: ToolCallFamily, n: int) -> str:
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    return {HERMES: "\n".join([f"<tool_call>\n{call}\n</tool_call>"] * n),
            LLAMA3: "; ".join([call] * n),
            MISTRAL: "[TOOL_CALLS]" + "[TOOL_CALLS]".join(['get_weather[ARGS]{"city": "Paris"}'] * n),
            GENERIC: '{"tool_calls": [' + ", ".join([call] * n) + "]}"}[family]


@pytest.mark.parametrize("family", list(ToolCallFamily))
def test_at_most_max_tool_calls(family):
    assert calls_of(parse_tool_calls(family, many(family, MAX_TOOL_CALLS))) == [PARIS] * MAX_TOOL_CALLS
    text = many(family, MAX_TOOL_CALLS + 1)
    assert parse_tool_calls(family, text) == ParsedOutput(text, (), "more than 16 tool calls")


HOSTILE = [
    '<tool_call>\n{"name": "f", "arguments": ' + "[" * 100_000,
    '{"name": "f", "parameters": ' + '{"a": ' * 100_000,
    "[TOOL_CALLS]f[ARGS]" + "[" * 100_000,
    '{"tool_calls": [{"name": "f", "arguments": "' + "[" * 100_000 + '"}]}',
    '{"name": "f", "parameters": {"n": 1' + "0" * 5_000 + "}}",  # past Python's int digits limit
    "[TOOL_CALLS]" + "x" * 100_000 + "[ARGS]{}",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("family", list(ToolCallFamily))
def test_hostile_output_is_content(family, text):
    parsed = parse_tool_calls(family, text)
    assert (parsed.content, parsed.tool_calls) == (text, ())


QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are \
provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- endif %}"""

HERMES2PRO = """{{- bos_token }}
{{- '<|im_start|>system\\n' }}
{{- "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML \
tags. Here are the available tools: <tools> " }}
{%- for tool in tools %}
    {{- '{"type": "function", "function": ' }}{{- tool.function|tojson }}{{- '}' }}
{%- endfor %}
{{- " </tools>" }}
{{- "For each function call return a json object with function name and arguments within <tool_call></tool_call> \
XML tags as follows:\\n" }}
{{- "<tool_call>\\n" }}
{{- '{"name": <function-name>, "arguments": <args-dict>}\\n' }}
{{- '</tool_call><|im_end|>\\n' }}"""

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{%- if builtin_tools is defined and tool_call.name in builtin_tools %}
    {{- "<|python_tag|>" + tool_call.name + ".call(" }}
{%- endif %}"""

LLAMA32 = """{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- '{"name": "' + tool_call.name + '", ' }}
{{- '"parameters": ' }}
{{- tool_call.arguments | tojson }}
{%- if message.role == "tool" or message.role == "ipython" %}
    {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
{%- endif %}"""

MISTRAL_V03 = """{%- if message["role"] == "user" %}
    {%- if tools is not none and (message == user_messages[-1]) %}
        {{- "[AVAILABLE_TOOLS] [" }}
        {%- for tool in tools %}
            {{- tool|tojson }}
        {%- endfor %}
        {{- "[/AVAILABLE_TOOLS]" }}
    {%- endif %}
    {{- "[INST] " + message["content"] + "[/INST]" }}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}
    {{- "[TOOL_CALLS] [" }}
    {%- for tool_call in message.tool_calls %}
        {%- set out = tool_call.function|tojson %}
        {{- out[:-1] }}
        {{- ', "id": "' + tool_call.id + '"}' }}
    {%- endfor %}
{%- endif %}"""

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
           "system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

GRANITE = """{%- if tools %}
    {{- '<|start_of_role|>available_tools<|end_of_role|>' }}
    {{- tools | tojson(indent=4) }}
{%- endif %}
{%- if message['role'] == 'assistant' and message.tool_calls %}
    {{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + message.tool_calls | tojson }}
{%- endif %}"""

COMMAND_R = """{%- if tools %}
## Available Tools
Here is a list of tools that you have available to you:
{%- for tool in tools %}
def {{ tool.name }}({{ tool.parameter_definitions | join(", ") }}) -> List[Dict]:
{%- endfor %}
Write 'Action:' followed by a json-formatted list of actions that you want to perform.
{%- endif %}"""


@pytest.mark.parametrize("template,family", [
    pytest.param(QWEN25, HERMES, id="qwen2.5"),
    pytest.param(HERMES2PRO, HERMES, id="hermes-2-pro"),
    pytest.param(LLAMA31, LLAMA3, id="llama3.1"),
    pytest.param(LLAMA32, LLAMA3, id="llama3.2"),
    pytest.param(MISTRAL_V03, MISTRAL, id="mistral-v0.3"),
    pytest.param(SMOLLM2, GENERIC, id="no-tools"),
    pytest.param(None, GENERIC, id="no-template"),
])
def test_detect_family(template, family):
    assert detect_family(template, tools_requested=True) is family
    assert detect_family(template, tools_requested=False) is family


@pytest.mark.parametrize("template,found", [pytest.param(GRANITE, ("<|tool_call|>",), id="granite"),
                                            pytest.param(COMMAND_R, (), id="command-r")])
def test_unknown_tool_syntax_is_refused_by_name(template, found):
    with pytest.raises(UnsupportedToolTemplate) as refused:
        detect_family(template, tools_requested=True)
    assert isinstance(refused.value, ValueError)
    assert refused.value.found == found
    what = "tool markup <|tool_call|>;" if found else "no tool-call markup known here;"
    assert str(refused.value).startswith("this model's chat template takes tools but has " + what)
    assert detect_family(template, tools_requested=False) is GENERIC


def run_stream(family, text: str, sizes, **kwargs) -> tuple[str, list[tuple[str, str, str]], ParsedOutput, int]:
    """Feeds `text` in chunks of `sizes` (cycled); checks that no content sent is later taken back.
    Returns the content, the calls (id, name, arguments), the stream's result, and the characters
    of content sent before finish()."""
    whole = parse_tool_calls(family, text, id_seed=SEED, **kwargs)
    final = whole.content or ""
    stream = ToolCallStream(family, id_seed=SEED, **kwargs)
    content, pos, n = "", 0, 0
    while pos < len(text):
        for delta in stream.feed(text[pos:pos + sizes[n % len(sizes)]]):
            assert delta.tool_call is None and delta.content
            content += delta.content
            assert final.startswith(content)
        pos += sizes[n % len(sizes)]
        n += 1
    early = len(content)
    calls: list[list[str]] = []
    for delta in stream.finish():
        if delta.content is not None:
            assert delta.tool_call is None and not calls
            content += delta.content
        elif "id" in delta.tool_call:
            i = len(calls)
            assert delta.tool_call == {"index": i, "id": delta.tool_call["id"], "type": "function",
                                       "function": {"name": delta.tool_call["function"]["name"], "arguments": ""}}
            calls.append([delta.tool_call["id"], delta.tool_call["function"]["name"], ""])
        else:
            assert set(delta.tool_call) == {"index", "function"} and delta.tool_call["index"] == len(calls) - 1
            calls[-1][2] += delta.tool_call["function"]["arguments"]
    assert stream.parsed == whole
    return content, [tuple(c) for c in calls], whole, early


ALL_OUTPUTS = [pytest.param(r[0], r[2], id=f"{r[0].value}-{r[1]}") for r in RECORDED + MALFORMED]


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("family,text", ALL_OUTPUTS)
def test_stream_equals_whole_text(family, text, size):
    content, calls, whole, _ = run_stream(family, text, [size])
    assert content == (whole.content or "")
    assert calls == [(c.id, c.name, c.arguments) for c in whole.tool_calls]


def test_stream_sends_text_before_a_call_early_and_holds_a_partial_marker():
    stream = ToolCallStream(HERMES, id_seed=SEED)
    assert stream.feed("Let me check.\n<tool_c") == [Delta(content="Let me check.")]
    assert stream.feed('all>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>') == []
    assert stream.finish() == [
        Delta(tool_call={"index": 0, "id": IDS[0], "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}),
        Delta(tool_call={"index": 0, "function": {"arguments": '{"city": "Paris"}'}})]
    prose = ToolCallStream(HERMES)
    assert prose.feed("a <tool") == [Delta(content="a")]
    assert prose.feed("s are fine") == [Delta(content=" <tools are fine")]
    assert prose.finish() == []
    llama = ToolCallStream(LLAMA3)
    assert llama.feed(" <|python") == []
    assert llama.feed("n") == [Delta(content=" <|pythonn")]


# A generic JSON answer's content is only known at its end: not here.
@pytest.mark.parametrize("family,text,content", [pytest.param(r[0], r[2], r[3] or r[2], id=f"{r[0].value}-{r[1]}")
                                                 for r in RECORDED if (r[3] is not None or not r[4])
                                                 and not (r[0] == GENERIC and r[2].startswith("{"))])
def test_stream_sends_plain_text_before_finish(family, text, content):
    assert run_stream(family, text, [1])[3] == len(content.rstrip())


FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_c", "\n", " ", "[TOOL_CALLS]", "[TOOL_", "[ARGS]", "get_weather",
             "<|python_tag|>", "<|pyth", ";", "{", "}", "[", "]", '"name": "f"', '"arguments": {}', ", ", '"',
             '{"name": "f", "arguments": {"x": "é"}}', '{"name": "g", "parameters": {}}', '{"tool_calls": [',
             '{"content": "hi"}', "Hello", "\\u00e9", '"tool_calls": ', "NaN", "李"]


def mutated(rng: random.Random, family: ToolCallFamily) -> str:
    """A recorded output of `family`, with fragments inserted, cut short, or followed by another."""
    texts = [r[2] for r in RECORDED + MALFORMED if r[0] == family]
    text = rng.choice(texts)
    for _ in range(rng.randint(0, 2)):
        at, how = rng.randint(0, len(text)), rng.randrange(3)
        text = (text[:at] + rng.choice(FRAGMENTS) + text[at:] if how == 0 else text[:at] if how == 1
                else text + rng.choice(texts))
    return text


@pytest.mark.parametrize("family", list(ToolCallFamily))
def test_random_outputs_never_raise_and_stream_alike(family):
    rng = random.Random(f"tool-calls-{family.value}")
    for n in range(800):
        text = (mutated(rng, family) if n % 2 else
                "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 10))))
        content, calls, whole, _ = run_stream(family, text, [rng.randint(1, 9) for _ in range(5)])
        assert content == (whole.content or "") and len(calls) == len(whole.tool_calls)
        if whole.malformed or not whole.tool_calls:
            assert whole.content == text or (family == GENERIC and not whole.malformed)


# Review finding 14 (issue 55): the stream rescanned all held whitespace per delta, 2.5 s of the
# gateway's event loop for 4,096 whitespace tokens. Each character is now scanned once, and a
# held marker prefix once more by the delta after it: the work is linear in the text.
SPACES = [" ", "\n"] * 10_000
LONG_HOLDS = [  # family, deltas, the prefix held across a delta, content
    (HERMES, ["Hi", *SPACES, "<tool_c", "\n", *SPACES, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'],
     "<tool_c", "Hi" + "".join(SPACES) + "<tool_c"),
    (MISTRAL, ["Hi", *SPACES, "[TOOL_", "\n", *SPACES, '[TOOL_CALLS][{"name": "f", "arguments": {}}]'],
     "[TOOL_", "Hi" + "".join(SPACES) + "[TOOL_"),
    (LLAMA3, [*SPACES, "<|pyth", 'on_tag|>{"name": "f", "parameters": {}}'], "<|pyth", None),
    (GENERIC, [*SPACES, '{"tool_calls": [{"name": "f", "arguments": {}}]}'], "", None),
]


@pytest.mark.parametrize("family,deltas,held,content", LONG_HOLDS, ids=[h[0].value for h in LONG_HOLDS])
def test_held_whitespace_is_scanned_once(family, deltas, held, content, monkeypatch):
    scanned = []
    for name in ("_scan_marker", "_scan_start"):
        def counted(self, text, scan=getattr(ToolCallStream, name)):
            scanned.append(len(text))
            return scan(self, text)
        monkeypatch.setattr(ToolCallStream, name, counted)
    text = "".join(deltas)
    stream = ToolCallStream(family, id_seed=SEED)
    early = "".join(d.content for delta in deltas for d in stream.feed(delta))
    final = stream.finish()
    assert sum(scanned) == len(text) + len(held)
    assert stream.parsed == parse_tool_calls(family, text, id_seed=SEED)
    assert (stream.parsed.content, [c.name for c in stream.parsed.tool_calls]) == (content, ["f"])
    assert early == (content or "")  # all content sent before finish(), none held back
    assert [d.tool_call["function"]["name"] for d in final if "id" in (d.tool_call or {})] == ["f"]
