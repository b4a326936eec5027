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
// Lives in the engine package so that only cpp/engine calls llama.cpp. Not thread-safe: one
// owner (the session's step, serialized by the worker's per-session lock) calls Sample.
#ifndef MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_
#define MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_

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
  static std::unique_ptr<Sampler> Make(const protocol::SamplingParams& params, const llama_vocab* vocab,
                                       std::string* error);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  const protocol::SamplingParams& params() const { return params_; }

  // Draws the token at `position` from `logits` (n_vocab floats, none NaN): Choose, then
  // Describe.
  protocol::SampledToken Sample(const std::vector<float>& logits, uint64_t position);
  // The draw alone (what advances a seeded chain and the grammar): greedy is the first largest
  // logit, as llama.cpp's greedy sampler picks it. `logits` points at n_vocab floats. kNoToken
  // when the grammar allows no token (error() says why); the sampler is then spent.
  uint32_t Choose(const float* logits, size_t n_vocab);
  bool constrained() const { return grammar_ != nullptr; }
  const std::string& error() const { return error_; }
  // The chosen token with its logprob and the params' top alternatives: no draw, so a caller
  // on a hot path may send the token on first and describe it after.
  protocol::SampledToken Describe(const float* logits, size_t n_vocab, uint32_t token,
                                  uint64_t position) const;

 private:
  uint32_t ChooseAllowed(const float* logits, size_t n_vocab);
  bool Allows(uint32_t token, float logit) const;  // the grammar's mask for one token
  bool Advance(uint32_t token);  // a replayed token: checked, then accepted; false with error_ set

  protocol::SamplingParams params_;
  llama_sampler* chain_ = nullptr;
  llama_sampler* grammar_ = nullptr;
  std::string error_;
};

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_SAMPLER_SAMPLER_H_
