#include "cpp/worker/draft.h"

#include <gtest/gtest.h>

namespace meshnet::worker {
namespace {

TEST(PromptLookupDraftTest, ContinuesTheLatestMatchOfTheLongestNgram) {
  // ... 1 2 3 [4 5 6] ... 9 2 3 [7 8] ... 2 3 -> the latest "2 3" is followed by 7 8
  std::vector<int32_t> history = {1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0, 2, 3};
  EXPECT_EQ(PromptLookupDraft(history, 2), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(PromptLookupDraft(history, 5), (std::vector<int32_t>{7, 8, 0, 2, 3}));
  // a longer n-gram wins over a later shorter one: "1 2 3" occurs once, then "x 2 3"
  std::vector<int32_t> longer = {1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3};
  EXPECT_EQ(PromptLookupDraft(longer, 1), (std::vector<int32_t>{4}));
}

TEST(PromptLookupDraftTest, NothingToDraft) {
  EXPECT_TRUE(PromptLookupDraft({}, 4).empty());
  EXPECT_TRUE(PromptLookupDraft({7}, 4).empty());
  EXPECT_TRUE(PromptLookupDraft({1, 2, 3, 4}, 4).empty());  // no token repeats
  EXPECT_TRUE(PromptLookupDraft({1, 2, 1, 2}, 0).empty());
  // the draft stops where the history ends
  EXPECT_EQ(PromptLookupDraft({5, 6, 5}, 8), (std::vector<int32_t>{6, 5}));
}

TEST(DraftBudgetTest, GrowsOnFullAcceptanceAndShrinksToWhatWasAccepted) {
  DraftBudget budget(8);
  EXPECT_EQ(budget.Next(), 4u);
  budget.Record(4, 4);
  EXPECT_EQ(budget.Next(), 8u);
  budget.Record(8, 8);
  EXPECT_EQ(budget.Next(), 8u);  // capped at max
  budget.Record(8, 2);
  EXPECT_EQ(budget.Next(), 3u);
}

TEST(DraftBudgetTest, BacksOffAfterRepeatedMissesWithGrowingPauses) {
  DraftBudget budget(8);
  for (int i = 0; i < 3; ++i) {
    ASSERT_GT(budget.Next(), 0u);
    budget.Record(1, 0);
  }
  int paused = 0;
  while (budget.Next() == 0) ++paused;
  EXPECT_EQ(paused, 4);
  for (int i = 0; i < 3; ++i) budget.Record(1, 0);  // three more misses: a pause twice as long
  paused = 0;
  while (budget.Next() == 0) ++paused;
  EXPECT_EQ(paused, 8);
  DraftBudget off(0);
  EXPECT_EQ(off.Next(), 0u);
}

TEST(StepCostTest, FitsFixedAndPerRowCostOnceSpansDiffer) {
  StepCost cost;
  for (int i = 0; i < 5; ++i) cost.Record(1, 1000 + 500);
  EXPECT_FALSE(cost.known());  // every step had one row: the two parts cannot be told apart
  for (uint32_t rows : {3u, 1u, 5u, 2u, 4u, 1u}) cost.Record(rows, 1000 + 500.0 * rows);
  ASSERT_TRUE(cost.known());
  EXPECT_NEAR(cost.fixed(), 1000, 1e-6);
  EXPECT_NEAR(cost.per_row(), 500, 1e-6);
  EXPECT_NEAR(cost.Predict(9), 5500, 1e-6);
  cost.Record(1, 1e9);  // a stall counts as 4x the prediction, not as a new cost per step
  EXPECT_LT(cost.fixed(), 1000 + 4 * 1500);
  StepCost empty;
  EXPECT_FALSE(empty.known());
  empty.Record(1, -5);  // no time, or none measured: ignored
  empty.Record(0, 100);
  EXPECT_EQ(empty.fixed(), 1);
}

// Steps whose rows cost `per_row` microseconds each beyond `fixed`, for a budget to learn from.
void Steps(DraftBudget& budget, double fixed, double per_row) {
  for (uint32_t rows : {1u, 3u, 1u, 5u, 2u, 1u, 4u}) budget.RecordStep(rows, fixed + per_row * rows);
}

TEST(DraftBudgetTest, DraftsNoMoreThanPayAtTheMeasuredCostAndAcceptance) {
  // Loopback on a CPU: a drafted row costs nearly a full step, and half the drafts are accepted:
  // no draft pays (1.5 tokens for 2 rows' time), so the budget pauses, then probes with one.
  DraftBudget local(8);
  Steps(local, 2000, 25000);
  for (int i = 0; i < 4; ++i) local.Record(4, 1);
  EXPECT_NEAR(local.acceptance(), 0.5, 0.1);
  EXPECT_EQ(local.Worthwhile(8), 0u);
  EXPECT_EQ(local.Next(), 0u);
  int paused = 1;
  while (local.Next() == 0) ++paused;
  EXPECT_EQ(paused, 4 + 1);  // the step that chose to pause, then the pause
  // Over a slow link (60 ms per step, 5 ms a row), the same acceptance pays for drafts.
  DraftBudget wan(8);
  Steps(wan, 60000, 5000);
  for (int i = 0; i < 4; ++i) wan.Record(4, 1);
  const uint32_t k = wan.Worthwhile(8);
  EXPECT_GE(k, 2u);
  EXPECT_LE(k, 8u);
  // Copying (every draft accepted) over that link: all the budget allows.
  DraftBudget copying(8);
  Steps(copying, 60000, 5000);
  for (int i = 0; i < 6; ++i) copying.Record(4, 4);
  EXPECT_GT(copying.acceptance(), 0.9);
  EXPECT_EQ(copying.Worthwhile(8), 8u);
  EXPECT_EQ(copying.Worthwhile(3), 3u);  // never more than asked

}

}  // namespace
}  // namespace meshnet::worker
