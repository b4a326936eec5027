#include "cpp/engine/cpu_clock/cpu_clock.h"

namespace meshnet::engine {

std::chrono::nanoseconds CpuTimeOf(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

}  // namespace meshnet::engine
