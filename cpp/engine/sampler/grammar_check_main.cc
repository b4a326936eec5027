// grammar_check: a GBNF grammar through the last hop's sampler (sampler.h) over a GGUF's
// vocabulary, for tests of the grammars the gateway writes (python/meshnet/gateway): does
// llama.cpp's parser take it, and how long does it take to compile; which token sequences it
// accepts (fed as a failover's grammar_tokens are) and whether it is complete after them; and the
// slowest of N greedy draws over seeded random logits.
//
// Usage: grammar_check MODEL.gguf GRAMMAR_FILE [--draws=N] [--seed=S] [--budget_ms=MS] < sequences
//   --budget_ms: the last hop's CPU budget per draw (--sampling_budget_ms; default none).
//   Each stdin line is one sequence of token ids separated by spaces.
// Output, one JSON object per line: first {"compile_ms": x}; then per input line {"accepted":
// bool, "complete": bool}; then, with --draws, {"draws": N, "choose_ms_max": x, "tokens": [...]}.
// Why a grammar or a sequence was refused goes to stderr, one line each.
// Exit status: 0; 1 when the model cannot be loaded or the grammar cannot be used; 2 on a bad
// argument or input line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpp/engine/sampler/sampler.h"
#include "llama.h"

namespace {

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::cerr << text;
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: grammar_check MODEL.gguf GRAMMAR_FILE [--draws=N] [--seed=S] [--budget_ms=MS] < sequences\n";
    return 2;
  }
  int draws = 0;
  uint64_t seed = 0;
  std::chrono::milliseconds budget(0);
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--draws=", 0) == 0) {
      draws = std::stoi(arg.substr(8));
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::stoull(arg.substr(7));
    } else if (arg.rfind("--budget_ms=", 0) == 0) {
      budget = std::chrono::milliseconds(std::stoll(arg.substr(12)));
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }
  llama_log_set(QuietLog, nullptr);
  llama_backend_init();
  llama_model_params model_params = llama_model_default_params();
  model_params.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], model_params);
  if (model == nullptr) {
    std::cerr << "cannot load " << argv[1] << "\n";
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const size_t n_vocab = static_cast<size_t>(llama_vocab_n_tokens(vocab));
  std::ostringstream text;
  {
    FILE* f = std::fopen(argv[2], "rb");
    if (f == nullptr) {
      std::cerr << "cannot read " << argv[2] << "\n";
      return 2;
    }
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.write(buf, static_cast<std::streamsize>(n));
    std::fclose(f);
  }
  meshnet::protocol::SamplingParams params;
  params.grammar = text.str();
  std::string error;
  const auto compiling = std::chrono::steady_clock::now();
  auto sampler = meshnet::engine::Sampler::Make(params, vocab, &error, budget);
  const double compile_ms = MillisSince(compiling);
  if (sampler == nullptr) {
    std::cerr << "grammar refused: " << error << "\n";
    return 1;
  }
  std::cout << "{\"compile_ms\": " << compile_ms << "}\n";

  // Only end-of-generation tokens are finite: the grammar allows one of them when it is complete.
  std::vector<float> only_eog(n_vocab, -INFINITY);
  for (size_t i = 0; i < n_vocab; ++i) {
    if (llama_vocab_is_eog(vocab, static_cast<llama_token>(i))) only_eog[i] = 0.0f;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream ids(line);
    meshnet::protocol::SamplingParams fed = params;
    long long id;
    while (ids >> id) {
      if (id < 0 || static_cast<size_t>(id) >= n_vocab) {
        std::cerr << "token id " << id << " is outside the vocabulary\n";
        return 2;
      }
      fed.grammar_tokens.push_back(static_cast<uint32_t>(id));
    }
    auto resumed = meshnet::engine::Sampler::Make(fed, vocab, &error, budget);
    const bool accepted = resumed != nullptr;
    const bool complete =
        accepted && resumed->Choose(only_eog.data(), n_vocab) != meshnet::engine::kNoToken;
    if (!accepted) std::cerr << "sequence refused: " << error << "\n";
    std::cout << "{\"accepted\": " << (accepted ? "true" : "false") << ", \"complete\": "
              << (complete ? "true" : "false") << "}\n";
  }

  if (draws > 0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0, 3);
    std::vector<float> logits(n_vocab);
    double slowest = 0;
    std::string tokens;
    for (int i = 0; i < draws; ++i) {
      for (float& logit : logits) logit = normal(rng);
      const auto choosing = std::chrono::steady_clock::now();
      const uint32_t token = sampler->Choose(logits.data(), n_vocab);
      slowest = std::max(slowest, MillisSince(choosing));
      if (token == meshnet::engine::kNoToken) {
        std::cerr << "draw refused: " << sampler->error() << "\n";
        return 1;
      }
      tokens += (tokens.empty() ? "" : ", ") + std::to_string(token);
      if (llama_vocab_is_eog(vocab, static_cast<llama_token>(token))) break;
    }
    std::cout << "{\"draws\": " << draws << ", \"choose_ms_max\": " << slowest << ", \"tokens\": [" << tokens
              << "]}\n";
  }
  llama_model_free(model);
  return 0;
}
