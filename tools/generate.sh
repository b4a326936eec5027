#!/usr/bin/env bash
# The README's main-job command, today: greedy generation on the bundled SmolLM2 GGUF with the
# pinned llama.cpp (its `simple` example, built by our overlay), single process, CPU.
# It becomes a local Meshnet swarm (tracker + nodes) once the node lands.
#
# usage: tools/bazel run //tools:generate -- [-n TOKENS] [PROMPT]
set -euo pipefail
runfiles=${RUNFILES_DIR:-$0.runfiles}
simple="$runfiles/meshnet/external/llama_cpp/llama-simple"
model="$runfiles/meshnet/external/smollm2/model.gguf"
[[ -x $simple && -f $model ]] || { echo "generate: runfiles missing ($simple, $model)" >&2; exit 1; }

n=32
if [[ ${1:-} == "-n" ]]; then
  [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "generate: -n needs a token count" >&2; exit 2; }
  n=$2
  shift 2
fi
prompt=${*:-The capital of France is}
exec "$simple" -m "$model" -n "$n" "$prompt"
