// One step's time limits on this hop, and the hand-off of its outcome between the gRPC thread
// that waits for it and the engine thread that computes it.
//
// StepDeadline turns a frame's relative `budget_ms` (time left for the step when it was sent;
// 0 = none) into a deadline on this hop's steady clock, counted from the frame's arrival; with
// no budget the wait is still bounded, by the worker's --max_step_ms. The budget forwarded to
// the next hop is what is left of it (rounded up to whole ms, at least 1); a spent budget is
// not forwarded.
//
// StepClaim decides, exactly once, who owns a step whose waiter may give up: the engine claims
// it when its last row is decoded (and then delivers it), the waiter abandons it when its wait
// expires (and then the engine takes the step's rows back out of the KV, or never runs them).
// Invariant: a step is either claimed (its result reaches the waiter) or abandoned (its rows
// never stay in the KV), never both. Used by cpp/worker/service.cc and the scheduler; any
// thread.
#ifndef MESHNET_CPP_WORKER_SCHEDULER_DEADLINE_H_
#define MESHNET_CPP_WORKER_SCHEDULER_DEADLINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "cpp/wire/status.h"

namespace meshnet::worker {

using Clock = std::chrono::steady_clock;

class StepDeadline {
 public:
  // A step whose frame arrived at `received` with `budget_ms` (0: none); `max_step` bounds
  // the wait when there is no budget (and caps a larger one).
  StepDeadline(Clock::time_point received, uint32_t budget_ms, std::chrono::milliseconds max_step);

  bool has_budget() const { return budget_ms_ != 0; }
  // When the step must have been computed: the budget's end, or arrival + max_step.
  Clock::time_point deadline() const { return deadline_; }
  // True when the frame came with a budget and it has run out at `now`.
  bool Spent(Clock::time_point now) const { return has_budget() && now >= budget_end_; }
  // The budget_ms for the frame this hop forwards at `now`: 0 without a budget, else what is
  // left rounded up to whole ms (>= 1). Call only when !Spent(now).
  uint32_t Remaining(Clock::time_point now) const;
  // DEADLINE_EXCEEDED (retryable) for step `step` on hop `node_id`: the budget, or max_step,
  // ran out before the step was done.
  protocol::Status Exceeded(uint64_t step, const std::string& node_id) const;

 private:
  uint32_t budget_ms_;
  std::chrono::milliseconds max_step_;
  Clock::time_point budget_end_;
  Clock::time_point deadline_;
};

class StepClaim {
 public:
  // Engine thread, once the step's last row is decoded: true (and the result is then
  // delivered) unless the waiter abandoned the step.
  bool Claim();
  // Waiter, when its wait expired: true (the step is the engine's to undo) unless the engine
  // claimed it first, in which case its result is being delivered.
  bool Abandon();
  bool abandoned() const { return state_.load() == kAbandoned; }

  // Engine thread, before it delivers the step: when the batch that finished it started and
  // ended decoding. The waiter reads them once the result reached it (Health's StepTimes split
  // its wait into queueing, the engine, and waking up).
  void SetEngineTimes(Clock::time_point start, Clock::time_point end) {
    engine_start_ = start;
    engine_end_ = end;
  }
  Clock::time_point engine_start() const { return engine_start_; }
  Clock::time_point engine_end() const { return engine_end_; }

 private:
  enum : int { kOpen, kClaimed, kAbandoned };
  std::atomic<int> state_{kOpen};
  Clock::time_point engine_start_{}, engine_end_{};
};

using StepOutcome = std::pair<protocol::Status, std::vector<float>>;

// Waits for `outcome` until `deadline`. Past it, abandons `claim` and returns `late`, unless
// the engine claimed the step first: then the result is a few statements from delivery (no
// blocking in between) and is waited for. A DEADLINE_EXCEEDED from the engine (the step was
// dropped unrun at its deadline) is answered with `late` too, so both paths read the same.
StepOutcome WaitForStep(std::future<StepOutcome>& outcome, StepClaim& claim,
                        Clock::time_point deadline, const protocol::Status& late);

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SCHEDULER_DEADLINE_H_
