#include "cpp/protocol/seam.h"

#include <climits>
#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace pb = ::meshnet::shard::v1;
namespace {

// Sets *out to the native form of a sub-message, or nullopt when it is absent.
template <typename Native, typename Proto>
void OptionalFromProto(bool present, const Proto& in, std::optional<Native>* out) {
  out->reset();
  if (present) FromProto(in, &out->emplace());
}

void OptionalStatusFromProto(bool present, const pb::Status& in, std::optional<Status>* out) {
  out->reset();
  if (present) *out = FromProto(in);
}

std::string SerializeDeterministic(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }  // the coded stream trims `out` to the bytes written when it goes away
  return out;
}

Status ParseBytes(std::string_view bytes, const char* what, google::protobuf::MessageLite* out) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return InvalidArgumentError(std::string(what) + " of " + std::to_string(bytes.size()) +
                                " bytes is too large to parse");
  }
  if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return InvalidArgumentError(std::string("malformed ") + what + " (" +
                                std::to_string(bytes.size()) + " bytes do not parse)");
  }
  return OkStatus();
}

// A frame's version: absent is INVALID_ARGUMENT unless `optional`, another major is
// VERSION_MISMATCH (not retryable); every minor of major 1 is accepted.
Status CheckVersion(bool present, const pb::ProtocolVersion& version, const char* what,
                    bool optional) {
  if (!present) {
    return optional ? OkStatus()
                    : InvalidArgumentError(std::string(what) + " has no protocol version");
  }
  if (version.major() != kProtocolMajor) {
    return VersionMismatchError(std::string(what) + " speaks protocol " +
                                std::to_string(version.major()) + "." +
                                std::to_string(version.minor()) + ", this peer speaks " +
                                std::to_string(kProtocolMajor) + ".x");
  }
  return OkStatus();
}

}  // namespace

// ---- native -> proto --------------------------------------------------------------------

void ToProto(const ProtocolVersion& in, pb::ProtocolVersion* out) {
  out->Clear();
  out->set_major(in.major);
  out->set_minor(in.minor);
}

void ToProto(const RouteSession& in, pb::RouteSession* out) {
  out->Clear();
  out->set_session_id(in.session_id);
  out->set_epoch(in.epoch);
}

void ToProto(const Fingerprints& in, pb::Fingerprints* out) {
  out->Clear();
  out->set_model_artifact(in.model_artifact);
  out->set_runtime_recipe(in.runtime_recipe);
}

void ToProto(const ShardRange& in, pb::ShardRange* out) {
  out->Clear();
  out->set_layer_start(in.layer_start);
  out->set_layer_end(in.layer_end);
  out->set_effective_start(in.effective_start);
}

void ToProto(const TokenSpan& in, pb::TokenSpan* out) {
  out->Clear();
  out->set_start(in.start);
  out->set_count(in.count);
}

void ToProto(const CacheState& in, pb::CacheState* out) {
  out->Clear();
  out->set_length(in.length);
}

void ToProto(const SamplingParams& in, pb::SamplingParams* out) {
  out->Clear();
  out->set_temperature(in.temperature);
  out->set_top_k(in.top_k);
  out->set_top_p(in.top_p);
  out->set_seed(in.seed);
  out->set_max_tokens(in.max_tokens);
  out->mutable_stop_token_ids()->Add(in.stop_token_ids.begin(), in.stop_token_ids.end());
  out->set_top_logprobs(in.top_logprobs);
  out->set_grammar(in.grammar);
  out->mutable_grammar_tokens()->Add(in.grammar_tokens.begin(), in.grammar_tokens.end());
}

void ToProto(const TokenLogprob& in, pb::TokenLogprob* out) {
  out->Clear();
  out->set_token_id(in.token_id);
  out->set_logprob(in.logprob);
}

void ToProto(const SampledToken& in, pb::SampledToken* out) {
  out->Clear();
  out->set_token_id(in.token_id);
  out->set_position(in.position);
  out->set_logprob(in.logprob);
  for (const TokenLogprob& top : in.top) ToProto(top, out->add_top());
}

void ToProto(const RouteTicket& in, pb::RouteTicket* out) {
  out->Clear();
  out->set_body(in.body);
  out->set_signature(in.signature);
}

void ToProto(const DownstreamHop& in, pb::DownstreamHop* out) {
  out->Clear();
  out->set_node_id(in.node_id);
  out->set_address(in.address);
  if (in.range) ToProto(*in.range, out->mutable_range());
  if (in.ticket) ToProto(*in.ticket, out->mutable_ticket());
}

void ToProto(const SeamFrame& in, pb::SeamFrame* out) {
  out->Clear();
  if (in.version) ToProto(*in.version, out->mutable_version());
  out->set_work_id(in.work_id);
  if (in.session) ToProto(*in.session, out->mutable_session());
  if (in.fingerprints) ToProto(*in.fingerprints, out->mutable_fingerprints());
  if (in.range) ToProto(*in.range, out->mutable_range());
  out->set_phase(static_cast<pb::Phase>(in.phase));
  if (in.span) ToProto(*in.span, out->mutable_span());
  out->set_step(in.step);
  out->mutable_token_ids()->Add(in.token_ids.begin(), in.token_ids.end());
  if (in.expected_cache) ToProto(*in.expected_cache, out->mutable_expected_cache());
  out->set_budget_ms(in.budget_ms);
  if (in.sampling) ToProto(*in.sampling, out->mutable_sampling());
  if (in.fragment) ToProto(*in.fragment, out->mutable_fragment());
  for (const DownstreamHop& hop : in.downstream) ToProto(hop, out->add_downstream());
  if (in.ticket) ToProto(*in.ticket, out->mutable_ticket());
  out->set_ring(in.ring);
  out->set_draft_max(in.draft_max);
  out->mutable_draft_token_ids()->Add(in.draft_token_ids.begin(), in.draft_token_ids.end());
}

void ToProto(const SeamReply& in, pb::SeamReply* out) {
  out->Clear();
  if (in.version) ToProto(*in.version, out->mutable_version());
  if (in.session) ToProto(*in.session, out->mutable_session());
  out->set_step(in.step);
  out->set_credits(in.credits);
  if (in.cache) ToProto(*in.cache, out->mutable_cache());
  if (in.status) ToProto(*in.status, out->mutable_status());
  out->set_replayed(in.replayed);
}

void ToProto(const ResultFrame& in, pb::ResultFrame* out) {
  out->Clear();
  if (in.version) ToProto(*in.version, out->mutable_version());
  if (in.session) ToProto(*in.session, out->mutable_session());
  out->set_step(in.step);
  for (const SampledToken& token : in.tokens) ToProto(token, out->add_tokens());
  out->set_finish_reason(static_cast<pb::FinishReason>(in.finish_reason));
  if (in.status) ToProto(*in.status, out->mutable_status());
}

void ToProto(const ResultsRequest& in, pb::ResultsRequest* out) {
  out->Clear();
  if (in.version) ToProto(*in.version, out->mutable_version());
  if (in.session) ToProto(*in.session, out->mutable_session());
  if (in.ticket) ToProto(*in.ticket, out->mutable_ticket());
  out->set_client_signature(in.client_signature);
}

void ToProto(const HelloRequest& in, pb::HelloRequest* out) {
  out->Clear();
  for (const ProtocolVersion& v : in.supported_versions) ToProto(v, out->add_supported_versions());
  for (const std::string& feature : in.features) out->add_features(feature);
  out->set_peer_id(in.peer_id);
}

void ToProto(const HelloReply& in, pb::HelloReply* out) {
  out->Clear();
  if (in.chosen_version) ToProto(*in.chosen_version, out->mutable_chosen_version());
  for (const std::string& feature : in.features) out->add_features(feature);
  out->set_peer_id(in.peer_id);
  if (in.status) ToProto(*in.status, out->mutable_status());
}

// ---- proto -> native --------------------------------------------------------------------

void FromProto(const pb::ProtocolVersion& in, ProtocolVersion* out) {
  *out = ProtocolVersion{in.major(), in.minor()};
}

void FromProto(const pb::RouteSession& in, RouteSession* out) {
  *out = RouteSession{in.session_id(), in.epoch()};
}

void FromProto(const pb::Fingerprints& in, Fingerprints* out) {
  *out = Fingerprints{in.model_artifact(), in.runtime_recipe()};
}

void FromProto(const pb::ShardRange& in, ShardRange* out) {
  *out = ShardRange{in.layer_start(), in.layer_end(), in.effective_start()};
}

void FromProto(const pb::TokenSpan& in, TokenSpan* out) {
  *out = TokenSpan{in.start(), in.count()};
}

void FromProto(const pb::CacheState& in, CacheState* out) { *out = CacheState{in.length()}; }

void FromProto(const pb::SamplingParams& in, SamplingParams* out) {
  out->temperature = in.temperature();
  out->top_k = in.top_k();
  out->top_p = in.top_p();
  out->seed = in.seed();
  out->max_tokens = in.max_tokens();
  out->stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  out->top_logprobs = in.top_logprobs();
  out->grammar = in.grammar();
  out->grammar_tokens.assign(in.grammar_tokens().begin(), in.grammar_tokens().end());
}

void FromProto(const pb::TokenLogprob& in, TokenLogprob* out) {
  *out = TokenLogprob{in.token_id(), in.logprob()};
}

void FromProto(const pb::SampledToken& in, SampledToken* out) {
  out->token_id = in.token_id();
  out->position = in.position();
  out->logprob = in.logprob();
  out->top.resize(in.top_size());
  for (int i = 0; i < in.top_size(); ++i) FromProto(in.top(i), &out->top[i]);
}

void FromProto(const pb::RouteTicket& in, RouteTicket* out) {
  *out = RouteTicket{in.body(), in.signature()};
}

void FromProto(const pb::DownstreamHop& in, DownstreamHop* out) {
  out->node_id = in.node_id();
  out->address = in.address();
  OptionalFromProto(in.has_range(), in.range(), &out->range);
  OptionalFromProto(in.has_ticket(), in.ticket(), &out->ticket);
}

void FromProto(const pb::SeamFrame& in, SeamFrame* out) {
  OptionalFromProto(in.has_version(), in.version(), &out->version);
  out->work_id = in.work_id();
  OptionalFromProto(in.has_session(), in.session(), &out->session);
  OptionalFromProto(in.has_fingerprints(), in.fingerprints(), &out->fingerprints);
  OptionalFromProto(in.has_range(), in.range(), &out->range);
  out->phase = static_cast<Phase>(in.phase());
  OptionalFromProto(in.has_span(), in.span(), &out->span);
  out->step = in.step();
  out->token_ids.assign(in.token_ids().begin(), in.token_ids().end());
  OptionalFromProto(in.has_expected_cache(), in.expected_cache(), &out->expected_cache);
  out->budget_ms = in.budget_ms();
  OptionalFromProto(in.has_sampling(), in.sampling(), &out->sampling);
  OptionalFromProto(in.has_fragment(), in.fragment(), &out->fragment);
  out->downstream.resize(in.downstream_size());
  for (int i = 0; i < in.downstream_size(); ++i) FromProto(in.downstream(i), &out->downstream[i]);
  OptionalFromProto(in.has_ticket(), in.ticket(), &out->ticket);
  out->ring = in.ring();
  out->draft_max = in.draft_max();
  out->draft_token_ids.assign(in.draft_token_ids().begin(), in.draft_token_ids().end());
}

void FromProto(const pb::SeamReply& in, SeamReply* out) {
  OptionalFromProto(in.has_version(), in.version(), &out->version);
  OptionalFromProto(in.has_session(), in.session(), &out->session);
  out->step = in.step();
  out->credits = in.credits();
  OptionalFromProto(in.has_cache(), in.cache(), &out->cache);
  OptionalStatusFromProto(in.has_status(), in.status(), &out->status);
  out->replayed = in.replayed();
}

void FromProto(const pb::ResultFrame& in, ResultFrame* out) {
  OptionalFromProto(in.has_version(), in.version(), &out->version);
  OptionalFromProto(in.has_session(), in.session(), &out->session);
  out->step = in.step();
  out->tokens.resize(in.tokens_size());
  for (int i = 0; i < in.tokens_size(); ++i) FromProto(in.tokens(i), &out->tokens[i]);
  out->finish_reason = static_cast<FinishReason>(in.finish_reason());
  OptionalStatusFromProto(in.has_status(), in.status(), &out->status);
}

void FromProto(const pb::ResultsRequest& in, ResultsRequest* out) {
  OptionalFromProto(in.has_version(), in.version(), &out->version);
  OptionalFromProto(in.has_session(), in.session(), &out->session);
  OptionalFromProto(in.has_ticket(), in.ticket(), &out->ticket);
  out->client_signature = in.client_signature();
}

void FromProto(const pb::HelloRequest& in, HelloRequest* out) {
  out->supported_versions.resize(in.supported_versions_size());
  for (int i = 0; i < in.supported_versions_size(); ++i) {
    FromProto(in.supported_versions(i), &out->supported_versions[i]);
  }
  out->features.assign(in.features().begin(), in.features().end());
  out->peer_id = in.peer_id();
}

void FromProto(const pb::HelloReply& in, HelloReply* out) {
  OptionalFromProto(in.has_chosen_version(), in.chosen_version(), &out->chosen_version);
  out->features.assign(in.features().begin(), in.features().end());
  out->peer_id = in.peer_id();
  OptionalStatusFromProto(in.has_status(), in.status(), &out->status);
}

// ---- wire codecs ------------------------------------------------------------------------

Status DecodeSeamFrame(std::string_view bytes, SeamFrame* out) {
  pb::SeamFrame proto;
  Status status = ParseBytes(bytes, "SeamFrame", &proto);
  if (status.ok()) status = CheckVersion(proto.has_version(), proto.version(), "SeamFrame", false);
  if (status.ok()) FromProto(proto, out);
  return status;
}

Status DecodeSeamReply(std::string_view bytes, SeamReply* out) {
  pb::SeamReply proto;
  Status status = ParseBytes(bytes, "SeamReply", &proto);
  if (status.ok()) status = CheckVersion(proto.has_version(), proto.version(), "SeamReply", false);
  if (status.ok()) FromProto(proto, out);
  return status;
}

Status DecodeResultFrame(std::string_view bytes, ResultFrame* out) {
  pb::ResultFrame proto;
  Status status = ParseBytes(bytes, "ResultFrame", &proto);
  if (status.ok()) {
    status = CheckVersion(proto.has_version(), proto.version(), "ResultFrame", false);
  }
  if (status.ok()) FromProto(proto, out);
  return status;
}

Status DecodeResultsRequest(std::string_view bytes, ResultsRequest* out) {
  pb::ResultsRequest proto;
  Status status = ParseBytes(bytes, "ResultsRequest", &proto);
  if (status.ok()) {
    status = CheckVersion(proto.has_version(), proto.version(), "ResultsRequest", false);
  }
  if (status.ok()) FromProto(proto, out);
  return status;
}

Status DecodeHelloRequest(std::string_view bytes, HelloRequest* out) {
  pb::HelloRequest proto;
  Status status = ParseBytes(bytes, "HelloRequest", &proto);
  if (status.ok()) FromProto(proto, out);
  return status;
}

Status DecodeHelloReply(std::string_view bytes, HelloReply* out) {
  pb::HelloReply proto;
  Status status = ParseBytes(bytes, "HelloReply", &proto);
  if (status.ok()) {
    status = CheckVersion(proto.has_chosen_version(), proto.chosen_version(), "HelloReply", true);
  }
  if (status.ok()) FromProto(proto, out);
  return status;
}

std::string EncodeSeamFrame(const SeamFrame& frame) {
  pb::SeamFrame proto;
  ToProto(frame, &proto);
  return SerializeDeterministic(proto);
}

std::string EncodeSeamReply(const SeamReply& reply) {
  pb::SeamReply proto;
  ToProto(reply, &proto);
  return SerializeDeterministic(proto);
}

std::string EncodeResultFrame(const ResultFrame& frame) {
  pb::ResultFrame proto;
  ToProto(frame, &proto);
  return SerializeDeterministic(proto);
}

std::string EncodeResultsRequest(const ResultsRequest& request) {
  pb::ResultsRequest proto;
  ToProto(request, &proto);
  return SerializeDeterministic(proto);
}

std::string EncodeHelloRequest(const HelloRequest& request) {
  pb::HelloRequest proto;
  ToProto(request, &proto);
  return SerializeDeterministic(proto);
}

std::string EncodeHelloReply(const HelloReply& reply) {
  pb::HelloReply proto;
  ToProto(reply, &proto);
  return SerializeDeterministic(proto);
}

}  // namespace meshnet::protocol
