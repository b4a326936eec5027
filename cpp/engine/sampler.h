// A session's sampler: llama.cpp's sampler chain (greedy, or top-k, top-p, temperature and a
// seeded draw) over one row of logits, plus the token's logprob and the top alternatives.
//
// Lives in the engine package so that only cpp/engine calls llama.cpp. Not thread-safe: one
// owner (the session's step, serialized by the worker's per-session lock) calls Sample.
#ifndef MESHNET_CPP_ENGINE_SAMPLER_H_
#define MESHNET_CPP_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "cpp/protocol/seam.h"

struct llama_sampler;

namespace meshnet::engine {

class Sampler {
 public:
  explicit Sampler(const protocol::SamplingParams& params);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  const protocol::SamplingParams& params() const { return params_; }

  // Draws the token at `position` from `logits` (n_vocab floats, none NaN): Choose, then
  // Describe.
  protocol::SampledToken Sample(const std::vector<float>& logits, uint64_t position);
  // The draw alone (what advances a seeded chain): greedy is the first largest logit, as
  // llama.cpp's greedy sampler picks it. `logits` points at n_vocab floats.
  uint32_t Choose(const float* logits, size_t n_vocab);
  // The chosen token with its logprob and the params' top alternatives: no draw, so a caller
  // on a hot path may send the token on first and describe it after.
  protocol::SampledToken Describe(const float* logits, size_t n_vocab, uint32_t token,
                                  uint64_t position) const;

 private:
  protocol::SamplingParams params_;
  llama_sampler* chain_ = nullptr;
};

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_SAMPLER_H_
