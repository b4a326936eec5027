"""Runtime recipes: everything besides the weights that decides what numbers a shard computes.

A node declares its recipe's fingerprint when it registers; the tracker admits it only if the
fingerprint equals the model's certified one (fail-closed admission: docs/architecture.md,
"Rules the code keeps"; ADRs 0009 and 0015).
Invariant: `canonical_bytes` is a stable wire contract (RECIPE_VERSION); two recipes have the
same fingerprint exactly when every field is equal, whatever order they were built in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from meshnet.recipe.fingerprint import GgufSummary

RECIPE_VERSION = 2  # bump on any change to the fields or to canonical_bytes (2: matmul_activations)
BACKENDS = ("gguf", "reference")
ACTIVATION_DTYPES = ("f32", "f16", "bf16")  # the seam's hidden-state wire dtypes
# What a matmul with quantized weights does with its activations: "quantized" (llama.cpp's own
# arithmetic: the activations are quantized to the weight type's dot type, Q8_0/Q8_1/Q8_K) or "f32"
# (the weight rows are dequantized and dotted with F32 activations; ADR 0012).
MATMUL_ACTIVATIONS = ("quantized", "f32")
# KV cache element types llama.cpp accepts (its --cache-type-k/-v choices).
KV_DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# The ggml backend a gguf shard computes on (ADR 0014): its kernels are part of what it computes.
# Only the backend is named, not which device of it (vulkan0 and vulkan1 run the same shaders).
COMPUTE_BACKENDS = ("cpu", "vulkan", "cuda")


def compute_backend_of(device: str) -> str:
    """The compute backend of a worker `--device` ("cpu", "vulkan0", "cuda1", ...)."""
    name = device.strip().lower()
    for backend in COMPUTE_BACKENDS:
        if name == backend == "cpu" or (backend != "cpu" and name.startswith(backend) and name[len(backend):].isdigit()):
            return backend
    raise ValueError(f"device {device!r}: expected cpu or one of {[b + 'N' for b in COMPUTE_BACKENDS[1:]]}")


def engine_tool_flags(matmul_activations: str) -> list[str]:
    """The flags that make the engine's tools (//cpp/engine:greedy, dump_logits, dump_boundaries)
    compute with `matmul_activations`, one of MATMUL_ACTIVATIONS."""
    if matmul_activations not in MATMUL_ACTIVATIONS:
        raise ValueError(f"matmul_activations {matmul_activations!r} not in {MATMUL_ACTIVATIONS}")
    return ["--f32-matmul-activations"] if matmul_activations == "f32" else []


@dataclasses.dataclass(frozen=True)
class RuntimeRecipe:
    backend: str  # "gguf" (native llama.cpp worker) or "reference" (PyTorch reference)
    architecture: str  # general.architecture of the artifact, e.g. "llama"
    weight_quantization: str  # GGUF weight type name, e.g. "Q4_1", "F32"
    activation_dtype: str  # wire dtype of hidden states between shards: "f32", "f16" or "bf16"
    kv_dtype: str  # KV cache element type, one of KV_DTYPES
    matmul_activations: str  # one of MATMUL_ACTIVATIONS
    context_length: int  # maximum positions a session may use
    rope_freq_base: float  # RoPE base frequency (theta)
    rope_freq_scale: float  # RoPE frequency scale, llama.cpp's convention (1 / scaling factor)
    patch_level: str  # runtime build identity, e.g. "llama.cpp@0c1e570+0/0" ("" for reference)
    compute_backend: str = "cpu"  # one of COMPUTE_BACKENDS (the reference computes on the CPU)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} not in {BACKENDS}")
        if self.activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"activation_dtype {self.activation_dtype!r} not in {ACTIVATION_DTYPES}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} not in {KV_DTYPES}")
        if self.compute_backend not in COMPUTE_BACKENDS:
            raise ValueError(f"compute_backend {self.compute_backend!r} not in {COMPUTE_BACKENDS}")
        if self.backend != "gguf" and self.compute_backend != "cpu":
            raise ValueError(f"the {self.backend} backend computes on the CPU")
        if self.matmul_activations not in MATMUL_ACTIVATIONS:
            raise ValueError(f"matmul_activations {self.matmul_activations!r} not in {MATMUL_ACTIVATIONS}")
        for name in ("architecture", "weight_quantization"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.patch_level, str):
            raise ValueError(f"patch_level must be a string, got {self.patch_level!r}")
        if not _is_int(self.context_length) or self.context_length <= 0:
            raise ValueError(f"context_length must be a positive integer, got {self.context_length!r}")
        for name in ("rope_freq_base", "rope_freq_scale"):
            value = getattr(self, name)
            is_number = _is_int(value) or isinstance(value, float)
            if not is_number or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")

    def canonical_bytes(self) -> bytes:
        """UTF-8 JSON of every field plus "recipe_version": RECIPE_VERSION.

        Canonical form: keys sorted, separators (",", ":"), ASCII only (non-ASCII escaped as
        \\uXXXX), no whitespace. context_length is a JSON integer. The two rope values are
        converted to float and written as Python's shortest round-trip repr, which is what
        json.dumps emits (e.g. 10000.0, 1.0, 9.999999747378752e-06), so an int 10000 and a
        float 10000.0 encode the same. compute_backend "cpu" is written as its absence, so the
        recipes certified before it existed (all on the CPU) keep their fingerprints; any other
        backend is a key like the rest.
        """
        document = dataclasses.asdict(self)
        if document["compute_backend"] == "cpu":
            del document["compute_backend"]
        document["rope_freq_base"] = float(self.rope_freq_base)
        document["rope_freq_scale"] = float(self.rope_freq_scale)
        document["recipe_version"] = RECIPE_VERSION
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return text.encode("ascii")

    def fingerprint(self) -> str:
        """"sha256:<hex>" of canonical_bytes()."""
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()


def recipe_for(
    summary: GgufSummary,
    backend: str,
    activation_dtype: str = "f32",
    kv_dtype: str = "f16",
    patch_level: str = "",
    matmul_activations: str = "quantized",
    compute_backend: str = "cpu",
) -> RuntimeRecipe:
    """The recipe of serving the artifact described by `summary` at its training context.

    ValueError for an unknown backend or dtype (raised by RuntimeRecipe).
    """
    return RuntimeRecipe(
        backend=backend,
        architecture=summary.architecture,
        weight_quantization=summary.file_type,
        activation_dtype=activation_dtype,
        kv_dtype=kv_dtype,
        matmul_activations=matmul_activations,
        context_length=summary.context_length,
        rope_freq_base=summary.rope_freq_base,
        rope_freq_scale=summary.rope_freq_scale,
        patch_level=patch_level,
        compute_backend=compute_backend,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
