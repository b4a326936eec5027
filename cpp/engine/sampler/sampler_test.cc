// The sampler's greedy choice and logprobs against plain definitions: the first largest logit
// (std::max_element), and log softmax.
#include "cpp/engine/sampler/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace meshnet::engine {
namespace {

std::vector<float> Logits(size_t n, uint64_t seed, int levels) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> level(0, levels - 1);
  std::vector<float> logits(n);
  for (float& logit : logits) logit = static_cast<float>(level(rng)) * 0.25f - 3.0f;  // many ties
  return logits;
}

TEST(SamplerTest, GreedyIsTheFirstLargestLogitAtEveryLength) {
  Sampler greedy{protocol::SamplingParams()};
  for (size_t n : {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 1000u, 49155u}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      std::vector<float> logits = Logits(n, seed, seed % 2 ? 4 : 4096);
      const size_t want = std::max_element(logits.begin(), logits.end()) - logits.begin();
      EXPECT_EQ(greedy.Choose(logits.data(), n), want) << "n " << n << " seed " << seed;
    }
  }
  std::vector<float> tail(33, -1.0f);
  tail.back() = 2.0f;  // the largest in the part past the last full group of eight
  EXPECT_EQ(greedy.Choose(tail.data(), tail.size()), 32u);
  std::vector<float> negative(20, -5.0f);  // all equal: the first
  EXPECT_EQ(greedy.Choose(negative.data(), negative.size()), 0u);
}

TEST(SamplerTest, LogprobsAreLogSoftmax) {
  protocol::SamplingParams params;
  params.top_logprobs = 3;
  Sampler sampler(params);
  std::vector<float> logits = Logits(1001, 7, 64);  // spread over 16: many terms count
  const uint32_t chosen = sampler.Choose(logits.data(), logits.size());
  protocol::SampledToken token = sampler.Describe(logits.data(), logits.size(), chosen, 42);
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float logit : logits) sum += std::exp(double(logit) - max);
  EXPECT_EQ(token.token_id, chosen);
  EXPECT_EQ(token.position, 42u);
  EXPECT_NEAR(token.logprob, logits[chosen] - (max + std::log(sum)), 1e-5);
  ASSERT_EQ(token.top.size(), 3u);
  EXPECT_EQ(logits[token.top[0].token_id], logits[chosen]);  // a largest logit (ties: any of them)
  EXPECT_FLOAT_EQ(token.top[0].logprob, token.logprob);
  EXPECT_GE(token.top[0].logprob, token.top[1].logprob);
  EXPECT_GE(token.top[1].logprob, token.top[2].logprob);
}

}  // namespace
}  // namespace meshnet::engine
