"""render_chat against HF transformers' apply_chat_template (the only place transformers is
imported for the gateway), and its refusals."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from meshnet.text.chat import ChatTemplateError, render_chat
from meshnet.text.tokenizer import GgufTokenizer

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"])

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime number."},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, bigger, with accents: é ü 日本?"},
    ],
    "no_system": [
        {"role": "user", "content": "Hello!\n  Indented line\tand a tab."},
    ],
    "tool_turn": [
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temp_c\": 21}"},
    ],
}

# Exercises what the environment adds to plain jinja2: tojson (no HTML escaping, options),
# loop controls, namespace, dict, the generation tag, strftime_now, trim/lstrip of blocks.
FEATURES_TEMPLATE = """\
{% set ns = namespace(count=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}{% continue %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    <{{ message['role'] }}>{{ message | tojson }}|{{ dict(a=1, b='<&>') | tojson(indent=2) }}
    {% generation %}{{ message['content'] | upper }}{% endgeneration %}
    {% if ns.count > 1 %}{% break %}{% endif %}
{% endfor %}
year={{ strftime_now('%Y') }} tools={{ tools is none }} {{ bos_token }}|{{ eos_token }}
{% if add_generation_prompt %}<assistant>{% endif %}
"""


@pytest.fixture(scope="module")
def tokenizer() -> GgufTokenizer:
    return GgufTokenizer.from_gguf(GGUF)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer  # test only: the gateway never imports transformers

    return AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)


def ours(tokenizer: GgufTokenizer, messages, template=None, **kwargs) -> str:
    return render_chat(template or tokenizer.chat_template, messages, bos_token=tokenizer.bos_token,
                       eos_token=tokenizer.eos_token, **kwargs)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_bundled_template_matches_transformers(tokenizer, hf_tokenizer, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours(tokenizer, messages, add_generation_prompt=add_generation_prompt) == expected
    assert expected.count("<|im_start|>") >= len(messages)  # the comparison is over a real render


def test_environment_features_match_transformers(tokenizer, hf_tokenizer):
    messages = CONVERSATIONS["multi_turn"]
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=FEATURES_TEMPLATE, tokenize=False,
                                                add_generation_prompt=True)
    got = ours(tokenizer, messages, FEATURES_TEMPLATE)
    assert got == expected
    assert '"<&>"' in got and "ANOTHER" not in got and "<assistant>" in got and "tools=True" in got


def test_text_parts_are_flattened_with_newlines(tokenizer):
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    flat = [{"role": "user", "content": "first\nsecond"}]
    assert ours(tokenizer, parts) == ours(tokenizer, flat)
    assert parts[0]["content"][0] == {"type": "text", "text": "first"}  # the caller's messages are untouched


def test_extra_variables_reach_the_template():
    assert render_chat("{{ greeting }} {{ messages | length }}", [{"role": "user", "content": "x"}],
                       greeting="hi") == "hi 1"


@pytest.mark.parametrize("messages,match", [
    ([{"role": "robot", "content": "beep"}], r"messages\[0\]: role 'robot' is not one of"),
    ([{"content": "no role"}], "role None"),
    ([{"role": "user", "content": 42}], "content must be a string or a list of text parts"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     r"messages\[0\]\.content\[0\] is not a"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], r"content\[0\] is not a"),
    ([{"role": "user"}], "content is missing"),
    (["just a string"], r"messages\[0\] is not an object"),
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}], r"only assistant messages have tool_calls"),
    ([{"role": "assistant", "tool_calls": {"id": "1"}}], "tool_calls must be a list of at most 64 objects"),
    ([{"role": "assistant", "tool_calls": [{"id": str(n)} for n in range(65)]}], "at most 64 objects"),
    ([{"role": "assistant", "tool_calls": ["call"]}], "at most 64 objects"),
    ([{"role": "tool", "content": "21", "tool_call_id": 7}], "tool_call_id must be a string"),
])
def test_refuses_malformed_messages(tokenizer, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        ours(tokenizer, messages)


def test_assistant_tool_calls_may_omit_content():
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    assert render_chat("{{ messages[0].tool_calls | tojson }}{{ messages[0].content is defined }}", calls) == \
        '[{"id": "1"}]False'


# Tools and tool turns, in the shape the gateway passes them (tool_use.template_messages):
# arguments as a JSON object, tool messages with tool_call_id and name.
TOOLS_TEMPLATE = """\
{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}|{{ tool.function.parameters | tojson(indent=1) }}
{% endfor %}</tools>{% endif %}
{% for m in messages %}<{{ m.role }}>{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.id }}:{{ c.function.name }}\
{{ c.function.arguments | tojson }}{% endfor %}{% elif m.role == 'tool' %}\
{{ m.tool_call_id }}/{{ m.name }}={{ m.content }}\
{% else %}{{ m.content }}{% endif %}
{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}
"""
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Météo <now>", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp_c\": 21}"},
]


def test_tools_and_tool_turns_match_transformers(tokenizer, hf_tokenizer):
    expected = hf_tokenizer.apply_chat_template(CALLED, tools=TOOLS, chat_template=TOOLS_TEMPLATE, tokenize=False,
                                                add_generation_prompt=True)
    got = ours(tokenizer, CALLED, TOOLS_TEMPLATE, tools=TOOLS)
    assert got == expected
    assert '<tools>{"type": "function"' in got and 'call_1:get_weather{"city": "Paris"}' in got
    assert 'call_1/get_weather={"temp_c": 21}' in got


@pytest.mark.parametrize("template,match", [
    ("{% for m in messages %}", "does not compile"),
    ("{{ raise_exception('only user turns, please') }}", "only user turns, please"),
    ("{{ messages[0]['content'] + 1 }}", "TypeError"),
    ("{% set ns = namespace() %}{% set ns._secret = 1 %}", "underscore"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError: access to attribute '__class__'"),
    ("{{ messages.append(1) }}", "SecurityError: access to attribute 'append'"),  # immutable sandbox
])
def test_template_errors_are_chat_template_errors(template, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(template, [{"role": "user", "content": "x"}])


# Review finding 17 (issue 55): a value doubled forty times by `~` (or `+`, or a block set) was
# stopped only by the clock, after peaking at 1.5 GiB; it is now refused at its first doubling
# past MAX_RENDER_CHARS (2**22 characters, from 'ab' at the 22nd), as `*` is.
DOUBLED = "{% set ns = namespace(s=START) %}{% for i in range(40) %}STEP{% endfor %}{{ ns.s | length }}"
DOUBLING_TEMPLATES = {
    "a string repeated by *": "{{ 'a' * 8388608 }}",  # the refusal the others must equal
    "a string doubled by ~": DOUBLED.replace("START", "'ab'").replace("STEP", "{% set ns.s = ns.s ~ ns.s %}"),
    "a string doubled by +": DOUBLED.replace("START", "'ab'").replace("STEP", "{% set ns.s = ns.s + ns.s %}"),
    "a list doubled by +": DOUBLED.replace("START", "['ab']").replace("STEP", "{% set ns.s = ns.s + ns.s %}"),
    "a string doubled by a block set": DOUBLED.replace("START", "'ab'").replace(
        "STEP", "{% set s %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = s %}"),
}


@pytest.mark.parametrize("template", DOUBLING_TEMPLATES.values(), ids=DOUBLING_TEMPLATES.keys())
def test_a_doubling_template_is_refused_before_it_grows(template):
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError) as refused:
            render_chat(template, [{"role": "user", "content": "x"}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == "chat template stopped: it would make a value of 8388608 characters (at most 4194304)"
    assert peak < 64 << 20  # the list's 2**22 pointers and their copy are 48 MiB; strings far less


def test_concatenation_within_the_bound_renders_as_jinja2_does():
    template = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' ~ m['content'] ~ 1 ~ none }}{% endfor %}"
                "|{{ [1] + [2] }}|{{ 'a' + 'b' }}|{{ 2 + 3 }}|{% set s %}x{{ 1 }}{% endset %}{{ s ~ 3 }}"
                "|{% autoescape true %}{{ ('<b>' | safe) ~ messages[0]['content'] }}{% endautoescape %}"
                "|{{ ('ab' * 1048576 ~ 'ab' * 1048576) | length }}")
    messages = [{"role": "user", "content": "&"}, {"role": "assistant", "content": "yo"}]
    assert render_chat(template, messages) == "<|user|>&1None<|assistant|>yo1None|[1, 2]|ab|5|x13|<b>&amp;|4194304"
