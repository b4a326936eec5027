"""A whole local Meshnet for a newcomer: tracker + N nodes on loopback + one generation.

  bazel run //python:swarm -- [--nodes 3] [--max-tokens 48] [PROMPT]
  bazel run //python:swarm -- --model gemma3 [PROMPT]      (Gemma 3 270M Q4_K_M, @gemma3, with
                                                            F32 matmul activations: its certified recipe)
  bazel run //python:swarm -- --gguf /abs/MODEL.gguf [PROMPT]
  bazel run //python:swarm -- --device vulkan0 [PROMPT]   (every node's range on Vulkan: a GPU, or
                                                            Mesa's lavapipe where there is none; ADR 0014)
  bazel run //python:swarm -- --serve [--listen 127.0.0.1:8000]

Tokens stream to the terminal as they arrive; the last line gives TTFT and decode tok/s.
Progress of the start-up (loading each node) goes to stderr. --serve instead starts the
OpenAI-compatible gateway in front of the swarm, prints its base URL and an API key, and serves
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.client.text import stream_text
from meshnet.text.llama_cpp_tokenizer import tokenizer_for
from meshnet.text.tokenizer import GgufTokenizer
from meshnet.process import stop_on_signals
from meshnet.swarm.gateway import GatewayProcess
from meshnet.recipe.fingerprint import gguf_summary
from meshnet.recipe.certify import PINNED_MATMUL_ACTIVATIONS
from meshnet.recipe.recipe import MATMUL_ACTIVATIONS, compute_backend_of
from meshnet.swarm.local import LocalSwarm, even_cuts


def serve(swarm: LocalSwarm, listen: str) -> int:
    host, _, port = listen.rpartition(":")
    stop = stop_on_signals()
    with GatewayProcess(swarm, host=host, port=int(port)) as gateway:
        print(f"OpenAI-compatible gateway at {gateway.base_url}  (model {swarm.model!r})\n"
              f"API key: {gateway.key}\n"
              f"try: curl -N {gateway.base_url}/chat/completions -H 'Authorization: Bearer {gateway.key}' "
              f"-H 'Content-Type: application/json' -d '{{\"model\": \"{swarm.model}\", \"stream\": true, "
              f"\"messages\": [{{\"role\": \"user\", \"content\": \"Hi!\"}}]}}'\n"
              "Ctrl-C stops the gateway and the swarm.", flush=True)
        stop.wait()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="*", default=["The capital of France is"])
    parser.add_argument("--gguf", type=Path, default=os.environ.get("MESHNET_BUNDLED_GGUF"))
    parser.add_argument("--model", choices=["smollm2", "gemma3"],
                        help="a pinned model instead of --gguf: smollm2 (the bundled default) or gemma3 (Gemma 3 "
                             "270M Q4_K_M); also the name the swarm serves it under")
    parser.add_argument("--gemma3-gguf", type=Path, help=argparse.SUPPRESS)  # set by bazel run
    parser.add_argument("--matmul-activations", choices=MATMUL_ACTIVATIONS,
                        help="gguf backend: what matmuls with quantized weights do with their activations (ADR 0012); "
                             "default: the recipe the model is certified with (f32 for gemma3, else quantized)")
    parser.add_argument("--tokenize-binary", type=Path,
                        help="llama.cpp's tokenizer (//cpp/engine:tokenize; set by bazel run), for vocabularies "
                             "the built-in one does not read (SentencePiece, e.g. Gemma)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--speculate", type=int, default=0, metavar="K",
                        help="speculative decoding in the ring: the first hop drafts up to K tokens a step by prompt "
                             "lookup (0: off; the tokens are the same either way)")
    parser.add_argument("--backend", default="gguf", choices=["gguf", "reference"],
                        help="gguf: native llama.cpp workers; reference: HF Transformers shards")
    parser.add_argument("--worker-binary", type=Path, default=os.environ.get("MESHNET_WORKER_BINARY"))
    parser.add_argument("--device", default="cpu",
                        help="gguf: where every node computes: cpu, or a Vulkan device (vulkan0, ...; the worker "
                             "linked with Vulkan, //cpp/worker:worker_vulkan, which bazel run sets)")
    parser.add_argument("--vulkan-worker-binary", type=Path, help=argparse.SUPPRESS)  # set by bazel run
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the OpenAI-compatible gateway in front of the swarm until Ctrl-C")
    parser.add_argument("--listen", default="127.0.0.1:8000", help="the gateway's host:port (with --serve)")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext links (route tickets are still checked); TLS everywhere by default")
    args = parser.parse_args()
    if args.model == "gemma3":
        args.gguf = args.gemma3_gguf
    if args.matmul_activations is None and args.backend == "gguf":
        args.matmul_activations = PINNED_MATMUL_ACTIVATIONS[args.model or "smollm2"]
    elif args.matmul_activations is not None and args.backend != "gguf":
        parser.error("--matmul-activations is a choice of the gguf backend (the reference computes in F32)")
    try:
        compute_backend = compute_backend_of(args.device)
    except ValueError as err:
        parser.error(str(err))
    if compute_backend != "cpu" and args.backend != "gguf":
        parser.error("--device is a choice of the gguf backend (the reference computes on the CPU)")
    if compute_backend == "vulkan":
        args.worker_binary = args.vulkan_worker_binary
    elif compute_backend != "cpu":
        parser.error(f"--device {args.device}: this swarm runs cpu or vulkanN (the {compute_backend} worker is "
                     "built separately; see docs/operating.md, 'GPU nodes')")
    if args.gguf is None or not Path(args.gguf).is_file():
        parser.error("--gguf PATH is required (bazel run sets the bundled model)")
    try:
        n_layer = gguf_summary(args.gguf).n_layer  # the split comes from the model itself
    except ValueError as err:
        parser.error(str(err))
    if not 1 <= args.nodes <= n_layer:
        parser.error(f"--nodes must be in 1..{n_layer} (the model's layers)")
    if not 0 <= args.speculate <= 16:
        parser.error("--speculate must be in 0..16 (the most drafts a ring step may carry)")
    if args.serve and not (args.listen.rpartition(":")[0] and args.listen.rpartition(":")[2].isdigit()):
        parser.error(f"--listen {args.listen!r}: expected HOST:PORT")
    prompt = " ".join(args.prompt)
    try:
        tokenizer = tokenizer_for(args.gguf, args.tokenize_binary)
    except ValueError as err:
        parser.error(str(err))
    if args.serve and not isinstance(tokenizer, GgufTokenizer):
        parser.error("--serve needs a vocabulary the gateway's tokenizer reads (byte-level BPE); this model's "
                     "is not one")
    with tempfile.TemporaryDirectory(prefix="meshnet-swarm-") as tmp:
        cuts = even_cuts(n_layer, args.nodes)
        print(f"starting tracker + {args.nodes} nodes {cuts} on loopback ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        worker = Path(args.worker_binary).resolve() if args.worker_binary else None
        if args.backend == "gguf" and (worker is None or not worker.is_file()):
            parser.error("--backend gguf needs --worker-binary (bazel run sets it)")
        with LocalSwarm(Path(tmp), Path(args.gguf).resolve(), cuts, model=args.model or "smollm2", backend=args.backend,
                        worker_binary=worker, insecure=args.insecure,
                        matmul_activations=args.matmul_activations, device=args.device) as swarm:
            links = "plaintext (--insecure)" if args.insecure else "TLS"
            if args.device != "cpu":
                print(f"every node computes on {args.device}: {swarm.devices()}", file=sys.stderr, flush=True)
            print(f"swarm ready in {time.perf_counter() - started:.1f}s; tracker at {swarm.tracker.address}; "
                  f"{links} on every link, route tickets on every hop",
                  file=sys.stderr, flush=True)
            if args.serve:
                return serve(swarm, args.listen)
            with swarm.client() as tracker:
                session = RouteClient(tracker, swarm.model, client_id="swarm-run", insecure=args.insecure)
                ids = tokenizer.encode(prompt)
                print(prompt, end="", flush=True)
                begun, tokens = time.perf_counter(), []

                def counted():
                    for token in session.generate(ids, GenerationParams(max_tokens=args.max_tokens,
                                                                        stop_token_ids=tokenizer.stop_token_ids,
                                                                        speculate=args.speculate)):
                        tokens.append(token)
                        yield token

                def decode(ids_so_far: list[int]) -> str:
                    return tokenizer.decode(ids_so_far, skip_special=True)

                for piece in stream_text(counted(), decode, args.stop):
                    print(piece, end="", flush=True)
                elapsed = time.perf_counter() - begun
        decode_s = elapsed - (session.ttft or 0)
        rate = (len(tokens) - 1) / decode_s if len(tokens) > 1 and decode_s > 0 else 0.0
        print(f"\n[{len(tokens)} tokens over {args.nodes} {args.backend} nodes | TTFT {session.ttft * 1000:.0f} ms | "
              f"decode {rate:.1f} tok/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
