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

}  // namespace
}  // namespace meshnet::worker
