#!/usr/bin/env bash
# Reruns the certification suite on every certified-architecture case and writes the reports here:
#   docs/evidence/architectures/run.sh
# qwen3, qwen3moe: the seeded tiny fixtures (//tools:synthetic_model, cached in ~/.cache/meshnet);
# gemma3: the pinned Gemma 3 270M Q4_K_M (@gemma3), certified with F32 matmul activations (ADR 0012);
# gemma3_f32: the same weights dequantized to F32 by the pinned llama-quantize; qwen3moe_q4_k_m: the
# seeded Qwen3-MoE quantized to Q4_K_M by the same tool, with F32 matmul activations (the experts'
# MUL_MAT_ID path). Each report is <case>.json; <case>.log holds the progress.
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
declare -A matmul=([gemma3]=f32 [qwen3moe_q4_k_m]=f32)
for recipe in qwen3 qwen3moe; do
  file[$recipe]=$(tools/bazel run //tools:synthetic_model -- --recipe "$recipe-tiny" 2>/dev/null | tail -1 |
                  python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')
done
bazel-bin/external/llama_cpp_upstream/llama-quantize "${file[qwen3moe]}" "$tmp/qwen3moe-q4_k_m.gguf" Q4_K_M 2 >/dev/null 2>&1
file[qwen3moe_q4_k_m]=$tmp/qwen3moe-q4_k_m.gguf
for case in qwen3 qwen3moe gemma3 gemma3_f32 qwen3moe_q4_k_m; do
  echo "== $case: ${file[$case]} (matmul activations ${matmul[$case]:-quantized})"
  tools/bazel run //python:certify -- --gguf "${file[$case]}" --model "$case" --report "$out/$case.json" --diagnose-kernels \
    --matmul-activations "${matmul[$case]:-quantized}" \
    >/dev/null 2>"$tmp/$case.log" || true  # exit 1 is a failed check: the report says which
  grep '^certify:' "$tmp/$case.log" | tee "$out/$case.log"
done
