// Session table: bounded pool, epoch fencing, idempotency record, idle reaping, counters.
#include "cpp/worker/sessions.h"

#include <gtest/gtest.h>

#include <set>

namespace meshnet::worker {
namespace {

using protocol::Code;

SessionTableOptions Options(int max_sessions) {
  SessionTableOptions options;
  options.max_sessions = max_sessions;
  options.idle = std::chrono::seconds(10);
  return options;
}

TEST(SessionTableTest, PoolIsBoundedAndSeqReturnsOnlyThroughFreeSeq) {
  SessionTable table(Options(2));
  Clock::time_point now = Clock::now();
  SessionInfo a, b, c;
  ASSERT_TRUE(table.Open({"a", 1}, now, &a).ok());
  ASSERT_TRUE(table.Open({"b", 1}, now, &b).ok());
  EXPECT_TRUE(a.created);
  EXPECT_NE(a.seq, b.seq);
  EXPECT_EQ(std::set<int32_t>({a.seq, b.seq}), std::set<int32_t>({0, 1}));
  protocol::Status full = table.Open({"c", 1}, now, &c);
  EXPECT_EQ(full.code, Code::kResourceExhausted);
  EXPECT_TRUE(full.retryable);

  SessionInfo again;
  ASSERT_TRUE(table.Open({"a", 1}, now, &again).ok());
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.seq, a.seq);

  std::optional<EndedSession> ended = table.Remove({"a", 1});
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->seq, a.seq);
  EXPECT_FALSE(table.Remove({"a", 1}).has_value());
  // Removed but not yet freed: the engine may still hold its KV.
  EXPECT_EQ(table.Open({"c", 1}, now, &c).code, Code::kResourceExhausted);
  table.FreeSeq(a.seq);
  table.FreeSeq(a.seq);  // a double free does not duplicate the id
  EXPECT_EQ(table.free_seqs(), 1);
  ASSERT_TRUE(table.Open({"c", 1}, now, &c).ok());
  EXPECT_EQ(c.seq, a.seq);
  EXPECT_EQ(table.active(), 2);
}

TEST(SessionTableTest, NewerEpochFencesOlder) {
  SessionTable table(Options(4));
  Clock::time_point now = Clock::now();
  std::vector<EndedSession> fenced;
  ASSERT_TRUE(table.Fence("s", 1, &fenced).ok());
  SessionInfo one;
  ASSERT_TRUE(table.Open({"s", 1}, now, &one).ok());
  ASSERT_TRUE(table.Fence("other", 7, &fenced).ok());
  EXPECT_TRUE(fenced.empty());

  ASSERT_TRUE(table.Fence("s", 2, &fenced).ok());
  ASSERT_EQ(fenced.size(), 1u);
  EXPECT_EQ(fenced[0].key, SessionKey("s", 1));
  EXPECT_EQ(fenced[0].seq, one.seq);
  EXPECT_EQ(table.active(), 0);

  std::vector<EndedSession> none;
  protocol::Status stale = table.Fence("s", 1, &none);
  EXPECT_EQ(stale.code, Code::kStaleEpoch);
  EXPECT_NE(stale.message.find("fenced by 2"), std::string::npos);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(table.Fence("s", 2, &none).ok());  // the same epoch stays admitted
}

TEST(SessionTableTest, RepeatedStepIsReplayedOlderIsRefused) {
  SessionTable table(Options(1));
  SessionKey key{"s", 3};
  SessionInfo info;
  ASSERT_TRUE(table.Open(key, Clock::now(), &info).ok());
  protocol::Status status;
  EXPECT_FALSE(table.Replay(key, 1, &status).has_value());
  EXPECT_TRUE(status.ok());

  protocol::SeamReply reply;
  reply.step = 1;
  reply.credits = 8;
  reply.cache = protocol::CacheState{5};
  table.RecordStep(key, 1, reply, 5, 5);
  reply.step = 2;
  reply.cache = protocol::CacheState{6};
  table.RecordStep(key, 2, reply, 6, 1);

  std::optional<protocol::SeamReply> replayed = table.Replay(key, 2, &status);
  ASSERT_TRUE(replayed.has_value());
  EXPECT_TRUE(replayed->replayed);
  EXPECT_EQ(replayed->step, 2u);
  EXPECT_EQ(replayed->cache->length, 6u);
  EXPECT_FALSE(table.Replay(key, 1, &status).has_value());
  EXPECT_EQ(status.code, Code::kInvalidArgument);
  EXPECT_FALSE(table.Replay(key, 3, &status).has_value());
  EXPECT_TRUE(status.ok());

  ASSERT_TRUE(table.Open(key, Clock::now(), &info).ok());
  EXPECT_EQ(info.length, 6u);
  EXPECT_EQ(info.last_step, 2u);
  EXPECT_EQ(table.TokenCounts().at(key), 6u);
}

TEST(SessionTableTest, IdleSessionsAreReported) {
  SessionTable table(Options(3));
  Clock::time_point t0 = Clock::now();
  SessionInfo info;
  ASSERT_TRUE(table.Open({"old", 1}, t0, &info).ok());
  ASSERT_TRUE(table.Open({"new", 1}, t0 + std::chrono::seconds(8), &info).ok());
  EXPECT_TRUE(table.Idle(t0 + std::chrono::seconds(9)).empty());
  std::vector<SessionKey> idle = table.Idle(t0 + std::chrono::seconds(11));
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0], SessionKey("old", 1));
  ASSERT_TRUE(table.Open({"old", 1}, t0 + std::chrono::seconds(11), &info).ok());  // touched
  EXPECT_TRUE(table.Idle(t0 + std::chrono::seconds(12)).empty());
}

}  // namespace
}  // namespace meshnet::worker
