"""A chain of reference shards reproduces the single-process model: hidden states at each seam,
greedy tokens, and session isolation (on the bundled SmolLM2, fp32)."""

from __future__ import annotations

import os

import pytest
import torch

from meshnet.protocol.errors import ProtocolError
from meshnet.reference.model import ReferenceEngine, ShardModel, load_model, load_tokenizer
from meshnet.wire.status import StatusCode

GGUF = os.environ["MESHNET_BUNDLED_GGUF"]
CUTS = [(0, 10), (10, 20), (20, 30)]


@pytest.fixture(scope="module")
def full():
    return load_model(GGUF)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(GGUF)


@pytest.fixture(scope="module")
def chain():
    # Each shard gets its own copy of the weights, as separate nodes would.
    return [ShardModel(load_model(GGUF), s, e) for s, e in CUTS]


def _run_chain(chain, caches, position, ids):
    x, seams = ids, []
    for shard, cache in zip(chain, caches):
        x = shard(cache, position, token_ids=x) if shard.first else shard(cache, position, hidden=x)
        if not shard.last:
            seams.append(x)
    return x, seams


def test_seam_hidden_states_match_the_full_model(full, tokenizer, chain):
    ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        reference = full(ids.unsqueeze(0), output_hidden_states=True)
    logits, seams = _run_chain(chain, [s.new_cache() for s in chain], 0, ids)
    for (start, _), seam in zip(CUTS[1:], seams):
        torch.testing.assert_close(seam, reference.hidden_states[start][0], atol=1e-4, rtol=0)
    torch.testing.assert_close(logits, reference.logits[0, -1], atol=1e-4, rtol=0)


def test_greedy_tokens_match_generate(full, tokenizer, chain):
    ids = tokenizer("Gravity is", return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        expected = full.generate(ids.unsqueeze(0), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    caches = [s.new_cache() for s in chain]
    logits, _ = _run_chain(chain, caches, 0, ids)
    tokens, position = [], len(ids)
    for _ in range(16):
        token = int(torch.argmax(logits))
        tokens.append(token)
        logits, _ = _run_chain(chain, caches, position, torch.tensor([token]))
        position += 1
    assert tokens == expected


def test_sessions_are_isolated_and_bounded(chain):
    engine = ReferenceEngine(chain[0], max_sessions=2, max_kv_tokens=64)
    a = torch.tensor([1, 2, 3])
    out_a, length = engine.step("a", 0, token_ids=a)
    assert length == 3
    engine.step("b", 0, token_ids=torch.tensor([9, 9, 9, 9]))
    again, _ = ReferenceEngine(chain[0]).step("fresh", 0, token_ids=a)
    torch.testing.assert_close(out_a, again, atol=0, rtol=0)
    with pytest.raises(ProtocolError) as err:
        engine.step("c", 0, token_ids=a)
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(ProtocolError) as err:
        engine.step("a", 5, token_ids=a)
    assert err.value.code == StatusCode.CACHE_MISMATCH
    assert engine.release("a") and not engine.release("a")
    assert engine.stats() == (1, 4)


def test_overlapping_shards_run_from_the_effective_start(full, tokenizer):
    """[0, 12) then [10, 30) entered at 12 (the route's effective start) is the whole model;
    both shards share one model's layers 10 and 11, as one process serving both would."""
    ids = tokenizer("Gravity is", return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        expected = full.generate(ids.unsqueeze(0), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    model = load_model(GGUF)
    a, b = ShardModel(model, 0, 12), ShardModel(model, 10, 30)
    cache_a, cache_b = a.new_cache(), b.new_cache()
    logits = b(cache_b, 0, hidden=a(cache_a, 0, token_ids=ids), from_layer=12)
    tokens, position = [], len(ids)
    for _ in range(12):
        tokens.append(int(torch.argmax(logits)))
        hidden = a(cache_a, position, token_ids=torch.tensor(tokens[-1:]))
        logits = b(cache_b, position, hidden=hidden, from_layer=12)
        position += 1
    assert tokens == expected
    with pytest.raises(ValueError):
        b(b.new_cache(), 0, hidden=hidden, from_layer=30)
