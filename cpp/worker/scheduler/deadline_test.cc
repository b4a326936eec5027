// Step deadlines: budget arithmetic on a fixed clock, and the waiter/engine claim, where the
// engine side is a promise fulfilled (or not) by the test itself.
#include "cpp/worker/scheduler/deadline.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace meshnet::worker {
namespace {

using protocol::Code;
using std::chrono::microseconds;
using std::chrono::milliseconds;

const Clock::time_point kT0{std::chrono::seconds(1000)};

TEST(StepDeadlineTest, BudgetCountsFromArrival) {
  StepDeadline step(kT0, 50, milliseconds(120000));
  EXPECT_TRUE(step.has_budget());
  EXPECT_EQ(step.deadline(), kT0 + milliseconds(50));
  EXPECT_FALSE(step.Spent(kT0 + milliseconds(49)));
  EXPECT_TRUE(step.Spent(kT0 + milliseconds(50)));
  EXPECT_EQ(step.Remaining(kT0), 50u);
  EXPECT_EQ(step.Remaining(kT0 + milliseconds(20)), 30u);
  EXPECT_EQ(step.Remaining(kT0 + microseconds(20500)), 30u);  // rounded up
  EXPECT_EQ(step.Remaining(kT0 + microseconds(49900)), 1u);   // never 0 ("none") while unspent
  protocol::Status late = step.Exceeded(7, "n-mid");
  EXPECT_EQ(late.code, Code::kDeadlineExceeded);
  EXPECT_TRUE(late.retryable);
  EXPECT_EQ(late.hop, "n-mid");
  EXPECT_EQ(late.message, "step 7 not done on n-mid within its budget of 50 ms");
}

TEST(StepDeadlineTest, NoBudgetIsBoundedByMaxStepAndForwardsNone) {
  StepDeadline step(kT0, 0, milliseconds(120000));
  EXPECT_FALSE(step.has_budget());
  EXPECT_EQ(step.deadline(), kT0 + milliseconds(120000));
  EXPECT_FALSE(step.Spent(kT0 + std::chrono::hours(1)));  // only a budget is "spent"
  EXPECT_EQ(step.Remaining(kT0 + milliseconds(5)), 0u);
  EXPECT_EQ(step.Exceeded(3, "n").message, "step 3 not done on n within the worker's "
                                           "--max_step_ms=120000");
  StepDeadline huge(kT0, 600000, milliseconds(1000));  // max_step caps a larger budget
  EXPECT_EQ(huge.deadline(), kT0 + milliseconds(1000));
  EXPECT_EQ(huge.Remaining(kT0), 600000u);
}

TEST(StepClaimTest, FirstDecisionWins) {
  StepClaim claimed;
  EXPECT_TRUE(claimed.Claim());
  EXPECT_FALSE(claimed.Abandon());
  EXPECT_FALSE(claimed.abandoned());
  StepClaim abandoned;
  EXPECT_TRUE(abandoned.Abandon());
  EXPECT_TRUE(abandoned.abandoned());
  EXPECT_FALSE(abandoned.Claim());
  EXPECT_TRUE(abandoned.Abandon());  // idempotent
}

const protocol::Status kLate = protocol::MakeError(Code::kDeadlineExceeded, "late", true);

TEST(WaitForStepTest, ExpiredWaitAbandonsTheStep) {
  std::promise<StepOutcome> engine;
  std::future<StepOutcome> outcome = engine.get_future();
  StepClaim claim;
  StepOutcome got = WaitForStep(outcome, claim, Clock::now(), kLate);
  EXPECT_EQ(got.first.message, "late");
  EXPECT_TRUE(claim.abandoned());
  EXPECT_FALSE(claim.Claim());  // the engine, finishing later, must undo the step
  engine.set_value({protocol::OkStatus(), {1.0f}});  // and delivering then harms nothing
}

TEST(WaitForStepTest, ClaimedStepIsWaitedForPastTheDeadline) {
  std::promise<StepOutcome> engine;
  std::future<StepOutcome> outcome = engine.get_future();
  StepClaim claim;
  ASSERT_TRUE(claim.Claim());  // the engine claimed it; delivery follows on its thread
  std::thread deliver([&engine] { engine.set_value({protocol::OkStatus(), {2.0f, 3.0f}}); });
  StepOutcome got = WaitForStep(outcome, claim, Clock::now(), kLate);
  deliver.join();
  EXPECT_TRUE(got.first.ok()) << got.first.ToString();
  EXPECT_EQ(got.second, (std::vector<float>{2.0f, 3.0f}));
  EXPECT_FALSE(claim.abandoned());
}

TEST(WaitForStepTest, ResultInTimeAndEngineDeadlineErrors) {
  StepClaim claim;
  std::promise<StepOutcome> engine;
  std::future<StepOutcome> outcome = engine.get_future();
  engine.set_value({protocol::OkStatus(), {4.0f}});
  StepOutcome got = WaitForStep(outcome, claim, Clock::now() + std::chrono::hours(1), kLate);
  EXPECT_TRUE(got.first.ok());
  EXPECT_EQ(got.second, std::vector<float>{4.0f});

  std::promise<StepOutcome> dropped;  // the engine dropped it unrun at its deadline
  std::future<StepOutcome> dropped_outcome = dropped.get_future();
  dropped.set_value({protocol::MakeError(Code::kDeadlineExceeded, "engine's words", true), {}});
  StepClaim open;
  EXPECT_EQ(WaitForStep(dropped_outcome, open, Clock::now() + std::chrono::hours(1), kLate)
                .first.message,
            "late");
  std::promise<StepOutcome> failed;  // other errors pass through
  std::future<StepOutcome> failed_outcome = failed.get_future();
  failed.set_value({protocol::MakeError(Code::kCancelled, "sequence released"), {}});
  StepClaim other;
  EXPECT_EQ(WaitForStep(failed_outcome, other, Clock::now() + std::chrono::hours(1), kLate)
                .first.code,
            Code::kCancelled);
}

}  // namespace
}  // namespace meshnet::worker
