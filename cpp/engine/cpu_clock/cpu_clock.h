#ifndef MESHNET_CPP_ENGINE_CPU_CLOCK_CPU_CLOCK_H_
#define MESHNET_CPP_ENGINE_CPU_CLOCK_CPU_CLOCK_H_

// The CPU time threads have used: what a constrained draw costs the node whatever else the node
// is doing (the sampler's budget, the worker's draw threads). Any thread may call these.

#include <time.h>

#include <chrono>

namespace meshnet::engine {

// The CPU time `clock` has counted (CLOCK_THREAD_CPUTIME_ID, or another thread's clock from
// pthread_getcpuclockid).
std::chrono::nanoseconds CpuTimeOf(clockid_t clock);

// The calling thread's CPU time.
inline std::chrono::nanoseconds ThreadCpuTime() { return CpuTimeOf(CLOCK_THREAD_CPUTIME_ID); }

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_CPU_CLOCK_CPU_CLOCK_H_
