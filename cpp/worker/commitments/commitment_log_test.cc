#include "cpp/worker/commitments/commitment_log.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "ggml.h"

namespace meshnet::worker {
namespace {

TEST(TopKTest, KeepsTheLargestMagnitudesInOrder) {
  std::vector<float> row(64, 0.5f);
  row[3] = -9.0f;
  row[40] = 7.0f;
  row[11] = 6.0f;
  uint16_t indices[kCommitmentK], values[kCommitmentK];
  TopK(row.data(), static_cast<int>(row.size()), indices, values);
  EXPECT_EQ(indices[0], 3);
  EXPECT_EQ(indices[1], 40);
  EXPECT_EQ(indices[2], 11);
  EXPECT_FLOAT_EQ(ggml_fp16_to_fp32(values[0]), -9.0f);
  EXPECT_FLOAT_EQ(ggml_fp16_to_fp32(values[1]), 7.0f);
}

TEST(CommitmentLogTest, RecordsEachKindByPositionAndOverwritesARewoundPosition) {
  CommitmentLog log;
  const CommitmentLog::Key key{"s", 1};
  log.InputTokens(key, 0, {5, 6, 7});
  std::vector<float> rows(3 * 16, 0.0f);
  rows[0 * 16 + 2] = 1.0f;
  rows[1 * 16 + 4] = 2.0f;
  rows[2 * 16 + 6] = 3.0f;
  log.Rows(key, 0, rows.data(), 3, 16, /*input=*/false);
  log.Sampled(key, 2, 42, 1.5f, 0.0f);
  rows[2 * 16 + 6] = 0.0f;
  rows[2 * 16 + 9] = -4.0f;
  log.Rows(key, 2, rows.data() + 2 * 16, 1, 16, /*input=*/false);  // position 2 again
  CommitmentRecord got;
  uint32_t n = 0;
  ASSERT_TRUE(log.Read(key, 1, 10, &got, &n));
  EXPECT_EQ(n, 2u);  // positions 1 and 2
  EXPECT_EQ(got.input_tokens, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(got.output_indices[0], 4);
  EXPECT_EQ(got.output_indices[kCommitmentK], 9);
  EXPECT_EQ(got.sampled_tokens, (std::vector<int32_t>{-1, 42}));
  EXPECT_FLOAT_EQ(ggml_fp16_to_fp32(got.sampled_logits[1]), 1.5f);
  EXPECT_FALSE(log.Read({"s", 2}, 0, 1, &got, &n));  // another epoch is another session
}

TEST(CommitmentLogTest, IsBoundedByPositionsDroppingTheLeastRecentSessions) {
  CommitmentOptions options;
  options.max_positions = 100;
  CommitmentLog log(options);
  for (int s = 0; s < 5; ++s) log.InputTokens({"s" + std::to_string(s), 1}, 0, std::vector<int32_t>(40, 1));
  EXPECT_LE(log.positions(), 100u);
  CommitmentRecord got;
  uint32_t n = 0;
  EXPECT_FALSE(log.Read({"s0", 1}, 0, 1, &got, &n));
  EXPECT_TRUE(log.Read({"s4", 1}, 0, 40, &got, &n));
  EXPECT_EQ(n, 40u);
}

TEST(CommitmentLogTest, DropsSessionsNotWrittenWithinRetain) {
  CommitmentOptions options;
  options.retain = std::chrono::seconds(0);
  CommitmentLog log(options);
  log.InputTokens({"old", 1}, 0, {1});
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  log.InputTokens({"new", 1}, 0, {1});
  CommitmentRecord got;
  uint32_t n = 0;
  EXPECT_FALSE(log.Read({"old", 1}, 0, 1, &got, &n));
}

}  // namespace
}  // namespace meshnet::worker
