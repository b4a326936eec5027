#include "cpp/engine/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "cpp/engine/cpu_clock/cpu_clock.h"
#include "cpp/engine/llama_log/llama_log.h"
#include "llama-ext.h"
#include "llama.h"

namespace meshnet::engine {
namespace {

// Greedy under a grammar: candidates checked alone before the whole row is masked.
constexpr size_t kCheckedOneByOne = 64;

// The largest of `n` (> 0) floats, none NaN. Eight running maxima: no branch, and a dependency
// chain n / 8 long, where std::max_element compares one element at a time (about 3x slower on
// a 49,152-entry vocabulary, and on the last hop's path to the next token).
float MaxOf(const float* values, size_t n) {
  float lanes[8];
  for (float& lane : lanes) lane = values[0];
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t k = 0; k < 8; ++k) lanes[k] = values[i + k] > lanes[k] ? values[i + k] : lanes[k];
  }
  for (; i < n; ++i) lanes[0] = values[i] > lanes[0] ? values[i] : lanes[0];
  float best = lanes[0];
  for (float lane : lanes) best = lane > best ? lane : best;
  return best;
}

// The first index of the largest of `n` (> 0) floats, none NaN: what std::max_element returns.
size_t ArgMax(const float* values, size_t n) {
  const float best = MaxOf(values, n);
  size_t i = 0;
  while (!(values[i] == best)) ++i;
  return i;
}

// llama.cpp's CPU limit on this thread's grammar steps (patch 0014) for as long as it lives:
// a step past it throws, so a draw under an ambiguous grammar ends near the budget instead of
// running for minutes before it could be measured. Zero: no limit.
class GrammarCpuLimit {
 public:
  explicit GrammarCpuLimit(std::chrono::nanoseconds limit) { llama_grammar_set_thread_cpu_limit(limit.count()); }
  ~GrammarCpuLimit() { llama_grammar_set_thread_cpu_limit(0); }
  GrammarCpuLimit(const GrammarCpuLimit&) = delete;
  GrammarCpuLimit& operator=(const GrammarCpuLimit&) = delete;
};

// The first line of what llama.cpp logged on this thread (it logs why a grammar was refused).
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

Sampler::Sampler(const protocol::SamplingParams& params) : params_(params) {
  chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (params.temperature <= 0) {
    llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
    return;
  }
  if (params.top_k > 0) llama_sampler_chain_add(chain_, llama_sampler_init_top_k(params.top_k));
  if (params.top_p > 0 && params.top_p < 1) {
    llama_sampler_chain_add(chain_, llama_sampler_init_top_p(params.top_p, 1));
  }
  llama_sampler_chain_add(chain_, llama_sampler_init_temp(params.temperature));
  llama_sampler_chain_add(chain_, llama_sampler_init_dist(static_cast<uint32_t>(params.seed)));
}

Sampler::~Sampler() {
  llama_sampler_free(chain_);
  if (grammar_ != nullptr) llama_sampler_free(grammar_);
}

std::unique_ptr<Sampler> Sampler::Make(const protocol::SamplingParams& params, const llama_vocab* vocab,
                                       std::string* error, std::chrono::nanoseconds draw_budget) {
  auto sampler = std::make_unique<Sampler>(params);
  sampler->draw_budget_ = draw_budget;
  if (params.grammar.empty()) {
    if (!params.grammar_tokens.empty()) {
      *error = "grammar_tokens without a grammar";
      return nullptr;
    }
    return sampler;
  }
  if (params.grammar.size() > kMaxGrammarBytes) {
    *error = "grammar of " + std::to_string(params.grammar.size()) + " bytes; at most " +
             std::to_string(kMaxGrammarBytes);
    return nullptr;
  }
  if (vocab == nullptr) {
    *error = "a grammar needs the model's vocabulary (this hop does not sample)";
    return nullptr;
  }
  // llama.cpp's parser reports what it dislikes on its log (one line, patch 0013) and returns null.
  TakeLlamaError();
  sampler->grammar_ = llama_sampler_init_grammar(vocab, params.grammar.c_str(), "root");
  if (sampler->grammar_ == nullptr) {
    const std::string why = FirstLine(TakeLlamaError());
    *error = "the grammar does not parse as GBNF with a 'root' rule (or is left-recursive, or past a bound)" +
             (why.empty() ? std::string() : ": " + why);
    return nullptr;
  }
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  for (uint32_t token : params.grammar_tokens) {
    if (token >= static_cast<uint32_t>(n_vocab)) {
      *error = "grammar token " + std::to_string(token) + " is outside the vocabulary";
      return nullptr;
    }
    const GrammarCpuLimit limit(draw_budget);  // a replayed token costs what a draw may
    if (!sampler->Advance(token)) {
      *error = "grammar_tokens: " + sampler->error_;
      return nullptr;
    }
  }
  return sampler;
}

bool Sampler::Allows(uint32_t token, float logit) const {
  llama_token_data one{static_cast<llama_token>(token), logit, 0.0f};
  llama_token_data_array single{&one, 1, -1, false};
  llama_sampler_apply(grammar_, &single);
  return std::isfinite(one.logit);
}

bool Sampler::Advance(uint32_t token) {
  // llama.cpp aborts the process on an end-of-generation token the grammar does not allow, and
  // throws on other tokens it does not: check first (a replay's tokens come from the network).
  // Either step throws past a grammar bound.
  try {
    if (!Allows(token, 0.0f)) {
      error_ = "token " + std::to_string(token) + " does not continue the grammar";
      return false;
    }
    llama_sampler_accept(grammar_, static_cast<llama_token>(token));
    return true;
  } catch (const std::exception& e) {
    error_ = std::string("token ") + std::to_string(token) + " does not continue the grammar: " + e.what();
    return false;
  }
}

bool Sampler::WithinBudget(std::chrono::nanoseconds started, const char* what) {
  const std::chrono::nanoseconds spent = ThreadCpuTime() - started;
  if (draw_budget_.count() <= 0 || spent <= draw_budget_) return true;
  over_budget_ = true;
  error_ = std::string(what) + " took " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(spent).count()) +
           " ms of CPU, more than this node's sampling budget of " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(draw_budget_).count()) +
           " ms a token";
  return false;
}

uint32_t Sampler::ChooseAllowed(const float* logits, size_t n_vocab) {
  if (params_.temperature <= 0) {
    // The first largest logit the grammar allows: the row's argmax checked alone, then the next
    // largest (ties: the lower id first) one at a time, each far cheaper than masking the row.
    const uint32_t best = static_cast<uint32_t>(ArgMax(logits, n_vocab));
    if (std::isfinite(logits[best]) && Allows(best, logits[best])) return best;
    const size_t k = std::min(kCheckedOneByOne, n_vocab);
    std::vector<uint32_t> ids(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) ids[i] = static_cast<uint32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](uint32_t a, uint32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 1; i < k; ++i) {  // ids[0] is `best`
      if (std::isfinite(logits[ids[i]]) && Allows(ids[i], logits[ids[i]])) return ids[i];
    }
  } else {
    // A seeded draw as llama.cpp's server makes it: from the whole row; a token the grammar
    // refuses is drawn again from the row masked by the grammar.
    std::vector<llama_token_data> data(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) data[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
    llama_token_data_array array{data.data(), data.size(), -1, false};
    llama_sampler_apply(chain_, &array);
    const uint32_t drawn = static_cast<uint32_t>(array.data[array.selected].id);
    if (Allows(drawn, logits[drawn])) return drawn;
  }
  std::vector<llama_token_data> data(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) data[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
  llama_token_data_array array{data.data(), data.size(), -1, false};
  llama_sampler_apply(grammar_, &array);  // disallowed tokens: -inf
  size_t allowed = 0;
  for (size_t i = 0; i < array.size; ++i) allowed += std::isfinite(array.data[i].logit) ? 1 : 0;
  if (allowed == 0) {
    error_ = "the grammar allows no token here";
    return kNoToken;
  }
  if (params_.temperature <= 0) {  // the first largest allowed logit (data is in id order)
    size_t best = 0;
    while (!std::isfinite(data[best].logit)) ++best;
    for (size_t i = best + 1; i < n_vocab; ++i) {
      if (std::isfinite(data[i].logit) && data[i].logit > data[best].logit) best = i;
    }
    return static_cast<uint32_t>(best);
  }
  llama_sampler_apply(chain_, &array);
  return static_cast<uint32_t>(array.data[array.selected].id);
}

protocol::SampledToken Sampler::Sample(const std::vector<float>& logits, uint64_t position) {
  const uint32_t token = Choose(logits.data(), logits.size());
  return Describe(logits.data(), logits.size(), token, position);
}

uint32_t Sampler::ChooseUnderGrammar(const float* logits, size_t n_vocab) {
  uint32_t token = kNoToken;
  try {  // masking throws past a grammar bound (patch 0013)
    token = ChooseAllowed(logits, n_vocab);
  } catch (const std::exception& e) {
    error_ = e.what();
    return kNoToken;
  }
  if (token == kNoToken) return kNoToken;
  try {  // allowed by the grammar just now: accepting it fails only past a bound, or for a bug
    llama_sampler_accept(grammar_, static_cast<llama_token>(token));
  } catch (const std::exception& e) {
    error_ = std::string("accepting token ") + std::to_string(token) + ": " + e.what();
    return kNoToken;
  }
  return token;
}

uint32_t Sampler::Choose(const float* logits, size_t n_vocab) {
  if (grammar_ != nullptr) {
    if (!error_.empty()) return kNoToken;
    const std::chrono::nanoseconds started = ThreadCpuTime();
    uint32_t token = kNoToken;
    {
      const GrammarCpuLimit limit(draw_budget_);
      token = ChooseUnderGrammar(logits, n_vocab);
    }
    last_draw_cpu_ = ThreadCpuTime() - started;
    if (token == kNoToken) {
      WithinBudget(started, "a constrained draw");  // past the budget: that is why (over_budget())
      return kNoToken;
    }
    return WithinBudget(started, "a constrained draw") ? token : kNoToken;
  }
  if (params_.temperature <= 0) {
    return static_cast<uint32_t>(ArgMax(logits, n_vocab));
  }
  std::vector<llama_token_data> data(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) data[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
  llama_token_data_array array{data.data(), data.size(), -1, false};
  llama_sampler_apply(chain_, &array);
  return static_cast<uint32_t>(array.data[array.selected].id);
}

protocol::SampledToken Sampler::Describe(const float* logits, size_t n_vocab, uint32_t token_id,
                                         uint64_t position) const {
  protocol::SampledToken token;
  token.token_id = token_id;
  token.position = position;
  const float max = MaxOf(logits, n_vocab);
  double sum = 0;
  for (size_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - max);
  const float log_z = max + static_cast<float>(std::log(sum));
  token.logprob = logits[token_id] - log_z;
  const size_t top = std::min<size_t>(params_.top_logprobs, n_vocab);
  if (top == 0) return token;
  std::vector<uint32_t> ids(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) ids[i] = static_cast<uint32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(),
                    [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
  for (size_t i = 0; i < top; ++i) token.top.push_back({ids[i], logits[ids[i]] - log_z});
  return token;
}

}  // namespace meshnet::engine
