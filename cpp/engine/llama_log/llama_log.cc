#include "cpp/engine/llama_log/llama_log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "llama.h"

namespace meshnet::engine {
namespace {

thread_local std::string g_last_llama_error;

void LogCallback(ggml_log_level level, const char* text, void*) {
  static const bool verbose = std::getenv("MESHNET_LLAMA_LOG") != nullptr;
  if (level == GGML_LOG_LEVEL_ERROR) {
    g_last_llama_error += text;
    if (g_last_llama_error.size() > kMaxKeptBytes) {
      g_last_llama_error.erase(0, g_last_llama_error.size() - kMaxKeptBytes);
    }
  }
  if (verbose || level == GGML_LOG_LEVEL_ERROR) {
    std::fputs(text, stderr);
  }
}

}  // namespace

void InstallLlamaLog() {
  static std::once_flag once;
  std::call_once(once, [] { llama_log_set(LogCallback, nullptr); });
}

std::string TakeLlamaError() {
  std::string text = std::move(g_last_llama_error);
  g_last_llama_error.clear();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace meshnet::engine
