#!/usr/bin/env bash
# Builds the llama library at every prefix of the patch series (0 = the pristine pin, ..., N = all),
# one Bazel build per level, and prints one line per level: "level K: ok" or "level K: FAILED".
# Exit status 0 only if every level builds. Not part of `bazel test //...`: each level recompiles
# llama.cpp (minutes on 2 cores); run it after changing the series:
#   tools/llama_cpp/build_prefixes.sh            # every level
#   tools/llama_cpp/build_prefixes.sh 5 9        # levels 5..9
# The Meshnet engine itself needs the whole series; a prefix is for bisecting llama.cpp behaviour.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
total=$(grep -c '\.patch"' third_party/llama_cpp/patches.bzl)
first=${1:-0}
last=${2:-$total}
failed=0
for level in $(seq "$first" "$last"); do
  if tools/bazel build --repo_env=MESHNET_LLAMA_PATCH_LEVEL="$level" @llama_cpp//:llama >"/tmp/meshnet-prefix-$level.log" 2>&1; then
    echo "level $level: ok"
  else
    echo "level $level: FAILED (log: /tmp/meshnet-prefix-$level.log)"
    failed=1
  fi
done
# leave the workspace on the whole series
tools/bazel build @llama_cpp//:llama >/dev/null 2>&1 || true
exit "$failed"
