// llama.cpp's process-wide log, routed so that a failed call can say why: error lines are kept
// per thread (at most kMaxKeptBytes, the newest) until the thread takes them, and written to
// stderr; everything below ERROR is dropped unless MESHNET_LLAMA_LOG=1.
//
// Callers: the engine (load, decode) and the sampler (grammars from the network). Any thread may
// call either function; what TakeLlamaError returns is only the calling thread's.
#ifndef MESHNET_CPP_ENGINE_LLAMA_LOG_LLAMA_LOG_H_
#define MESHNET_CPP_ENGINE_LLAMA_LOG_LLAMA_LOG_H_

#include <cstddef>
#include <string>

namespace meshnet::engine {

// The most error text kept for one thread: a thread that never takes its errors (a gRPC thread
// refusing grammar after grammar) holds no more than this.
inline constexpr size_t kMaxKeptBytes = 4096;

// Installs the callback (once per process; later calls do nothing).
void InstallLlamaLog();

// The calling thread's error lines since it last took them, trailing blanks removed; clears them.
std::string TakeLlamaError();

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_LLAMA_LOG_LLAMA_LOG_H_
