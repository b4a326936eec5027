#include "cpp/worker/scheduler/deadline.h"

#include <algorithm>

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::Status;

StepDeadline::StepDeadline(Clock::time_point received, uint32_t budget_ms,
                           std::chrono::milliseconds max_step)
    : budget_ms_(budget_ms),
      max_step_(max_step),
      budget_end_(received + std::chrono::milliseconds(budget_ms)),
      deadline_(received + max_step) {
  if (has_budget()) deadline_ = std::min(deadline_, budget_end_);
}

uint32_t StepDeadline::Remaining(Clock::time_point now) const {
  if (!has_budget()) return 0;
  const auto left = budget_end_ - now;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, budget_ms_));
}

Status StepDeadline::Exceeded(uint64_t step, const std::string& node_id) const {
  const bool budget = has_budget() && deadline_ == budget_end_;
  // Retryable: the step left no trace on this hop (never run, or its rows taken back out of
  // the KV), so sending it again is safe; whether time is left for that is the client's call.
  Status status = MakeError(
      Code::kDeadlineExceeded,
      "step " + std::to_string(step) + " not done on " + node_id + " within " +
          (budget ? "its budget of " + std::to_string(budget_ms_) + " ms"
                  : "the worker's --max_step_ms=" + std::to_string(max_step_.count())),
      true);
  status.hop = node_id;
  return status;
}

bool StepClaim::Claim() {
  int open = kOpen;
  return state_.compare_exchange_strong(open, kClaimed) || open == kClaimed;
}

bool StepClaim::Abandon() {
  int open = kOpen;
  return state_.compare_exchange_strong(open, kAbandoned) || open == kAbandoned;
}

StepOutcome WaitForStep(std::future<StepOutcome>& outcome, StepClaim& claim,
                        Clock::time_point deadline, const Status& late) {
  if (outcome.wait_until(deadline) != std::future_status::ready && claim.Abandon()) {
    return {late, {}};
  }
  StepOutcome result = outcome.get();
  if (result.first.code == Code::kDeadlineExceeded) return {late, {}};
  return result;
}

}  // namespace meshnet::worker
