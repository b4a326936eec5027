#include "cpp/worker/draft.h"

#include <algorithm>
#include <cmath>

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

namespace {
constexpr double kAcceptanceDecay = 0.7;  // per drafted step: copying comes and goes in runs
constexpr double kMinRowVariance = 0.05;  // below it the spans seen were (nearly) all alike
constexpr double kOutlier = 4.0;          // a step over 4x the prediction counts as 4x (a stall)
}  // namespace

void StepCost::Record(uint32_t rows, double micros) {
  if (!(micros > 0) || rows == 0) return;
  if (known()) micros = std::min(micros, kOutlier * Predict(rows));
  const double r = rows;
  w_ = w_ * decay_ + 1;
  x_ = x_ * decay_ + r;
  y_ = y_ * decay_ + micros;
  xx_ = xx_ * decay_ + r * r;
  xy_ = xy_ * decay_ + r * micros;
}

bool StepCost::known() const {
  if (w_ < 3) return false;
  const double mean = x_ / w_;
  return xx_ / w_ - mean * mean >= kMinRowVariance;
}

double StepCost::per_row() const {
  if (!known()) return 0;
  const double mx = x_ / w_, my = y_ / w_;
  const double slope = (xy_ / w_ - mx * my) / (xx_ / w_ - mx * mx);
  return std::max(0.0, slope);
}

double StepCost::fixed() const {
  if (w_ == 0) return 1;
  return std::max(1.0, y_ / w_ - per_row() * (x_ / w_));
}

uint32_t DraftBudget::Next() {
  if (max_ == 0) return 0;
  if (pause_ > 0) {
    if (--pause_ == 0) probe_ = true;
    return 0;
  }
  const uint32_t k = Worthwhile(k_);
  if (probe_) {  // the first step after a pause drafts, so that acceptance and cost move on
    probe_ = false;
    return std::max<uint32_t>(k, 1);
  }
  if (k == 0) Pause();  // no draft pays at this acceptance and cost: pause, then probe again
  return k;
}

void DraftBudget::Pause() {
  pause_ = next_pause_;
  next_pause_ = std::min<uint32_t>(64, next_pause_ * 2);
}

uint32_t DraftBudget::Worthwhile(uint32_t k) const {
  if (k == 0 || !cost_.known()) return k;
  const double p = acceptance();
  double expected = 1, term = 1;  // tokens a step gives: 1 + p + p^2 + ... + p^i
  uint32_t best = 0;
  double best_rate = 1 / cost_.Predict(1);
  for (uint32_t i = 1; i <= k; ++i) {
    term *= p;
    expected += term;
    const double rate = expected / cost_.Predict(1 + i);
    if (rate > best_rate) best = i, best_rate = rate;
  }
  return best;
}

void DraftBudget::Record(uint32_t drafted, uint32_t accepted) {
  if (drafted == 0 || max_ == 0) return;
  accepted_ = accepted_ * kAcceptanceDecay + accepted;
  trials_ = trials_ * kAcceptanceDecay + accepted + (accepted < drafted ? 1 : 0);
  if (accepted >= drafted) {
    k_ = std::min(max_, std::max<uint32_t>(1, k_ * 2));
    misses_ = 0;
    next_pause_ = 4;
    return;
  }
  if (accepted == 0) {
    k_ = std::max<uint32_t>(1, k_ / 2);
    if (++misses_ >= 3) {
      Pause();
      misses_ = 0;
    }
    return;
  }
  misses_ = 0;
  k_ = std::max<uint32_t>(1, std::min(max_, accepted + 1));
}

}  // namespace meshnet::worker
