#!/usr/bin/env bash
# Reruns the certification suite on every certified-architecture case and writes the reports here:
#   docs/evidence/architectures/run.sh
# qwen3, qwen3moe: the seeded tiny fixtures (//tools:synthetic_model, cached in ~/.cache/meshnet);
# gemma3: the pinned Gemma 3 270M Q4_K_M (@gemma3); gemma3_f32: the same weights dequantized to
# F32 by the pinned llama-quantize. Each report is <case>.json; <case>.log holds the progress.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
out=$PWD/docs/evidence/architectures
tools/bazel build //python:certify //tools:synthetic_model @gemma3//:gguf @llama_cpp_upstream//:llama-quantize
base=$(tools/bazel info output_base 2>/dev/null)
gemma=$base/external/gemma3/model.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bazel-bin/external/llama_cpp_upstream/llama-quantize --allow-requantize "$gemma" "$tmp/gemma3-f32.gguf" F32 2 >/dev/null 2>&1
declare -A file=([gemma3]="$gemma" [gemma3_f32]="$tmp/gemma3-f32.gguf")
for recipe in qwen3 qwen3moe; do
  file[$recipe]=$(tools/bazel run //tools:synthetic_model -- --recipe "$recipe-tiny" 2>/dev/null | tail -1 |
                  python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')
done
for case in qwen3 qwen3moe gemma3 gemma3_f32; do
  echo "== $case: ${file[$case]}"
  tools/bazel run //python:certify -- --gguf "${file[$case]}" --model "$case" --report "$out/$case.json" --diagnose-kernels \
    >/dev/null 2>"$tmp/$case.log" || true  # exit 1 is a failed check: the report says which
  grep '^certify:' "$tmp/$case.log" | tee "$out/$case.log"
done
