// A session's sampler: llama.cpp's sampler chain (greedy, or top-k, top-p, temperature and a
// seeded draw) over one row of logits, plus the token's logprob and the top alternatives.
//
// Constrained sampling (issue 33): with a grammar (GBNF, llama.cpp's grammar sampler) every
// drawn token continues it. Greedy is the first largest logit the grammar allows: the largest
// logits are checked one token at a time, and only when none of the first 64 is allowed is the
// whole row masked. A seeded draw is made as llama.cpp's server makes it: from the whole row,
// and when the grammar refuses that token, again from the row the grammar masked. Each drawn
// token advances the grammar.
//
// Grammars come from the network (issue 55): llama.cpp's grammar (patch 0013) refuses one nested,
// expanded or ambiguous past its process-wide bounds, and a constrained draw that takes more than
// the sampler's CPU budget ends the session's sampling (over_budget()): the time is the sampling
// thread's own CPU time, so a busy node does not charge its load to the grammar. The budget is
// enforced inside llama.cpp's grammar steps (patch 0014), so a draw whose masking would take
// minutes (time exponential in a token's length, under a few kilobytes of ambiguous grammar)
// ends within milliseconds of it; a replayed grammar token gets the same budget.
//
// Lives in the engine package so that only cpp/engine calls llama.cpp. Not thread-safe: one
// owner (the session's step, serialized by the worker's per-session lock) calls Sample.
#ifndef MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_
#define MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpp/wire/seam.h"

struct llama_sampler;
struct llama_vocab;

namespace meshnet::engine {

inline constexpr size_t kMaxGrammarBytes = 256 << 10;  // a SamplingParams.grammar's largest size
inline constexpr uint32_t kNoToken = std::numeric_limits<uint32_t>::max();

class Sampler {
 public:
  // Unconstrained (params.grammar is ignored).
  explicit Sampler(const protocol::SamplingParams& params);
  // With params.grammar (when not empty) over `vocab`, and params.grammar_tokens fed to it; nullptr
  // with `*error` set when the grammar is too large, does not parse, has no "root" rule, or
  // refuses one of those tokens.
  // `draw_budget`: the most CPU time one constrained draw may take (zero: no limit). Feeding
  // grammar_tokens is not timed: each token is bounded by the grammar's stack bound, and there are
  // at most a session's KV positions of them, once an epoch.
  static std::unique_ptr<Sampler> Make(const protocol::SamplingParams& params, const llama_vocab* vocab,
                                       std::string* error,
                                       std::chrono::nanoseconds draw_budget = std::chrono::nanoseconds(0));
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  const protocol::SamplingParams& params() const { return params_; }

  // Draws the token at `position` from `logits` (n_vocab floats, none NaN): Choose, then
  // Describe.
  protocol::SampledToken Sample(const std::vector<float>& logits, uint64_t position);
  // The draw alone (what advances a seeded chain and the grammar): greedy is the first largest
  // logit, as llama.cpp's greedy sampler picks it. `logits` points at n_vocab floats. kNoToken
  // when the grammar allows no token, passes a bound, or the draw took more than the budget
  // (error() says why; over_budget() tells the last apart); the sampler is then spent.
  uint32_t Choose(const float* logits, size_t n_vocab);
  bool constrained() const { return grammar_ != nullptr; }
  const std::string& error() const { return error_; }
  bool over_budget() const { return over_budget_; }
  // The CPU time the last constrained draw took (zero before one, and without a grammar).
  std::chrono::nanoseconds last_draw_cpu() const { return last_draw_cpu_; }
  // The chosen token with its logprob and the params' top alternatives: no draw, so a caller
  // on a hot path may send the token on first and describe it after.
  protocol::SampledToken Describe(const float* logits, size_t n_vocab, uint32_t token,
                                  uint64_t position) const;

 private:
  uint32_t ChooseAllowed(const float* logits, size_t n_vocab);
  uint32_t ChooseUnderGrammar(const float* logits, size_t n_vocab);
  bool WithinBudget(std::chrono::nanoseconds started, const char* what);
  bool Allows(uint32_t token, float logit) const;  // the grammar's mask for one token
  bool Advance(uint32_t token);  // a replayed token: checked, then accepted; false with error_ set

  protocol::SamplingParams params_;
  llama_sampler* chain_ = nullptr;
  llama_sampler* grammar_ = nullptr;
  std::string error_;
  std::chrono::nanoseconds draw_budget_{0};
  bool over_budget_ = false;
  std::chrono::nanoseconds last_draw_cpu_{0};
};

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_
