"""Node admission: whether a registration is well formed and within the tracker's limits
(`validate_node`), and how it is admitted against the certified models (`admit`: routable, dark or
refused, ADR 0009).

Called by the registry (registry.py) on Register, before anything is stored; pure functions of
their arguments. Invariant: a node is ROUTABLE only when its artifact, recipe and (for entries
with tensor digests) layer-range fingerprints match a certified entry exactly.
"""

from __future__ import annotations

from typing import Optional

from meshnet.identity import keys
from meshnet.recipe import fingerprint
from meshnet.recipe.adapters import has_adapter
from meshnet.tracker.certified import CertifiedModel
from meshnet.wire import tracker as tt

MAX_LAYERS = 4096
MAX_SESSIONS = 1 << 16
MAX_KV_TOKENS = 1 << 40
MAX_ID_CHARS = 128
MAX_CERTIFICATE_CHARS = 8192
MAX_RELAY_RTT_MS = 60_000.0


def admit(info: tt.NodeInfo, models: dict[str, CertifiedModel]) -> tuple[tt.Admission, str]:
    """How a well-formed registration is admitted against the certified `models` (by name): DARK
    (no layer-range adapter for its architecture), REFUSED (with why) or ROUTABLE."""
    if not has_adapter(info.architecture):
        return tt.Admission.DARK, f"architecture {info.architecture!r} has no layer-range adapter; registered dark"
    model = models.get(info.model)
    if model is None:
        return tt.Admission.REFUSED, f"model {info.model!r} has no certified recipe on this tracker"
    fp = info.fingerprints
    if info.architecture != model.architecture or info.n_layer != model.n_layer:
        return tt.Admission.REFUSED, (f"model {info.model!r} is certified as {model.architecture} with "
                                      f"{model.n_layer} layers; node says {info.architecture} with {info.n_layer}")
    if fp is None or fp.model_artifact != model.artifact_fingerprint:
        got = fp.model_artifact if fp else "none"
        return tt.Admission.REFUSED, f"artifact fingerprint {got} != certified {model.artifact_fingerprint}"
    if fp.runtime_recipe not in model.recipes():
        hint = (f" (certified with {model.matmul_activations} matmul activations: the node's --matmul-activations "
                f"{model.matmul_activations})" if model.matmul_activations else "")
        backends = sorted(set(model.recipes().values()))
        if backends != ["cpu"]:
            hint += f" (certified on {', '.join(backends)}: the node's --device cpu or BACKENDN)"
        certified = ", ".join(f"{fingerprint} ({backend})" for fingerprint, backend in model.recipes().items())
        return tt.Admission.REFUSED, f"recipe fingerprint {fp.runtime_recipe} != certified {certified}{hint}"
    if model.tensor_digests:
        start, end = info.layers.start, info.layers.end
        try:
            expected = fingerprint.certified_range_fingerprint(model.tensor_digests, model.n_layer, start, end)
        except ValueError as err:
            return tt.Admission.REFUSED, f"layers [{start}, {end}) cannot be served from the certified model: {err}"
        if info.range_fingerprint != expected:
            return tt.Admission.REFUSED, (f"range fingerprint {info.range_fingerprint or 'none'} for layers "
                                          f"[{start}, {end}) != certified {expected}")
    return tt.Admission.ROUTABLE, ""


def validate_node(info: Optional[tt.NodeInfo]) -> str:
    """'' if `info` is well formed, else what is wrong with it."""
    if info is None:
        return "registration without node info"
    for what, value in (("node_id", info.node_id), ("address", info.address), ("model", info.model),
                        ("architecture", info.architecture)):
        if not value or len(value) > MAX_ID_CHARS:
            return f"{what} must be 1..{MAX_ID_CHARS} characters"
    if not 0 < info.n_layer <= MAX_LAYERS:
        return f"n_layer {info.n_layer} outside 1..{MAX_LAYERS}"
    if info.layers is None:
        return "registration without a layer range"
    start, end = info.layers.start, info.layers.end
    if end <= start:
        return f"layer range [{start}, {end}) ends before it starts"
    if end > info.n_layer:
        return f"layer range [{start}, {end}) exceeds the model's {info.n_layer} layers"
    cap = info.capacity or tt.Capacity()
    if cap.max_sessions > MAX_SESSIONS or cap.kv_tokens > MAX_KV_TOKENS:
        return f"capacity {cap} exceeds the tracker's limits ({MAX_SESSIONS} sessions, {MAX_KV_TOKENS} KV tokens)"
    if info.backend not in (tt.BackendKind.REFERENCE, tt.BackendKind.GGUF):
        return f"unknown backend {int(info.backend)}"
    if len(info.public_key) != keys.PUBLIC_KEY_BYTES:
        return f"public_key must be a {keys.PUBLIC_KEY_BYTES}-byte Ed25519 key"
    if len(info.tls_certificate) > MAX_CERTIFICATE_CHARS:
        return f"tls_certificate exceeds {MAX_CERTIFICATE_CHARS} characters"
    if len(info.relay) > MAX_ID_CHARS:
        return f"relay must be at most {MAX_ID_CHARS} characters"
    if not 0.0 <= info.relay_rtt_ms <= MAX_RELAY_RTT_MS:  # also refuses NaN
        return f"relay_rtt_ms {info.relay_rtt_ms} outside 0..{MAX_RELAY_RTT_MS:g}"
    device = info.device
    if device is not None:
        if not device.name or len(device.name) > MAX_ID_CHARS or len(device.description) > MAX_ID_CHARS:
            return f"device name must be 1..{MAX_ID_CHARS} characters, its description at most {MAX_ID_CHARS}"
        if device.memory_free_bytes > device.memory_total_bytes:
            return f"device {device.name}: {device.memory_free_bytes} bytes free of {device.memory_total_bytes}"
    return ""
