// Scheduler: batching decisions (pure) and, on the tiny F32 fixture, that items batched
// together give the same outputs as each run alone.
#include "cpp/worker/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/tiny_llama.h"
#include "cpp/worker/scheduler/engine_gate.h"

namespace meshnet::worker {
namespace {

using protocol::Code;
using test_support::EngineGate;

std::vector<std::pair<int, int>> Pairs(const std::vector<Slice>& plan) {
  std::vector<std::pair<int, int>> out;
  for (const Slice& s : plan) out.emplace_back(s.item, s.count);
  return out;
}

TEST(PlanBatchTest, DecodesFirstThenPrefillChunksWithinBudget) {
  std::vector<PendingView> pending = {
      {0, 100, false},  // prefill
      {1, 1, true},     // decode
      {2, 30, false},   // prefill
      {3, 1, true},     // decode
  };
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(Pairs(PlanBatch(pending, 64, 16)), (P{{1, 1}, {3, 1}, {0, 16}, {2, 16}}));
  EXPECT_EQ(Pairs(PlanBatch(pending, 20, 16)), (P{{1, 1}, {3, 1}, {0, 16}, {2, 2}}));
  EXPECT_EQ(Pairs(PlanBatch(pending, 2, 16)), (P{{1, 1}, {3, 1}}));
  EXPECT_EQ(Pairs(PlanBatch(pending, 1, 16)), (P{{1, 1}}));
  EXPECT_EQ(Pairs(PlanBatch(pending, 200, 1000)), (P{{1, 1}, {3, 1}, {0, 100}, {2, 30}}));
  EXPECT_TRUE(PlanBatch(pending, 0, 16).empty());
  EXPECT_TRUE(PlanBatch({}, 64, 16).empty());
}

TEST(PlanBatchTest, OneSlicePerSequence) {
  std::vector<PendingView> pending = {{5, 1, true}, {5, 1, true}, {5, 10, false}, {6, 10, false}};
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(Pairs(PlanBatch(pending, 64, 64)), (P{{0, 1}, {3, 10}}));
}

TEST(PlanBatchTest, RowsEnterTheDecodeInSequenceOrder) {
  // Queue order 5, 2, 7, 0, then a prefill of 3: PlanBatch picks all of them, decodes first;
  // the Decode takes them by sequence id, so llama.cpp can put ids 0..7 into one ubatch.
  std::vector<PendingView> pending = {{5, 1, true}, {2, 1, true}, {7, 1, true}, {0, 1, true}, {3, 40, false}};
  std::vector<Slice> plan = PlanBatch(pending, 64, 16);
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(Pairs(plan), (P{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 16}}));
  OrderBySequence(&plan, pending);
  EXPECT_EQ(Pairs(plan), (P{{3, 1}, {1, 1}, {4, 16}, {0, 1}, {2, 1}}));
  std::vector<Slice> none;
  OrderBySequence(&none, pending);
  EXPECT_TRUE(none.empty());
}

TEST(PlanBatchTest, TheBatchWindowGrowsWithTheDecodeTimeAndStaysOffWhenOff) {
  using std::chrono::microseconds;
  EXPECT_EQ(BatchWindow(microseconds(2000), microseconds(0)), microseconds(2000));
  EXPECT_EQ(BatchWindow(microseconds(2000), microseconds(8000)), microseconds(2000));
  EXPECT_EQ(BatchWindow(microseconds(2000), microseconds(90000)), microseconds(90000 / kBatchWindowShare));
  EXPECT_EQ(BatchWindow(microseconds(0), microseconds(90000)), microseconds(0));
}

TEST(PlanBatchTest, OnAGpuAPrefillRunsAloneAndDecodesShareUpToTheVectorKernelsRows) {
  const BatchShape gpu = BatchShapeFor("vulkan0");
  EXPECT_EQ(gpu.max_decode_rows, kVectorKernelRows);
  EXPECT_TRUE(gpu.prefill_alone);
  EXPECT_EQ(BatchShapeFor("cpu").max_decode_rows, 0);
  EXPECT_FALSE(BatchShapeFor("cpu").prefill_alone);
  using P = std::vector<std::pair<int, int>>;
  // The oldest item is a prefill: its chunk alone, whatever waits behind it.
  std::vector<PendingView> pending = {{0, 100, false}, {1, 1, true}, {2, 30, false}, {3, 1, true}};
  EXPECT_EQ(Pairs(PlanBatch(pending, 64, 16, gpu)), (P{{0, 16}}));
  EXPECT_EQ(Pairs(PlanBatch(pending, 5, 16, gpu)), (P{{0, 5}}));
  // The oldest is a decode step: decode steps only (the waiting prefills go later), at most 8.
  std::vector<PendingView> decodes;
  for (int seq = 0; seq < 12; ++seq) decodes.push_back({seq, 1, true});
  decodes.push_back({20, 30, false});
  P first_eight;
  for (int i = 0; i < kVectorKernelRows; ++i) first_eight.emplace_back(i, 1);
  EXPECT_EQ(Pairs(PlanBatch(decodes, 256, 128, gpu)), first_eight);
  EXPECT_EQ(Pairs(PlanBatch(decodes, 3, 128, gpu)), (P{{0, 1}, {1, 1}, {2, 1}}));
  // Served items leave the queue: the prefill becomes the oldest and runs next.
  std::vector<PendingView> later = {{20, 30, false}, {0, 1, true}, {1, 1, true}};
  EXPECT_EQ(Pairs(PlanBatch(later, 256, 128, gpu)), (P{{0, 30}}));
  EXPECT_TRUE(PlanBatch({}, 64, 16, gpu).empty());
  EXPECT_TRUE(PlanBatch(pending, 0, 16, gpu).empty());
}

TEST(PlanBatchTest, OnAGpuAPrefillLeavesNoTailForTheVectorKernels) {
  const BatchShape gpu = BatchShapeFor("vulkan0");
  using P = std::vector<std::pair<int, int>>;
  // 132 prompt rows at chunks of 128: 123 then 9 (both past the vector kernels), not 128 then 4.
  EXPECT_EQ(Pairs(PlanBatch({{0, 132, false}}, 256, 128, gpu)), (P{{0, 123}}));
  EXPECT_EQ(Pairs(PlanBatch({{0, 9, false}}, 256, 128, gpu)), (P{{0, 9}}));
  EXPECT_EQ(PrefillChunk(136, 256, 128), 127);  // a tail of 8 becomes 9
  EXPECT_EQ(PrefillChunk(137, 256, 128), 128);  // a tail of 9 stays
  EXPECT_EQ(PrefillChunk(300, 256, 128), 128);  // a long rest stays
  EXPECT_EQ(PrefillChunk(12, 256, 10), 10);     // 10 - 7 would be a vector-kernel chunk itself
  EXPECT_EQ(PrefillChunk(40, 16, 128), 16);     // the budget bounds it as before
}

TEST(PlanBatchTest, OnAGpuASpeculativeSpanRunsInVectorKernelChunks) {
  const BatchShape gpu = BatchShapeFor("vulkan0");
  using P = std::vector<std::pair<int, int>>;
  PendingView span{0, 17, false, true};
  EXPECT_EQ(Pairs(PlanBatch({span}, 256, 128, gpu)), (P{{0, kVectorKernelRows}}));
  span.rows_left = 1;
  EXPECT_EQ(Pairs(PlanBatch({span}, 256, 128, gpu)), (P{{0, 1}}));
  // On the CPU a span is one batch, as before.
  EXPECT_EQ(Pairs(PlanBatch({{0, 17, false, true}}, 256, 128, BatchShapeFor("cpu"))), (P{{0, 17}}));
}

std::string Fixture() {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/scheduler_test_tiny.gguf";
  std::string error;
  engine::TinyLlamaOptions options;
  EXPECT_TRUE(engine::WriteTinyLlama(path, options, &error)) << error;
  return path;
}

SchedulerOptions Options(const std::string& path, int layer_start, int layer_end) {
  SchedulerOptions options;
  options.model.path = path;
  options.model.layer_start = layer_start;
  options.model.layer_end = layer_end;
  options.context.n_seq = 4;
  options.context.n_ctx = 256;
  options.context.n_threads = 1;
  options.max_batch_tokens = 8;
  options.max_prefill_chunk = 3;
  options.max_queue = 8;
  return options;
}

// Submits items; returns each one's output once all are done.
std::vector<std::vector<float>> RunAll(Scheduler& scheduler, std::vector<WorkItem> items) {
  std::vector<std::promise<std::vector<float>>> promises(items.size());
  std::vector<std::future<std::vector<float>>> futures;
  for (size_t i = 0; i < items.size(); ++i) {
    futures.push_back(promises[i].get_future());
    std::promise<std::vector<float>>* promise = &promises[i];
    items[i].done = [promise](const protocol::Status& status, std::vector<float> out) {
      EXPECT_TRUE(status.ok()) << status.ToString();
      promise->set_value(std::move(out));
    };
    protocol::Status status = scheduler.Submit(std::move(items[i]));
    EXPECT_TRUE(status.ok()) << status.ToString();
    if (!status.ok()) promises[i].set_value({});
  }
  std::vector<std::vector<float>> outputs;
  for (auto& future : futures) outputs.push_back(future.get());
  return outputs;
}

WorkItem Tokens(int32_t seq, int32_t pos, std::vector<int32_t> tokens) {
  WorkItem item;
  item.seq = seq;
  item.pos = pos;
  item.tokens = std::move(tokens);
  return item;
}

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f) << "index " << i;
}

TEST(SchedulerTest, BatchedItemsMatchSoloRuns) {
  std::string path = Fixture();
  std::string error;
  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  ASSERT_TRUE(scheduler->last());
  const std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25}, b = {2, 4, 6}, c = {30, 31, 32, 33};

  // Alone: one item at a time, each on its own sequence.
  std::vector<std::vector<float>> solo;
  solo.push_back(RunAll(*scheduler, {Tokens(0, 0, a)})[0]);
  solo.push_back(RunAll(*scheduler, {Tokens(1, 0, b)})[0]);
  solo.push_back(RunAll(*scheduler, {Tokens(2, 0, c)})[0]);
  solo.push_back(RunAll(*scheduler, {Tokens(0, 7, {40})})[0]);  // a decode step after a
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 15u);
  for (int32_t seq = 0; seq < 3; ++seq) {
    std::promise<void> released;
    scheduler->Release(seq, 0, [&released] { released.set_value(); });
    released.get_future().get();
  }
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 0u);

  // Together: a long prefill keeps the engine busy so the others join its batches.
  std::vector<int32_t> filler(40, 7);
  std::vector<std::vector<float>> prefills = RunAll(
      *scheduler, {Tokens(3, 0, filler), Tokens(0, 0, a), Tokens(1, 0, b), Tokens(2, 0, c)});
  for (int i = 0; i < 3; ++i) ExpectNear(prefills[i + 1], solo[i]);
  uint64_t batches_before = scheduler->Stats().batches;
  std::vector<std::vector<float>> together =
      RunAll(*scheduler, {Tokens(0, 7, {40}), Tokens(1, 3, {41}), Tokens(2, 4, {42})});
  EXPECT_GE(scheduler->Stats().batches - batches_before, 1u);
  ExpectNear(together[0], solo[3]);
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 8u + 4u + 5u + 40u);
}

TEST(SchedulerTest, MixedBatchLogitsMatchSolo) {
  std::string path = Fixture();
  std::string error;
  SchedulerOptions options = Options(path, 0, -1);
  options.max_queue = 2;
  auto solo_scheduler = Scheduler::Start(options, &error);
  ASSERT_NE(solo_scheduler, nullptr) << error;
  const std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25}, b = {2, 4, 6};
  std::vector<float> solo_a = RunAll(*solo_scheduler, {Tokens(0, 0, a)})[0];
  std::vector<float> solo_b = RunAll(*solo_scheduler, {Tokens(1, 0, b)})[0];
  ASSERT_EQ(solo_a.size(), static_cast<size_t>(solo_scheduler->n_vocab()));

  auto scheduler = Scheduler::Start(options, &error);
  ASSERT_NE(scheduler, nullptr) << error;
  std::vector<std::vector<float>> both = RunAll(*scheduler, {Tokens(0, 0, a), Tokens(1, 0, b)});
  ExpectNear(both[0], solo_a);
  ExpectNear(both[1], solo_b);
}

TEST(SchedulerTest, HiddenShardChainMatchesWholeModel) {
  std::string path = Fixture();
  std::string error;
  auto whole = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(whole, nullptr) << error;
  auto head = Scheduler::Start(Options(path, 0, 2), &error);
  ASSERT_NE(head, nullptr) << error;
  auto tail = Scheduler::Start(Options(path, 2, -1), &error);
  ASSERT_NE(tail, nullptr) << error;
  ASSERT_FALSE(head->last());
  ASSERT_FALSE(tail->first());
  const std::vector<int32_t> a = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<float> expected = RunAll(*whole, {Tokens(0, 0, a)})[0];
  std::vector<float> hidden = RunAll(*head, {Tokens(0, 0, a)})[0];
  ASSERT_EQ(hidden.size(), a.size() * head->n_embd());
  WorkItem item;
  item.seq = 0;
  item.hidden = hidden;
  std::vector<float> logits = RunAll(*tail, {std::move(item)})[0];
  ExpectNear(logits, expected);
}

TEST(SchedulerTest, RefusesBadItemsAndFullQueue) {
  std::string path = Fixture();
  std::string error;
  SchedulerOptions options = Options(path, 2, -1);
  options.max_queue = 1;
  auto tail = Scheduler::Start(options, &error);
  ASSERT_NE(tail, nullptr) << error;
  EXPECT_EQ(tail->Submit(Tokens(0, 0, {1})).code, Code::kInvalidArgument);
  WorkItem odd;
  odd.hidden.assign(tail->n_embd() + 1, 0.f);
  EXPECT_EQ(tail->Submit(std::move(odd)).code, Code::kInvalidArgument);

  // Hold the engine thread inside a callback so the queue stays full.
  std::promise<void> gate, entered;
  std::shared_future<void> open = gate.get_future().share();
  WorkItem first;
  first.seq = 0;
  first.hidden.assign(tail->n_embd(), 0.5f);
  first.done = [open, &entered](const protocol::Status&, std::vector<float>) {
    entered.set_value();
    open.wait();
  };
  ASSERT_TRUE(tail->Submit(std::move(first)).ok());
  entered.get_future().wait();
  WorkItem second;
  second.seq = 1;
  second.hidden.assign(tail->n_embd(), 0.5f);
  second.done = [](const protocol::Status&, std::vector<float>) {};
  ASSERT_TRUE(tail->Submit(std::move(second)).ok());
  WorkItem third;
  third.seq = 2;
  third.hidden.assign(tail->n_embd(), 0.5f);
  third.done = [](const protocol::Status&, std::vector<float>) {};
  EXPECT_EQ(tail->Submit(std::move(third)).code, Code::kResourceExhausted);
  gate.set_value();
}

struct Outcome {
  std::promise<std::pair<protocol::Status, std::vector<float>>> promise;
  std::future<std::pair<protocol::Status, std::vector<float>>> future = promise.get_future();
  WorkItem Bind(WorkItem item) {
    item.done = [this](const protocol::Status& status, std::vector<float> out) {
      promise.set_value({status, std::move(out)});
    };
    return item;
  }
};

TEST(SchedulerTest, StepPastItsDeadlineIsNotComputedAndOthersAreUnaffected) {
  std::string path = Fixture();
  std::string error;
  auto solo = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(solo, nullptr) << error;
  const std::vector<int32_t> long_prompt(40, 7), b = {2, 4, 6};
  std::vector<float> solo_long = RunAll(*solo, {Tokens(0, 0, long_prompt)})[0];
  std::vector<float> solo_b = RunAll(*solo, {Tokens(1, 0, b)})[0];

  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  EngineGate gate(*scheduler, 2);
  gate.WaitEntered();
  Outcome long_prefill, late;
  ASSERT_TRUE(scheduler->Submit(long_prefill.Bind(Tokens(0, 0, long_prompt))).ok());
  WorkItem budgeted = late.Bind(Tokens(1, 0, b));
  budgeted.deadline = Clock::now() + std::chrono::milliseconds(1);  // a 1 ms budget
  budgeted.claim = std::make_shared<StepClaim>();
  const Clock::time_point deadline = budgeted.deadline;
  ASSERT_TRUE(scheduler->Submit(std::move(budgeted)).ok());
  while (Clock::now() <= deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gate.Open();

  auto [late_status, late_out] = late.future.get();
  EXPECT_EQ(late_status.code, Code::kDeadlineExceeded) << late_status.ToString();
  EXPECT_TRUE(late_status.retryable);
  EXPECT_TRUE(late_out.empty());
  auto [long_status, long_out] = long_prefill.future.get();
  ASSERT_TRUE(long_status.ok()) << long_status.ToString();
  ExpectNear(long_out, solo_long);
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 1u + 40u);  // nothing of the late step
  // Its sequence is as it was: the same step without a deadline gives the solo output.
  ExpectNear(RunAll(*scheduler, {Tokens(1, 0, b)})[0], solo_b);
}

TEST(SchedulerTest, AbandonedStepIsTakenBackOutOfTheKv) {
  std::string path = Fixture();
  std::string error;
  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  const std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25};  // 3 batches of max_prefill_chunk 3
  std::vector<float> solo_a = RunAll(*scheduler, {Tokens(0, 0, a)})[0];
  std::promise<void> released;
  scheduler->Release(0, 0, [&released] { released.set_value(); });
  released.get_future().get();
  ASSERT_EQ(scheduler->Stats().kv_cells_used, 0u);

  auto claim = std::make_shared<StepClaim>();
  EngineGate hold(*scheduler, 3);
  hold.WaitEntered();
  // Runs in the same first batch as a's first chunk, then its waiter gives up on a.
  EngineGate abandon(*scheduler, 2, [claim] { EXPECT_TRUE(claim->Abandon()); });
  Outcome outcome;
  WorkItem item = outcome.Bind(Tokens(0, 0, a));
  item.claim = claim;
  ASSERT_TRUE(scheduler->Submit(std::move(item)).ok());
  hold.Open();
  abandon.Open();
  auto [status, out] = outcome.future.get();
  EXPECT_EQ(status.code, Code::kDeadlineExceeded) << status.ToString();
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 2u);  // the two gates' tokens only
  ExpectNear(RunAll(*scheduler, {Tokens(0, 0, a)})[0], solo_a);
}

TEST(SchedulerTest, TruncateDropsAStepsRows) {
  std::string path = Fixture();
  std::string error;
  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  const std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25};
  RunAll(*scheduler, {Tokens(0, 0, a)});
  std::vector<float> step = RunAll(*scheduler, {Tokens(0, 7, {40})})[0];
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 8u);
  scheduler->Truncate(0, 7);
  std::vector<float> again = RunAll(*scheduler, {Tokens(0, 7, {40})})[0];
  ExpectNear(again, step);
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 8u);
}

TEST(SchedulerTest, ReleasedOwnersLateStepsAreRefused) {
  std::string path = Fixture();
  std::string error;
  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  const std::vector<int32_t> a = {1, 5, 9, 13, 17, 21, 25}, b = {2, 4, 6};
  std::vector<float> solo_b = RunAll(*scheduler, {Tokens(1, 0, b)})[0];
  WorkItem first = Tokens(0, 0, a);
  first.owner = 7;
  RunAll(*scheduler, {std::move(first)});
  std::promise<void> released;
  scheduler->Release(0, 7, [&released] { released.set_value(); });
  released.get_future().get();
  ASSERT_EQ(scheduler->Stats().kv_cells_used, 3u);  // b's rows only

  // Owner 7's step that was on its way when its session ended: refused, nothing enters the KV.
  WorkItem late = Tokens(0, 7, {40});
  late.owner = 7;
  late.done = [](const protocol::Status&, std::vector<float>) { ADD_FAILURE() << "queued"; };
  EXPECT_EQ(scheduler->Submit(std::move(late)).code, Code::kCancelled);
  scheduler->Truncate(0, 0, 7);  // a stale truncate does not touch the next holder's rows
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 3u);

  // The sequence's next holder works as on a fresh sequence, and a stale truncate spares it.
  WorkItem next = Tokens(0, 0, b);
  next.owner = 8;
  std::vector<float> out = RunAll(*scheduler, {std::move(next)})[0];
  ExpectNear(out, solo_b);
  scheduler->Truncate(0, 0, 7);
  WorkItem step = Tokens(0, 3, {40});
  step.owner = 8;
  RunAll(*scheduler, {std::move(step)});
  EXPECT_EQ(scheduler->Stats().kv_cells_used, 3u + 4u);
}

}  // namespace
}  // namespace meshnet::worker

namespace meshnet::worker {
namespace {

// Runs one decode step for each of `seqs` at `pos`, submitting seq i after i * `apart`; returns
// how many sessions the scheduler saw in its latest batch once all are done.
int DecodeStaggered(Scheduler& scheduler, const std::vector<int32_t>& seqs, int32_t pos,
                    std::chrono::milliseconds apart) {
  std::vector<std::promise<void>> done(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(apart);
    WorkItem item = Tokens(seqs[i], pos, {static_cast<int32_t>(7 + i)});
    std::promise<void>* promise = &done[i];
    item.done = [promise](const protocol::Status& status, std::vector<float>) {
      EXPECT_TRUE(status.ok()) << status.ToString();
      promise->set_value();
    };
    EXPECT_TRUE(scheduler.Submit(std::move(item)).ok());
  }
  for (auto& promise : done) promise.get_future().get();
  return scheduler.Stats().last_batch_items;
}

TEST(SchedulerTest, BatchingWindowLetsStragglersJoinAndNeverHoldsALoneSession) {
  std::string path = Fixture();
  std::string error;
  SchedulerOptions options = Options(path, 0, -1);
  options.batch_window = std::chrono::milliseconds(200);
  auto scheduler = Scheduler::Start(options, &error);
  ASSERT_NE(scheduler, nullptr) << error;
  // Three sessions decode together once, so the engine expects three.
  RunAll(*scheduler, {Tokens(0, 0, {1}), Tokens(1, 0, {2}), Tokens(2, 0, {3})});
  DecodeStaggered(*scheduler, {0, 1, 2}, 1, std::chrono::milliseconds(0));
  // Now they arrive 20 ms apart: the window (200 ms) holds the batch until all three are in.
  EXPECT_EQ(DecodeStaggered(*scheduler, {0, 1, 2}, 2, std::chrono::milliseconds(20)), 3);

  // Once a session is released the engine no longer waits for it: the other two decode as
  // soon as both are in.
  std::promise<void> released;
  scheduler->Release(2, 0, [&released] { released.set_value(); });
  released.get_future().get();
  const auto after_release = std::chrono::steady_clock::now();
  EXPECT_EQ(DecodeStaggered(*scheduler, {0, 1}, 3, std::chrono::milliseconds(0)), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - after_release, std::chrono::milliseconds(200));

  // A lone session (the only one decoding lately) does not wait for the window.
  auto lone = Scheduler::Start(options, &error);
  ASSERT_NE(lone, nullptr) << error;
  RunAll(*lone, {Tokens(0, 0, {1})});
  const auto started = std::chrono::steady_clock::now();
  for (int32_t pos = 1; pos < 6; ++pos) DecodeStaggered(*lone, {0}, pos, std::chrono::milliseconds(0));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(200));
}

TEST(SchedulerTest, AllLogitsGivesEveryRowAsDecodedOneByOne) {
  std::string path = Fixture();
  std::string error;
  auto scheduler = Scheduler::Start(Options(path, 0, -1), &error);
  ASSERT_NE(scheduler, nullptr) << error;
  const std::vector<int32_t> prompt = {3, 1, 4}, drafts = {1, 5, 9};
  RunAll(*scheduler, {Tokens(0, 0, prompt), Tokens(1, 0, prompt)});
  WorkItem wide = Tokens(0, 3, drafts);  // the three rows in one step, every row's logits
  wide.all_logits = true;
  std::vector<float> rows = RunAll(*scheduler, {std::move(wide)})[0];
  const size_t n_vocab = static_cast<size_t>(scheduler->n_vocab());
  ASSERT_EQ(rows.size(), drafts.size() * n_vocab);
  for (size_t r = 0; r < drafts.size(); ++r) {  // the same rows one decode at a time
    std::vector<float> one =
        RunAll(*scheduler, {Tokens(1, static_cast<int32_t>(3 + r), {drafts[r]})})[0];
    ExpectNear(std::vector<float>(rows.begin() + r * n_vocab, rows.begin() + (r + 1) * n_vocab), one);
  }
}

}  // namespace
}  // namespace meshnet::worker
