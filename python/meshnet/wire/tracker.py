"""Native types of the tracker protocol (meshnet.tracker.v1), one frozen dataclass per message.

Field names equal the proto's, so meshnet.protocol.tracker converts them generically. Shared
pieces (versions, fingerprints, route sessions, status) are the seam's native types.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence

from meshnet.wire.ids import NodeId
from meshnet.wire.seam import AuditTicket, Fingerprints, ProtocolVersion, RouteSession, RouteTicket
from meshnet.wire.status import Status


class BackendKind(enum.IntEnum):
    UNSPECIFIED = 0
    REFERENCE = 1  # HF Transformers reference shard
    GGUF = 2  # C++ shard worker over patched llama.cpp


def ring_decode_capable(nodes: Sequence[Optional["NodeInfo"]]) -> bool:
    """Ring decode (docs/adr/0005-ring-decode.md) needs every hop of a route to be a GGUF shard
    worker: the tracker then names the first hop as the last hop's downstream and says so in
    RouteReply.ring, the only place a client learns it (docs/adr/0021-the-route-decided-once.md)."""
    return bool(nodes) and all(n is not None and n.backend == BackendKind.GGUF for n in nodes)


class Admission(enum.IntEnum):
    UNSPECIFIED = 0
    ROUTABLE = 1
    DARK = 2  # registered, visible, never routed
    REFUSED = 3


@dataclasses.dataclass(frozen=True)
class LayerRange:
    start: int
    end: int  # exclusive

    def __len__(self) -> int:
        return max(0, self.end - self.start)


@dataclasses.dataclass(frozen=True)
class Capacity:
    max_sessions: int = 0
    kv_tokens: int = 0
    memory_bytes: int = 0
    max_session_tokens: int = 0  # the longest one session may be (prompt + new tokens); 0 = not given


@dataclasses.dataclass(frozen=True)
class Device:
    name: str = ""  # "cpu", "vulkan0", "cuda0", ... (ADR 0014)
    description: str = ""  # the driver's name for it
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0  # when the node started its worker


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: NodeId
    address: str  # host:port of the Seam service
    backend: BackendKind
    model: str
    architecture: str
    fingerprints: Optional[Fingerprints]
    range_fingerprint: str
    layers: Optional[LayerRange]
    capacity: Optional[Capacity]
    n_layer: int
    public_key: bytes = b""  # Ed25519 identity key; node_id == identity.keys.node_id(public_key)
    tls_certificate: str = ""  # PEM of the shard service's certificate, pinned by its peers
    relay: str = ""  # host:port of the relay `address` is an allocation on; "" = reached directly
    relay_rtt_ms: float = 0.0  # the node's measured round trip to that relay
    device: Optional[Device] = None  # where the range computes; None: not reported
    pieces_address: str = ""  # host:port of its Pieces service (the part it holds, to joining peers); "" none


@dataclasses.dataclass(frozen=True)
class RegisterRequest:
    version: Optional[ProtocolVersion]
    node: Optional[NodeInfo]


@dataclasses.dataclass(frozen=True)
class RegisterReply:
    status: Optional[Status]
    admission: Admission = Admission.UNSPECIFIED
    reason: str = ""
    lease_ms: int = 0


@dataclasses.dataclass(frozen=True)
class Load:
    active_sessions: int = 0
    queue_depth: int = 0
    batch_occupancy: float = 0.0  # float32 on the wire
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    decode_tokens_per_second: float = 0.0
    prefill_tokens_per_second: float = 0.0
    rss_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class HeartbeatRequest:
    node_id: NodeId
    load: Optional[Load] = None


@dataclasses.dataclass(frozen=True)
class HeartbeatReply:
    status: Optional[Status]
    lease_ms: int = 0
    fenced_epoch_below: int = 0


@dataclasses.dataclass(frozen=True)
class DrainRequest:
    node_id: NodeId


@dataclasses.dataclass(frozen=True)
class DrainReply:
    status: Optional[Status]


@dataclasses.dataclass(frozen=True)
class DeregisterRequest:
    node_id: NodeId


@dataclasses.dataclass(frozen=True)
class DeregisterReply:
    status: Optional[Status]


@dataclasses.dataclass(frozen=True)
class CoverageRequest:
    model: str
    max_nodes: int = 0  # the most nodes listed; 0 (or more than the tracker's cap): its cap


@dataclasses.dataclass(frozen=True)
class LayerCoverage:
    layer: int
    node_ids: tuple[NodeId, ...] = ()  # the first few routable nodes serving it, by node id
    replicas: int = 0  # every routable node serving it


@dataclasses.dataclass(frozen=True)
class CoverageReply:
    """A bounded summary: exact counts, lists cut to the first nodes by node id."""

    status: Optional[Status]
    n_layer: int = 0
    layers: tuple[LayerCoverage, ...] = ()
    gaps: tuple[LayerRange, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    dark_node_ids: tuple[NodeId, ...] = ()
    quarantined_node_ids: tuple[NodeId, ...] = ()  # failed an audit: never routed (ADR 0008)
    node_count: int = 0  # registered nodes of the model, dark ones included, listed or not
    routable_count: int = 0  # of which routable
    artifact_fingerprint: str = ""  # the certified entry's: what a gateway checks its GGUF against


@dataclasses.dataclass(frozen=True)
class Hop:
    node: Optional[NodeInfo]
    layers: Optional[LayerRange]  # what this hop runs: [effective_start, end)
    ticket: Optional[RouteTicket] = None  # signed by the tracker for this hop


@dataclasses.dataclass(frozen=True)
class OpenRouteRequest:
    model: str
    client_id: str = ""
    expected_tokens: int = 0
    avoid_node_ids: tuple[NodeId, ...] = ()


@dataclasses.dataclass(frozen=True)
class RouteReply:
    status: Optional[Status]
    session: Optional[RouteSession] = None
    hops: tuple[Hop, ...] = ()
    uncovered: tuple[LayerRange, ...] = ()
    lease_ms: int = 0  # renew within this or the route expires
    ring: bool = False  # the route rings: the last hop's ticket names the first hop (ADR 0005, 0021)


@dataclasses.dataclass(frozen=True)
class ReportFailureRequest:
    session: Optional[RouteSession]
    failed_node_id: NodeId
    failure: Optional[Status] = None


@dataclasses.dataclass(frozen=True)
class WorkEntry:
    session: Optional[RouteSession]
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class WorkReport:
    node_id: NodeId
    entries: tuple[WorkEntry, ...] = ()
    report_id: int = 0  # unique per report from a node; a repeat is not counted again


@dataclasses.dataclass(frozen=True)
class WorkReply:
    status: Optional[Status]


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What a route session's client received (CloseRoute): caps its hops' credit."""

    prompt_tokens: int = 0
    tokens: int = 0  # new tokens, across every epoch


@dataclasses.dataclass(frozen=True)
class CloseRouteRequest:
    session: Optional[RouteSession]
    delivery: Optional[Delivery] = None  # None: not reported (the hops' credit stays capped by the route's budget)


@dataclasses.dataclass(frozen=True)
class CloseRouteReply:
    status: Optional[Status]


@dataclasses.dataclass(frozen=True)
class RenewRouteRequest:
    session: Optional[RouteSession]


@dataclasses.dataclass(frozen=True)
class RenewRouteReply:
    status: Optional[Status]
    lease_ms: int = 0


@dataclasses.dataclass(frozen=True)
class TrackerKeyRequest:
    pass


@dataclasses.dataclass(frozen=True)
class TrackerKeyReply:
    status: Optional[Status]
    ticket_public_key: bytes = b""  # Ed25519 key that verifies route tickets


@dataclasses.dataclass(frozen=True)
class RedeemInviteRequest:
    invite_id: str = ""  # the invite's public half
    secret: bytes = b""  # its secret half (the tracker keeps only a hash)


@dataclasses.dataclass(frozen=True)
class RedeemInviteReply:
    status: Optional[Status]
    role: str = ""  # the role the invite bound to the caller's key
    role_token: str = ""  # that role's bearer token


@dataclasses.dataclass(frozen=True)
class AssignRequest:
    memory_bytes: int = 0  # what the node may hold (measured, or its cap)
    disk_free_bytes: int = 0  # free under its data directory
    device: str = ""  # where it computes
    refused_parts: tuple[str, ...] = ()  # parts it was assigned and measured it cannot hold


@dataclasses.dataclass(frozen=True)
class AssignReply:
    status: Optional[Status]
    model: str = ""
    layers: Optional[LayerRange] = None
    part_file: str = ""  # the manifest's part holding `layers`
    reason: str = ""  # why this part, or why none
    sources: tuple[NodeInfo, ...] = ()  # routable nodes serving this part's pieces


@dataclasses.dataclass(frozen=True)
class TakeAuditRequest:
    model_artifact: str = ""  # only audits of a model certified from this artifact ("" any)
    compute_backends: tuple[str, ...] = ()  # what the verifier replays (ADR 0015; () = ("cpu",))


@dataclasses.dataclass(frozen=True)
class HopRecipe:
    """The certified recipe one hop of an audited route ran (ADR 0015)."""

    compute_backend: str
    recipe_fingerprint: str
    matmul_activations: str


@dataclasses.dataclass(frozen=True)
class AuditJob:
    audit_id: int
    session: Optional[RouteSession]  # the closed route session at its last epoch
    model: str
    hops: tuple[Hop, ...] = ()
    tickets: tuple[AuditTicket, ...] = ()  # one per hop
    # the certified entry's artifact and recipe: the verifier replays under this recipe, from this artifact
    fingerprints: Optional[Fingerprints] = None
    matmul_activations: str = ""  # the recipe's, in clear ("" from a tracker before this field)
    hop_recipes: tuple[HopRecipe, ...] = ()  # per hop ((): every hop ran `fingerprints`' recipe)


@dataclasses.dataclass(frozen=True)
class TakeAuditReply:
    status: Optional[Status]
    job: Optional[AuditJob] = None


@dataclasses.dataclass(frozen=True)
class SignedCommitments:
    """A hop's commitments as it signed them (a serialized CommitmentsBody and its signature)."""

    body: bytes = b""
    signature: bytes = b""


@dataclasses.dataclass(frozen=True)
class ReportAuditRequest:
    audit_id: int
    passed: bool
    culprit_node_id: str = ""
    checked_positions: int = 0
    evidence: str = ""
    commitments: tuple[SignedCommitments, ...] = ()  # a refutation's proof: the culprit's (and its upstream's)


@dataclasses.dataclass(frozen=True)
class ReportAuditReply:
    status: Optional[Status]
