// tiny_llama: writes the test fixture (tiny_llama.h) to a file, for tests in other languages, so
// the one fixture is made one way. Test-only.
//
// Usage: tiny_llama OUT.gguf [--n_layer=4] [--n_embd=32] [--n_vocab=64] [--seed=0] [--tied=1]
//                            [--rope_freqs=0]
#include <cstdlib>
#include <iostream>
#include <string>

#include "cpp/engine/tiny_llama.h"

namespace {

// "--name=VALUE" -> VALUE as a non-negative integer; false if `arg` is another flag or malformed.
bool Flag(const std::string& arg, const std::string& name, long* value, bool* bad) {
  const std::string prefix = "--" + name + "=";
  if (arg.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string text = arg.substr(prefix.size());
  char* end = nullptr;
  *value = std::strtol(text.c_str(), &end, 10);
  *bad = text.empty() || *end != '\0' || *value < 0 || *value > (1L << 20);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  meshnet::engine::TinyLlamaOptions options;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    long value = 0;
    bool bad = false;
    if (Flag(arg, "n_layer", &value, &bad)) {
      options.n_layer = static_cast<int>(value);
    } else if (Flag(arg, "n_embd", &value, &bad)) {
      options.n_embd = static_cast<int>(value);
    } else if (Flag(arg, "n_vocab", &value, &bad)) {
      options.n_vocab = static_cast<int>(value);
    } else if (Flag(arg, "seed", &value, &bad)) {
      options.seed = static_cast<uint32_t>(value);
    } else if (Flag(arg, "tied", &value, &bad)) {
      options.tied = value != 0;
    } else if (Flag(arg, "rope_freqs", &value, &bad)) {
      options.rope_freqs = value != 0;
    } else if (arg.rfind("--", 0) != 0 && out.empty()) {
      out = arg;
    } else {
      bad = true;
    }
    if (bad) {
      std::cerr << "tiny_llama: bad argument " << arg << "\n";
      return 2;
    }
  }
  if (out.empty()) {
    std::cerr << "usage: tiny_llama OUT.gguf [--n_layer=N] [--n_embd=N] [--n_vocab=N] [--seed=N] "
                 "[--tied=0|1] [--rope_freqs=0|1]\n";
    return 2;
  }
  std::string error;
  if (!meshnet::engine::WriteTinyLlama(out, options, &error)) {
    std::cerr << "tiny_llama: " << error << "\n";
    return 1;
  }
  return 0;
}
