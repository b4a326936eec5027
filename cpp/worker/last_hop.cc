#include "cpp/worker/last_hop.h"

#include <algorithm>
#include <string>
#include <utility>

namespace meshnet::worker {

engine::Sampler& LastHop::sampler() {
  if (sampler_ == nullptr) sampler_ = std::make_unique<engine::Sampler>(protocol::SamplingParams());
  return *sampler_;
}

protocol::Status LastHop::Configure(const protocol::SeamFrame& frame) {
  if (!frame.sampling.has_value()) return protocol::OkStatus();
  const size_t replayed = frame.sampling->grammar_tokens.size();
  if (replayed > static_cast<size_t>(hop_.scheduler->n_ctx_per_session())) {
    return protocol::InvalidArgumentError("sampling: " + std::to_string(replayed) +
                                          " grammar tokens, more than a session's KV holds");
  }
  std::string error;
  std::unique_ptr<engine::Sampler> made =
      engine::Sampler::Make(*frame.sampling, hop_.scheduler->vocab(), &error, hop_.options->sampling_budget);
  if (made == nullptr) return protocol::InvalidArgumentError("sampling: " + error);
  sampler_ = std::move(made);
  return protocol::OkStatus();
}

uint32_t LastHop::Draw(const float* row, size_t n_vocab) {
  engine::Sampler& chooser = sampler();
  if (!chooser.constrained() || hop_.draw_threads == nullptr) return chooser.Choose(row, n_vocab);
  uint32_t token = engine::kNoToken;
  // Run returns once the draw is done: the references stay valid.
  if (hop_.draw_threads->Run([&] { token = chooser.Choose(row, n_vocab); }, heavy_)) heavy_ = true;
  return token;
}

Sampled LastHop::Accept(const protocol::SeamFrame& frame, const std::vector<float>& logits) {
  engine::Sampler& chooser = sampler();
  const protocol::SamplingParams& params = chooser.params();
  const auto& stops = params.stop_token_ids;
  const auto& drafts = frame.draft_token_ids;
  const size_t rows = drafts.empty() ? 1 : drafts.size() + 1;  // rows with logits
  const size_t n_vocab = static_cast<size_t>(hop_.scheduler->n_vocab());
  const uint64_t room = static_cast<uint64_t>(hop_.scheduler->n_ctx_per_session());
  const uint64_t end = frame.span->start + frame.span->count;
  Sampled out;
  for (size_t r = 0; r < rows && out.finish == protocol::FinishReason::kUnspecified; ++r) {
    const uint64_t position = end - rows + r + 1;  // row r's logits give the token after it
    const uint32_t token = Draw(logits.data() + r * n_vocab, n_vocab);
    if (token == engine::kNoToken) {
      const std::string why = "constrained sampling at position " + std::to_string(position) + ": " + chooser.error();
      out.status = chooser.over_budget() ? protocol::MakeError(protocol::Code::kResourceExhausted, why)
                                         : protocol::InvalidArgumentError(why);
      break;
    }
    out.tokens.push_back({token, position, r});
    ++generated_;
    if (std::count(stops.begin(), stops.end(), token)) {
      out.finish = protocol::FinishReason::kStop;
    } else if ((params.max_tokens > 0 && generated_ >= params.max_tokens) || position + 1 > room) {
      // Ring or not, the tokens end here (a ring stops ringing); the client releases.
      out.finish = protocol::FinishReason::kLength;
    }
    if (r < drafts.size() && drafts[r] != token) break;  // the next row's input was a bad draft
  }
  if (!drafts.empty() && !out.tokens.empty()) {
    hop_.counters->accepted_drafts.fetch_add(out.tokens.size() - 1);
  }
  return out;
}

void LastHop::Commit(const SessionKey& key, const std::vector<float>& logits, Sampled* sampled) {
  const size_t n_vocab = static_cast<size_t>(hop_.scheduler->n_vocab());
  const float temperature = sampler().params().temperature;
  const bool constrained = sampler().constrained();
  for (Sampled::Token& token : sampled->tokens) {
    if (hop_.options->cheat != nullptr) token.id = hop_.options->cheat->Token(token.id, n_vocab);
    if (hop_.commitments != nullptr) {
      hop_.commitments->Sampled(key, static_cast<uint32_t>(token.position - 1),
                                static_cast<int32_t>(token.id), logits[token.row * n_vocab + token.id],
                                temperature, constrained);
    }
  }
}

void LastHop::Publish(const protocol::SeamFrame& frame, const std::vector<float>& logits,
                      const Sampled& sampled) {
  const size_t n_vocab = static_cast<size_t>(hop_.scheduler->n_vocab());
  const engine::Sampler& describer = sampler();
  for (size_t i = 0; i < sampled.tokens.size(); ++i) {
    const Sampled::Token& token = sampled.tokens[i];
    protocol::ResultFrame result;
    result.version = protocol::CurrentVersion();
    result.session = frame.session;
    result.step = frame.step;
    result.tokens.push_back(
        describer.Describe(logits.data() + token.row * n_vocab, n_vocab, token.id, token.position));
    if (i + 1 == sampled.tokens.size()) result.finish_reason = sampled.finish;
    result.status = protocol::OkStatus();
    hop_.results->Push({frame.session->session_id, frame.session->epoch}, std::move(result), false);
  }
}

protocol::Status LastHop::Ring(SessionLink& link, const protocol::SeamFrame& frame, uint32_t token,
                               uint64_t position, const StepDeadline& deadline) {
  if (!ring_hop_.has_value()) {
    return protocol::InvalidArgumentError(
        "ring decode asked, but the session's first frame carried no first hop's ticket");
  }
  const bool opening = ring_ == nullptr;
  if (opening) {
    const ServiceOptions& options = *hop_.options;
    std::shared_ptr<SeamCall> upstream = link.upstream;
    protocol::Status opened = Downstream::Open(
        *ring_hop_, DownstreamCredentials{options.insecure, link.ticket.downstream_tls_certificate},
        std::min(deadline.deadline(), Clock::now() + options.connect_timeout),
        [upstream] { return upstream->Abandoned(); }, link.ReportUpstream(), &ring_);
    if (!opened.ok()) return opened;
  }
  protocol::SeamFrame next;
  next.version = protocol::CurrentVersion();
  next.session = frame.session;  // no range: the first hop's comes from its ticket
  next.phase = protocol::Phase::kDecode;
  next.span = protocol::TokenSpan{position, 1};  // before the step's end: drafts were rejected
  next.step = frame.step + 1;
  next.token_ids = {token};
  next.ring = true;
  if (opening) next.ticket = ring_hop_->ticket;  // binds the ring stream on the first hop
  if (!ring_->Send(next)) {
    protocol::Status lost = protocol::MakeError(
        protocol::Code::kUnavailable, "ring to first hop " + ring_hop_->node_id + " lost", true);
    lost.hop = ring_hop_->node_id;
    return lost;
  }
  return protocol::OkStatus();
}

}  // namespace meshnet::worker
