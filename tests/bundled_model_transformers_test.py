"""HF Transformers loads the bundled SmolLM2 GGUF (dequantized, fp32) and continues
"The capital of France is" greedily with " Paris": the baseline stack can read the default model.
"""

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@pytest.fixture(scope="module")
def gguf() -> Path:
    path = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
    assert path.is_file(), path
    return path


def test_greedy_continuation_names_paris(gguf):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    assert model.config.num_hidden_layers == 30
    assert model.config.hidden_size == 576
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    continuation = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
    assert continuation.startswith(" Paris"), repr(continuation)
