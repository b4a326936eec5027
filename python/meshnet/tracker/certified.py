"""A model's certified entry, as the tracker loads it from models.json (`load_models`): the
artifact, the recipes certified on each compute backend (ADR 0015) and the certifications they
rest on.

Admission (admission.py) compares a registering node's fingerprints against it; route choice
(registry.py) combines only the compute backends it certifies. Immutable: the registry holds the
entries it was built with for its lifetime.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from meshnet.wire import tracker as tt


@dataclasses.dataclass(frozen=True)
class CertifiedModel:
    model: str  # name clients ask for
    architecture: str  # GGUF general.architecture
    n_layer: int
    artifact_fingerprint: str  # "sha256:<hex>" of the certified GGUF
    recipe_fingerprint: str  # "sha256:<hex>" of the certified runtime recipe
    # tensor name -> digest (meshnet.recipe.fingerprint): any range's expected fingerprint; an
    # empty map (an entry certified before range checks) skips the range check
    tensor_digests: dict = dataclasses.field(default_factory=dict)
    # what //python:certify measured when it wrote the entry ({"suite", "passed", "checks", ...});
    # empty for an entry made without the suite (the local test harness: --allow-uncertified)
    certification: dict = dataclasses.field(default_factory=dict)
    # the certified recipe's matmul activations, in clear ("" in an entry from before recipe 2):
    # only to tell a refused node what to run; admission compares the fingerprint
    matmul_activations: str = ""
    # the compute backend the recipe names (ADR 0014), in clear for the same reason: "cpu" in an
    # entry from before it
    compute_backend: str = "cpu"
    # the same artifact certified on other compute backends, each by its own suite run (ADR 0015):
    # [{"compute_backend", "recipe_fingerprint", "matmul_activations", "certification"}]
    other_backends: list = dataclasses.field(default_factory=list)
    # a certified cross-backend agreement (ADR 0015): {"backends": [...], "certification": {...}};
    # without one a route never mixes compute backends (the tracker loads only passed ones)
    mixed_backends: dict = dataclasses.field(default_factory=dict)

    def recipes(self) -> dict[str, str]:
        """Every certified recipe fingerprint -> the compute backend it names."""
        out = {self.recipe_fingerprint: self.compute_backend}
        out.update({b["recipe_fingerprint"]: b["compute_backend"] for b in self.other_backends})
        return out

    def recipe_on(self, backend: str) -> tuple[str, str]:
        """(recipe fingerprint, matmul activations) certified on `backend`, or ("", "")."""
        if self.compute_backend == backend:
            return self.recipe_fingerprint, self.matmul_activations
        part = next((b for b in self.other_backends if b["compute_backend"] == backend), None)
        return (part["recipe_fingerprint"], part["matmul_activations"]) if part else ("", "")

    def hop_recipe(self, recipe_fingerprint: str) -> tt.HopRecipe:
        """The certified recipe with this fingerprint, as an audit job names it per hop (ADR 0015);
        empty fields for one the entry does not certify."""
        if recipe_fingerprint == self.recipe_fingerprint:
            return tt.HopRecipe(self.compute_backend, self.recipe_fingerprint, self.matmul_activations)
        part = next((b for b in self.other_backends if b["recipe_fingerprint"] == recipe_fingerprint), None)
        return (tt.HopRecipe(part["compute_backend"], recipe_fingerprint, part["matmul_activations"]) if part
                else tt.HopRecipe("", "", ""))

    def route_combinations(self) -> list[frozenset[str]]:
        """The sets of compute backends one route may combine: each certified backend alone, and
        the certified mix, if any."""
        out = [frozenset([backend]) for backend in dict.fromkeys(self.recipes().values())]
        if self.mixed_backends.get("backends"):
            out.append(frozenset(self.mixed_backends["backends"]))
        return out

    def certifications(self) -> dict[str, dict]:
        """Each certification this entry rests on, by what it certifies ("cpu", "vulkan", "mixed")."""
        out = {self.compute_backend: self.certification}
        out.update({b["compute_backend"]: b.get("certification", {}) for b in self.other_backends})
        if self.mixed_backends:
            out["mixed"] = self.mixed_backends.get("certification", {})
        return out


def load_models(path: Path, allow_uncertified: bool = False) -> list[CertifiedModel]:
    """The entries of `path`; each must carry a passed certification (//python:certify writes it
    only when its parity suite passes) for every backend and mix it lists (ADR 0015), unless
    `allow_uncertified` (the local test harness)."""
    try:
        entries = json.loads(path.read_text())
        models = [CertifiedModel(**entry) for entry in entries]
    except (OSError, ValueError, TypeError) as err:
        raise SystemExit(f"tracker: cannot read certified models from {path}: {err}") from err
    uncertified = [m.model for m in models
                   if any(c.get("passed") is not True for c in m.certifications().values())]
    if uncertified and not allow_uncertified:
        raise SystemExit(f"tracker: {path}: no passed certification for {uncertified}; make entries with "
                         "`tools/bazel run //python:certify -- --gguf M.gguf --model NAME --append models.json`")
    return models
