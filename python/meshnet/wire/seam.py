"""Native types of the seam protocol (meshnet.shard.v1), one frozen dataclass per message.

Converted to and from protobuf only in meshnet.protocol (seam, supervision, commitments).
Conventions: a sub-message that may be absent is Optional (None = absent, which differs from
present-but-empty); repeated fields are tuples; enums keep the wire numbers.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from meshnet.wire.ids import SessionId
from meshnet.wire.status import Status


class DType(enum.IntEnum):
    UNSPECIFIED = 0
    F32 = 1
    F16 = 2
    BF16 = 3

    @property
    def itemsize(self) -> int:
        if self == DType.UNSPECIFIED:
            raise ValueError("DType.UNSPECIFIED has no size")
        return 4 if self == DType.F32 else 2


class ByteOrder(enum.IntEnum):
    UNSPECIFIED = 0
    LITTLE = 1
    BIG = 2


class Compression(enum.IntEnum):
    UNSPECIFIED = 0
    NONE = 1
    ZLIB = 2


class Phase(enum.IntEnum):
    UNSPECIFIED = 0
    PREFILL = 1
    DECODE = 2
    RELEASE = 3
    CANCEL = 4


class FinishReason(enum.IntEnum):
    UNSPECIFIED = 0
    LENGTH = 1
    STOP = 2
    CANCELLED = 3
    ERROR = 4


@dataclasses.dataclass(frozen=True)
class ProtocolVersion:
    major: int
    minor: int = 0


@dataclasses.dataclass(frozen=True)
class RouteSession:
    session_id: SessionId
    epoch: int  # route epoch; newer fences older


@dataclasses.dataclass(frozen=True)
class Fingerprints:
    model_artifact: str  # "sha256:<hex>" of the GGUF file
    runtime_recipe: str  # "sha256:<hex>" of the canonical runtime recipe


@dataclasses.dataclass(frozen=True)
class ShardRange:
    layer_start: int
    layer_end: int  # exclusive
    effective_start: int  # >= layer_start: where this frame's input enters


@dataclasses.dataclass(frozen=True)
class TokenSpan:
    start: int  # first position
    count: int


@dataclasses.dataclass(frozen=True)
class CacheState:
    length: int  # positions [0, length) are held


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    byte_order: ByteOrder
    offset: int  # into the bundle's uncompressed payload
    length: int  # bytes
    crc32: int  # CRC-32 of the bytes as sent


@dataclasses.dataclass(frozen=True)
class BundleHeader:
    tensors: tuple[TensorSpec, ...]
    compression: Compression
    payload_bytes: int  # uncompressed
    wire_bytes: int  # what the fragments carry in total


@dataclasses.dataclass(frozen=True)
class TensorFragment:
    bundle_id: int
    index: int
    count: int
    header: Optional[BundleHeader]  # on index 0 only
    data: bytes


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (float32 on the wire, like every float here)
    top_k: int = 0  # 0 = off
    top_p: float = 0.0  # 0 or 1 = off
    seed: int = 0
    max_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
    grammar: str = ""  # GBNF every sampled token must continue ("" = unconstrained)
    grammar_tokens: tuple[int, ...] = ()  # generated before a failover: fed to the grammar first


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float


@dataclasses.dataclass(frozen=True)
class SampledToken:
    token_id: int
    position: int
    logprob: float = 0.0
    top: tuple[TokenLogprob, ...] = ()


@dataclasses.dataclass(frozen=True)
class RouteTicket:
    """The tracker's signed permission for one hop (meshnet.identity.tickets opens it)."""

    body: bytes  # a serialized TicketBody, exactly as signed
    signature: bytes  # Ed25519 by the tracker over b"meshnet-ticket-v1\0" + body


@dataclasses.dataclass(frozen=True)
class AuditTicket:
    """The tracker's permission to read one hop's commitments (ADR 0008)."""

    body: bytes  # a serialized AuditBody, exactly as signed
    signature: bytes  # Ed25519 by the tracker over b"meshnet-audit-v1\0" + body


@dataclasses.dataclass(frozen=True)
class TicketBody:
    """What a route ticket admits (ADR 0003); signed as serialized bytes, never re-encoded."""

    session_id: SessionId
    epoch: int
    node_id: str  # the hop it admits work on
    range: Optional[ShardRange]  # that hop's registered range and effective start
    downstream_node_id: str = ""  # "" on the last hop
    downstream_address: str = ""  # the only address the hop may dial
    downstream_public_key: bytes = b""  # the downstream's Ed25519 identity key
    downstream_tls_certificate: str = ""  # the only certificate the hop accepts downstream (PEM)
    client_public_key: bytes = b""  # the client that opened the route
    client_principal: str = ""
    expires_unix_ms: int = 0  # wall clock


@dataclasses.dataclass(frozen=True)
class DownstreamHop:
    node_id: str
    address: str  # host:port of its Shard service
    range: Optional[ShardRange]
    ticket: Optional[RouteTicket] = None  # that hop's ticket, passed on unopened


@dataclasses.dataclass(frozen=True)
class SeamFrame:
    version: Optional[ProtocolVersion]
    session: Optional[RouteSession]
    phase: Phase
    step: int  # idempotency step, 1, 2, ...
    work_id: str = ""
    fingerprints: Optional[Fingerprints] = None
    range: Optional[ShardRange] = None
    span: Optional[TokenSpan] = None
    token_ids: tuple[int, ...] = ()  # first hop only
    expected_cache: Optional[CacheState] = None
    budget_ms: int = 0  # time left for the step when sent; 0 = none
    sampling: Optional[SamplingParams] = None
    fragment: Optional[TensorFragment] = None
    downstream: tuple[DownstreamHop, ...] = ()  # hops after the receiver (first frame of an epoch)
    ticket: Optional[RouteTicket] = None  # the receiver's ticket (first frame of a session on a stream)
    ring: bool = False  # ring decode: the last hop feeds each sampled token to the first hop (ADR 0005)
    draft_max: int = 0  # speculation: on the prefill, the most tokens the first hop drafts per ring step
    draft_token_ids: tuple[int, ...] = ()  # speculation: a ring step's drafted tokens


@dataclasses.dataclass(frozen=True)
class SeamReply:
    version: Optional[ProtocolVersion]
    session: Optional[RouteSession]
    step: int
    credits: int = 0
    cache: Optional[CacheState] = None
    status: Optional[Status] = None
    replayed: bool = False


@dataclasses.dataclass(frozen=True)
class ResultsRequest:
    version: Optional[ProtocolVersion]
    session: Optional[RouteSession]
    ticket: Optional[RouteTicket] = None  # the last hop's ticket
    client_signature: bytes = b""  # by the ticket's client key over b"meshnet-results-v1\0" + ticket.signature


@dataclasses.dataclass(frozen=True)
class ResultFrame:
    version: Optional[ProtocolVersion]
    session: Optional[RouteSession]
    step: int
    tokens: tuple[SampledToken, ...] = ()
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    status: Optional[Status] = None


@dataclasses.dataclass(frozen=True)
class HelloRequest:
    supported_versions: tuple[ProtocolVersion, ...]
    features: tuple[str, ...] = ()
    peer_id: str = ""


@dataclasses.dataclass(frozen=True)
class HelloReply:
    chosen_version: Optional[ProtocolVersion]
    features: tuple[str, ...] = ()
    peer_id: str = ""
    status: Optional[Status] = None


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Where a hop's completed DECODE steps spent their time, summed since start (microseconds)."""

    steps: int = 0
    admit_us: int = 0  # arrival to submission to the engine
    wait_us: int = 0  # waiting for the engine (queue_us + engine_us + the waiter's wake-up)
    after_us: int = 0  # after the engine: sampling, commitments
    send_us: int = 0  # encoding and writing to the next hop
    reply_us: int = 0  # writing the reply upstream
    queue_us: int = 0  # until the batch that ran the step started
    engine_us: int = 0  # that batch's decode


@dataclasses.dataclass(frozen=True)
class Health:
    """A shard's liveness and load (the Health call); counters are since the worker started."""

    status: Optional[Status] = None
    active_sessions: int = 0
    queue_depth: int = 0  # steps waiting for the engine
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    batches: int = 0  # engine decodes run
    mean_batch_rows: float = 0.0  # rows per decode, mean (float32 on the wire)
    max_batch_sessions: int = 0  # most distinct sessions seen in one decode
    compute_us: int = 0  # time spent in engine decodes
    seam_frames_in: int = 0  # SeamFrame messages received
    seam_bytes_in: int = 0  # their serialized size
    fence_entries: int = 0  # session ids with an epoch fence held
    results_readers: int = 0  # open Results streams
    drafted_tokens: int = 0  # speculation (ADR 0005): tokens this (first) hop drafted
    accepted_drafts: int = 0  # drafts this (last) hop's sampler accepted
    rewound_rows: int = 0  # KV rows this hop dropped for rejected drafts
    device: str = ""  # where the range computes (ADR 0014): "cpu", "vulkan0", ...
    device_description: str = ""  # the driver's name for it
    device_memory_used: int = 0  # what this worker holds there (weights, KV, compute buffers)
    device_memory_free: int = 0  # as the device's backend reports it
    device_memory_total: int = 0
    step_times: Optional[StepTimes] = None  # absent from a hop that times no steps (the reference)


@dataclasses.dataclass(frozen=True)
class AuditBody:
    """What an audit ticket admits (ADR 0008): one hop's commitments for one route session."""

    session_id: SessionId
    epoch: int
    node_id: str  # the hop whose commitments may be read
    expires_unix_ms: int = 0  # wall clock


@dataclasses.dataclass(frozen=True)
class CommitmentsBody:
    """What a hop committed to for positions [start, start + count) of a session (ADR 0008), as
    it signed it. Per position, little-endian, `k` values each: indices uint16, values float16;
    tokens int32 (-1: none sampled there), logits float16. Empty bytes: not this hop's part."""

    node_id: str
    session_id: SessionId
    epoch: int
    layer_start: int
    layer_end: int
    k: int
    start: int
    count: int
    input_tokens: bytes = b""  # first hop: the token fed at each position
    input_indices: bytes = b""  # other hops: top-K of the hidden row received
    input_values: bytes = b""
    output_indices: bytes = b""  # non-last hops: top-K of the hidden row sent on
    output_values: bytes = b""
    sampled_tokens: bytes = b""  # last hop: the token sampled from each position's logits
    sampled_logits: bytes = b""  # and its logit
    temperature: float = 0.0  # last hop: the session's sampling temperature (0: greedy)
    constrained: bool = False  # last hop: sampled under a grammar (issue 33)
