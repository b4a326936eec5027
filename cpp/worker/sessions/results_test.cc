// Results queues: one reader per session, a bounded number of reader-opened queues, closed
// unread queues dropped after the grace period.
#include "cpp/worker/sessions/results.h"

#include <gtest/gtest.h>

namespace meshnet::worker {
namespace {

protocol::ResultFrame Frame(uint64_t step) {
  protocol::ResultFrame frame;
  frame.step = step;
  return frame;
}

TEST(ResultsBoardTest, OneReaderPerSessionAndBounded) {
  ResultsBoard board(2, std::chrono::seconds(10));
  std::shared_ptr<ResultQueue> a, again, b, c;
  ASSERT_EQ(board.Attach({"a", 1}, &a), ResultsBoard::Attached::kOk);
  EXPECT_EQ(board.Attach({"a", 1}, &again), ResultsBoard::Attached::kHasReader);
  EXPECT_EQ(again, nullptr);
  ASSERT_EQ(board.Attach({"b", 1}, &b), ResultsBoard::Attached::kOk);
  EXPECT_EQ(board.Attach({"c", 1}, &c), ResultsBoard::Attached::kFull);
  EXPECT_EQ(board.readers(), 2);
  EXPECT_EQ(board.queues(), 2);

  board.Push({"a", 1}, Frame(1), false);
  board.Push({"a", 1}, Frame(2), true);
  protocol::ResultFrame out;
  bool closed = false;
  ASSERT_TRUE(a->Pop(std::chrono::milliseconds(10), &out, &closed));
  EXPECT_EQ(out.step, 1u);
  ASSERT_TRUE(a->Pop(std::chrono::milliseconds(10), &out, &closed));
  EXPECT_EQ(out.step, 2u);
  EXPECT_FALSE(a->Pop(std::chrono::milliseconds(10), &out, &closed));
  EXPECT_TRUE(closed);
  board.Detach({"a", 1}, a);
  EXPECT_EQ(board.readers(), 1);
  ASSERT_EQ(board.Attach({"c", 1}, &c), ResultsBoard::Attached::kOk);
}

TEST(ResultsBoardTest, ClosedUnreadQueuesGoAfterGrace) {
  ResultsBoard board(4, std::chrono::milliseconds(50));
  board.Push({"late", 1}, Frame(1), true);
  board.Push({"open", 1}, Frame(1), false);
  EXPECT_EQ(board.queues(), 2);
  board.Reap(Clock::now());
  EXPECT_EQ(board.queues(), 2);  // within grace: a late reader still gets it
  board.Reap(Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(board.queues(), 1);  // only the open one stays
}

}  // namespace
}  // namespace meshnet::worker
