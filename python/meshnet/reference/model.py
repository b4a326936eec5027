"""Reference shard engine: layers [start, end) of a HF Llama-family model in fp32, with one
isolated KV cache per route session.

Used by the reference shard server (server.py) and by tests as the single-process baseline.
It runs exactly the operations of `LlamaModel.forward` over its own layers (same mask, rotary
and cache code), so a chain of shards reproduces the whole model. The first shard embeds
tokens; the last applies the final norm and lm_head to the last position; the others return
the pre-norm residual stream. Thread ownership: all methods take the engine's lock, so one
step runs at a time; sessions never share a cache.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from pathlib import Path
from typing import Hashable, Optional

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.masking_utils import create_causal_mask

from meshnet.protocol.errors import ProtocolError
from meshnet.recipe.gguf_header import read_header
from meshnet.wire.status import StatusCode


# config attribute -> GGUF key (after "<arch>."), for sizes Transformers' GGUF loader does not map
_GGUF_SIZES_TRANSFORMERS_MISSES = {"head_dim": "attention.key_length",
                                   "moe_intermediate_size": "expert_feed_forward_length"}


def load_model(gguf: str | Path) -> nn.Module:
    """The whole model from a GGUF file (dequantized to fp32), for shards and baselines."""
    path = Path(gguf).resolve()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=load_config(path),
                                                 dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def load_config(gguf: str | Path):
    """The Transformers config of a GGUF file (its metadata only; a per-range part's is its
    source's), with the sizes Transformers' GGUF mapping misses taken from the file."""
    path = Path(gguf).resolve()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    # Transformers' GGUF config mapping leaves some sizes at the architecture's defaults, wrong
    # wherever a model differs from them (head_dim of the Qwen3 fixtures and Gemma 3 270M, the
    # expert width of Qwen3-MoE): take them from the GGUF, as llama.cpp does.
    metadata = read_header(path).metadata
    arch = metadata.get("general.architecture")
    for attribute, key in _GGUF_SIZES_TRANSFORMERS_MISSES.items():
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, int) and getattr(config, attribute, None) not in (None, value):
            setattr(config, attribute, value)
    return config


def load_tokenizer(gguf: str | Path):
    path = Path(gguf).resolve()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


class ShardModel(nn.Module):
    """Layers [start, end) of `full` (a LlamaForCausalLM); keeps only what the range owns."""

    def __init__(self, full: nn.Module, start: int, end: int) -> None:
        super().__init__()
        n_layer = full.config.num_hidden_layers
        if not 0 <= start < end <= n_layer:
            raise ValueError(f"layer range [{start}, {end}) is not inside [0, {n_layer})")
        self.start, self.end, self.n_layer = start, end, n_layer
        self.config = copy.deepcopy(full.config)
        self.config.num_hidden_layers = end - start
        if getattr(self.config, "layer_types", None):
            self.config.layer_types = self.config.layer_types[start:end]
        self.layers = nn.ModuleList(full.model.layers[start:end])
        for local, layer in enumerate(self.layers):
            layer.self_attn.layer_idx = local  # this shard's cache holds only its own layers
        self.rotary_emb = full.model.rotary_emb
        self.embed_tokens = full.model.embed_tokens if self.first else None
        self.norm = full.model.norm if self.last else None
        self.lm_head = full.lm_head if self.last else None

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end == self.n_layer

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.no_grad()
    def forward(self, cache: DynamicCache, position: int, token_ids: Optional[torch.Tensor] = None,
                hidden: Optional[torch.Tensor] = None, from_layer: Optional[int] = None) -> torch.Tensor:
        """One step for one session: [n] token ids (from layer 0) or [n, n_embd] hidden states.

        `from_layer` (the effective start, default `start`) skips this shard's layers below it:
        the previous hop of an overlapping route already ran them. A session always uses the
        same `from_layer` (its ticket's), so its cache holds layers [from_layer, end) at cache
        indices 0.. (callers serialise steps: each step sets its layers' cache indices).
        Returns [n, n_embd] pre-norm hidden states, or on the last shard [vocab] logits of the
        last position."""
        skip = (self.start if from_layer is None else from_layer) - self.start
        if not 0 <= skip < len(self.layers):
            raise ValueError(f"effective start {from_layer} is outside [{self.start}, {self.end})")
        if self.start + skip == 0:
            x = self.embed_tokens(token_ids.view(1, -1))
        else:
            x = hidden.view(1, hidden.shape[0], -1).to(torch.float32)
        layers = self.layers[skip:]
        for local, layer in enumerate(layers):  # set per step: shards built from one model share layers
            layer.self_attn.layer_idx = local
        return self._run(cache, position, x, layers)

    def _run(self, cache: DynamicCache, position: int, x: torch.Tensor, layers) -> torch.Tensor:
        position_ids = torch.arange(position, position + x.shape[1]).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
                                  position_ids=position_ids)
        position_embeddings = self.rotary_emb(x, position_ids=position_ids)
        for layer in layers:
            x = layer(x, attention_mask=mask, position_embeddings=position_embeddings, position_ids=position_ids,
                      cache=cache, use_cache=True)
        if self.last:
            return self.lm_head(self.norm(x[:, -1:, :]))[0, -1]
        return x[0]


@dataclasses.dataclass
class _Session:
    cache: DynamicCache
    length: int = 0  # positions [0, length) are cached


class ReferenceEngine:
    """A ShardModel plus a bounded table of per-session caches (thread-safe, one step at a time)."""

    def __init__(self, shard: ShardModel, max_sessions: int = 16, max_kv_tokens: int = 32768) -> None:
        self.shard = shard
        self.max_sessions, self.max_kv_tokens = max_sessions, max_kv_tokens
        self._lock = threading.Lock()
        self._sessions: dict[Hashable, _Session] = {}
        self.rows, self.compute_seconds = 0, 0.0  # cumulative, for the node's rate telemetry

    def step(self, key: Hashable, position: int, token_ids: Optional[torch.Tensor] = None,
             hidden: Optional[torch.Tensor] = None, from_layer: Optional[int] = None,
             deadline: Optional[float] = None) -> tuple[torch.Tensor, int]:
        """Runs one step of session `key` at `position` from layer `from_layer` (the session's
        effective start; the shard's start by default); returns (output, cached length). A step
        whose `deadline` (time.monotonic) has passed when its turn comes is not run:
        DEADLINE_EXCEEDED, and the session's cache is as it was."""
        n = int(token_ids.numel()) if token_ids is not None else int(hidden.shape[0])
        with self._lock:
            if deadline is not None and time.monotonic() > deadline:
                raise ProtocolError(StatusCode.DEADLINE_EXCEEDED, "the step's budget ran out while it waited for "
                                    "the engine", retryable=True)
            session = self._sessions.get(key)
            if session is None:
                if position != 0:
                    raise ProtocolError(StatusCode.CACHE_MISMATCH, f"new session must start at position 0, got {position}")
                if len(self._sessions) >= self.max_sessions:
                    raise ProtocolError(StatusCode.RESOURCE_EXHAUSTED,
                                        f"all {self.max_sessions} session slots are in use", retryable=True)
                session = _Session(self.shard.new_cache())
            elif position != session.length:
                raise ProtocolError(StatusCode.CACHE_MISMATCH,
                                    f"step at position {position}, but positions [0, {session.length}) are cached")
            if self._kv_tokens() + n > self.max_kv_tokens:
                raise ProtocolError(StatusCode.RESOURCE_EXHAUSTED,
                                    f"KV budget of {self.max_kv_tokens} tokens is full", retryable=True)
            started = time.perf_counter()
            out = self.shard(session.cache, position, token_ids=token_ids, hidden=hidden, from_layer=from_layer)
            self.rows, self.compute_seconds = self.rows + n, self.compute_seconds + time.perf_counter() - started
            session.length += n
            self._sessions[key] = session
            return out, session.length

    def release(self, key: Hashable) -> bool:
        with self._lock:
            return self._sessions.pop(key, None) is not None

    def _kv_tokens(self) -> int:
        return sum(s.length for s in self._sessions.values())

    def stats(self) -> tuple[int, int]:
        """(live sessions, cached tokens)."""
        with self._lock:
            return len(self._sessions), self._kv_tokens()
