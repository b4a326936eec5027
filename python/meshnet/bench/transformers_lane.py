"""Lane 3: HF Transformers in one process (fp32, the GGUF's weights dequantized), greedy.

  python -m meshnet.bench.transformers_lane --gguf M.gguf --prompts prompts.json --out cells.json
      --cells 128x1,128x8,512x1 --tokens 64 --threads 2

Run as a child of the harness so its peak RSS is its own. At concurrency c the c prompts (same
length, so no padding) go through the model as one batch: one prefill forward, then one decode
forward per token for all streams, as a batching server would. Every stream's token times are
recorded and turned into figures by meshnet.bench.measure. Writes {"cells": [...], "tokens":
{prompt_len: stream 0's tokens at concurrency 1}}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from meshnet.bench.measure import cell_figures, rounded
from meshnet.reference.model import load_model


def run_cell(model, prompts: list[list[int]], tokens: int) -> tuple[dict, list[list[int]]]:
    from transformers import DynamicCache

    batch = len(prompts)
    cache = DynamicCache(config=model.config)
    times: list[list[float]] = [[] for _ in range(batch)]
    out: list[list[int]] = [[] for _ in range(batch)]
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(torch.tensor(prompts), cache=cache, use_cache=True).logits[:, -1]
        for _ in range(tokens):
            chosen = torch.argmax(logits, dim=-1)
            now = time.perf_counter()
            for i, token in enumerate(chosen.tolist()):
                out[i].append(token)
                times[i].append(now)
            if len(out[0]) == tokens:
                break
            logits = model(chosen[:, None], cache=cache, use_cache=True).logits[:, -1]
    figures = cell_figures(start, times, len(prompts[0]))
    return figures, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help='JSON {"128": [[ids], ...], ...}')
    parser.add_argument("--cells", required=True, help="PROMPTxCONCURRENCY,... in the order to run")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = {int(k): v for k, v in json.loads(args.prompts.read_text()).items()}
    model = load_model(args.gguf)
    first = next(iter(prompts.values()))[0]
    run_cell(model, [first[:16]], 4)  # warm-up
    cells, tokens = [], {}
    for length, c in (map(int, cell.split("x")) for cell in args.cells.split(",")):
        figures, out = run_cell(model, prompts[length][:c], args.tokens)
        cells.append({"prompt_tokens": length, "concurrency": c, "new_tokens": args.tokens, "failures": 0,
                      **rounded(figures)})
        if c == 1:
            tokens[length] = out[0]
        print(json.dumps({"cell": [length, c]}), flush=True)  # progress for the harness
    args.out.write_text(json.dumps({"cells": cells, "tokens": tokens}))


if __name__ == "__main__":
    main()
