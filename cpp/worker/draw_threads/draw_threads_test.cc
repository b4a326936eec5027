#include "cpp/worker/draw_threads/draw_threads.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cpp/engine/cpu_clock/cpu_clock.h"
#include "gtest/gtest.h"

namespace meshnet::worker {
namespace {

using std::chrono::milliseconds;

int ThisThreadNice() { return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))); }
pid_t ThisThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Spins until this thread has used `cpu` of CPU time.
void Burn(milliseconds cpu) {
  const auto start = engine::ThreadCpuTime();
  while (engine::ThreadCpuTime() - start < cpu) {
  }
}

TEST(DrawThreadsTest, ACheapTaskRunsAtTheNodesPriorityOnAKeptThread) {
  DrawThreads threads(milliseconds(50), 2);
  const int caller_nice = ThisThreadNice();
  int nice = -100;
  pid_t first = 0, second = 0;
  EXPECT_FALSE(threads.Run([&] { nice = ThisThreadNice(); first = ThisThreadId(); }, false));
  EXPECT_EQ(nice, caller_nice);
  EXPECT_NE(first, ThisThreadId());
  EXPECT_FALSE(threads.Run([&] { second = ThisThreadId(); }, false));
  EXPECT_EQ(second, first);  // kept and used again
  EXPECT_EQ(threads.lowered(), 0u);
}

TEST(DrawThreadsTest, ATaskPastItsCpuIsLoweredForTheRestAndItsThreadRetires) {
  DrawThreads threads(milliseconds(30), 2);
  int nice_before = -100, nice_after = -100;
  pid_t heavy = 0, next = 0;
  EXPECT_TRUE(threads.Run([&] {
    heavy = ThisThreadId();
    nice_before = ThisThreadNice();
    Burn(milliseconds(200));
    nice_after = ThisThreadNice();
  }, false));
  ASSERT_FALSE(threads.lowering_failed());
  EXPECT_EQ(nice_before, ThisThreadNice());
  EXPECT_EQ(nice_after, 19);
  EXPECT_EQ(threads.lowered(), 1u);
  // The next task gets a fresh thread at the caller's priority.
  int nice = -100;
  EXPECT_FALSE(threads.Run([&] { next = ThisThreadId(); nice = ThisThreadNice(); }, false));
  EXPECT_NE(next, heavy);
  EXPECT_EQ(nice, ThisThreadNice());
}

TEST(DrawThreadsTest, ATaskKnownToBeHeavyIsLoweredBeforeItStarts) {
  DrawThreads threads(milliseconds(1000), 2);
  const int caller_nice = ThisThreadNice();
  int nice = -100;
  EXPECT_TRUE(threads.Run([&] { nice = ThisThreadNice(); }, true));
  EXPECT_EQ(nice, 19);
  EXPECT_EQ(ThisThreadNice(), caller_nice);  // the caller is untouched
}

TEST(DrawThreadsTest, ConcurrentDrawsNeverWaitForEachOther) {
  DrawThreads threads(milliseconds(1000), 1);
  std::set<pid_t> seen;
  std::mutex mu;
  std::vector<std::thread> callers;
  std::atomic<int> inside{0}, most{0};
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      threads.Run([&] {
        const int now = ++inside;
        int was = most.load();
        while (now > was && !most.compare_exchange_weak(was, now)) {
        }
        std::this_thread::sleep_for(milliseconds(100));
        --inside;
        std::lock_guard<std::mutex> lock(mu);
        seen.insert(ThisThreadId());
      }, false);
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(most.load(), 4);
  EXPECT_EQ(seen.size(), 4u);
}

}  // namespace
}  // namespace meshnet::worker
