"""render_chat against HF transformers' apply_chat_template (the only place transformers is
imported for the gateway), and its refusals."""

from __future__ import annotations

import os
import re
import tracemalloc
from pathlib import Path

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from meshnet.text.chat import ChatTemplateError, render_chat
from meshnet.text.template_sandbox import _FILTER_GROWTH, _TEST_GROWTH
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
    # Review finding (filters): jinja2's filters are called directly, past the sandbox's call hook; the
    # join doubling peaked at 1.5 GiB before the clock stopped it, and % doubled without any check.
    "a string doubled by join": DOUBLED.replace("START", "'ab'").replace(
        "STEP", "{% set ns.s = [ns.s, ns.s] | join %}"),
    "a string doubled by format": DOUBLED.replace("START", "'ab'").replace(
        "STEP", "{% set ns.s = '%s%s' | format(ns.s, ns.s) %}"),
    "a string doubled by %": DOUBLED.replace("START", "'ab'").replace("STEP", "{% set ns.s = '%s%s' % (ns.s, ns.s) %}"),
    "a string doubled by replace": DOUBLED.replace("START", "'aa'").replace(
        "STEP", "{% set ns.s = ns.s | replace('a', 'aa') %}"),
    "a string doubled by center": DOUBLED.replace("START", "'ab'").replace(
        "STEP", "{% set ns.s = ns.s | center(2 * ns.s | length) %}"),
    "a list doubled by sum": DOUBLED.replace("START", "['ab']").replace(
        "STEP", "{% set ns.s = [ns.s, ns.s] | sum(start=[]) %}"),
}


def refusal_and_peak(template: str) -> tuple[str, int]:
    """render_chat's refusal of `template`, and the most memory Python held while it rendered."""
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError) as refused:
            render_chat(template, [{"role": "user", "content": "x"}])
        return str(refused.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("template", DOUBLING_TEMPLATES.values(), ids=DOUBLING_TEMPLATES.keys())
def test_a_doubling_template_is_refused_before_it_grows(template):
    refusal, peak = refusal_and_peak(template)
    assert refusal == "chat template stopped: it would make a value of 8388608 characters (at most 4194304)"
    assert peak < 64 << 20  # the list's 2**22 pointers and their copy are 48 MiB; strings far less


# Filters, tests, str methods and globals that make a value far larger than their arguments, each refused
# before it makes it, with the size it would have made: exact for widths, separators and repeats, and
# _text_size's count for str(), repr() and JSON of nested values (each string plus 4 per item, 16 per list).
SHARED = "{% set s = 'a' * 4194304 %}"  # as large as a value may be; [s, s] is two pointers, str([s, s]) 2 s
SHARED_TWICE = 2 * (4194304 + 4) + 16  # _text_size([s, s])
GROWING_TEMPLATES = {  # what: (template, the size it would make)
    "center to a billion": ("{{ 'a' | center(1000000000) }}", 1000000000),
    "center through map": ("{{ ['a'] | map('center', 1000000000) | list }}", 1000000000),
    "join with a long separator": ("{{ ['a', 'b', 'c'] | select | join('x' * 4194304) }}", 3 + 2 * 4194304),
    "indent by a million": ("{{ ('a\n' * 100000) | indent(1000000) }}", 200001 + 100001 * 1000000),
    "indent by a long string": ("{{ ('a\n' * 100000) | indent('x' * 100000) }}", 200001 + 100001 * 100000),
    "format to a billion": ("{{ '%1000000000s' | format('a') }}", 1000000000),
    "% to a billion": ("{{ '%*d' % (1000000000, 1) }}", 1000000000),
    "replace by a long string": ("{% set s = 'a' * 100000 %}{{ s | replace('a', 'b' * 100000) }}", 100000 ** 2),
    "wordwrap with a long separator": ("{{ ('a ' * 100000) | wordwrap(1, wrapstring='x' * 100000) }}",
                                       200000 * 100001),
    "batch padded to a billion": ("{{ [1] | batch(1000000000, 0) | list }}", 1000000000),
    "a billion slices": ("{{ [1] | slice(1000000000) | list }}", 1000000000),
    "tojson indented a billion": ("{{ [1] | tojson(indent=1000000000) }}", 1000000027),
    "tojson of shared strings": (SHARED + "{{ [s, s] | tojson }}", SHARED_TWICE),
    "pprint past a long key": ("{{ {'k' * 1000000: ['a'] * 1000} | pprint }}", 2002028053),
    "string of shared strings": (SHARED + "{{ [s, s] | string }}", SHARED_TWICE),
    "escape of shared strings": (SHARED + "{{ [s, s] | e }}", SHARED_TWICE),
    "upper of shared strings": (SHARED + "{{ [s, s] | upper }}", SHARED_TWICE),
    "urlize with a long target": ("{{ ('www.a.com ' * 10000) | urlize(target='t' * 100000) }}",
                                  100000 + 25001 * 5 * 100000),
    "xmlattr of shared strings": (SHARED + "{{ {'k': [s, s]} | xmlattr }}", SHARED_TWICE + 21),
    "sum of long lists": ("{{ ([['x'] * 4194304] * 2) | sum(start=[]) }}", 8388608),
    "output of shared strings": (SHARED + "{{ [s, s] }}", SHARED_TWICE),
    "~ of shared strings": (SHARED + "{{ [s, s] ~ '' }}", SHARED_TWICE),
    "%s of shared strings": (SHARED + "{{ '%s' % ([s, s],) }}", SHARED_TWICE),
    "str.join with a long separator": ("{{ ('x' * 1000).join(['a'] * 1000000) }}", 1000000 + 999999 * 1000),
    "str.format to a billion": ("{{ '{:>1000000000}'.format('a') }}", 1000000000),
    "str.format !r of shared strings": (SHARED + "{{ '{!r}'.format([s, s]) }}", SHARED_TWICE),
    "str.translate to long strings": ("{{ ('a' * 100000).translate({97: 'b' * 100000}) }}", 100000 ** 2),
    "raise_exception of shared strings": (SHARED + "{{ raise_exception([s, s]) }}", SHARED_TWICE),
    "an undefined key of shared strings": (SHARED + "{{ {}[[s, s]].x }}", SHARED_TWICE),
    "strftime_now's buffer": ("{{ strftime_now('%9999Y' * 20000) }}", 256 * (120000 + 4 * 20000)),
    "the odd test's %": ("{{ '%1000000000d' is odd }}", 1000000000),
    "the divisibleby test's %": (SHARED + "{{ ('%s' * 100) is divisibleby((s,) * 100) }}", 100 * 4194304),
    "the lower test of shared strings": (SHARED + "{{ [s, s] is lower }}", SHARED_TWICE),
}


@pytest.mark.parametrize("template,made", GROWING_TEMPLATES.values(), ids=GROWING_TEMPLATES.keys())
def test_a_growing_filter_test_or_method_is_refused_before_it_grows(template, made):
    refusal, peak = refusal_and_peak(template)
    assert refusal == f"chat template stopped: it would make a value of {made} characters (at most 4194304)"
    assert peak < 64 << 20  # the largest value made is a list of 2**22 pointers (32 MiB)


# Every filter and test template_sandbox.py bounds, used as an honest template would, and values as large as may be.
HONEST_TEMPLATE = """\
{{ messages | map(attribute='content') | join(' | ') }}|{{ [1, 'a', none] | join(', ') }}
{{ messages | join('/', attribute='role') }}|{{ 'ab' | center(9) }}|{{ 'a\nb\n\nc' | indent(2) }}
{{ 'a\nb\n' | indent('> ', first=true, blank=true) }}|{{ '%s=%05.1f %%' | format('x', 3.14159) }}
{{ '%(a)s-%(b)d' | format(a='k', b=7) }}|{{ '%-4s|%*d|%.2s|%c' % ('a', 3, 5, 'xyz', 65) }}
{{ 'a-b-a' | replace('a', 'xyz') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'ab' | replace('', '.') }}
{{ 1 | replace(1, 22) }}|{{ 'the quick brown fox jumps' | wordwrap(10) }}
{{ 'the quick brown fox' | wordwrap(5, wrapstring='<br>') }}|{{ [1, 2, 3, 4, 5] | batch(2, 0) | list }}
{{ [1, 2, 3, 4, 5] | batch(2) | list }}|{{ [1, 2, 3, 4, 5] | slice(2, 'x') | list }}
{{ [[1], [2, 3]] | sum(start=[]) }}|{{ [1, 2] | sum }}|{{ [{'n': 1}, {'n': 2.5}] | sum(attribute='n') }}
{{ [(1,), (2,)] | sum(start=()) }}|{{ {'b': [1, 'x', {'c': none}]} | tojson(indent=2) }}|{{ [1, 'x'] | tojson }}
{{ {'a': [1, 2], 'b': 'x y' * 30} | pprint }}|{{ [1, 'x', none, 2.5, (1, 2)] | string }}
{{ '<a & b>' | e }}|{{ '<i>' | escape }}|{{ '<i>' | forceescape }}|{{ 'ab' | upper }}{{ 'AB' | lower }}
{{ 'ab cd' | title }}{{ 'ab' | capitalize }}|{{ '  x  ' | trim }}|{{ 'xxyxx' | trim('x') }}
{{ '<b>x</b>  y' | striptags }}|{{ 'a b c' | wordcount }}|{{ 'a b&c/d' | urlencode }}|{{ {'k': 'v w'} | urlencode }}
{{ [('a', 1)] | urlencode }}|{{ 'x' | safe }}|{{ 'see www.example.com now' | urlize(target='_blank') }}
{{ 'mail a@b.com' | urlize(rel='x', nofollow=true) }}|{{ {'class': 'c', 'id': 3, 'n': none} | xmlattr }}
{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby(3) }}{{ 'abc' is lower }}{{ 'ABC' is upper }}
{{ [1, 2, 3] | select('odd') | list }}|{{ [1, [2, 'x'], {'k': (1, none)}] }}|{{ 'a' ~ [1, 2] ~ {'k': none} ~ 3 }}
{{ '%s/%r' % ('x', [1]) }}|{{ '%(k)s' % {'k': [1]} }}|{{ '{}-{:>5}-{k!r}-{:.2f}'.format(1, 'ab', 2.5, k='v') }}
{{ '{a}'.format_map({'a': 2}) }}|{{ '{:{w}}|'.format('x', w=3) }}|{{ ', '.join(['a', 'b']) }}|{{ '-'.join('abc') }}
{{ 'abc'.translate({97: 'xy', 98: none}) }}|{{ 'ab'.center(6, '*') }}
{% set ns = namespace(a=1) %}{{ ns }}|{{ dict(a=1) }}|{{ messages[0] }}|{{ none }}|{{ 3.5 }}|{{ {}['k'] }}
{% autoescape true %}{{ ['<a>', 'b'] | join('&') }}|{{ '<x>' ~ 1 }}|{{ ('<p>{}</p>' | safe).format('<i>') }}
{% endautoescape %}
{% set s = 'ab' * 1048576 %}{{ [s, s] | join | length }} {{ ('%s%s' % (s, s)) | length }}
{{ '{0}{0}'.format(s) | length }} {{ ''.join([s, s]) | length }} {{ 'a' | center(4194304) | length }}
{{ [[s], [s]] | sum(start=[]) | length }}
"""


def test_growing_filters_within_the_bound_render_as_jinja2_does():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    got = render_chat(HONEST_TEMPLATE, messages)
    assert got == plain.from_string(HONEST_TEMPLATE).render(messages=messages)
    assert got.endswith("4194304 4194304\n4194304 4194304 4194304\n2")
    assert all(re.search(rf"\| {name}\b", HONEST_TEMPLATE) for name in _FILTER_GROWTH)  # each bounded filter,
    assert all(f"is {name}" in HONEST_TEMPLATE for name in _TEST_GROWTH)  # and each test, is exercised here


def test_concatenation_within_the_bound_renders_as_jinja2_does():
    template = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' ~ m['content'] ~ 1 ~ none }}{% endfor %}"
                "|{{ [1] + [2] }}|{{ 'a' + 'b' }}|{{ 2 + 3 }}|{% set s %}x{{ 1 }}{% endset %}{{ s ~ 3 }}"
                "|{% autoescape true %}{{ ('<b>' | safe) ~ messages[0]['content'] }}{% endautoescape %}"
                "|{{ ('ab' * 1048576 ~ 'ab' * 1048576) | length }}")
    messages = [{"role": "user", "content": "&"}, {"role": "assistant", "content": "yo"}]
    assert render_chat(template, messages) == "<|user|>&1None<|assistant|>yo1None|[1, 2]|ab|5|x13|<b>&amp;|4194304"
