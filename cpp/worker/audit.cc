// Audits (docs/adr/0008-verified-outputs.md): the Commitments RPC, the last hop's token
// commitments, and the test-only cheats that audits are shown to catch.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>

#include "cpp/worker/service.h"
#include "cpp/worker/service_state.h"

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

void ShardService::CommitSampled(const SessionKey& key, const Live& live, const std::vector<float>& logits,
                                 Sampled* sampled) {
  const size_t n_vocab = static_cast<size_t>(scheduler_->n_vocab());
  const float temperature = live.sampler ? live.sampler->params().temperature : 0.0f;
  for (Sampled::Token& token : sampled->tokens) {
    if (options_.cheat.mode == ServiceOptions::Cheat::Mode::kForgeTokens) {
      token.id = static_cast<uint32_t>((token.id + 1) % n_vocab);  // test only: a forged token
    }
    if (options_.record_commitments) {
      commitments_.Sampled(key, static_cast<uint32_t>(token.position - 1), static_cast<int32_t>(token.id),
                           logits[token.row * n_vocab + token.id], temperature);
    }
  }
}

void ShardService::CheatOnRows(std::vector<float>* rows, uint64_t start) {
  using Mode = ServiceOptions::Cheat::Mode;
  if (options_.cheat.mode != Mode::kNoise && options_.cheat.mode != Mode::kGarbage) return;
  const size_t n_embd = static_cast<size_t>(scheduler_->n_embd());
  std::mt19937_64 rng(0x6d657368ULL ^ start);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t r = 0; r * n_embd < rows->size(); ++r) {
    float* row = rows->data() + r * n_embd;
    double sum = 0;
    for (size_t i = 0; i < n_embd; ++i) sum += double(row[i]) * row[i];
    const float rms = static_cast<float>(std::sqrt(sum / double(n_embd)));
    for (size_t i = 0; i < n_embd; ++i) {
      row[i] = options_.cheat.mode == Mode::kGarbage ? normal(rng) * rms
                                                     : row[i] + normal(rng) * rms * options_.cheat.noise;
    }
  }
}

}  // namespace meshnet::worker
