"""GgufTokenizer against llama.cpp's own tokenizer (//cpp/engine:tokenize) on the bundled model.

The expected ids always come from the llama.cpp tool at test time. Besides the bundled vocabulary
(pre-tokenizer "smollm"), the same vocabulary is re-labelled with other supported pre-tokenizers
in vocabulary-only GGUFs, so their splitting rules are checked against llama.cpp too.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from meshnet.text.chat import render_chat
from meshnet.text.tokenizer import GgufTokenizer

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"])
TOOL = Path(os.environ["MESHNET_TOKENIZE_BINARY"])

CHAT = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "Où est la tour Eiffel ? 🗼"},
    {"role": "assistant", "content": "À Paris, au Champ-de-Mars."},
    {"role": "user", "content": "And its height in metres?"},
]

PROMPTS = [
    "The capital of France is",
    "Hello, world!",
    "Héllo wörld, ça va? Crème brûlée à la française.",
    "Ångström naïve façade coöperate résumé Straße",
    "e\u0301 a\u0308 o\u0302: combining marks",
    "日本語のテキストです。中文测试，你好世界！",
    "한국어 텍스트와 숫자 42",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷",
    "مرحبا بالعالم، كيف حالك؟",
    "Привет, мир! Ελληνικά γράμματα",
    "∑ ∫ √ ≤ ≥ ≠ ∞ π² ½",
    "def f(x):\n\tif x:\n\t\treturn  x  # comment\n",
    "class A:\n    def __init__(self):\n        self.x = [1, 2, 3]\n\n\n",
    "int main() {\r\n  return 0;\r\n}\r\n",
    "1234567890 3.14159 1,000,000 2024-01-31 0x1F",
    "12345678901234567890123",
    "a  b   c    d     e",
    "   leading and trailing   ",
    "   ",
    "\n\n\n",
    "\t",
    " ",
    "a",
    "I'm can't we'll THEY'RE you'd I've she's 'quoted'",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^",
    "https://example.com/path?q=1&r=2 user@example.org",
    "\u00a0nbsp\u3000ideographic\u2009thin\u200bzero-width",
    "nul\x00 and \x01 control \x7f chars",
    "x" * 300,
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|><|im_end|>x<|endoftext|> <|im_start|>",
    "<|im_start <|im_end| |im_end|> <|im_start|",
    "<repo_name>meshnet<file_sep>a.py<jupyter_code>print(1)",
    "",
]


def llama_tokenize(gguf_path: Path, texts: list[str], *flags: str) -> list[list[int]]:
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run([str(TOOL), str(gguf_path), *flags], input=lines, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def llama_vocab(gguf_path: Path) -> dict:
    out = subprocess.run([str(TOOL), str(gguf_path), "--vocab"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return json.loads(out)


@pytest.fixture(scope="module")
def tokenizer() -> GgufTokenizer:
    return GgufTokenizer.from_gguf(GGUF)


@pytest.fixture(scope="module")
def fields() -> dict:
    """The GGUF's key-value pairs with their GGUF types (for writing re-labelled copies)."""
    reader = gguf.GGUFReader(GGUF, "r")
    return {key: (field.contents(), field.types) for key, field in reader.fields.items()
            if not key.startswith("GGUF.")}


def vocab_only_copy(fields: dict, path: Path, changes: dict) -> dict[str, object]:
    """Writes a GGUF with the metadata of `fields` updated by `changes` (None drops a key) and no
    tensors; returns the plain metadata GgufTokenizer takes."""
    plain = {key: value for key, (value, _) in fields.items()}
    plain.update(changes)
    writer = gguf.GGUFWriter(path, plain["general.architecture"])
    for key, (_, types) in fields.items():
        if key == "general.architecture" or plain.get(key) is None:
            continue
        array = types[0] == gguf.GGUFValueType.ARRAY
        writer.add_key_value(key, plain[key], types[0], sub_type=types[-1] if array else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return {key: value for key, value in plain.items() if value is not None}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[list[int]]]:
    return {"special": llama_tokenize(GGUF, PROMPTS), "plain": llama_tokenize(GGUF, PROMPTS, "--no-parse-special"),
            "add_special": llama_tokenize(GGUF, PROMPTS, "--add-special")}


@pytest.mark.parametrize("index", range(len(PROMPTS)), ids=[repr(p)[:30] for p in PROMPTS])
def test_encode_matches_llama_cpp(tokenizer, reference, index):
    text = PROMPTS[index]
    assert tokenizer.encode(text) == reference["special"][index]
    assert tokenizer.encode(text, special=False) == reference["plain"][index]
    assert tokenizer.encode(text, add_bos=None) == reference["add_special"][index]


def test_chat_rendered_prompt_matches_llama_cpp(tokenizer):
    text = render_chat(tokenizer.chat_template, CHAT, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    assert text.count("<|im_start|>") == len(CHAT) + 1
    [expected] = llama_tokenize(GGUF, [text])
    assert tokenizer.encode(text) == expected
    assert tokenizer.decode(expected, skip_special=False) == text


def test_prompts_exercise_special_tokens(reference):
    # Guards the parity test: parsing special tokens changes the ids of several prompts.
    changed = [p for p, a, b in zip(PROMPTS, reference["special"], reference["plain"]) if a != b]
    assert len(changed) >= 3, changed


def test_vocabulary_matches_llama_cpp(tokenizer):
    vocab = llama_vocab(GGUF)
    assert tokenizer.vocab_size == len(vocab["pieces"])
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (vocab["bos"], vocab["eos"])
    assert tokenizer.eot_token_id == vocab["eot"]
    assert tokenizer.add_bos == vocab["add_bos"]
    assert set(tokenizer.stop_token_ids) == set(vocab["eog"])
    assert tokenizer.stop_token_ids[0] == tokenizer.eos_token_id
    for skip_special, key in ((False, "pieces"), (True, "plain_pieces")):
        expected = [bytes.fromhex(h).decode("utf-8", errors="replace") for h in vocab[key]]
        got = [tokenizer.decode([i], skip_special=skip_special) for i in range(tokenizer.vocab_size)]
        mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
        assert not mismatches, f"{key}: first mismatching ids {mismatches[:10]}"


def test_token_properties(tokenizer):
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.encode(tokenizer.eos_token) == [tokenizer.eos_token_id]
    assert "<|im_start|>" in tokenizer.chat_template


@pytest.mark.parametrize("text", PROMPTS, ids=[repr(p)[:30] for p in PROMPTS])
def test_decode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special=False) == text
    assert tokenizer.decode(tokenizer.encode(text, special=False)) == text


def test_decode_skips_control_tokens_and_marks_split_characters(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhé<|im_end|>")
    assert tokenizer.decode(ids) == "user\nhé"
    emoji = tokenizer.encode("😀")
    assert len(emoji) > 1 and tokenizer.decode(emoji[:1]).endswith("\ufffd")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])


def test_add_bos_flag(tokenizer):
    assert tokenizer.encode("hi", add_bos=True) == [tokenizer.bos_token_id] + tokenizer.encode("hi")
    assert tokenizer.encode("hi", add_bos=False) == tokenizer.encode("hi")


@pytest.mark.parametrize("pre,changes", [
    ("gpt-2", {}),
    ("qwen2", {}),
    ("llama-bpe", {"tokenizer.ggml.add_bos_token": None}),  # llama3's default: add BOS
], ids=["gpt-2", "qwen2", "llama-bpe"])
def test_other_pre_tokenizers_match_llama_cpp(fields, tmp_path, pre, changes):
    path = tmp_path / f"{pre}.gguf"
    metadata = vocab_only_copy(fields, path, {"tokenizer.ggml.pre": pre, **changes})
    tokenizer = GgufTokenizer(metadata, source=pre)
    for flags, kwargs in (((), {"add_bos": False}), (("--add-special",), {"add_bos": None}),
                          (("--no-parse-special",), {"add_bos": False, "special": False})):
        expected = llama_tokenize(path, PROMPTS, *flags)
        got = [tokenizer.encode(text, **kwargs) for text in PROMPTS]
        mismatches = [(PROMPTS[i], got[i], expected[i]) for i in range(len(PROMPTS)) if got[i] != expected[i]]
        assert not mismatches, f"{pre} {flags}: {mismatches[:3]}"
    assert tokenizer.add_bos == llama_vocab(path)["add_bos"]


def random_texts(count: int, seed: int) -> list[str]:
    """Seeded strings over the characters and pieces the splitting rules treat differently."""
    pool = [*"aZé日😀٣²½ \t\n\r'sStTdDlLmM.,!?-_(){}<>|0123456789", "\u00a0", "\u3000", "\u2009", "\u200b",
            "\u0301", "\u2019", "\u0378", "\ue000", "\x00", "\x0b", "\x85", "\u2028", "\U0001F3FD", "'ll", "'RE",
            "\r\n", "  \n", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(count)]


@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "qwen2", "llama-bpe"])
def test_random_strings_match_llama_cpp(fields, tmp_path, pre):
    path = tmp_path / f"{pre}.gguf"
    tokenizer = GgufTokenizer(vocab_only_copy(fields, path, {"tokenizer.ggml.pre": pre}), source=pre)
    texts = random_texts(2000, seed=15)
    expected = llama_tokenize(path, texts)
    mismatches = [(t, e) for t, e in zip(texts, expected) if tokenizer.encode(t, add_bos=False) != e]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, e.g. {mismatches[:3]}"


def test_the_splitting_rules_differ_between_pre_tokenizers(fields):
    # Guards the test above: on these prompts the llama3/qwen2 rules (whitespace before newlines,
    # punctuation joined to words) give other ids than the GPT-2 rules of the bundled vocabulary.
    plain = {key: value for key, (value, _) in fields.items()}
    smollm, qwen2 = (GgufTokenizer(dict(plain, **{"tokenizer.ggml.pre": pre})) for pre in ("smollm", "qwen2"))
    assert sum(smollm.encode(p) != qwen2.encode(p) for p in PROMPTS) >= 3


def test_refuses_unsupported_tokenizers(fields):
    plain = {key: value for key, (value, _) in fields.items()}
    with pytest.raises(ValueError, match="tokenizer model 'llama'"):
        GgufTokenizer(dict(plain, **{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(ValueError, match="pre-tokenizer 'deepseek-llm'"):
        GgufTokenizer(dict(plain, **{"tokenizer.ggml.pre": "deepseek-llm"}))
    no_pre = dict(plain)
    del no_pre["tokenizer.ggml.pre"]
    with pytest.raises(ValueError, match="pre-tokenizer None"):
        GgufTokenizer(no_pre)
    with pytest.raises(ValueError, match="not valid Unicode"):
        GgufTokenizer(plain).encode("lone \ud800 surrogate")


def test_no_torch_or_transformers_imported():
    script = (
        "import sys\n"
        "from meshnet.text.tokenizer import GgufTokenizer\n"
        "from meshnet.text.chat import render_chat\n"
        "tok = GgufTokenizer.from_gguf(sys.argv[1])\n"
        "text = render_chat(tok.chat_template, [{'role': 'user', 'content': 'hi'}])\n"
        "assert tok.decode(tok.encode(text), skip_special=False) == text\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", script, str(GGUF)], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout
    assert out.strip() == "[]"
