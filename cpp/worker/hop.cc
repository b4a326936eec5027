#include "cpp/worker/hop.h"

#include <cmath>
#include <string>
#include <utility>

#include "cpp/worker/draft.h"

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Status;

Status CheckFrameHeader(const protocol::SeamFrame& frame) {
  if (!frame.version.has_value()) {
    return protocol::InvalidArgumentError("frame without a protocol version");
  }
  if (frame.version->major != protocol::kProtocolMajor) {
    return protocol::VersionMismatchError("major " + std::to_string(frame.version->major) +
                                          " is not spoken");
  }
  if (!frame.session.has_value()) {
    return protocol::InvalidArgumentError("frame without a route session");
  }
  if (frame.session->session_id.size() > kMaxSessionIdBytes) {
    return protocol::InvalidArgumentError(
        "session id of " + std::to_string(frame.session->session_id.size()) +
        " bytes; at most " + std::to_string(kMaxSessionIdBytes));
  }
  return OkStatus();
}

Status CheckTicket(const std::optional<protocol::RouteTicket>& ticket,
                   const protocol::RouteSession& session, const HopIdentity& hop,
                   uint64_t now_unix_ms, protocol::Ticket* out) {
  if (!ticket.has_value()) {
    return MakeError(Code::kUnauthenticated, "no route ticket for a session not bound here");
  }
  protocol::Ticket body;
  Status verified = protocol::VerifyTicket(*ticket, hop.tracker_key, &body);
  if (!verified.ok()) return verified;
  auto denied = [](const std::string& why) {
    return MakeError(Code::kPermissionDenied, "route ticket " + why);
  };
  if (body.session_id != session.session_id) return denied("is for another session");
  if (body.epoch != session.epoch) {
    return denied("is for epoch " + std::to_string(body.epoch) + ", the frame's is " +
                  std::to_string(session.epoch));
  }
  if (body.node_id != hop.node_id) return denied("is for node " + body.node_id);
  if (body.range.layer_start != hop.layer_start || body.range.layer_end != hop.layer_end) {
    return denied("is for layers [" + std::to_string(body.range.layer_start) + ", " +
                  std::to_string(body.range.layer_end) + "), this hop serves [" +
                  std::to_string(hop.layer_start) + ", " + std::to_string(hop.layer_end) + ")");
  }
  if (body.expires_unix_ms <= now_unix_ms) {
    return denied("expired at " + std::to_string(body.expires_unix_ms) + " (now " +
                  std::to_string(now_unix_ms) + ")");
  }
  Status range = CheckEffectiveStart(body.range, hop);
  if (!range.ok()) return range;
  *out = std::move(body);
  return OkStatus();
}

Status CheckEffectiveStart(const protocol::ShardRange& range, const HopIdentity& hop) {
  if (range.effective_start == 0 || range.effective_start == hop.layer_start) return OkStatus();
  const std::string s = std::to_string(hop.layer_start);
  return protocol::InvalidArgumentError(
      "this GGUF hop runs layers [" + s + ", " + std::to_string(hop.layer_end) + ") only from " +
      s + "; effective start " + std::to_string(range.effective_start) +
      " is not supported (the tracker routes GGUF nodes at exact boundaries)");
}

Status ResolveDownstream(const protocol::Ticket& ticket,
                         const std::vector<protocol::DownstreamHop>& downstream, bool last,
                         bool pinned_tls, std::optional<protocol::DownstreamHop>* next) {
  next->reset();
  auto denied = [](const std::string& why) { return MakeError(Code::kPermissionDenied, why); };
  if (ticket.downstream_node_id.empty()) {
    if (!downstream.empty()) return denied("a last-hop ticket admits no downstream");
    if (!last) return denied("route ticket names no downstream, but this hop is not the last");
    return OkStatus();
  }
  if (downstream.empty()) {
    if (last) return OkStatus();  // the route does not ring: the last hop forwards nowhere
    return protocol::InvalidArgumentError("not the last hop, but no downstream hop given");
  }
  if (!downstream[0].ticket.has_value()) {
    return protocol::InvalidArgumentError("the downstream hop carries no ticket to present");
  }
  if (pinned_tls && ticket.downstream_tls_certificate.empty()) {
    return denied("route ticket names no certificate for its downstream");
  }
  protocol::DownstreamHop hop;  // the frame's node_id, address and range play no part
  hop.node_id = ticket.downstream_node_id;
  hop.address = ticket.downstream_address;
  hop.ticket = downstream[0].ticket;
  *next = std::move(hop);
  return OkStatus();
}

Status CheckResultsRequest(const protocol::ResultsRequest& request, const HopIdentity& hop,
                           uint64_t now_unix_ms, protocol::Ticket* out) {
  if (!request.session.has_value()) {
    return protocol::InvalidArgumentError("results request without a session");
  }
  if (request.session->session_id.size() > kMaxSessionIdBytes) {
    return protocol::InvalidArgumentError("session id longer than " +
                                          std::to_string(kMaxSessionIdBytes) + " bytes");
  }
  protocol::Ticket ticket;
  Status admitted = CheckTicket(request.ticket, *request.session, hop, now_unix_ms, &ticket);
  if (!admitted.ok()) return admitted;
  if (!hop.last) return MakeError(Code::kPermissionDenied, "results are read on the last hop");
  Status client = protocol::VerifyResultsSignature(ticket.client_public_key,
                                                   request.ticket->signature,
                                                   request.client_signature);
  if (!client.ok()) return client;
  *out = std::move(ticket);
  return OkStatus();
}

protocol::Limits StepLimits(uint32_t rows, int n_embd, bool compression) {
  protocol::Limits limits;
  const uint64_t payload = uint64_t{rows} * static_cast<uint64_t>(n_embd) * sizeof(float);
  // zlib's compressBound: what deflate may add to incompressible input.
  const uint64_t slack = (payload >> 12) + (payload >> 14) + (payload >> 25) + 13;
  limits.max_bundle_bytes = compression ? payload + slack : payload;
  return limits;
}

Status CheckFragment(const protocol::TensorFragment& fragment, bool compression) {
  if (fragment.index == 0 && fragment.header.has_value() &&
      fragment.header->compression == protocol::Compression::kZlib && !compression) {
    return protocol::InvalidArgumentError(
        "zlib bundle, but this hop does not offer compression.zlib");
  }
  return OkStatus();
}

Status CheckFinite(const std::vector<float>& values, int width) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      const size_t w = width > 0 ? static_cast<size_t>(width) : 1;
      return protocol::InvalidArgumentError("non-finite activation at row " +
                                            std::to_string(i / w) + ", column " +
                                            std::to_string(i % w));
    }
  }
  return OkStatus();
}

Status CheckDrafts(const protocol::SeamFrame& frame, int n_vocab) {
  const auto& drafts = frame.draft_token_ids;
  if (!frame.ring || frame.phase != protocol::Phase::kDecode || drafts.size() > kMaxDraftTokens ||
      drafts.size() + 1 != frame.span->count) {
    return protocol::InvalidArgumentError(
        std::to_string(drafts.size()) + " drafted tokens for a span of " +
        std::to_string(frame.span->count) + " (a ring decode step drafts at most " +
        std::to_string(kMaxDraftTokens) + ", one fewer than its span)");
  }
  for (uint32_t token : drafts) {
    if (token >= static_cast<uint32_t>(n_vocab)) {
      return protocol::InvalidArgumentError("drafted token id " + std::to_string(token) +
                                            " is outside the vocabulary");
    }
  }
  return protocol::OkStatus();
}

}  // namespace meshnet::worker
