#include "cpp/worker/scheduler/engine_gate.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "cpp/wire/status.h"

namespace meshnet::worker::test_support {

EngineGate::EngineGate(Scheduler& scheduler, int32_t seq, std::function<void()> on_done) {
  // Owned by the callback too, so it may run after this gate is gone.
  auto entered = std::make_shared<std::promise<void>>();
  entered_ = entered->get_future().share();
  std::shared_future<void> open = gate_.get_future().share();
  WorkItem item;
  item.seq = seq;
  item.pos = 0;
  item.tokens = {11};
  item.done = [open, entered, on_done = std::move(on_done)](const protocol::Status&,
                                                            std::vector<float>) {
    if (on_done) on_done();
    entered->set_value();
    open.wait();
  };
  EXPECT_TRUE(scheduler.Submit(std::move(item)).ok());
}

void EngineGate::Open() {
  if (!opened_) gate_.set_value();
  opened_ = true;
}

}  // namespace meshnet::worker::test_support
