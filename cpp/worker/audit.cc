// Audits (docs/adr/0008-verified-outputs.md): the Commitments RPC, which serves what this hop's
// sessions committed to (HopSession records it) under the node's signature.
#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpp/protocol/status.h"
#include "cpp/worker/service.h"

namespace meshnet::worker {
namespace pb = ::meshnet::shard::v1;
namespace {

template <typename T>
std::string LittleEndian(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const auto bits = static_cast<std::make_unsigned_t<T>>(values[i]);
    for (size_t b = 0; b < sizeof(T); ++b) out[i * sizeof(T) + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  return out;
}

}  // namespace

grpc::Status ShardService::Commitments(grpc::ServerContext*, const pb::CommitmentsRequest* request,
                                       pb::CommitmentsReply* reply) {
  const pb::AuditTicket& ticket = request->ticket();
  std::string_view tracker_key(reinterpret_cast<const char*>(options_.tracker_key.data()),
                               options_.tracker_key.size());
  if (!protocol::VerifyEd25519(tracker_key, protocol::kAuditContext, ticket.body(), ticket.signature())) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "audit ticket signature does not verify with the "
                                                           "tracker's key");
  }
  pb::AuditBody audit;
  if (ticket.body().size() > static_cast<size_t>(INT_MAX) || !audit.ParseFromString(ticket.body())) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "audit ticket body does not parse");
  }
  if (audit.node_id() != options_.node_id) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "audit ticket is for node " + audit.node_id() + ", not " + options_.node_id);
  }
  if (NowUnixMs() > audit.expires_unix_ms()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "audit ticket has expired");
  }
  if (request->count() == 0 || request->count() > kMaxAuditPositions) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "count must be 1.." + std::to_string(kMaxAuditPositions));
  }
  if (options_.node_key.size() != 32) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this worker has no node key to sign commitments with");
  }
  CommitmentRecord record;
  uint32_t got = 0;
  if (!commitments_.Read({audit.session_id(), audit.epoch()}, request->start(), request->count(), &record, &got)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no commitments held for session " + audit.session_id() +
                                                         " epoch " + std::to_string(audit.epoch()));
  }
  pb::CommitmentsBody body;
  body.set_node_id(options_.node_id);
  body.set_session_id(audit.session_id());
  body.set_epoch(audit.epoch());
  body.set_layer_start(identity_.layer_start);
  body.set_layer_end(identity_.layer_end);
  body.set_k(kCommitmentK);
  body.set_start(request->start());
  body.set_count(got);
  if (scheduler_->first()) body.set_input_tokens(LittleEndian(record.input_tokens));
  if (!scheduler_->first()) {
    body.set_input_indices(LittleEndian(record.input_indices));
    body.set_input_values(LittleEndian(record.input_values));
  }
  if (!scheduler_->last()) {
    body.set_output_indices(LittleEndian(record.output_indices));
    body.set_output_values(LittleEndian(record.output_values));
  } else {
    body.set_sampled_tokens(LittleEndian(record.sampled_tokens));
    body.set_sampled_logits(LittleEndian(record.sampled_logits));
    body.set_temperature(record.temperature);
    body.set_constrained(record.constrained);
  }
  std::string bytes;
  body.SerializeToString(&bytes);
  std::string signature = protocol::SignEd25519(options_.node_key, protocol::kCommitmentsContext, bytes);
  if (signature.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, "signing the commitments failed");
  protocol::ToProto(protocol::OkStatus(), reply->mutable_status());
  reply->set_body(std::move(bytes));
  reply->set_signature(std::move(signature));
  return grpc::Status::OK;
}

}  // namespace meshnet::worker
