// Native mirrors of the seam protocol's messages (proto/meshnet/shard/v1/shard.proto) and
// their wire codecs. Callers inside the worker use only these structs; *.pb.h stops in
// cpp/protocol (the pb types below are forward-declared for the conversion functions only).
//
// Invariants: an optional sub-message is std::nullopt exactly when it is absent on the wire,
// so "present but empty" and "absent" both round-trip; enum and Status code numbers are kept
// verbatim; Encode* is deterministic, so Decode then Encode reproduces canonical bytes (fields
// unknown to this build are dropped on decode). Plain value types, no shared state.
#ifndef MESHNET_CPP_PROTOCOL_SEAM_H_
#define MESHNET_CPP_PROTOCOL_SEAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/status.h"

namespace meshnet::shard::v1 {
class CacheState;
class DownstreamHop;
class Fingerprints;
class HelloReply;
class HelloRequest;
class ProtocolVersion;
class ResultFrame;
class ResultsRequest;
class RouteSession;
class RouteTicket;
class SampledToken;
class SamplingParams;
class SeamFrame;
class SeamReply;
class ShardRange;
class TokenLogprob;
class TokenSpan;
}  // namespace meshnet::shard::v1

namespace meshnet::protocol {

// The version every v1 frame carries; peers accept any minor of this major.
inline constexpr uint32_t kProtocolMajor = 1;
inline constexpr uint32_t kProtocolMinor = 0;

// Numbers equal the proto enums; values read from the wire are kept verbatim.
enum class Phase : int32_t { kUnspecified, kPrefill, kDecode, kRelease, kCancel };
enum class FinishReason : int32_t { kUnspecified, kLength, kStop, kCancelled, kError };

struct ProtocolVersion {
  uint32_t major = 0;
  uint32_t minor = 0;
};
ProtocolVersion CurrentVersion();  // {kProtocolMajor, kProtocolMinor}

struct RouteSession {
  std::string session_id;
  uint64_t epoch = 0;
};

struct Fingerprints {
  std::string model_artifact;  // "sha256:<hex>"
  std::string runtime_recipe;  // "sha256:<hex>"
};

struct ShardRange {  // [layer_start, layer_end); input starts at effective_start
  uint32_t layer_start = 0;
  uint32_t layer_end = 0;
  uint32_t effective_start = 0;
};

struct TokenSpan {  // positions [start, start + count)
  uint64_t start = 0;
  uint32_t count = 0;
};

struct CacheState {  // KV positions [0, length)
  uint64_t length = 0;
};

struct SamplingParams {
  float temperature = 0;  // 0 = greedy
  uint32_t top_k = 0;     // 0 = off
  float top_p = 0;        // 0 or 1 = off
  uint64_t seed = 0;
  uint32_t max_tokens = 0;
  std::vector<uint32_t> stop_token_ids;
  uint32_t top_logprobs = 0;
  std::string grammar;                  // GBNF every sampled token continues; empty = unconstrained
  std::vector<uint32_t> grammar_tokens;  // accepted in an earlier epoch (failover replay)
};

struct TokenLogprob {
  uint32_t token_id = 0;
  float logprob = 0;
};

struct SampledToken {
  uint32_t token_id = 0;
  uint64_t position = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// A tracker-signed TicketBody (docs/adr/0003-identities-and-route-tickets.md); opened and
// checked by cpp/protocol/ticket.h, passed on unopened by every other hop.
struct RouteTicket {
  std::string body;       // serialized meshnet.shard.v1.TicketBody, verified as received
  std::string signature;  // Ed25519 over "meshnet-ticket-v1\0" || body
};

struct DownstreamHop {  // a hop after the receiver: where to forward, the layers it runs
  std::string node_id;
  std::string address;  // host:port of its Shard service
  std::optional<ShardRange> range;
  std::optional<RouteTicket> ticket;  // that hop's ticket
};

struct SeamFrame {
  std::optional<ProtocolVersion> version;
  std::string work_id;
  std::optional<RouteSession> session;
  std::optional<Fingerprints> fingerprints;
  std::optional<ShardRange> range;
  Phase phase = Phase::kUnspecified;
  std::optional<TokenSpan> span;
  uint64_t step = 0;
  std::vector<uint32_t> token_ids;
  std::optional<CacheState> expected_cache;
  uint32_t budget_ms = 0;
  std::optional<SamplingParams> sampling;
  std::optional<TensorFragment> fragment;
  std::vector<DownstreamHop> downstream;  // in order; empty at the last hop
  std::optional<RouteTicket> ticket;      // the receiver's; required until the session is bound
  bool ring = false;                      // ring decode (shard.proto, SeamFrame.ring)
  uint32_t draft_max = 0;                 // speculation: the most drafts per ring step
  std::vector<uint32_t> draft_token_ids;  // speculation: this step's drafted tokens
};

struct SeamReply {
  std::optional<ProtocolVersion> version;
  std::optional<RouteSession> session;
  uint64_t step = 0;
  uint32_t credits = 0;
  std::optional<CacheState> cache;
  std::optional<Status> status;
  bool replayed = false;
};

struct ResultFrame {
  std::optional<ProtocolVersion> version;
  std::optional<RouteSession> session;
  uint64_t step = 0;
  std::vector<SampledToken> tokens;
  FinishReason finish_reason = FinishReason::kUnspecified;
  std::optional<Status> status;
};

struct ResultsRequest {  // the client opens Results on the last hop with this
  std::optional<ProtocolVersion> version;
  std::optional<RouteSession> session;
  std::optional<RouteTicket> ticket;  // the last hop's ticket for the session
  std::string client_signature;       // Ed25519 by the ticket's client key (ADR 0003)
};

struct HelloRequest {
  std::vector<ProtocolVersion> supported_versions;
  std::vector<std::string> features;
  std::string peer_id;
};

struct HelloReply {
  std::optional<ProtocolVersion> chosen_version;  // absent when status is not OK
  std::vector<std::string> features;
  std::string peer_id;
  std::optional<Status> status;
};

// Field-for-field conversions (ToProto clears *out first; FromProto replaces *out).
void ToProto(const ProtocolVersion& in, meshnet::shard::v1::ProtocolVersion* out);
void ToProto(const RouteSession& in, meshnet::shard::v1::RouteSession* out);
void ToProto(const Fingerprints& in, meshnet::shard::v1::Fingerprints* out);
void ToProto(const ShardRange& in, meshnet::shard::v1::ShardRange* out);
void ToProto(const TokenSpan& in, meshnet::shard::v1::TokenSpan* out);
void ToProto(const CacheState& in, meshnet::shard::v1::CacheState* out);
void ToProto(const SamplingParams& in, meshnet::shard::v1::SamplingParams* out);
void ToProto(const TokenLogprob& in, meshnet::shard::v1::TokenLogprob* out);
void ToProto(const SampledToken& in, meshnet::shard::v1::SampledToken* out);
void ToProto(const RouteTicket& in, meshnet::shard::v1::RouteTicket* out);
void ToProto(const DownstreamHop& in, meshnet::shard::v1::DownstreamHop* out);
void ToProto(const SeamFrame& in, meshnet::shard::v1::SeamFrame* out);
void ToProto(const SeamReply& in, meshnet::shard::v1::SeamReply* out);
void ToProto(const ResultFrame& in, meshnet::shard::v1::ResultFrame* out);
void ToProto(const ResultsRequest& in, meshnet::shard::v1::ResultsRequest* out);
void ToProto(const HelloRequest& in, meshnet::shard::v1::HelloRequest* out);
void ToProto(const HelloReply& in, meshnet::shard::v1::HelloReply* out);
void FromProto(const meshnet::shard::v1::ProtocolVersion& in, ProtocolVersion* out);
void FromProto(const meshnet::shard::v1::RouteSession& in, RouteSession* out);
void FromProto(const meshnet::shard::v1::Fingerprints& in, Fingerprints* out);
void FromProto(const meshnet::shard::v1::ShardRange& in, ShardRange* out);
void FromProto(const meshnet::shard::v1::TokenSpan& in, TokenSpan* out);
void FromProto(const meshnet::shard::v1::CacheState& in, CacheState* out);
void FromProto(const meshnet::shard::v1::SamplingParams& in, SamplingParams* out);
void FromProto(const meshnet::shard::v1::TokenLogprob& in, TokenLogprob* out);
void FromProto(const meshnet::shard::v1::SampledToken& in, SampledToken* out);
void FromProto(const meshnet::shard::v1::RouteTicket& in, RouteTicket* out);
void FromProto(const meshnet::shard::v1::DownstreamHop& in, DownstreamHop* out);
void FromProto(const meshnet::shard::v1::SeamFrame& in, SeamFrame* out);
void FromProto(const meshnet::shard::v1::SeamReply& in, SeamReply* out);
void FromProto(const meshnet::shard::v1::ResultFrame& in, ResultFrame* out);
void FromProto(const meshnet::shard::v1::ResultsRequest& in, ResultsRequest* out);
void FromProto(const meshnet::shard::v1::HelloRequest& in, HelloRequest* out);
void FromProto(const meshnet::shard::v1::HelloReply& in, HelloReply* out);

// Decode*: INVALID_ARGUMENT for bytes that do not parse. SeamFrame, SeamReply, ResultFrame and
// ResultsRequest need a version (absent: INVALID_ARGUMENT) of major 1 (else VERSION_MISMATCH);
// a HelloReply's chosen_version, if present, must be major 1; a HelloRequest is not refused
// (its versions are for negotiation). *out is replaced only on success.
// Encode*: deterministic serialization.
Status DecodeSeamFrame(std::string_view bytes, SeamFrame* out);
Status DecodeSeamReply(std::string_view bytes, SeamReply* out);
Status DecodeResultFrame(std::string_view bytes, ResultFrame* out);
Status DecodeResultsRequest(std::string_view bytes, ResultsRequest* out);
Status DecodeHelloRequest(std::string_view bytes, HelloRequest* out);
Status DecodeHelloReply(std::string_view bytes, HelloReply* out);
std::string EncodeSeamFrame(const SeamFrame& frame);
std::string EncodeSeamReply(const SeamReply& reply);
std::string EncodeResultFrame(const ResultFrame& frame);
std::string EncodeResultsRequest(const ResultsRequest& request);
std::string EncodeHelloRequest(const HelloRequest& request);
std::string EncodeHelloReply(const HelloReply& reply);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_SEAM_H_
