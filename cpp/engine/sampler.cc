#include "cpp/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "llama.h"

namespace meshnet::engine {
namespace {

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

Sampler::~Sampler() { llama_sampler_free(chain_); }

protocol::SampledToken Sampler::Sample(const std::vector<float>& logits, uint64_t position) {
  const uint32_t token = Choose(logits.data(), logits.size());
  return Describe(logits.data(), logits.size(), token, position);
}

uint32_t Sampler::Choose(const float* logits, size_t n_vocab) {
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
