// The threads a last hop's constrained draws run on (issue 55, finding 7: one key's grammar drew
// for 179 ms a token at the node's priority, and an honest stream on the same last hop fell to
// 0.38 of its rate). A draw starts at the node's priority; once it has used `demote_after` of CPU
// its thread is lowered to nice 19, the lowest priority the kernel gives without privilege, for
// the rest of the draw: on a busy machine such work gets what the node's other threads leave, on
// an idle one it runs at full speed. Linux keeps a nice value per thread and lowering it back
// needs privilege, so a lowered thread retires after its draw and the next draw gets a fresh
// thread at the node's priority (made by the caller's thread: a thread starts at its maker's).
//
// Invariant: every task runs exactly once, on a pool thread, and Run returns only after it
// finished (the caller's state stays its own); no thread that was lowered runs a second task.
// At most `keep` idle threads are kept; a draw never waits for a thread. Any thread.
#ifndef MESHNET_CPP_WORKER_DRAW_THREADS_DRAW_THREADS_H_
#define MESHNET_CPP_WORKER_DRAW_THREADS_DRAW_THREADS_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace meshnet::worker {

class DrawThreads {
 public:
  // `demote_after`: the CPU a task may use at the node's priority (zero: lowered at once).
  DrawThreads(std::chrono::nanoseconds demote_after, int keep);
  ~DrawThreads();
  DrawThreads(const DrawThreads&) = delete;
  DrawThreads& operator=(const DrawThreads&) = delete;

  // Runs `task` and waits for it; `lowered_at_once`: its thread is lowered before it starts.
  // True when the task's thread was lowered (at once, or for using more than demote_after).
  bool Run(const std::function<void()>& task, bool lowered_at_once);

  // Threads lowered so far, and whether lowering ever failed (a seccomp filter refusing
  // setpriority, say: the draws then run at the node's priority throughout).
  uint64_t lowered() const { return lowered_.load(); }
  bool lowering_failed() const { return lowering_failed_.load(); }

 private:
  class Thread;
  std::unique_ptr<Thread> Take();
  void Lower(Thread& thread);

  const std::chrono::nanoseconds demote_after_;
  const size_t keep_;
  std::mutex mu_;  // guards idle_
  std::vector<std::unique_ptr<Thread>> idle_;
  std::atomic<uint64_t> lowered_{0};
  std::atomic<bool> lowering_failed_{false};
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_DRAW_THREADS_DRAW_THREADS_H_
