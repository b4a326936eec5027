"""Transformers fp32 on one layer range at a time, for models no process may hold whole
(certification's teacher-forced reference, issue 29).

`load_range(model, start, end)` builds a Transformers model of the architecture with only
layers [start, end) (its config cut to them, sliding-window layer types included), and gives it
those layers' weights dequantized from the GGUF file that holds them (the whole file, or the
per-range parts of a `ModelFiles`), through Transformers' own GGUF name map and tensor
processors (Llama's Q/K un-permutation, Gemma's norm offset, merged MoE experts). The token
embeddings are loaded only when the range starts at layer 0, the final norm and head only when
it ends at the last layer: nothing vocabulary-sized is allocated elsewhere. `RangeReference.run`
takes every position in one teacher-forced pass and returns the residual rows [n, n_embd]
leaving the range (what the next range takes) or, for the last range, the logits
[n, n_vocab]. A chain of ranges computes the whole model's logits exactly (range_reference_test).

  python -m meshnet.reference.range_reference --model M.gguf|M.parts.json --layers S:E
      --tokens 1,2,3 [--input-rows IN.f32] --out OUT.f32 [--threads N]
runs one range in its own process (certify/streamed.py runs a chain of them); its last stdout
line is JSON with the output's shape, the seconds taken and the process's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from gguf import GGUFReader, dequantize
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.model_files import ModelFiles, open_model_files
from meshnet.reference.model import load_config

_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
TOKEN_EMBD, OUTPUT_NORM, OUTPUT = "token_embd.weight", "output_norm.weight", "output.weight"
_PLACEHOLDER_VOCAB = 8  # the vocabulary the skeleton is built with: the real matrices are assigned


@dataclasses.dataclass
class RangeReference:
    start: int
    end: int
    n_layer: int
    model: nn.Module  # a CausalLM of end - start layers (final norm an identity unless the range is last)

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end == self.n_layer

    @torch.no_grad()
    def run(self, ids: Optional[Sequence[int]] = None, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Token ids (the first range) or the previous range's rows [n, n_embd] in; this range's
        rows [n, n_embd] out, or the logits [n, n_vocab] of the last range."""
        if self.first != (ids is not None) or (rows is None) == (ids is None):
            raise ValueError(f"layers [{self.start}, {self.end}) take {'token ids' if self.first else 'rows'}")
        inputs = {"input_ids": torch.tensor([list(ids)])} if self.first else {"inputs_embeds": rows[None].float()}
        if self.last:
            return self.model(**inputs, use_cache=False).logits[0]
        return self.model.model(**inputs, use_cache=False).last_hidden_state[0]


def load_range(model: ModelFiles, start: int, end: int) -> RangeReference:
    """Layers [start, end) of `model` in fp32 (ValueError for a range its files do not hold)."""
    pieces = model.pieces(start, end)
    first, last = start == 0, end == model.n_layer
    config = load_config(pieces[0].path)
    cut = copy.deepcopy(config)
    cut.num_hidden_layers = end - start
    if getattr(cut, "layer_types", None):
        cut.layer_types = cut.layer_types[start:end]
    cut.vocab_size, cut.tie_word_embeddings = _PLACEHOLDER_VOCAB, False
    with no_init_weights():  # every weight is assigned below
        module = AutoModelForCausalLM.from_config(cut, dtype=torch.float32, attn_implementation="sdpa")
    summary = gguf_summary(pieces[0].path)  # a part's summary is its source's
    processor = TENSOR_PROCESSORS.get(summary.architecture, TensorProcessor)(config=config.to_dict())
    names = get_gguf_hf_weights_map(module, processor)  # GGUF names of a start-at-0 model -> HF names
    state: dict[str, torch.Tensor] = {}
    embeddings: Optional[torch.Tensor] = None
    head: Optional[torch.Tensor] = None
    for piece in pieces:
        holds_first, holds_last = piece.start == 0, piece.end == model.n_layer
        for tensor in GGUFReader(piece.path).tensors:
            block = _BLOCK.fullmatch(tensor.name)
            if block:
                wanted = piece.start <= int(block[1]) < piece.end
            else:
                wanted = (tensor.name == TOKEN_EMBD and (holds_first or holds_last and summary.tied_embeddings)
                          or tensor.name in (OUTPUT_NORM, OUTPUT) and holds_last)
            if not wanted:
                continue
            local = f"blk.{int(block[1]) - start}.{block[2]}" if block else tensor.name
            result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=local,
                                       tensor_key_mapping=names, parsed_parameters={"tensors": state})
            if result.name is None:  # the processor put it in `state` itself (merged MoE experts)
                continue
            weights = torch.from_numpy(np.ascontiguousarray(result.weights, dtype=np.float32))
            if result.name == TOKEN_EMBD:  # one matrix for the embeddings and a tied head
                embeddings = weights if holds_first else embeddings
                head = weights if holds_last and summary.tied_embeddings else head
            elif result.name == OUTPUT:
                head = weights
            elif result.name in names:
                state[names[result.name]] = weights
    missing = [k for k in module.state_dict() if k.startswith("model.layers.") and k not in state]
    if not last:
        module.model.norm = nn.Identity()
    elif "model.norm.weight" not in state:
        missing.append("model.norm.weight")
    if missing or (first and embeddings is None) or (last and head is None):
        raise ValueError(f"layers [{start}, {end}): the model's files lack {missing[:6] or 'the vocabulary matrices'}")
    module.load_state_dict(state, strict=False, assign=True)
    if first:
        module.model.embed_tokens.weight = nn.Parameter(embeddings, requires_grad=False)
        module.model.embed_tokens.num_embeddings = embeddings.shape[0]
    if last:
        module.lm_head.weight = nn.Parameter(head, requires_grad=False)
        module.lm_head.out_features = head.shape[0]
    module.config.vocab_size = config.vocab_size
    return RangeReference(start, end, model.n_layer, module.eval())


def peak_rss_bytes() -> int:
    """This process's VmHWM (the most it has held resident), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="one layer range of Transformers fp32, teacher-forced")
    parser.add_argument("--model", type=Path, required=True, help="the GGUF, whole, or its parts record")
    parser.add_argument("--layers", required=True, help="START:END, end exclusive")
    parser.add_argument("--tokens", required=True, help="the sequence's token ids, comma-separated")
    parser.add_argument("--input-rows", type=Path, help="float32 [n, n_embd]: the previous range's output")
    parser.add_argument("--out", type=Path, required=True, help="float32 rows [n, n_embd] or logits [n, n_vocab]")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        start, end = (int(x) for x in args.layers.split(":"))
        ids = [int(t) for t in args.tokens.split(",")]
        reference = load_range(open_model_files(args.model), start, end)
    except ValueError as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = None
    if args.input_rows is not None:
        rows = torch.from_numpy(np.fromfile(args.input_rows, dtype=np.float32).reshape(len(ids), -1))
    try:
        out = reference.run(ids=None if rows is not None else ids, rows=rows)
    except ValueError as err:
        parser.error(str(err))
    out.numpy().astype(np.float32).tofile(args.out)
    print(json.dumps({"layers": [start, end], "shape": list(out.shape),
                      "seconds": round(time.monotonic() - started, 2), "peak_rss_bytes": peak_rss_bytes()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
