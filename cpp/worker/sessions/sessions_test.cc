// Session table: bounded pool, stream binding, bounded epoch fencing, idempotency record, idle
// reaping, the token ledger.
#include "cpp/worker/sessions/sessions.h"

#include <gtest/gtest.h>

#include <set>

namespace meshnet::worker {
namespace {

using protocol::Code;

constexpr uint64_t kNow = 1'000'000, kFar = kNow + 600'000;  // unix ms: now, a ticket's expiry

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
  ASSERT_TRUE(table.Open({"a", 1}, 1, now, &a).ok());
  ASSERT_TRUE(table.Open({"b", 1}, 1, now, &b).ok());
  EXPECT_TRUE(a.created);
  EXPECT_NE(a.seq, b.seq);
  EXPECT_EQ(std::set<int32_t>({a.seq, b.seq}), std::set<int32_t>({0, 1}));
  protocol::Status full = table.Open({"c", 1}, 1, now, &c);
  EXPECT_EQ(full.code, Code::kResourceExhausted);
  EXPECT_TRUE(full.retryable);

  SessionInfo again;
  ASSERT_TRUE(table.Open({"a", 1}, 1, now, &again).ok());
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.seq, a.seq);

  std::optional<EndedSession> ended = table.Remove({"a", 1});
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->seq, a.seq);
  EXPECT_FALSE(table.Remove({"a", 1}).has_value());
  // Removed but not yet freed: the engine may still hold its KV.
  EXPECT_EQ(table.Open({"c", 1}, 1, now, &c).code, Code::kResourceExhausted);
  table.FreeSeq(a.seq);
  table.FreeSeq(a.seq);  // a double free does not duplicate the id
  EXPECT_EQ(table.free_seqs(), 1);
  ASSERT_TRUE(table.Open({"c", 1}, 1, now, &c).ok());
  EXPECT_EQ(c.seq, a.seq);
  EXPECT_EQ(table.active(), 2);
  // Each tenure of a sequence id has its own owner, newer ones larger (the scheduler refuses
  // a released owner's late steps by it).
  EXPECT_EQ(again.owner, a.owner);
  EXPECT_EQ(ended->owner, a.owner);
  EXPECT_GT(b.owner, a.owner);
  EXPECT_GT(c.owner, b.owner);
}

TEST(SessionTableTest, ANewSessionTakesTheLowestFreeSeq) {
  // Live sessions keep neighbouring sequence ids, which the engine decodes in one ubatch.
  SessionTable table(Options(6));
  Clock::time_point now = Clock::now();
  std::vector<SessionInfo> opened(6);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(table.Open({"s" + std::to_string(i), 1}, 1, now, &opened[i]).ok());
    EXPECT_EQ(opened[i].seq, i);
  }
  for (int i : {4, 1, 3}) {
    ASSERT_TRUE(table.Remove({"s" + std::to_string(i), 1}).has_value());
    table.FreeSeq(i);
  }
  for (int32_t expected : {1, 3, 4}) {
    SessionInfo next;
    ASSERT_TRUE(table.Open({"n" + std::to_string(expected), 1}, 1, now, &next).ok());
    EXPECT_EQ(next.seq, expected);
  }
  EXPECT_EQ(table.free_seqs(), 0);
}

TEST(SessionTableTest, NewerEpochFencesOlder) {
  SessionTable table(Options(4));
  Clock::time_point now = Clock::now();
  std::vector<EndedSession> fenced;
  ASSERT_TRUE(table.Fence("s", 1, kFar, kNow, &fenced).ok());
  SessionInfo one;
  ASSERT_TRUE(table.Open({"s", 1}, 1, now, &one).ok());
  ASSERT_TRUE(table.Fence("other", 7, kFar, kNow, &fenced).ok());
  EXPECT_TRUE(fenced.empty());

  ASSERT_TRUE(table.Fence("s", 2, kFar, kNow, &fenced).ok());
  ASSERT_EQ(fenced.size(), 1u);
  EXPECT_EQ(fenced[0].key, SessionKey("s", 1));
  EXPECT_EQ(fenced[0].seq, one.seq);
  EXPECT_EQ(table.active(), 0);

  std::vector<EndedSession> none;
  protocol::Status stale = table.Fence("s", 1, kFar, kNow, &none);
  EXPECT_EQ(stale.code, Code::kStaleEpoch);
  EXPECT_NE(stale.message.find("fenced by 2"), std::string::npos);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(table.Fence("s", 2, kFar, kNow, &none).ok());  // the same epoch stays admitted
  // The fenced session's own stream is told it is stale; no other stream or session is.
  EXPECT_TRUE(table.FencedOn({"s", 1}, 1));
  EXPECT_FALSE(table.FencedOn({"s", 1}, 2));
  EXPECT_FALSE(table.FencedOn({"s", 2}, 1));
}

TEST(SessionTableTest, RepeatedStepIsReplayedOlderIsRefused) {
  SessionTable table(Options(1));
  SessionKey key{"s", 3};
  SessionInfo info;
  ASSERT_TRUE(table.Open(key, 1, Clock::now(), &info).ok());
  protocol::Status status;
  EXPECT_FALSE(table.Replay(key, 1, &status).has_value());
  EXPECT_TRUE(status.ok());

  protocol::SeamReply reply;
  reply.step = 1;
  reply.credits = 8;
  reply.cache = protocol::CacheState{5};
  table.RecordStep(key, 1, reply, 5, 5, false);
  reply.step = 2;
  reply.cache = protocol::CacheState{6};
  table.RecordStep(key, 2, reply, 6, 1, true);

  std::optional<protocol::SeamReply> replayed = table.Replay(key, 2, &status);
  ASSERT_TRUE(replayed.has_value());
  EXPECT_TRUE(replayed->replayed);
  EXPECT_EQ(replayed->step, 2u);
  EXPECT_EQ(replayed->cache->length, 6u);
  EXPECT_FALSE(table.Replay(key, 1, &status).has_value());
  EXPECT_EQ(status.code, Code::kInvalidArgument);
  EXPECT_FALSE(table.Replay(key, 3, &status).has_value());
  EXPECT_TRUE(status.ok());

  ASSERT_TRUE(table.Open(key, 1, Clock::now(), &info).ok());
  EXPECT_EQ(info.length, 6u);
  EXPECT_EQ(info.last_step, 2u);
  EXPECT_EQ(table.TokenCounts().at(key), 6u);
  std::vector<SessionWork> work = table.TakeWork();
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].key, key);
  EXPECT_EQ(work[0].prefill, 5u);
  EXPECT_EQ(work[0].decode, 1u);
  EXPECT_TRUE(table.TakeWork().empty());  // taken
  table.Remove(key);
  table.RecordStep(key, 3, reply, 7, 1, true);  // ended while the step ran: not counted
  EXPECT_TRUE(table.TakeWork().empty());
}

TEST(SessionTableTest, SessionIsBoundToItsStream) {
  SessionTable table(Options(2));
  SessionInfo info;
  EXPECT_FALSE(table.Stream({"s", 1}).has_value());
  ASSERT_TRUE(table.Open({"s", 1}, 7, Clock::now(), &info).ok());
  EXPECT_EQ(table.Stream({"s", 1}), 7u);
  EXPECT_EQ(table.Open({"s", 1}, 8, Clock::now(), &info).code, Code::kPermissionDenied);
  EXPECT_EQ(table.active(), 1);
  EXPECT_EQ(table.free_seqs(), 1);
  ASSERT_TRUE(table.Open({"s", 1}, 7, Clock::now(), &info).ok());
  EXPECT_FALSE(info.created);
}

TEST(SessionTableTest, FencesAreBoundedAndExpire) {
  SessionTableOptions options = Options(2);
  options.max_fences = 2;
  SessionTable table(options);
  std::vector<EndedSession> fenced;
  // A frame of a bound session (no ticket, expiry 0) creates no fence.
  ASSERT_TRUE(table.Fence("bound", 3, 0, kNow, &fenced).ok());
  EXPECT_EQ(table.fence_entries(), 0);
  ASSERT_TRUE(table.Fence("a", 1, kNow + 10, kNow, &fenced).ok());
  ASSERT_TRUE(table.Fence("b", 1, kFar, kNow, &fenced).ok());
  EXPECT_EQ(table.fence_entries(), 2);
  // Full of unexpired fences: a new id is refused, a known one still admitted.
  EXPECT_EQ(table.Fence("c", 1, kFar, kNow, &fenced).code, Code::kResourceExhausted);
  EXPECT_TRUE(table.Fence("a", 2, kNow + 5, kNow, &fenced).ok());
  EXPECT_EQ(table.Fence("a", 1, kFar, kNow, &fenced).code, Code::kStaleEpoch);
  // Once "a"'s tickets (the latest expiry seen, kNow + 10) expired, its fence makes room.
  ASSERT_TRUE(table.Fence("c", 1, kFar, kNow + 11, &fenced).ok());
  EXPECT_EQ(table.fence_entries(), 2);
  table.PruneFences(kFar);
  EXPECT_EQ(table.fence_entries(), 0);
  EXPECT_TRUE(fenced.empty());
}

TEST(SessionTableTest, IdleSessionsAreReported) {
  SessionTable table(Options(3));
  Clock::time_point t0 = Clock::now();
  SessionInfo info;
  ASSERT_TRUE(table.Open({"old", 1}, 1, t0, &info).ok());
  ASSERT_TRUE(table.Open({"new", 1}, 1, t0 + std::chrono::seconds(8), &info).ok());
  EXPECT_TRUE(table.Idle(t0 + std::chrono::seconds(9)).empty());
  std::vector<SessionKey> idle = table.Idle(t0 + std::chrono::seconds(11));
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0], SessionKey("old", 1));
  ASSERT_TRUE(table.Open({"old", 1}, 1, t0 + std::chrono::seconds(11), &info).ok());  // touched
  EXPECT_TRUE(table.Idle(t0 + std::chrono::seconds(12)).empty());
}

}  // namespace
}  // namespace meshnet::worker
