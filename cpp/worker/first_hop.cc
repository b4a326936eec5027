#include "cpp/worker/first_hop.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace meshnet::worker {

protocol::Status FirstHop::CheckTokens(const protocol::SeamFrame& frame) const {
  if (frame.token_ids.size() != frame.span->count) {
    return protocol::InvalidArgumentError(std::to_string(frame.token_ids.size()) +
                                          " token ids for a span of " +
                                          std::to_string(frame.span->count));
  }
  for (uint32_t token : frame.token_ids) {
    if (token >= static_cast<uint32_t>(hop_.scheduler->n_vocab())) {
      return protocol::InvalidArgumentError("token id " + std::to_string(token) +
                                            " is outside the vocabulary");
    }
  }
  return protocol::OkStatus();
}

std::optional<protocol::SeamFrame> FirstHop::Draft(const protocol::SeamFrame& in,
                                                   uint64_t last_start) {
  using protocol::Phase;
  const uint64_t start = in.span->start, count = in.span->count;
  if (in.phase == Phase::kPrefill && start == 0) {
    drafts_ = DraftBudget(in.ring ? std::min<uint32_t>(in.draft_max, kMaxDraftTokens) : 0);
    max_tokens_ = in.sampling.has_value() ? in.sampling->max_tokens : 0;
    prompt_length_ = count;
    last_drafted_ = 0;
    last_step_at_.reset();
  }
  if (drafts_.max() == 0) return std::nullopt;  // no speculation: no token history either
  history_.resize(std::min<uint64_t>(start, history_.size()));
  history_.insert(history_.end(), in.token_ids.begin(), in.token_ids.end());
  if (!in.ring || in.phase != Phase::kDecode || count != 1) return std::nullopt;
  // The ring came round: the previous step (1 + its drafts rows) cost the time since it started.
  const auto now = std::chrono::steady_clock::now();
  if (last_step_at_.has_value() && start > last_start) {
    drafts_.RecordStep(1 + last_drafted_,
                       std::chrono::duration<double, std::micro>(now - *last_step_at_).count());
  }
  last_step_at_ = now;
  if (last_drafted_ > 0 && start > last_start) {
    drafts_.Record(last_drafted_, static_cast<uint32_t>(start - last_start - 1));
  }
  last_drafted_ = 0;
  uint64_t k = drafts_.Next();
  // Room in the KV, and no more tokens than the session still wants (the step emits up to k+1).
  const uint64_t room = static_cast<uint64_t>(hop_.scheduler->n_ctx_per_session());
  k = std::min(k, room > start + 1 ? room - start - 1 : 0);
  if (max_tokens_ > 0) {
    const uint64_t emitted = start + 1 > prompt_length_ ? start + 1 - prompt_length_ : 0;
    k = std::min(k, max_tokens_ > emitted + 1 ? max_tokens_ - emitted - 1 : 0);
  }
  if (k == 0) return std::nullopt;
  std::vector<int32_t> drafts = PromptLookupDraft(history_, static_cast<uint32_t>(k));
  if (drafts.empty()) return std::nullopt;
  last_drafted_ = static_cast<uint32_t>(drafts.size());
  hop_.counters->drafted_tokens.fetch_add(drafts.size());
  history_.insert(history_.end(), drafts.begin(), drafts.end());
  protocol::SeamFrame out = in;
  out.span->count = 1 + drafts.size();
  out.token_ids.insert(out.token_ids.end(), drafts.begin(), drafts.end());
  out.draft_token_ids.assign(drafts.begin(), drafts.end());
  return out;
}

}  // namespace meshnet::worker
