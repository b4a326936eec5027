// Speculative decoding in the ring (docs/adr/0005-ring-decode.md): what the first hop drafts.
//
// PromptLookupDraft proposes the tokens that followed the most recent earlier occurrence of the
// sequence's trailing n-gram (longest n first), the "prompt lookup" drafter: free to compute,
// and right exactly where output copies its context (code edits, quoting, repetition).
// DraftBudget adapts how many tokens to draft from what the last hop accepted: it grows while
// drafts are accepted in full, shrinks to what was accepted otherwise, and after repeated
// total misses pauses drafting for a number of steps that doubles each time (so ordinary text,
// where lookups rarely hit, pays almost nothing). StepCost learns what a ring step costs per row
// from the steps' wall times, and DraftBudget drafts no more tokens than pay for themselves at
// the acceptance it has seen (so a drafted row that costs nearly a full row is not spent on
// drafts that are likely to be rejected, and over a slow link drafts are cheap). Pure C++; no
// threads.
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

// A ring step's wall time as fixed + per_row * rows, fitted by exponentially weighted least
// squares over the latest steps (each step weighs `decay` times the one after it).
class StepCost {
 public:
  explicit StepCost(double decay = 0.9) : decay_(decay) {}

  // A step of `rows` rows took `micros` from its start to the next step's.
  void Record(uint32_t rows, double micros);
  // Whether the steps seen so far had spans different enough to tell the two parts apart.
  bool known() const;
  double fixed() const;    // microseconds per step, whatever its rows
  double per_row() const;  // microseconds per row (at least 0)
  double Predict(uint32_t rows) const { return fixed() + per_row() * rows; }

 private:
  double decay_;
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // weighted sums of 1, rows, time, ...
};

class DraftBudget {
 public:
  explicit DraftBudget(uint32_t max_tokens = 0) : max_(max_tokens), k_(max_tokens < 4 ? max_tokens : 4) {}

  uint32_t max() const { return max_; }
  // How many tokens to draft for the next step (0: do not draft this step).
  uint32_t Next();
  // The last hop accepted `accepted` of `drafted` tokens of the previous drafted step.
  void Record(uint32_t drafted, uint32_t accepted);
  // The previous step ran `rows` rows (1 + its drafts) in `micros`, start to start.
  void RecordStep(uint32_t rows, double micros) { cost_.Record(rows, micros); }
  // A drafted token's chance of being accepted when the one before it was (recent steps weigh
  // most: copying comes in runs).
  double acceptance() const { return (accepted_ + 1) / (trials_ + 2); }
  // Of 0..k drafts, the number that gives the most tokens per microsecond, with each draft
  // accepted at acceptance() given the one before it, at cost_'s prediction; k if the cost is
  // not known yet.
  uint32_t Worthwhile(uint32_t k) const;

 private:
  void Pause();  // skip the next next_pause_ steps, and double next_pause_ (at most 64)

  uint32_t max_;
  uint32_t k_;
  uint32_t misses_ = 0;      // drafted steps in a row with nothing accepted
  uint32_t pause_ = 0;       // steps left without drafting
  uint32_t next_pause_ = 4;  // the next pause's length (doubles, at most 64)
  bool probe_ = false;       // after a pause the cost model chose: draft at least one
  double accepted_ = 0, trials_ = 0;  // decayed counts behind acceptance()
  StepCost cost_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_DRAFT_H_
