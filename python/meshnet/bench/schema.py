"""The types of the bench's results: a Cell per (prompt, concurrency) workload, a Lane per lane,
and the processes and nodes a lane measured. results.json is these, as JSON.

They are TypedDicts so results stay plain JSON while every field a lane may write is declared
here, with its type and meaning; `problems` checks a whole results document against them (the
harness records what it finds in meta.schema_problems, and schema_test checks the committed
evidence), so a lane cannot invent a field or change a field's type unseen. Times are ms, rates
tokens per second, sizes bytes, unless the name says otherwise. None means "not measured here".
"""

from __future__ import annotations

import typing
from typing import Any, Optional, TypedDict, Union

Number = Union[int, float]


class HopStages(TypedDict, total=False):
    """One hop's mean time per completed decode step in each stage of its worker, over a cell (its
    Health's StepTimes before and after; microseconds). None where the hop reports none (the
    reference backend)."""

    steps: int  # decode steps
    admit_us: Optional[Number]  # frame received to submitted: decoding, checks, unpacking, commitments
    wait_us: Optional[Number]  # submitted to the engine's result: queue_us + engine_us + wake_us
    queue_us: Optional[Number]  # submitted to the start of the batch that ran the step
    engine_us: Optional[Number]  # that batch's decode
    wake_us: Optional[Number]  # the batch's end to the waiting thread running again
    after_us: Optional[Number]  # sampling, commitments
    send_us: Optional[Number]  # encoding and writing to the next hop, or the ring and results
    reply_us: Optional[Number]  # the reply upstream


class Cell(TypedDict, total=False):
    """One (prompt length, concurrency) workload of one lane (measure.py defines the figures)."""

    prompt_tokens: int
    concurrency: int
    new_tokens: int  # per stream
    failures: int  # streams that ended short of new_tokens
    errors: list[str]  # what the failed streams raised (at most 5, distinct)
    ttft_ms: Optional[Number]
    prefill_tok_s: Optional[Number]
    decode_tok_s: Optional[Number]  # median per-stream rate after the first token
    aggregate_tok_s: Optional[Number]  # every stream decoding at once
    itl_p50_ms: Optional[Number]
    itl_p95_ms: Optional[Number]
    itl_mean_ms: Optional[Number]  # batched-bench lanes: no per-token times, the mean only
    # route lanes, from the hops' Health around the cell
    seam_bytes_per_token: Optional[Number]
    mean_batch_rows: Optional[Number]
    max_batch_sessions: Optional[int]
    max_queue_depth: int
    max_live_sessions: int
    max_kv_cells: int
    drafted_tokens: int  # speculation: tokens drafted by the first hop
    accepted_drafts: int  # and accepted by the last
    # single stream: what is not compute is seams and client
    seam_overhead_ms: Number  # per token, all hops
    overhead_ms_per_token_per_hop: Number
    hop_stages: list[HopStages]  # per hop, in route order: where each step's time went (issue 31)
    decode_compute_ms_per_token: Number  # the hops' engine time per decoded token
    model_itl_ms: Number  # delay lanes: decode compute + hops x one-way delay
    itl_p50_over_model_ms: Number
    itl_p95_over_model_ms: Number
    tokens_matching_transformers: int  # common prefix with Transformers' greedy tokens


class Process(TypedDict, total=False):
    role: str
    peak_rss_bytes: Optional[int]  # VmHWM, None when the process was gone before it was read


class Node(TypedDict, total=False):
    node: str
    layers: list[int]  # [start, end)
    peak_rss_bytes: int  # the node's processes together
    weight_bytes: int  # of its layer range
    kv_bytes: int  # of its KV cache as allocated


class Figures(TypedDict, total=False):
    """A lane's figures of its own, beside or instead of cells (the contract reads them)."""

    decode_tok_s: Optional[Number]  # copy lanes: all decode tokens over all decode time
    tokens_identical: int  # speculation lanes: 1 when single-stream tokens equal the plain lane's
    added_ttft_ms: Number  # gateway lane: gateway minus direct
    added_itl_p50_ms: Optional[Number]
    errors_c32: int
    gateway_cpu_ms_per_token: Optional[Number]  # gateway lane: CPU per token, solo runs (gateway_lane.py)
    gateway_client_cpu_ms_per_token: Optional[Number]
    direct_client_cpu_ms_per_token: Optional[Number]
    aggregate_tok_s_c32: Optional[Number]


class Lane(TypedDict, total=False):
    available: bool
    reason: str  # why not, when not available
    label: str
    duration_s: Number
    cells: list[Cell]
    figures: Figures
    processes: list[Process]
    nodes: list[Node]
    peak_rss_bytes: int  # every process of the lane together
    kv_bytes: int
    notes: list[str]
    command: str  # batched-bench lanes: the tool's arguments
    startup_s: Number
    round_cells: list[list[Cell]]  # --rounds N: each round's cells; `cells` holds their medians (rounds.py)
    wan: dict[str, Any]  # the namespace WAN lane: what was applied
    direct: dict[str, Any]  # gateway lane: its two sides and the concurrent run
    gateway: dict[str, Any]
    concurrent: dict[str, Any]
    beside: dict[str, Any]  # a hostile client's sessions beside the measured streams (bench/beside.py)


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin is Union:
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if typing.is_typeddict(hint):
        return isinstance(value, dict) and not _record_problems(value, hint, "")
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _record_problems(record: dict, kind: type, where: str) -> list[str]:
    hints = typing.get_type_hints(kind)
    out = []
    for key, value in record.items():
        if key not in hints:
            out.append(f"{where}: {key!r} is not a field of {kind.__name__}")
        elif typing.is_typeddict(hints[key]) or (typing.get_origin(hints[key]) is list and typing.is_typeddict(
                typing.get_args(hints[key])[0])):
            items = value if isinstance(value, list) else [value]
            inner = hints[key] if typing.is_typeddict(hints[key]) else typing.get_args(hints[key])[0]
            for i, item in enumerate(items):
                label = f"{where}.{key}[{i}]" if isinstance(value, list) else f"{where}.{key}"
                out += _record_problems(item, inner, label) if isinstance(item, dict) else \
                    [f"{label}: not an object"]
        elif not _fits(value, hints[key]):
            out.append(f"{where}.{key}: {value!r} is not {hints[key]}")
    return out


def problems(results: dict) -> list[str]:
    """Every field of every lane (runtime-only lanes included) that the types above do not
    declare, or whose value has another type; [] when the document conforms."""
    out = []
    groups = [("lanes", results.get("lanes", {}))]
    if "runtime_only" in results:
        groups.append(("runtime_only.lanes", results["runtime_only"].get("lanes", {})))
    for group, lanes in groups:
        for name, lane in lanes.items():
            out += _record_problems(lane, Lane, f"{group}.{name}")
    return out
