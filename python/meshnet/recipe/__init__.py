"""Artifact and runtime-recipe fingerprints that capability admission compares (ADR 0009).

`fingerprint` hashes GGUF artifacts (whole file, per layer range) and summarizes their
metadata; `recipe` describes and fingerprints how an artifact is run. `fixtures` (tests only)
writes tiny seeded GGUF models and is deliberately not imported here.
"""

from meshnet.recipe.fingerprint import GgufSummary, artifact_fingerprint, gguf_summary, range_fingerprint
from meshnet.recipe.recipe import RuntimeRecipe, recipe_for

__all__ = [
    "GgufSummary",
    "RuntimeRecipe",
    "artifact_fingerprint",
    "gguf_summary",
    "range_fingerprint",
    "recipe_for",
]
