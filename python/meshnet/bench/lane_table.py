"""The bench's lanes, in one table: each lane's name, label, runner, whether it runs by default,
its group and, for a speculation lane, the lane whose tokens it must match. The table's order is
the order lanes run in (unless --lanes names others) and are reported in. Everything else that
names lanes is derived from it: LANES, DEFAULT_LANES, RUNTIME_ONLY, the labels results.json
carries, the runners run_group dispatches to (lanes.py), and the --lanes help and error text
(harness.py). To add a lane, add a row here; harness.py's docstring describes the lanes in prose
(not every one by name), and a row's label says what its lane is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

from meshnet.bench.beside import Beside
from meshnet.bench.route_lanes import RouteOptions
from meshnet.bench.schema import Lane
from meshnet.gateway.grammar.json_grammar import schema_grammar
from meshnet.gateway.grammar.worst_cases import EXPONENTIAL_GBNF, enum_ways_schema

WAN_DELAYS_MS = (5, 10, 25)  # one-way delay per link in the proxy WAN lanes
SPECULATE = 8  # the most tokens the first hop drafts per step in the speculation lanes
# Issue 29: the synthetic ~8B (//tools:synthetic_big_model), run with --synthetic-8b-gguf: a
# 4-node ring against one llama.cpp process holding the whole model.
BIG_MODEL_NODES = 4
# The JSON lane's grammar: the document cannot end within a lane's new tokens, so each one is
# drawn inside it (once a JSON answer is complete only end-of-generation tokens are allowed).
OPEN_JSON_GRAMMAR = schema_grammar({"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 64})
# Issue 55: the worst grammars the bounds admit (gateway/grammar/worst_cases.py), sampled by one
# client at its limit of two sessions beside the measured stream: what an API key can send (the
# converter's worst, 1,000 enum values to start every array item from, at most 1,024 items so
# that the answer goes on), and what a client-role ticket holder can send as raw GBNF.
HOSTILE_SCHEMA_GRAMMAR = schema_grammar(enum_ways_schema(250, min_items=1024))


@dataclasses.dataclass(frozen=True)
class Run:
    """One run_group call as a lane's runner sees it: the bench (lanes.Bench, not imported here
    since lanes.py imports this table), the model and the group's prompts and concurrency."""

    bench: Any
    model: Path
    prompts: dict[int, list[list[int]]]
    prompt_lengths: list[int]
    concurrency: list[int]
    progress: Any

    @property
    def k(self) -> int:
        return self.bench.args.k

    @property
    def short(self) -> dict[int, list[list[int]]]:
        """The shortest prompt only (the synthetic lanes)."""
        return {min(self.prompt_lengths): self.prompts[min(self.prompt_lengths)]}

    def route(self, backend: str, k: int, model: Optional[Path] = None, prompts: Optional[dict] = None,
              concurrency: Optional[list[int]] = None, **options: Any) -> Lane:
        """Bench.route on this group's model, prompts and concurrency unless given; `options` are
        RouteOptions' fields."""
        return self.bench.route(self.model if model is None else model, backend, k,
                                self.prompts if prompts is None else prompts,
                                self.concurrency if concurrency is None else concurrency, self.progress,
                                options=RouteOptions(**options))


@dataclasses.dataclass(frozen=True)
class LaneSpec:
    name: str
    label: str  # results.json's "label": `{k}` is --k
    run: Callable[[Run], Lane]
    default: bool = True  # run when --lanes is not given
    group: str = ""  # the family the help text names (the Vulkan lanes)
    runtime_only: bool = False  # run again on the F32 GGUF (the runtime-only comparison)
    same_tokens_as: Optional[str] = None  # a speculation lane: its single-stream tokens must equal this lane's


def _wan(d: int) -> tuple[LaneSpec, ...]:
    """The lanes run at one delay: the ring, RPC, and the copy-heavy pair without and with speculation."""
    copy = f"wan_{d}ms_gguf_ring_3_nodes_copy"
    return (
        LaneSpec(f"wan_{d}ms_gguf_ring_3_nodes", f"GGUF route, {{k}} nodes, ring decode, {d} ms one-way per link "
                 "(delay proxy)", lambda g: g.bench.proxy_wan_lane(g.model, g.prompts, g.progress, d, ring=True),
                 group="WAN"),
        LaneSpec(f"wan_{d}ms_llama_cpp_rpc_3", f"llama.cpp RPC over {{k}} rpc-servers, {d} ms one-way per link "
                 "(delay proxy)", lambda g: g.bench.llama_rpc(g.model, delay_ms=d), group="WAN"),
        LaneSpec(copy, f"GGUF route, {{k}} nodes, ring decode, copy-heavy prompts, {d} ms one-way per link",
                 lambda g: g.bench.copy_lane(g.model, g.progress, d, speculate=0), group="WAN"),
        LaneSpec(f"wan_{d}ms_gguf_ring_3_nodes_spec_copy", f"GGUF route, {{k}} nodes, ring decode with speculation, "
                 f"copy-heavy prompts, {d} ms one-way per link",
                 lambda g: g.bench.copy_lane(g.model, g.progress, d, speculate=SPECULATE), group="WAN",
                 same_tokens_as=copy),
    )


_OPTIMIZED = "upstream's CPU kernels and F16 flash attention"
_SYN1B, _SYN8B = "synthetic 1.1B Q4_0", "synthetic 8B Q4_0"
TABLE: tuple[LaneSpec, ...] = (
    LaneSpec("transformers_single_process", "Transformers fp32, one process",
             lambda g: g.bench.transformers(g.model, g.prompts, g.concurrency, g.progress), runtime_only=True),
    LaneSpec("llama_cpp_single_process", "llama.cpp, one process (upstream, batched-bench)",
             lambda g: g.bench.llama_single(g.model, g.prompt_lengths, g.concurrency), runtime_only=True),
    LaneSpec("llama_cpp_rpc_3", "llama.cpp RPC over {k} local rpc-servers", lambda g: g.bench.llama_rpc(g.model)),
    LaneSpec("gguf_route_1_node", "GGUF route, 1 node, client-driven decode", lambda g: g.route("gguf", 1),
             runtime_only=True),
    LaneSpec("gguf_route_3_nodes", "GGUF route, {k} nodes, client-driven decode", lambda g: g.route("gguf", g.k),
             runtime_only=True),
    LaneSpec("gguf_ring_1_node", "GGUF route, 1 node, ring decode", lambda g: g.route("gguf", 1, ring=True)),
    LaneSpec("gguf_ring_3_nodes", "GGUF route, {k} nodes, ring decode", lambda g: g.route("gguf", g.k, ring=True)),
    LaneSpec("gguf_route_3_nodes_plaintext", "GGUF route, {k} nodes, plaintext links (--insecure; tickets on)",
             lambda g: g.route("gguf", g.k, insecure=True)),
    LaneSpec("reference_route_3_nodes", "Transformers reference route, {k} nodes",
             lambda g: g.route("reference", g.k)),
    LaneSpec("gguf_route_3_nodes_wan", "GGUF route, {k} nodes in network namespaces (WAN)",
             lambda g: g.bench.wan_lane(g.model, g.prompts, g.progress)),
    *(lane for d in WAN_DELAYS_MS for lane in _wan(d)),
    LaneSpec("wan_10ms_gguf_route_3_nodes", "GGUF route, {k} nodes, client-driven decode, 10 ms one-way per link "
             "(delay proxy)", lambda g: g.bench.proxy_wan_lane(g.model, g.prompts, g.progress, 10, ring=False),
             group="WAN"),
    LaneSpec("gguf_ring_3_nodes_spec", "GGUF route, {k} nodes, ring decode with speculation (prompt lookup), "
             "ordinary prompts", lambda g: g.route("gguf", g.k, ring=True, speculate=SPECULATE),
             same_tokens_as="gguf_ring_3_nodes"),
    LaneSpec("gguf_ring_3_nodes_json", "GGUF route, {k} nodes, ring decode sampled under a JSON-schema grammar on "
             "the last hop (issue 33; an array of at least 64 short strings, so that every new token is inside the "
             "document): against gguf_ring_3_nodes, the last hop's sampling time per token",
             lambda g: g.route("gguf", g.k, ring=True, grammar=OPEN_JSON_GRAMMAR)),
    LaneSpec("gguf_ring_3_nodes_beside_hostile_schema", "GGUF route, {k} nodes, ring decode, one stream beside a "
             "client at its limit of two sessions sampling under the JSON-schema converter's worst grammar on the "
             "same last hop (issue 55): against gguf_ring_3_nodes, what it costs its neighbour",
             lambda g: g.route("gguf", g.k, concurrency=[1], ring=True,
                               beside=Beside(HOSTILE_SCHEMA_GRAMMAR, label="an array of 1,000 enum values sharing a "
                                             "prefix (the converter's worst)")), group="hostile"),
    LaneSpec("gguf_ring_3_nodes_beside_plain", "GGUF route, {k} nodes, ring decode, one stream beside a client at "
             "its limit of two sessions decoding without a grammar (a diagnostic, no contract check): the load two "
             "sessions make by themselves, against which the grammar lanes' own cost reads",
             lambda g: g.route("gguf", g.k, concurrency=[1], ring=True,
                               beside=Beside("", label="no grammar (plain decoding)")), group="hostile"),
    LaneSpec("gguf_ring_3_nodes_beside_hostile_gbnf", "GGUF route, {k} nodes, ring decode, one stream beside a client "
             "at its limit of two sessions sampling under a raw GBNF grammar whose every draw runs to the sampling "
             "budget, on the same last hop (issue 55): against gguf_ring_3_nodes, what it costs its neighbour",
             lambda g: g.route("gguf", g.k, concurrency=[1], ring=True,
                               beside=Beside(EXPONENTIAL_GBNF, label="300 one-character alternatives repeated "
                                             "(exponential masking, a ticket holder's)")), group="hostile"),
    LaneSpec("gateway_3_nodes", "OpenAI-compatible gateway over a GGUF route of {k} nodes, vs the direct client",
             lambda g: g.bench.gateway(g.model, g.prompts, g.progress)),
    # Issue 17: the ring with audits at 5% (commitments kept, the verifier role running on this
    # machine) against no commitments and no audits; and every session audited, the verifier's
    # worst case here (a lane's few sessions seldom draw a 5% audit), which also measures its cost.
    LaneSpec("gguf_ring_3_nodes_unaudited", "GGUF route, {k} nodes, ring decode, no commitments, no audits",
             lambda g: g.route("gguf", g.k, ring=True, commitments=False, audit_rate=0.0), group="audit"),
    LaneSpec("gguf_ring_3_nodes_audited", "GGUF route, {k} nodes, ring decode, audits at 5% (verifier on this "
             "machine)", lambda g: g.route("gguf", g.k, ring=True, audit_rate=0.05,
                                           verifier=g.bench.verifier_tools()), group="audit"),
    LaneSpec("gguf_ring_3_nodes_audited_all", "GGUF route, {k} nodes, ring decode, every session audited (verifier "
             "on this machine)", lambda g: g.route("gguf", g.k, ring=True, audit_rate=1.0,
                                                   verifier=g.bench.verifier_tools()), group="audit"),
    LaneSpec("gguf_ring_3_nodes_optimized_kernels", f"GGUF route, {{k}} nodes, ring decode, {_OPTIMIZED} (batched "
             "sessions may differ from solo; ADR 0009, 0010)",
             lambda g: g.route("gguf", g.k, ring=True, reference_kernels=False)),
    LaneSpec("gguf_ring_1_node_optimized_kernels", f"GGUF route, 1 node, ring decode, {_OPTIMIZED}: against "
             "gguf_ring_1_node, what batch invariance costs at c=8; against llama.cpp batched, the runtime's own "
             "cost (issue 31)", lambda g: g.route("gguf", 1, ring=True, reference_kernels=False)),
    LaneSpec("gguf_ring_3_nodes_f32_matmul", "GGUF route, {k} nodes, ring decode, F32 matmul activations (quantized "
             "weights dequantized; the recipe of ADR 0012)",
             lambda g: g.route("gguf", g.k, ring=True, matmul_activations="f32")),
    # Lanes on the synthetic ~1.1B model (//tools:synthetic_model; issue 16), run with
    # --synthetic-gguf: weights dominate memory there, as they do for the models Meshnet is for.
    LaneSpec("synthetic_1b_llama_cpp_single_process", f"{_SYN1B}: llama.cpp, one process (batched-bench)",
             lambda g: g.bench.llama_single(g.bench.synthetic(), list(g.short), g.concurrency),
             group="synthetic 1.1B"),
    LaneSpec("synthetic_1b_gguf_ring_1_node", f"{_SYN1B}: GGUF route, 1 node, ring decode",
             lambda g: g.route("gguf", 1, g.bench.synthetic(), g.short, ring=True), group="synthetic 1.1B"),
    LaneSpec("synthetic_1b_gguf_ring_3_nodes", f"{_SYN1B}: GGUF route, {{k}} nodes, ring decode",
             lambda g: g.route("gguf", g.k, g.bench.synthetic(), g.short, ring=True), group="synthetic 1.1B"),
    LaneSpec("synthetic_1b_reference_route_3_nodes", "synthetic 1.1B: Transformers fp32 reference route, {k} nodes",
             lambda g: g.route("reference", g.k, g.bench.synthetic(), g.short, [1]), group="synthetic 1.1B"),
    # Issue 29, the ~8B. The last two are diagnostics (no contract check): upstream without its
    # repacked copy of the weights (what the nodes run: the mapped file itself), and the ring on
    # upstream's CPU kernels.
    LaneSpec("synthetic_8b_llama_cpp_single_process", f"{_SYN8B}: llama.cpp, one process (batched-bench)",
             lambda g: g.bench.llama_single(g.bench.synthetic("8b"), list(g.short), g.concurrency),
             group="synthetic 8B"),
    LaneSpec("synthetic_8b_gguf_ring_4_nodes", f"{_SYN8B}: GGUF route, {BIG_MODEL_NODES} nodes, ring decode",
             lambda g: g.route("gguf", BIG_MODEL_NODES, g.bench.synthetic("8b"), g.short, ring=True),
             group="synthetic 8B"),
    LaneSpec("synthetic_8b_llama_cpp_single_process_no_repack", f"{_SYN8B}: llama.cpp, one process, --no-repack",
             lambda g: g.bench.llama_single(g.bench.synthetic("8b"), list(g.short), g.concurrency,
                                            extra=("--no-repack",)), group="synthetic 8B"),
    LaneSpec("synthetic_8b_gguf_ring_4_nodes_optimized_kernels", f"{_SYN8B}: GGUF route, {BIG_MODEL_NODES} nodes, "
             "ring decode, upstream's CPU kernels (not the certified runtime)",
             lambda g: g.route("gguf", BIG_MODEL_NODES, g.bench.synthetic("8b"), g.short, ring=True,
                               reference_kernels=False), group="synthetic 8B"),
    # Issue 30: the bundled model's ring with every node on Vulkan (`--device vulkan0`), 1 node (the
    # whole model in one worker on the device) and 3. On lavapipe (no GPU) their speed is a cost of
    # running the Vulkan code, never a GPU figure; tools/gpu_check/gpu_check.py measures real GPUs. Not run
    # by default: they need a worker linked with Vulkan and, on Mesa's lavapipe, take minutes for
    # what the CPU lanes do in seconds (named with --lanes).
    LaneSpec("gguf_ring_1_node_vulkan", "GGUF route, 1 node, ring decode, on vulkan0",
             lambda g: g.route("gguf", 1, ring=True, device="vulkan0"), default=False, group="Vulkan"),
    LaneSpec("gguf_ring_3_nodes_vulkan", "GGUF route, {k} nodes, ring decode, every node on vulkan0",
             lambda g: g.route("gguf", g.k, ring=True, device="vulkan0"), default=False, group="Vulkan"),
)
BY_NAME = {spec.name: spec for spec in TABLE}
LANES = tuple(BY_NAME)
DEFAULT_LANES = tuple(spec.name for spec in TABLE if spec.default)
RUNTIME_ONLY = tuple(spec.name for spec in TABLE if spec.runtime_only)
SPECULATION_PAIRS = tuple((spec.name, spec.same_tokens_as) for spec in TABLE if spec.same_tokens_as)
# Lanes that other code reads by their role (lane_table_test checks each is a row above).
REFERENCE_TOKENS = "transformers_single_process"  # every lane's single-stream tokens are compared with its
BATCHED_BASELINE = "llama_cpp_single_process"  # its batched figures are the contract's llama_cpp_batched
NAMESPACE_WAN = "gguf_route_3_nodes_wan"  # its WAN settings and notes are results.json's "wan"


def lanes_help() -> str:
    """The --lanes help: the groups that run only when named come from the table."""
    named_only = " and ".join(dict.fromkeys(spec.group for spec in TABLE if not spec.default))
    return f"which lanes, run in this order (the {named_only} lanes only when named)"
