// Test support (testonly): EngineGate holds a Scheduler's engine thread so a test can line up
// work behind it. Used by scheduler_test and service_test to stand in for a long step of
// another session: whatever is submitted while the gate is closed waits in the queue.
#ifndef MESHNET_CPP_WORKER_SCHEDULER_ENGINE_GATE_H_
#define MESHNET_CPP_WORKER_SCHEDULER_ENGINE_GATE_H_

#include <cstdint>
#include <functional>
#include <future>

#include "cpp/worker/scheduler/scheduler.h"

namespace meshnet::worker::test_support {

// Submits a 1-token item (token 11 at position 0) on `seq`, a sequence the code under test never
// hands out, whose callback runs `on_done` (on the engine thread) and then blocks until Open()
// or destruction. The scheduler must hold the first layers (it takes token ids). The gate's
// token stays in the KV cache. Test thread only, apart from the callback.
class EngineGate {
 public:
  EngineGate(Scheduler& scheduler, int32_t seq, std::function<void()> on_done = nullptr);
  ~EngineGate() { Open(); }
  EngineGate(const EngineGate&) = delete;
  EngineGate& operator=(const EngineGate&) = delete;

  // Returns once the engine thread is inside the callback (and `on_done` has run).
  void WaitEntered() const { entered_.wait(); }
  // Lets the engine thread go on; later calls do nothing.
  void Open();

 private:
  std::promise<void> gate_;
  std::shared_future<void> entered_;
  bool opened_ = false;
};

}  // namespace meshnet::worker::test_support

#endif  // MESHNET_CPP_WORKER_SCHEDULER_ENGINE_GATE_H_
