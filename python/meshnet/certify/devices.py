"""Where a certification computes (ADR 0015): `//python:certify --device` as one device per node,
the engine tools linked with those devices' backends, and what a route that mixes backends must
meet.

  --device cpu | vulkan0 | cuda0       every node (and every llama.cpp process of the suite) there:
                                       certifies the (model, backend) pair
  --device cpu,vulkan0,cpu             one device per node: certifies the mix, on top of an entry
                                       that already certifies each of its backends alone

A mixed route's tokens equal none of the single-backend references, so what it must meet is
defined here and nowhere else: (1) its greedy tokens are, at every generated position, the argmax
of the same mixed range chain teacher-forced over the prompt and the tokens before it (each hop is
exact on its own backend, so this is exact); (2) 8 concurrent sessions keep their solo tokens;
(3) the mixed chain's teacher-forced top-1 against Transformers fp32 meets the suite's bar; (4) its
teacher-forced top-1 against the chain of each of its backends alone is at least
CROSS_BACKEND_TOP1_MIN over the same positions (KL reported). Called by certify/main.py only.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from meshnet.certify.teacher_forced import compare
from meshnet.recipe.recipe import compute_backend_of

# A mixed chain against each of its backends alone, teacher-forced top-1 over the suite's
# positions: the bar the suite sets against Transformers fp32, fixed before any mix was measured.
CROSS_BACKEND_TOP1_MIN = 0.98
# The engine tools each backend needs, as certify's flags: (worker, greedy, dump_boundaries).
TOOL_FLAGS = {"cpu": ("worker_binary", "greedy_binary", "dump_boundaries"),
              "vulkan": ("worker_binary_vulkan", "greedy_binary_vulkan", "dump_boundaries_vulkan"),
              "cuda": ("worker_binary_cuda", "greedy_binary_cuda", "dump_boundaries_cuda")}


@dataclasses.dataclass(frozen=True)
class Placement:
    """One device per node (and per range of the suite's llama.cpp chains), in route order."""

    devices: tuple[str, ...]

    @property
    def backends(self) -> tuple[str, ...]:
        """The compute backends, in the order the devices first name them."""
        return tuple(dict.fromkeys(compute_backend_of(d) for d in self.devices))

    @property
    def mixed(self) -> bool:
        return len(self.backends) > 1

    def alone(self, backend: str) -> tuple[str, ...]:
        """Every range on the first of these devices of `backend`: that backend's chain alone."""
        device = next(d for d in self.devices if compute_backend_of(d) == backend)
        return (device,) * len(self.devices)


@dataclasses.dataclass(frozen=True)
class Tools:
    """The engine tools linked with every backend of a placement."""

    worker: Path
    greedy: Path
    dump_boundaries: Path


def parse_devices(text: str, nodes: int) -> Placement:
    """`--device`'s value as a Placement of `nodes` devices; ValueError naming what is wrong."""
    names = [name.strip().lower() for name in text.split(",")]
    if len(names) == 1:
        names *= nodes
    if len(names) != nodes:
        raise ValueError(f"--device {text}: {len(names)} devices for {nodes} nodes (give one device, or one per node)")
    for name in names:
        compute_backend_of(name)  # ValueError for a name that is not a device
    return Placement(tuple(names))


def tools_for(args: argparse.Namespace, placement: Placement) -> Tools:
    """The tools that compute on every device of `placement`: the CPU's own where all are on the
    CPU, else those linked with the one GPU backend named (their CPU device computes as the CPU
    tools do: llama.cpp gets an empty device list). ValueError for a backend this build has no
    tools for, or tools that were not given."""
    gpu = [b for b in placement.backends if b != "cpu"]
    if len(gpu) > 1:
        raise ValueError(f"--device {','.join(placement.devices)}: at most one GPU backend per certification run")
    backend = gpu[0] if gpu else "cpu"
    if backend not in TOOL_FLAGS:
        raise ValueError(f"no {backend} build of the engine tools is linked here (backends with tools: "
                         f"{', '.join(TOOL_FLAGS)})")
    paths = [getattr(args, name) for name in TOOL_FLAGS[backend]]
    missing = [f"--{name.replace('_', '-')}" for name, path in zip(TOOL_FLAGS[backend], paths) if path is None]
    if missing:
        raise ValueError(f"--device {','.join(placement.devices)} needs {', '.join(missing)} "
                         f"({'built by hand: third_party/cuda/README.md' if backend == 'cuda' else 'set by bazel run'})")
    return Tools(*paths)


def cross_backend_agreement(mixed: torch.Tensor, placement: Placement,
                            chain_logits: Callable[[Sequence[str]], torch.Tensor],
                            log: Callable[[str], None]) -> dict:
    """{"top1_min", "backends": {backend: {"positions", "top1_agreement", "mean_kl_alone_to_mixed",
    "max_kl"}}, "passed"}: the mixed chain's teacher-forced logits against each of its backends'
    chain alone (`chain_logits(devices)` computes one)."""
    out: dict = {"top1_min": CROSS_BACKEND_TOP1_MIN, "backends": {}}
    for backend in placement.backends:
        measured = compare(chain_logits(placement.alone(backend)), mixed)
        measured["mean_kl_alone_to_mixed"] = measured.pop("mean_kl_transformers_to_gguf")
        out["backends"][backend] = measured
        log(f"  mixed chain against {backend} alone: top-1 {measured['top1_agreement']}, mean KL "
            f"{measured['mean_kl_alone_to_mixed']}")
    out["passed"] = all(m["top1_agreement"] >= CROSS_BACKEND_TOP1_MIN for m in out["backends"].values())
    return out


def mix_problem(existing: Optional[dict], placement: Placement, artifact: str, matmul_activations: str,
                certified_backends: dict[str, dict]) -> str:
    """Why a mix cannot be certified on top of `existing` (the model's entry), or "": each backend
    of the mix must already be certified alone for this artifact, with these matmul activations."""
    if existing is None:
        return "no entry for this model in --append: certify each backend alone first (--device cpu, --device vulkan0)"
    if existing.get("artifact_fingerprint") != artifact:
        return f"the entry in --append is for another artifact ({existing.get('artifact_fingerprint')})"
    missing = [b for b in placement.backends if b not in certified_backends]
    if missing:
        return f"the entry in --append does not certify {', '.join(missing)} alone yet"
    other = [b for b in placement.backends if certified_backends[b]["matmul_activations"] != matmul_activations]
    if other:
        return f"{', '.join(other)} is certified with other matmul activations than {matmul_activations}"
    return ""
