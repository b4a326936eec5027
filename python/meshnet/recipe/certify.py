"""Certification: the tracker's entry for a model served under one runtime recipe.

  python -m meshnet.recipe.certify --gguf PATH --model NAME --backend reference [--append models.json]

prints (or appends to the tracker's --models file) {"model", "architecture", "n_layer",
"artifact_fingerprint", "recipe_fingerprint", "tensor_digests"}. Nodes compute the same two
fingerprints with `node_fingerprints`, so a node is admitted only when it serves the certified
bytes the certified way; the per-tensor digests let the tracker check the range fingerprint a
node declares for whatever layers it registers. Invariant: certify and node_fingerprints use one
recipe definition (`recipe_of`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from meshnet.recipe.fingerprint import GgufSummary, artifact_fingerprint, gguf_summary, tensor_digests
from meshnet.recipe.recipe import MATMUL_ACTIVATIONS, RuntimeRecipe, recipe_for


def llama_cpp_commit() -> str:
    """The pinned llama.cpp commit, from third_party/versions.bzl: through the build
    (//python/meshnet/recipe:pins writes pins.json beside this module), or, in a source tree
    without Bazel, from versions.bzl itself."""
    pins = Path(__file__).with_name("pins.json")
    if pins.exists():
        return json.loads(pins.read_text())["llama_cpp_commit"]
    versions = Path(__file__).resolve().parents[3] / "third_party" / "versions.bzl"
    match = re.search(r'^LLAMA_CPP_COMMIT = "([0-9a-f]{40})"$', versions.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no LLAMA_CPP_COMMIT in {versions}")
    return match.group(1)


# What each backend runs, besides the artifact: wire dtype, KV dtype (the shards' F32 cache, ADR
# 0010), runtime identity, and its default matmul activations (the reference computes everything in
# F32; a GGUF node quantizes activations for quantized weights unless its model was certified with
# F32 ones, ADR 0012).
BACKEND_DEFAULTS = {
    "reference": {"activation_dtype": "f32", "kv_dtype": "f32", "patch_level": "transformers-reference-v1",
                  "matmul_activations": "f32"},
    "gguf": {"activation_dtype": "f32", "kv_dtype": "f32", "patch_level": f"llama.cpp@{llama_cpp_commit()[:7]}",
             "matmul_activations": "quantized"},
}


# The matmul activations each pinned model is certified with (docs/evidence/architectures/): Gemma 3
# 270M Q4_K_M meets the top-1 bar only with F32 ones (ADR 0012). The local swarm's presets serve them
# so, and the certification tests certify them so.
PINNED_MATMUL_ACTIVATIONS = {"smollm2": "quantized", "gemma3": "f32"}


def recipe_of(summary: GgufSummary, backend: str, matmul_activations: str | None = None,
              compute_backend: str = "cpu") -> RuntimeRecipe:
    """The recipe of serving `summary`'s artifact with `backend`; `matmul_activations` (None: the
    backend's default) may only be chosen for the gguf backend, and so may a `compute_backend`
    other than the CPU (ADR 0014)."""
    if backend not in BACKEND_DEFAULTS:
        raise ValueError(f"unknown backend {backend!r}; known: {sorted(BACKEND_DEFAULTS)}")
    fields = dict(BACKEND_DEFAULTS[backend])
    if matmul_activations is not None:
        if backend != "gguf" and matmul_activations != fields["matmul_activations"]:
            raise ValueError(f"the {backend} backend computes matmuls with {fields['matmul_activations']} activations")
        fields["matmul_activations"] = matmul_activations
    return recipe_for(summary, backend, compute_backend=compute_backend, **fields)


def node_fingerprints(gguf: str | Path, backend: str, matmul_activations: str | None = None,
                      compute_backend: str = "cpu") -> tuple[GgufSummary, str, str]:
    """(summary, artifact fingerprint, recipe fingerprint) of serving `gguf` with `backend`."""
    summary = gguf_summary(gguf)
    recipe = recipe_of(summary, backend, matmul_activations, compute_backend)
    return summary, artifact_fingerprint(gguf), recipe.fingerprint()


def certify(gguf: str | Path, model: str, backend: str, matmul_activations: str | None = None,
            compute_backend: str = "cpu") -> dict:
    """The tracker's entry; `matmul_activations` and a compute backend other than the CPU are
    recorded in clear too, so a node refused for another recipe is told which one to run."""
    summary = gguf_summary(gguf)
    recipe = recipe_of(summary, backend, matmul_activations, compute_backend)
    entry = {"model": model, "architecture": summary.architecture, "n_layer": summary.n_layer,
             "artifact_fingerprint": artifact_fingerprint(gguf), "recipe_fingerprint": recipe.fingerprint(),
             "matmul_activations": recipe.matmul_activations, "tensor_digests": tensor_digests(gguf)[1]}
    if compute_backend != "cpu":
        entry["compute_backend"] = compute_backend
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description="Certify a model for a Meshnet tracker.")
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--model", required=True, help="the name clients ask for")
    parser.add_argument("--backend", required=True, choices=sorted(BACKEND_DEFAULTS))
    parser.add_argument("--matmul-activations", choices=MATMUL_ACTIVATIONS,
                        help="gguf only: F32 activations for quantized weights (ADR 0012); default quantized")
    parser.add_argument("--append", type=Path, help="add (or replace) the entry in this models.json")
    args = parser.parse_args()
    try:
        entry = certify(args.gguf, args.model, args.backend, args.matmul_activations)
    except ValueError as err:
        parser.error(str(err))
    if args.append:
        entries = json.loads(args.append.read_text()) if args.append.exists() else []
        entries = [e for e in entries if e.get("model") != args.model] + [entry]
        args.append.write_text(json.dumps(entries, indent=2) + "\n")
    print(json.dumps(entry, indent=2))


if __name__ == "__main__":
    main()
