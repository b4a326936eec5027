"""llama.cpp's own tokenizer through //cpp/engine:tokenize: the same ids and text as GgufTokenizer
on the bundled model, and a SentencePiece vocabulary (Gemma 3) that GgufTokenizer refuses."""

import os
from pathlib import Path

import pytest

from meshnet.text.llama_cpp_tokenizer import LlamaCppTokenizer, tokenizer_for
from meshnet.text.tokenizer import GgufTokenizer

TOOL = Path(os.environ["MESHNET_TOKENIZE_BINARY"])
SMOLLM2 = Path(os.environ["MESHNET_BUNDLED_GGUF"])
GEMMA3 = Path(os.environ["MESHNET_GEMMA3_GGUF"])
TEXTS = ["The capital of France is", "def f(x):\n\treturn x  # é ü 中文", "<|im_start|>user\nhi<|im_end|>"]


def test_matches_gguf_tokenizer_on_the_bundled_model():
    ours, theirs = LlamaCppTokenizer(SMOLLM2, TOOL), GgufTokenizer.from_gguf(SMOLLM2)
    assert ours.encode_many(TEXTS) == [theirs.encode(t) for t in TEXTS]
    for text in TEXTS:
        ids = theirs.encode(text)
        assert ours.decode(ids) == theirs.decode(ids) and ours.decode(ids, skip_special=False) == \
            theirs.decode(ids, skip_special=False)
    assert ours.eos_token_id == theirs.eos_token_id


def test_sentencepiece_vocabulary_is_served_by_llama_cpp():
    with pytest.raises(ValueError, match="not supported"):
        GgufTokenizer.from_gguf(GEMMA3)
    with pytest.raises(ValueError, match="no tokenize binary"):
        tokenizer_for(GEMMA3, None)
    tokenizer = tokenizer_for(GEMMA3, TOOL)
    assert isinstance(tokenizer, LlamaCppTokenizer)
    ids = tokenizer.encode("The capital of France is")
    assert ids[0] == 2  # Gemma's BOS, added as the vocabulary asks
    assert tokenizer.decode(ids) == "The capital of France is"
    assert 106 in tokenizer.stop_token_ids  # <end_of_turn> ends a generation as in llama.cpp
