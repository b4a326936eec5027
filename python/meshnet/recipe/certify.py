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
from typing import Sequence

from meshnet.recipe.fingerprint import GgufSummary, artifact_fingerprint, gguf_summary, tensor_digests
from meshnet.recipe.recipe import MATMUL_ACTIVATIONS, RuntimeRecipe, compute_backend_of, recipe_for


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


def backend_recipe(entry: dict) -> dict:
    """One backend's part of an entry made by `certify`: what `other_backends` lists."""
    return {"compute_backend": entry.get("compute_backend", "cpu"), "recipe_fingerprint": entry["recipe_fingerprint"],
            "matmul_activations": entry["matmul_activations"], "certification": entry.get("certification", {})}


def merge_entry(existing: dict | None, new: dict) -> dict:
    """The model's entry once `new` (one backend's, as `certify` makes it, with its passed
    "certification") is certified too (ADR 0015). Another artifact, or no entry yet: `new` alone.
    The same artifact: `new` replaces that backend's recipe and the other backends stay (the first
    certified in front, the rest in `other_backends`); a certified mix stays only if the recipe of
    each of its backends is unchanged."""
    if existing is None or existing.get("artifact_fingerprint") != new["artifact_fingerprint"]:
        return dict(new)
    front, added = backend_recipe(existing), backend_recipe(new)
    before = [front, *existing.get("other_backends", [])]
    others = [r for r in existing.get("other_backends", []) if r["compute_backend"] != added["compute_backend"]]
    if front["compute_backend"] == added["compute_backend"]:
        merged = dict(new)
    else:
        merged = {k: v for k, v in existing.items() if k not in ("other_backends", "mixed_backends")}
        others.append(added)
    if others:
        merged["other_backends"] = others
    mixed = existing.get("mixed_backends")
    unchanged = all(r["recipe_fingerprint"] == added["recipe_fingerprint"] for r in before
                    if r["compute_backend"] == added["compute_backend"])
    if mixed and unchanged:
        merged["mixed_backends"] = mixed
    return merged


def certified_backends(entry: dict) -> dict[str, dict]:
    """compute backend -> its recipe part (`backend_recipe`), for every backend whose
    certification in `entry` passed."""
    recipes = [backend_recipe(entry), *entry.get("other_backends", [])]
    return {r["compute_backend"]: r for r in recipes if r.get("certification", {}).get("passed") is True}


def uncertified_entry(gguf: str | Path, model: str, backend: str, matmul_activations: str | None,
                      devices: Sequence[str]) -> dict:
    """The entry a local swarm's tracker serves without the suite (--allow-uncertified): the
    recipe of every compute backend of `devices` (one per node) and, when they are more than one,
    their mix (ADR 0015). Nothing in it claims a certification."""
    backends = list(dict.fromkeys(compute_backend_of(device) for device in devices)) or ["cpu"]  # no node yet
    entry = certify(gguf, model, backend, matmul_activations, backends[0])
    summary = gguf_summary(gguf)
    for other in backends[1:]:
        recipe = recipe_of(summary, backend, matmul_activations, other)
        entry.setdefault("other_backends", []).append(
            {"compute_backend": other, "recipe_fingerprint": recipe.fingerprint(),
             "matmul_activations": recipe.matmul_activations})
    if len(backends) > 1:
        entry["mixed_backends"] = {"backends": sorted(backends)}
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
