"""Reference route vs single-process Transformers, measured side by side in one run.

  bazel run //python:bench_reference_route -- --out /tmp/results.json [--tokens 64] [--repeats 3]

Lane A: the whole model in this process (HF Transformers, fp32), greedy, `--threads` torch
threads. Lane B: a local swarm (tracker + 3 reference nodes on loopback, one torch thread
each) through RouteSession. Both lanes use the same prompt, token count and weights; TTFT and
decode tok/s are medians over repeats. Also checks both lanes produced the same tokens.
A measurement for the notes, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from meshnet.client.session import GenerationParams, RouteSession
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.reference.model import load_model, load_tokenizer
from meshnet.swarm.local import LocalSwarm


def single_process(model, ids: list[int], tokens: int) -> tuple[list[int], float, float]:
    """Greedy loop over the full model with its cache: (tokens, TTFT s, decode tok/s)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out, started = [], time.perf_counter()
    with torch.no_grad():
        logits = model(torch.tensor([ids]), cache=cache, use_cache=True).logits[0, -1]
        out.append(int(torch.argmax(logits)))
        ttft = time.perf_counter() - started
        for _ in range(tokens - 1):
            logits = model(torch.tensor([[out[-1]]]), cache=cache, use_cache=True).logits[0, -1]
            out.append(int(torch.argmax(logits)))
    decode_s = time.perf_counter() - started - ttft
    return out, ttft, (tokens - 1) / decode_s


def route(tracker: TrackerClient, ids: list[int], tokens: int) -> tuple[list[int], float, float]:
    session = RouteSession(tracker, "smollm2", client_id="bench")
    started = time.perf_counter()
    out = list(session.generate(ids, GenerationParams(max_tokens=tokens)))
    total = time.perf_counter() - started
    return out, session.ttft, (tokens - 1) / (total - session.ttft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=os.environ.get("MESHNET_BUNDLED_GGUF"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompt", default="Explain why the sky is blue in simple words.")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the single-process lane")
    args = parser.parse_args()
    gguf = Path(args.gguf).resolve()
    tokenizer = load_tokenizer(gguf)
    ids = tokenizer(args.prompt)["input_ids"]
    lanes = {}

    torch.set_num_threads(args.threads)
    model = load_model(gguf)
    single_process(model, ids, 4)  # warm-up
    runs = [single_process(model, ids, args.tokens) for _ in range(args.repeats)]
    lanes["transformers_single_process"] = runs
    del model

    with tempfile.TemporaryDirectory() as tmp:
        with LocalSwarm(Path(tmp), gguf, [(0, 10), (10, 20), (20, 30)], threads=1) as swarm:
            with swarm.client() as tracker:
                route(tracker, ids, 4)  # warm-up
                lanes["reference_route_3_nodes"] = [route(tracker, ids, args.tokens) for _ in range(args.repeats)]

    result = {"prompt_tokens": len(ids), "new_tokens": args.tokens, "repeats": args.repeats,
              "single_process_threads": args.threads, "node_threads": 1, "lanes": {}}
    for name, runs in lanes.items():
        result["lanes"][name] = {"ttft_ms": round(statistics.median(r[1] for r in runs) * 1000, 1),
                                 "decode_tok_s": round(statistics.median(r[2] for r in runs), 2)}
    a, b = lanes["transformers_single_process"][0][0], lanes["reference_route_3_nodes"][0][0]
    result["same_tokens"] = a == b
    ra, rb = result["lanes"]["reference_route_3_nodes"], result["lanes"]["transformers_single_process"]
    result["ratios"] = {"route_over_single_decode": round(ra["decode_tok_s"] / rb["decode_tok_s"], 3),
                        "route_over_single_ttft": round(ra["ttft_ms"] / rb["ttft_ms"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
