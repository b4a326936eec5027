"""The seam protocol's edge: meshnet.shard.v1 protobuf <-> native types (meshnet.wire.seam).

Callers encode and decode whole messages here and never see *_pb2 types. Decoding checks the
protocol version (major 1; any minor) and turns malformed bytes into ProtocolError. Encoding is
deterministic, so equal native values give equal bytes (the golden frames rely on it).

Why the conversions are written out by hand here, while the tracker protocol's are driven by
the message descriptors (protocol/descriptors.py): the seam carries every step of every route,
one frame per token where the route does not ring, and the descriptor-driven form of this codec
(`descriptor_codec()`, equal bytes and values on every message: seam_test) is slower on exactly
those frames. //python:codec_bench measures the two in alternating rounds; its figures, in
docs/evidence/seam-codec/README.md, put a decode step's frame at 1.34 times the time to encode
and 1.38 times the time to decode; a hidden-state bundle's frames lose nothing (0.98 to 1.0 of
the throughput), since copying their bytes dominates.
A field added to shard.proto is therefore added here by hand; readers_test fails until it is.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, TypeVar, Union

from google.protobuf.message import Message

from meshnet.protocol.descriptors import DescriptorCodec
from meshnet.protocol.errors import ProtocolError, invalid, parsed
from meshnet.shard.v1 import shard_pb2 as pb
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId
from meshnet.wire.status import Status, StatusCode

PROTOCOL_VERSION = t.ProtocolVersion(major=1, minor=1)  # minor 1: docs/adr/0021-the-route-decided-once.md
SUPPORTED_MAJORS = (1,)
FEATURES = ("compression.zlib", "logprobs")

E = TypeVar("E")
NativeMessage = Union[t.SeamFrame, t.SeamReply, t.ResultFrame, t.ResultsRequest, t.HelloRequest, t.HelloReply]


def _enum(cls: Callable[[int], E], value: int, what: str) -> E:
    try:
        return cls(value)
    except ValueError:
        raise invalid(f"unknown {what} {value}") from None


def _opt(msg: Message, field: str, convert: Callable[[Message], E]) -> Optional[E]:
    return convert(getattr(msg, field)) if msg.HasField(field) else None


def _set(msg: Message, field: str, value: object, convert: Callable[[object, Message], None]) -> None:
    if value is not None:
        sub = getattr(msg, field)
        sub.SetInParent()
        convert(value, sub)


# ---- leaves ---------------------------------------------------------------------------------

def _version_in(m: pb.ProtocolVersion) -> t.ProtocolVersion:
    return t.ProtocolVersion(m.major, m.minor)


def _version_out(v: t.ProtocolVersion, m: pb.ProtocolVersion) -> None:
    m.major, m.minor = v.major, v.minor


def _session_in(m: pb.RouteSession) -> t.RouteSession:
    return t.RouteSession(SessionId(m.session_id), m.epoch)


def _session_out(v: t.RouteSession, m: pb.RouteSession) -> None:
    m.session_id, m.epoch = v.session_id, v.epoch


def status_in(m: pb.Status) -> Status:
    return Status(_enum(StatusCode, m.code, "status code"), m.message, m.retryable, m.hop)


def status_out(v: Status, m: pb.Status) -> None:
    m.code, m.message, m.retryable, m.hop = int(v.code), v.message, v.retryable, v.hop


def _range_in(m: pb.ShardRange) -> t.ShardRange:
    return t.ShardRange(m.layer_start, m.layer_end, m.effective_start)


def _range_out(v: t.ShardRange, m: pb.ShardRange) -> None:
    m.layer_start, m.layer_end, m.effective_start = v.layer_start, v.layer_end, v.effective_start


def _cache_in(m: pb.CacheState) -> t.CacheState:
    return t.CacheState(m.length)


def _cache_out(v: t.CacheState, m: pb.CacheState) -> None:
    m.length = v.length


def _spec_in(m: pb.TensorSpec) -> t.TensorSpec:
    return t.TensorSpec(m.name, _enum(t.DType, m.dtype, "dtype"), tuple(m.shape),
                        _enum(t.ByteOrder, m.byte_order, "byte order"), m.offset, m.length, m.crc32)


def _spec_out(v: t.TensorSpec, m: pb.TensorSpec) -> None:
    m.name, m.dtype, m.byte_order = v.name, int(v.dtype), int(v.byte_order)
    m.shape.extend(v.shape)
    m.offset, m.length, m.crc32 = v.offset, v.length, v.crc32


def _header_in(m: pb.BundleHeader) -> t.BundleHeader:
    return t.BundleHeader(tuple(_spec_in(s) for s in m.tensors), _enum(t.Compression, m.compression, "compression"),
                          m.payload_bytes, m.wire_bytes)


def _header_out(v: t.BundleHeader, m: pb.BundleHeader) -> None:
    for spec in v.tensors:
        _spec_out(spec, m.tensors.add())
    m.compression, m.payload_bytes, m.wire_bytes = int(v.compression), v.payload_bytes, v.wire_bytes


def _fragment_in(m: pb.TensorFragment) -> t.TensorFragment:
    return t.TensorFragment(m.bundle_id, m.index, m.count, _opt(m, "header", _header_in), m.data)


def _fragment_out(v: t.TensorFragment, m: pb.TensorFragment) -> None:
    m.bundle_id, m.index, m.count, m.data = v.bundle_id, v.index, v.count, bytes(v.data)
    _set(m, "header", v.header, _header_out)


def _sampling_in(m: pb.SamplingParams) -> t.SamplingParams:
    return t.SamplingParams(m.temperature, m.top_k, m.top_p, m.seed, m.max_tokens, tuple(m.stop_token_ids),
                            m.top_logprobs, m.grammar, tuple(m.grammar_tokens))


def _sampling_out(v: t.SamplingParams, m: pb.SamplingParams) -> None:
    m.temperature, m.top_k, m.top_p, m.seed, m.max_tokens = v.temperature, v.top_k, v.top_p, v.seed, v.max_tokens
    m.stop_token_ids.extend(v.stop_token_ids)
    m.top_logprobs = v.top_logprobs
    m.grammar = v.grammar
    m.grammar_tokens.extend(v.grammar_tokens)


def _token_in(m: pb.SampledToken) -> t.SampledToken:
    return t.SampledToken(m.token_id, m.position, m.logprob, tuple(t.TokenLogprob(x.token_id, x.logprob) for x in m.top))


def _token_out(v: t.SampledToken, m: pb.SampledToken) -> None:
    m.token_id, m.position, m.logprob = v.token_id, v.position, v.logprob
    for alt in v.top:
        m.top.add(token_id=alt.token_id, logprob=alt.logprob)


def _ticket_in(m: pb.RouteTicket) -> t.RouteTicket:
    return t.RouteTicket(m.body, m.signature)


def _ticket_out(v: t.RouteTicket, m: pb.RouteTicket) -> None:
    m.body, m.signature = bytes(v.body), bytes(v.signature)


def _downstream_in(m: pb.DownstreamHop) -> t.DownstreamHop:
    return t.DownstreamHop(m.node_id, m.address, _opt(m, "range", _range_in), _opt(m, "ticket", _ticket_in))


# ---- top-level messages ---------------------------------------------------------------------

def _frame_in(m: pb.SeamFrame) -> t.SeamFrame:
    return t.SeamFrame(
        version=_opt(m, "version", _version_in),
        session=_opt(m, "session", _session_in),
        phase=_enum(t.Phase, m.phase, "phase"),
        step=m.step,
        work_id=m.work_id,
        fingerprints=_opt(m, "fingerprints", lambda f: t.Fingerprints(f.model_artifact, f.runtime_recipe)),
        range=_opt(m, "range", _range_in),
        span=_opt(m, "span", lambda s: t.TokenSpan(s.start, s.count)),
        token_ids=tuple(m.token_ids),
        expected_cache=_opt(m, "expected_cache", _cache_in),
        budget_ms=m.budget_ms,
        sampling=_opt(m, "sampling", _sampling_in),
        fragment=_opt(m, "fragment", _fragment_in),
        downstream=tuple(_downstream_in(d) for d in m.downstream),
        ticket=_opt(m, "ticket", _ticket_in),
        ring=m.ring,
        draft_max=m.draft_max,
        draft_token_ids=tuple(m.draft_token_ids),
    )


def _frame_out(v: t.SeamFrame) -> pb.SeamFrame:
    m = pb.SeamFrame(work_id=v.work_id, phase=int(v.phase), step=v.step, budget_ms=v.budget_ms, ring=v.ring,
                     draft_max=v.draft_max)
    m.draft_token_ids.extend(v.draft_token_ids)
    _set(m, "version", v.version, _version_out)
    _set(m, "session", v.session, _session_out)
    _set(m, "fingerprints", v.fingerprints, lambda f, x: (setattr(x, "model_artifact", f.model_artifact),
                                                          setattr(x, "runtime_recipe", f.runtime_recipe)))
    _set(m, "range", v.range, _range_out)
    _set(m, "span", v.span, lambda s, x: (setattr(x, "start", s.start), setattr(x, "count", s.count)))
    m.token_ids.extend(v.token_ids)
    _set(m, "expected_cache", v.expected_cache, _cache_out)
    _set(m, "sampling", v.sampling, _sampling_out)
    _set(m, "fragment", v.fragment, _fragment_out)
    for hop in v.downstream:
        d = m.downstream.add(node_id=hop.node_id, address=hop.address)
        _set(d, "range", hop.range, _range_out)
        _set(d, "ticket", hop.ticket, _ticket_out)
    _set(m, "ticket", v.ticket, _ticket_out)
    return m


def _reply_in(m: pb.SeamReply) -> t.SeamReply:
    return t.SeamReply(_opt(m, "version", _version_in), _opt(m, "session", _session_in), m.step, m.credits,
                       _opt(m, "cache", _cache_in), _opt(m, "status", status_in), m.replayed)


def _reply_out(v: t.SeamReply) -> pb.SeamReply:
    m = pb.SeamReply(step=v.step, credits=v.credits, replayed=v.replayed)
    _set(m, "version", v.version, _version_out)
    _set(m, "session", v.session, _session_out)
    _set(m, "cache", v.cache, _cache_out)
    _set(m, "status", v.status, status_out)
    return m


def _result_in(m: pb.ResultFrame) -> t.ResultFrame:
    return t.ResultFrame(_opt(m, "version", _version_in), _opt(m, "session", _session_in), m.step,
                         tuple(_token_in(x) for x in m.tokens), _enum(t.FinishReason, m.finish_reason, "finish reason"),
                         _opt(m, "status", status_in))


def _result_out(v: t.ResultFrame) -> pb.ResultFrame:
    m = pb.ResultFrame(step=v.step, finish_reason=int(v.finish_reason))
    _set(m, "version", v.version, _version_out)
    _set(m, "session", v.session, _session_out)
    for token in v.tokens:
        _token_out(token, m.tokens.add())
    _set(m, "status", v.status, status_out)
    return m


def _results_request_in(m: pb.ResultsRequest) -> t.ResultsRequest:
    return t.ResultsRequest(_opt(m, "version", _version_in), _opt(m, "session", _session_in),
                            _opt(m, "ticket", _ticket_in), m.client_signature)


def _results_request_out(v: t.ResultsRequest) -> pb.ResultsRequest:
    m = pb.ResultsRequest(client_signature=bytes(v.client_signature))
    _set(m, "version", v.version, _version_out)
    _set(m, "session", v.session, _session_out)
    _set(m, "ticket", v.ticket, _ticket_out)
    return m


def _hello_in(m: pb.HelloRequest) -> t.HelloRequest:
    return t.HelloRequest(tuple(_version_in(x) for x in m.supported_versions), tuple(m.features), m.peer_id)


def _hello_out(v: t.HelloRequest) -> pb.HelloRequest:
    m = pb.HelloRequest(features=list(v.features), peer_id=v.peer_id)
    for version in v.supported_versions:
        _version_out(version, m.supported_versions.add())
    return m


def _hello_reply_in(m: pb.HelloReply) -> t.HelloReply:
    return t.HelloReply(_opt(m, "chosen_version", _version_in), tuple(m.features), m.peer_id, _opt(m, "status", status_in))


def _hello_reply_out(v: t.HelloReply) -> pb.HelloReply:
    m = pb.HelloReply(features=list(v.features), peer_id=v.peer_id)
    _set(m, "chosen_version", v.chosen_version, _version_out)
    _set(m, "status", v.status, status_out)
    return m


_CODECS = {
    t.SeamFrame: (pb.SeamFrame, _frame_in, _frame_out),
    t.SeamReply: (pb.SeamReply, _reply_in, _reply_out),
    t.ResultFrame: (pb.ResultFrame, _result_in, _result_out),
    t.ResultsRequest: (pb.ResultsRequest, _results_request_in, _results_request_out),
    t.HelloRequest: (pb.HelloRequest, _hello_in, _hello_out),
    t.HelloReply: (pb.HelloReply, _hello_reply_in, _hello_reply_out),
}
MESSAGE_TYPES = {cls.__name__: cls for cls in _CODECS}


def to_proto(value: NativeMessage) -> Message:
    return _CODECS[type(value)][2](value)


def from_proto(message: Message) -> NativeMessage:
    for _, (pb_cls, decode, _) in _CODECS.items():
        if isinstance(message, pb_cls):
            return decode(message)
    raise TypeError(f"not a seam message: {type(message).__name__}")


def encode(value: NativeMessage) -> bytes:
    """Deterministic wire bytes of a native seam message."""
    return to_proto(value).SerializeToString(deterministic=True)


def encode_ticket_body(body: t.TicketBody) -> bytes:
    """The bytes a ticket signs (deterministic)."""
    m = pb.TicketBody(session_id=body.session_id, epoch=body.epoch, node_id=body.node_id,
                      downstream_node_id=body.downstream_node_id, downstream_address=body.downstream_address,
                      downstream_public_key=body.downstream_public_key,
                      downstream_tls_certificate=body.downstream_tls_certificate,
                      client_public_key=body.client_public_key, client_principal=body.client_principal,
                      expires_unix_ms=body.expires_unix_ms)
    _set(m, "range", body.range, _range_out)
    return m.SerializeToString(deterministic=True)


def encode_audit_body(session_id: str, epoch: int, node_id: str, expires_unix_ms: int) -> bytes:
    """A serialized AuditBody (ADR 0008): what the tracker signs to let one hop's commitments
    for one route session be read."""
    return pb.AuditBody(session_id=session_id, epoch=epoch, node_id=node_id,
                        expires_unix_ms=expires_unix_ms).SerializeToString(deterministic=True)


def decode_audit_body(data: bytes) -> t.AuditBody:
    """The AuditBody an audit ticket signs; ProtocolError if `data` is not one."""
    m = parsed(pb.AuditBody(), data, "AuditBody")
    return t.AuditBody(SessionId(m.session_id), m.epoch, m.node_id, m.expires_unix_ms)


def decode_ticket_body(data: bytes) -> t.TicketBody:
    m = parsed(pb.TicketBody(), data, "TicketBody")
    return t.TicketBody(SessionId(m.session_id), m.epoch, m.node_id, _opt(m, "range", _range_in),
                        m.downstream_node_id, m.downstream_address, m.downstream_public_key,
                        m.downstream_tls_certificate, m.client_public_key, m.client_principal, m.expires_unix_ms)


def check_version(version: Optional[t.ProtocolVersion]) -> None:
    if version is None:
        raise invalid("frame carries no protocol version")
    if version.major not in SUPPORTED_MAJORS:
        raise ProtocolError(StatusCode.VERSION_MISMATCH,
                            f"protocol {version.major}.{version.minor}; this peer speaks major {SUPPORTED_MAJORS}")


def decode(cls: type, data: bytes) -> NativeMessage:
    """Parses `data` as the message type `cls` (a meshnet.wire.seam class)."""
    pb_cls, decode_fn, _ = _CODECS[cls]
    return decode_fn(parsed(pb_cls(), data, cls.__name__))


def decode_seam_frame(data: bytes) -> t.SeamFrame:
    frame = decode(t.SeamFrame, data)
    assert isinstance(frame, t.SeamFrame)
    check_version(frame.version)
    return frame


# The seam messages and their parts, for the descriptor-driven form of this codec.
_DESCRIBED = ("ProtocolVersion", "RouteSession", "Fingerprints", "ShardRange", "TokenSpan", "CacheState", "TensorSpec",
              "BundleHeader", "TensorFragment", "SamplingParams", "TokenLogprob", "SampledToken", "RouteTicket",
              "DownstreamHop", "SeamFrame", "SeamReply", "ResultsRequest", "ResultFrame", "HelloRequest", "HelloReply")


def descriptor_codec() -> DescriptorCodec:
    """This codec's messages converted by their descriptors (protocol/descriptors.py), as the
    tracker protocol is: equal bytes and values (seam_test), measured against the hand-written
    functions above by //python:codec_bench."""
    natives: dict[type, type] = {getattr(pb, name): getattr(t, name) for name in _DESCRIBED}
    natives[pb.Status] = Status
    return DescriptorCodec(natives, {
        "meshnet.shard.v1.Phase": t.Phase, "meshnet.shard.v1.DType": t.DType, "meshnet.shard.v1.ByteOrder": t.ByteOrder,
        "meshnet.shard.v1.Compression": t.Compression, "meshnet.shard.v1.FinishReason": t.FinishReason,
        "meshnet.shard.v1.StatusCode": StatusCode,
    })


def negotiate(request: t.HelloRequest, peer_id: str, features: Iterable[str] = FEATURES) -> t.HelloReply:
    """The answering side of Hello: the highest common major, our minor, common features."""
    common = sorted({v.major for v in request.supported_versions} & set(SUPPORTED_MAJORS))
    if not common:
        offered = ", ".join(f"{v.major}.{v.minor}" for v in request.supported_versions) or "none"
        return t.HelloReply(None, (), peer_id, Status(StatusCode.VERSION_MISMATCH,
                                                      f"peer offers {offered}; this peer speaks major {SUPPORTED_MAJORS}"))
    chosen = t.ProtocolVersion(common[-1], PROTOCOL_VERSION.minor)
    shared = tuple(sorted(set(request.features) & set(features)))
    return t.HelloReply(chosen, shared, peer_id, Status(StatusCode.OK))
