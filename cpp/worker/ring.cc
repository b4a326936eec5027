// The last hop's side of a step and the ring (docs/adr/0005-ring-decode.md): choosing tokens
// (with speculation, row by row against the drafts), publishing them to Results, and sending the
// next decode step to the first hop; and the first hop's side: admitting ring steps on the ring
// stream, and drafting by prompt lookup. Member functions of ShardService (service.h); the RPC
// handlers and the step itself are in service.cc.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpp/worker/service.h"
#include "cpp/worker/service_state.h"

namespace meshnet::worker {

std::optional<protocol::SeamReply> ShardService::HandleRing(const protocol::SeamFrame& frame,
                                                            const std::shared_ptr<Stream>& stream,
                                                            Clock::time_point received) {
  const SessionKey key{frame.session->session_id, frame.session->epoch};
  std::shared_ptr<Live> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(key);
    if (it != live_.end()) live = it->second;
  }
  const Status gone = MakeError(Code::kNotFound, "ring step for a session not open on this hop");
  if (live == nullptr) return Reply(frame, gone);
  std::lock_guard<std::mutex> lock(live->mu);
  if (live->ended) return Reply(frame, gone);
  if (live->ring_stream != stream->id) {
    if (live->ring_stream != 0) {
      return Reply(frame, MakeError(Code::kPermissionDenied, "session already has a ring stream"));
    }
    protocol::Ticket ticket;  // this hop's own ticket for the session, as the client presented
    Status admitted = CheckTicket(frame.ticket, *frame.session, identity_, NowUnixMs(), &ticket);
    if (!admitted.ok()) return Reply(frame, admitted);
    live->ring_stream = stream->id;
    stream->authenticated = true;
  }
  if (frame.range.has_value()) {
    Status range = CheckEffectiveStart(*frame.range, identity_);
    if (!range.ok()) return Reply(frame, range);
  }
  const std::optional<uint64_t> holder = table_.Stream(key);
  if (!holder.has_value()) return Reply(frame, gone);
  SessionInfo info;
  Status opened = table_.Open(key, *holder, Clock::now(), &info);
  if (!opened.ok()) return Reply(frame, opened);
  Status older;
  std::optional<protocol::SeamReply> replayed = table_.Replay(key, frame.step, &older);
  if (replayed.has_value()) return replayed;
  if (!older.ok()) return Reply(frame, older);
  return Step(key, info, *live, frame, received);
}

Status ShardService::CheckDrafts(const protocol::SeamFrame& frame) const {
  const auto& drafts = frame.draft_token_ids;
  if (!frame.ring || frame.phase != Phase::kDecode || drafts.size() > kMaxDraftTokens ||
      drafts.size() + 1 != frame.span->count) {
    return protocol::InvalidArgumentError(
        std::to_string(drafts.size()) + " drafted tokens for a span of " +
        std::to_string(frame.span->count) + " (a ring decode step drafts at most " +
        std::to_string(kMaxDraftTokens) + ", one fewer than its span)");
  }
  for (uint32_t token : drafts) {
    if (token >= static_cast<uint32_t>(scheduler_->n_vocab())) {
      return protocol::InvalidArgumentError("drafted token id " + std::to_string(token) +
                                            " is outside the vocabulary");
    }
  }
  return OkStatus();
}

std::optional<protocol::SeamFrame> ShardService::Draft(Live& live, const protocol::SeamFrame& in) {
  const uint64_t start = in.span->start, count = in.span->count;
  if (in.phase == Phase::kPrefill && start == 0) {
    live.drafts = DraftBudget(in.ring ? std::min<uint32_t>(in.draft_max, kMaxDraftTokens) : 0);
    live.max_tokens = in.sampling.has_value() ? in.sampling->max_tokens : 0;
    live.prompt_length = count;
    live.last_drafted = 0;
  }
  if (live.drafts.max() == 0) return std::nullopt;  // no speculation: no token history either
  live.history.resize(std::min<uint64_t>(start, live.history.size()));
  live.history.insert(live.history.end(), in.token_ids.begin(), in.token_ids.end());
  if (!in.ring || in.phase != Phase::kDecode || count != 1) return std::nullopt;
  if (live.last_drafted > 0 && start > live.last_start) {
    live.drafts.Record(live.last_drafted, static_cast<uint32_t>(start - live.last_start - 1));
  }
  live.last_drafted = 0;
  uint64_t k = live.drafts.Next();
  // Room in the KV, and no more tokens than the session still wants (the step emits up to k+1).
  const uint64_t room = static_cast<uint64_t>(scheduler_->n_ctx_per_session());
  k = std::min(k, room > start + 1 ? room - start - 1 : 0);
  if (live.max_tokens > 0) {
    const uint64_t emitted = start + 1 > live.prompt_length ? start + 1 - live.prompt_length : 0;
    k = std::min(k, live.max_tokens > emitted + 1 ? live.max_tokens - emitted - 1 : 0);
  }
  if (k == 0) return std::nullopt;
  std::vector<int32_t> drafts = PromptLookupDraft(live.history, static_cast<uint32_t>(k));
  if (drafts.empty()) return std::nullopt;
  live.last_drafted = static_cast<uint32_t>(drafts.size());
  drafted_tokens_.fetch_add(drafts.size());
  live.history.insert(live.history.end(), drafts.begin(), drafts.end());
  protocol::SeamFrame out = in;
  out.span->count = 1 + drafts.size();
  out.token_ids.insert(out.token_ids.end(), drafts.begin(), drafts.end());
  out.draft_token_ids.assign(drafts.begin(), drafts.end());
  return out;
}

ShardService::Sampled ShardService::Accept(Live& live, const protocol::SeamFrame& frame,
                                           const std::vector<float>& logits) {
  if (live.sampler == nullptr) {
    live.sampler = std::make_unique<engine::Sampler>(protocol::SamplingParams());
  }
  const protocol::SamplingParams& params = live.sampler->params();
  const auto& stops = params.stop_token_ids;
  const auto& drafts = frame.draft_token_ids;
  const size_t rows = drafts.empty() ? 1 : drafts.size() + 1;  // rows with logits
  const size_t n_vocab = static_cast<size_t>(scheduler_->n_vocab());
  const uint64_t end = frame.span->start + frame.span->count;
  Sampled out;
  for (size_t r = 0; r < rows && out.finish == FinishReason::kUnspecified; ++r) {
    const uint64_t position = end - rows + r + 1;  // row r's logits give the token after it
    const uint32_t token = live.sampler->Choose(logits.data() + r * n_vocab, n_vocab);
    out.tokens.push_back({token, position, r});
    ++live.generated;
    if (std::count(stops.begin(), stops.end(), token)) {
      out.finish = FinishReason::kStop;
    } else if (frame.ring && ((params.max_tokens > 0 && live.generated >= params.max_tokens) ||
                              position + 1 > static_cast<uint64_t>(scheduler_->n_ctx_per_session()))) {
      out.finish = FinishReason::kLength;  // the ring ends here; the client releases
    }
    if (r < drafts.size() && drafts[r] != token) break;  // the next row's input was a bad draft
  }
  if (!drafts.empty()) accepted_drafts_.fetch_add(out.tokens.size() - 1);
  return out;
}

void ShardService::Publish(Live& live, const protocol::SeamFrame& frame,
                           const std::vector<float>& logits, const Sampled& sampled) {
  const size_t n_vocab = static_cast<size_t>(scheduler_->n_vocab());
  for (size_t i = 0; i < sampled.tokens.size(); ++i) {
    const Sampled::Token& token = sampled.tokens[i];
    protocol::ResultFrame result;
    result.version = protocol::CurrentVersion();
    result.session = frame.session;
    result.step = frame.step;
    result.tokens.push_back(live.sampler->Describe(logits.data() + token.row * n_vocab, n_vocab,
                                                   token.id, token.position));
    if (i + 1 == sampled.tokens.size()) result.finish_reason = sampled.finish;
    result.status = OkStatus();
    results_.Push({frame.session->session_id, frame.session->epoch}, std::move(result), false);
  }
}

Status ShardService::Ring(Live& live, const protocol::SeamFrame& frame, uint32_t token,
                          uint64_t position, const StepDeadline& deadline) {
  if (!live.ring_hop.has_value()) {
    return protocol::InvalidArgumentError(
        "ring decode asked, but the session's first frame named no first hop to ring to");
  }
  const bool opening = live.ring == nullptr;
  if (opening) {
    std::shared_ptr<Stream> upstream = live.upstream;
    Status opened = Downstream::Open(
        *live.ring_hop,
        DownstreamCredentials{options_.insecure, live.ticket.downstream_tls_certificate},
        std::min(deadline.deadline(), Clock::now() + options_.connect_timeout),
        [upstream] { return upstream->context->IsCancelled(); }, ReportUpstream(live),
        &live.ring);
    if (!opened.ok()) return opened;
  }
  protocol::SeamFrame next;
  next.version = protocol::CurrentVersion();
  next.work_id = "ring";
  next.session = frame.session;
  next.fingerprints = frame.fingerprints;
  next.range = live.ring_hop->range;
  next.phase = Phase::kDecode;
  next.span = protocol::TokenSpan{position, 1};  // before the step's end: drafts were rejected
  next.step = frame.step + 1;
  next.token_ids = {token};
  next.expected_cache = protocol::CacheState{position};
  next.ring = true;
  if (opening) next.ticket = live.ring_hop->ticket;  // binds the ring stream on the first hop
  if (!live.ring->Send(next)) {
    Status lost = MakeError(Code::kUnavailable,
                            "ring to first hop " + live.ring_hop->node_id + " lost", true);
    lost.hop = live.ring_hop->node_id;
    return lost;
  }
  return OkStatus();
}

}  // namespace meshnet::worker
