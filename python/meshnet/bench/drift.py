"""Output drift of the GGUF runtime against Transformers fp32, teacher-forced.

  bazel run //python:bench_drift -- --out results.json [--positions 256]

Feeds the same token sequence to HF Transformers (fp32, weights dequantized from the GGUF) and
to llama.cpp (//cpp/engine:dump_logits: the whole model, which the shard chain reproduces
bit-exactly) and reports top-1 agreement and mean KL(Transformers || llama.cpp) over the
positions. The difference is the Q4_1 runtime (quantized matmuls and activations) against fp32 math.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from meshnet.certify.teacher_forced import agreement
from meshnet.reference.model import load_tokenizer

TEXT = ("The history of astronomy is the story of how people learned to read the sky. Early farmers "
        "watched the stars to know when to plant, sailors used them to find their way across open water, "
        "and priests kept calendars by the motion of the sun and moon. ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=os.environ.get("MESHNET_BUNDLED_GGUF"))
    parser.add_argument("--dump-logits", type=Path, default=os.environ.get("MESHNET_DUMP_LOGITS"))
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    gguf = Path(args.gguf).resolve()
    tokenizer = load_tokenizer(gguf)
    ids = tokenizer(TEXT * 8)["input_ids"][: args.positions]
    if len(ids) < args.positions:
        raise SystemExit(f"text gives only {len(ids)} tokens")
    result = agreement(gguf, args.dump_logits, ids)
    result["lanes"] = {"reference": "HF Transformers fp32 (dequantized Q4_1)",
                       "gguf": "llama.cpp Q4_1 whole model (= the shard chain, bit-exact)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
