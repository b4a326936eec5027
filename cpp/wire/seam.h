// Native mirrors of the seam protocol's messages (proto/meshnet/shard/v1/shard.proto), with no
// protobuf: the worker's scheduler and session table and the engine's sampler use these structs
// alone; cpp/protocol/seam.h converts them to and from the wire (the same split as Python's
// meshnet.wire and meshnet.protocol).
//
// Invariants: an optional sub-message is std::nullopt exactly when it is absent on the wire,
// so "present but empty" and "absent" both round-trip; enum and Status code numbers are kept
// verbatim. Plain value types, no shared state.
#ifndef MESHNET_CPP_WIRE_SEAM_H_
#define MESHNET_CPP_WIRE_SEAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpp/wire/status.h"
#include "cpp/wire/tensor.h"

namespace meshnet::protocol {

// The version every v1 frame carries; peers accept any minor of this major. Minor 1
// (shard.proto, ProtocolVersion): a hop dials the downstream its ticket names, and the
// deprecated fields (work_id, expected_cache, a forwarded frame's range) are no longer written.
inline constexpr uint32_t kProtocolMajor = 1;
inline constexpr uint32_t kProtocolMinor = 1;

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

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_WIRE_SEAM_H_
