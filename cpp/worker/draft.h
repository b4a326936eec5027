// Speculative decoding in the ring (docs/adr/0005-ring-decode.md): what the first hop drafts.
//
// PromptLookupDraft proposes the tokens that followed the most recent earlier occurrence of the
// sequence's trailing n-gram (longest n first), the "prompt lookup" drafter: free to compute,
// and right exactly where output copies its context (code edits, quoting, repetition).
// DraftBudget adapts how many tokens to draft from what the last hop accepted: it grows while
// drafts are accepted in full, shrinks to what was accepted otherwise, and after repeated
// total misses pauses drafting for a number of steps that doubles each time (so ordinary text,
// where lookups rarely hit, pays almost nothing). Pure C++; no threads.
#ifndef MESHNET_CPP_WORKER_DRAFT_H_
#define MESHNET_CPP_WORKER_DRAFT_H_

#include <cstdint>
#include <vector>

namespace meshnet::worker {

inline constexpr uint32_t kMaxDraftTokens = 16;  // drafted tokens per speculative ring step

// Up to `k` tokens following the latest earlier match of the last n tokens of `history`, for n
// from `max_ngram` down to `min_ngram`; empty when nothing matches or k == 0.
std::vector<int32_t> PromptLookupDraft(const std::vector<int32_t>& history, uint32_t k,
                                       int max_ngram = 3, int min_ngram = 1);

class DraftBudget {
 public:
  explicit DraftBudget(uint32_t max_tokens = 0) : max_(max_tokens), k_(max_tokens < 4 ? max_tokens : 4) {}

  uint32_t max() const { return max_; }
  // How many tokens to draft for the next step (0: do not draft this step).
  uint32_t Next();
  // The last hop accepted `accepted` of `drafted` tokens of the previous drafted step.
  void Record(uint32_t drafted, uint32_t accepted);

 private:
  uint32_t max_;
  uint32_t k_;
  uint32_t misses_ = 0;      // drafted steps in a row with nothing accepted
  uint32_t pause_ = 0;       // steps left without drafting
  uint32_t next_pause_ = 4;  // the next pause's length (doubles, at most 64)
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_DRAFT_H_
