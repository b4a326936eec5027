#include "cpp/engine/cpu_clock/cpu_clock.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace meshnet::engine {
namespace {

using std::chrono::milliseconds;

// Spins until this thread has used `cpu` of CPU time; its wall time, for comparison.
void Burn(milliseconds cpu) {
  const auto start = ThreadCpuTime();
  while (ThreadCpuTime() - start < cpu) {
  }
}

TEST(CpuClockTest, CountsTheCallingThreadsWorkNotItsSleep) {
  const auto before = ThreadCpuTime();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_LT(ThreadCpuTime() - before, milliseconds(20));  // sleeping costs no CPU
  Burn(milliseconds(30));
  EXPECT_GE(ThreadCpuTime() - before, milliseconds(30));
}

TEST(CpuClockTest, ReadsAnotherThreadsClock) {
  std::atomic<bool> done{false};
  std::thread burner([&] {
    Burn(milliseconds(40));
    while (!done) std::this_thread::sleep_for(milliseconds(1));
  });
  clockid_t clock{};
  ASSERT_EQ(pthread_getcpuclockid(burner.native_handle(), &clock), 0);
  const auto mine = ThreadCpuTime();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (CpuTimeOf(clock) < milliseconds(40) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_GE(CpuTimeOf(clock), milliseconds(40));  // the burner's work, read from this thread
  EXPECT_LT(ThreadCpuTime() - mine, milliseconds(30));  // while this one mostly slept
  done = true;
  burner.join();
}

}  // namespace
}  // namespace meshnet::engine
