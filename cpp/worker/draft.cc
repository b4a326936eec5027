#include "cpp/worker/draft.h"

#include <algorithm>

namespace meshnet::worker {

std::vector<int32_t> PromptLookupDraft(const std::vector<int32_t>& history, uint32_t k,
                                       int max_ngram, int min_ngram) {
  const int size = static_cast<int>(history.size());
  if (k == 0) return {};
  for (int n = std::min(max_ngram, size - 1); n >= std::max(1, min_ngram); --n) {
    const int tail = size - n;  // the trailing n-gram is history[tail, size)
    // Latest earlier start i < tail whose n tokens equal the tail and that has a continuation.
    for (int i = tail - 1; i >= 0; --i) {
      if (!std::equal(history.begin() + i, history.begin() + i + n, history.begin() + tail)) continue;
      const int from = i + n;
      const int count = std::min<int>(static_cast<int>(k), size - from);
      if (count <= 0) continue;
      return std::vector<int32_t>(history.begin() + from, history.begin() + from + count);
    }
  }
  return {};
}

uint32_t DraftBudget::Next() {
  if (max_ == 0) return 0;
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  return k_;
}

void DraftBudget::Record(uint32_t drafted, uint32_t accepted) {
  if (drafted == 0 || max_ == 0) return;
  if (accepted >= drafted) {
    k_ = std::min(max_, std::max<uint32_t>(1, k_ * 2));
    misses_ = 0;
    next_pause_ = 4;
    return;
  }
  if (accepted == 0) {
    k_ = std::max<uint32_t>(1, k_ / 2);
    if (++misses_ >= 3) {
      pause_ = next_pause_;
      next_pause_ = std::min<uint32_t>(64, next_pause_ * 2);
      misses_ = 0;
    }
    return;
  }
  misses_ = 0;
  k_ = std::max<uint32_t>(1, std::min(max_, accepted + 1));
}

}  // namespace meshnet::worker
