#include "cpp/worker/draw_threads/draw_threads.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <thread>
#include <utility>

#include "cpp/engine/cpu_clock/cpu_clock.h"

namespace meshnet::worker {

namespace {

constexpr int kLowestNice = 19;

}  // namespace

// One pool thread: runs the tasks handed to it one at a time; its CPU clock and thread id are
// readable from other threads while it lives.
class DrawThreads::Thread {
 public:
  Thread() {
    thread_ = std::thread([this] { Loop(); });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return ready_; });
  }
  ~Thread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Thread(const Thread&) = delete;
  Thread& operator=(const Thread&) = delete;

  std::chrono::nanoseconds Cpu() const { return engine::CpuTimeOf(clock_); }
  pid_t tid() const { return tid_; }

  void Start(const std::function<void()>* task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = task;
    }
    cv_.notify_all();
  }
  // Waits up to `wall` for the task to finish; true when it has.
  bool WaitFor(std::chrono::nanoseconds wall) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, wall, [this] { return task_ == nullptr; });
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return task_ == nullptr; });
  }

  bool lowered = false;  // owner's field: the thread was lowered and must not run another task

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    tid_ = static_cast<pid_t>(syscall(SYS_gettid));
    pthread_getcpuclockid(pthread_self(), &clock_);
    ready_ = true;
    cv_.notify_all();
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || task_ != nullptr; });
      if (quit_) return;
      const std::function<void()>* task = task_;
      lock.unlock();
      (*task)();
      lock.lock();
      task_ = nullptr;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* task_ = nullptr;  // the running task; null when idle
  bool ready_ = false;
  bool quit_ = false;
  pid_t tid_ = 0;
  clockid_t clock_{};
  std::thread thread_;
};

DrawThreads::DrawThreads(std::chrono::nanoseconds demote_after, int keep)
    : demote_after_(demote_after), keep_(keep < 0 ? 0 : static_cast<size_t>(keep)) {}

DrawThreads::~DrawThreads() = default;

std::unique_ptr<DrawThreads::Thread> DrawThreads::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Thread> thread = std::move(idle_.back());
      idle_.pop_back();
      return thread;
    }
  }
  return std::make_unique<Thread>();  // made here: it starts at this (the caller's) priority
}

void DrawThreads::Lower(Thread& thread) {
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(thread.tid()), kLowestNice) == 0) {
    thread.lowered = true;
    lowered_.fetch_add(1);
  } else {
    lowering_failed_.store(true);
  }
}

bool DrawThreads::Run(const std::function<void()>& task, bool lowered_at_once) {
  std::unique_ptr<Thread> thread = Take();
  bool heavy = lowered_at_once || demote_after_.count() <= 0;
  if (heavy) Lower(*thread);
  const std::chrono::nanoseconds started = thread->Cpu();
  thread->Start(&task);
  // CPU time never runs ahead of wall time: wait as long as the task has left at full speed,
  // then read its CPU clock again.
  while (!heavy) {
    const std::chrono::nanoseconds left = demote_after_ - (thread->Cpu() - started);
    if (left.count() <= 0) {
      heavy = true;
      Lower(*thread);
    } else if (thread->WaitFor(left)) {
      break;
    }
  }
  thread->Wait();
  if (!thread->lowered) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < keep_) idle_.push_back(std::move(thread));
  }
  return heavy;  // a lowered thread is joined here, as `thread` goes
}

}  // namespace meshnet::worker
