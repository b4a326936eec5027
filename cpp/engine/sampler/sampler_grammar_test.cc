// Constrained sampling (issue 33) over the bundled model's real vocabulary: every token drawn
// under a grammar continues it, greedy is the argmax over the tokens the grammar allows, a
// grammar fed the tokens of an earlier epoch goes on exactly as an undisturbed one, and what
// cannot be used is refused with a reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/llama_log/llama_log.h"
#include "cpp/engine/sampler/sampler.h"
#include "llama.h"

namespace meshnet::engine {
namespace {

const char* g_model_path = nullptr;

class SamplerGrammarTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    model_ = llama_model_load_from_file(g_model_path, params);
    ASSERT_NE(model_, nullptr) << g_model_path;
  }
  static void TearDownTestSuite() { llama_model_free(model_); }

  static const llama_vocab* vocab() { return llama_model_get_vocab(model_); }
  static size_t n_vocab() { return static_cast<size_t>(llama_vocab_n_tokens(vocab())); }
  static std::string Piece(uint32_t token) {
    char buf[256];
    const int n = llama_token_to_piece(vocab(), static_cast<llama_token>(token), buf, sizeof buf, 0, true);
    return std::string(buf, n > 0 ? n : 0);
  }
  static std::vector<float> Logits(std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0, 3);
    std::vector<float> logits(n_vocab());
    for (float& logit : logits) logit = normal(rng);
    return logits;
  }
  // Draws until the grammar is complete (an end-of-generation token) or `limit` tokens.
  static std::vector<uint32_t> Run(Sampler& sampler, uint64_t seed, int limit) {
    std::mt19937_64 rng(seed);
    std::vector<uint32_t> tokens;
    for (int i = 0; i < limit; ++i) {
      const uint32_t token = sampler.Choose(Logits(rng).data(), n_vocab());
      EXPECT_NE(token, kNoToken) << sampler.error();
      if (token == kNoToken) break;
      tokens.push_back(token);
      if (llama_vocab_is_eog(vocab(), static_cast<llama_token>(token))) break;
    }
    return tokens;
  }
  static std::string Text(const std::vector<uint32_t>& tokens) {
    std::string text;
    for (uint32_t token : tokens) {
      if (!llama_vocab_is_eog(vocab(), static_cast<llama_token>(token))) text += Piece(token);
    }
    return text;
  }

  static llama_model* model_;
};
llama_model* SamplerGrammarTest::model_ = nullptr;

// A finite JSON-ish language: every run must end, and the text must match it exactly.
constexpr char kObject[] = R"(root ::= "{\"n\": " [1-9] [0-9]? ", \"ok\": " ("true" | "false") "}")";
const std::regex kObjectText(R"(\{"n": [1-9][0-9]?, "ok": (true|false)\})");

protocol::SamplingParams Constrained(const char* grammar, float temperature = 0, uint64_t seed = 0) {
  protocol::SamplingParams params;
  params.grammar = grammar;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

TEST_F(SamplerGrammarTest, EveryDrawContinuesTheGrammarAndEndsWhereItIsComplete) {
  for (float temperature : {0.0f, 0.8f}) {
    for (uint64_t seed = 0; seed < 10; ++seed) {
      std::string error;
      auto sampler = Sampler::Make(Constrained(kObject, temperature, seed), vocab(), &error);
      ASSERT_NE(sampler, nullptr) << error;
      EXPECT_TRUE(sampler->constrained());
      std::vector<uint32_t> tokens = Run(*sampler, seed, 64);
      ASSERT_FALSE(tokens.empty());
      EXPECT_TRUE(llama_vocab_is_eog(vocab(), static_cast<llama_token>(tokens.back())))
          << "temperature " << temperature << " seed " << seed << ": " << Text(tokens);
      EXPECT_TRUE(std::regex_match(Text(tokens), kObjectText)) << Text(tokens);
    }
  }
}

TEST_F(SamplerGrammarTest, GreedyIsTheFirstLargestAllowedLogit) {
  std::string error;
  auto sampler = Sampler::Make(Constrained(R"(root ::= "yes" | "no")"), vocab(), &error);
  ASSERT_NE(sampler, nullptr) << error;
  std::mt19937_64 rng(3);
  std::vector<float> logits = Logits(rng);
  Sampler free_sampler{protocol::SamplingParams()};
  const uint32_t unconstrained = free_sampler.Choose(logits.data(), n_vocab());
  const uint32_t chosen = sampler->Choose(logits.data(), n_vocab());
  ASSERT_NE(chosen, kNoToken) << sampler->error();
  const std::string piece = Piece(chosen);
  EXPECT_TRUE(std::string("yes").rfind(piece, 0) == 0 || std::string("no").rfind(piece, 0) == 0) << piece;
  // Among all tokens that start "yes" or "no", none has a larger logit (ties: the first).
  for (size_t i = 0; i < n_vocab(); ++i) {
    const std::string other = Piece(static_cast<uint32_t>(i));
    if (other.empty() || !(std::string("yes").rfind(other, 0) == 0 || std::string("no").rfind(other, 0) == 0)) continue;
    EXPECT_TRUE(logits[i] < logits[chosen] || (logits[i] == logits[chosen] && i >= chosen)) << other;
  }
  EXPECT_NE(unconstrained, chosen);  // the row's own argmax is not one of them (seed 3)
}

TEST_F(SamplerGrammarTest, FedTheTokensOfAnEarlierEpochItGoesOnAsUndisturbed) {
  // Greedy: a seeded draw restarts its random stream on a new epoch anyway.
  std::string error;
  auto whole = Sampler::Make(Constrained(kObject), vocab(), &error);
  ASSERT_NE(whole, nullptr) << error;
  std::mt19937_64 rng(11);
  std::vector<std::vector<float>> rows;
  std::vector<uint32_t> expected;
  for (int i = 0; i < 40; ++i) {
    rows.push_back(Logits(rng));
    expected.push_back(whole->Choose(rows.back().data(), n_vocab()));
    if (llama_vocab_is_eog(vocab(), static_cast<llama_token>(expected.back()))) break;
  }
  ASSERT_GE(expected.size(), 4u);
  for (size_t cut = 1; cut + 1 < expected.size(); ++cut) {
    protocol::SamplingParams params = Constrained(kObject);
    params.grammar_tokens.assign(expected.begin(), expected.begin() + cut);
    auto resumed = Sampler::Make(params, vocab(), &error);
    ASSERT_NE(resumed, nullptr) << error;
    for (size_t i = cut; i < expected.size(); ++i) {
      EXPECT_EQ(resumed->Choose(rows[i].data(), n_vocab()), expected[i]) << "cut " << cut << " row " << i;
    }
  }
}

TEST_F(SamplerGrammarTest, WhatCannotBeUsedIsRefusedWithAReason) {
  struct Case {
    std::string grammar;
    std::vector<uint32_t> tokens;
    std::string want;
  };
  const std::vector<uint32_t> wrong = {static_cast<uint32_t>(llama_vocab_bos(vocab()))};
  const std::vector<Case> cases = {
      {"root ::= [", {}, "does not parse"},
      {"start ::= \"x\"", {}, "does not parse"},  // no root rule
      {"root ::= root \"x\" | \"x\"", {}, "left-recursive"},
      {std::string(kMaxGrammarBytes + 1, ' '), {}, "at most"},
      {kObject, {static_cast<uint32_t>(n_vocab())}, "outside the vocabulary"},
      {kObject, wrong, "does not continue the grammar"},
      {"", {1}, "grammar_tokens without a grammar"},
  };
  for (const Case& c : cases) {
    protocol::SamplingParams params = Constrained("");
    params.grammar = c.grammar;
    params.grammar_tokens = c.tokens;
    std::string error;
    EXPECT_EQ(Sampler::Make(params, vocab(), &error), nullptr) << c.want;
    EXPECT_NE(error.find(c.want), std::string::npos) << error;
  }
  std::string error;
  EXPECT_EQ(Sampler::Make(Constrained(kObject), nullptr, &error), nullptr);
  EXPECT_NE(error.find("vocabulary"), std::string::npos) << error;
  // Without a grammar nothing changes: no vocabulary needed, greedy as before.
  auto plain = Sampler::Make(protocol::SamplingParams(), nullptr, &error);
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->constrained());
}

TEST_F(SamplerGrammarTest, ASpentGrammarAllowsNothingAndSaysSo) {
  std::string error;
  auto sampler = Sampler::Make(Constrained(R"(root ::= "a")"), vocab(), &error);
  ASSERT_NE(sampler, nullptr) << error;
  std::vector<float> logits(n_vocab(), 0.0f);
  // Only end-of-generation tokens follow "a"; a row where those are -inf leaves nothing.
  const uint32_t a = sampler->Choose(logits.data(), n_vocab());
  ASSERT_NE(a, kNoToken) << sampler->error();
  EXPECT_EQ(Piece(a), "a");
  for (size_t i = 0; i < n_vocab(); ++i) {
    if (llama_vocab_is_eog(vocab(), static_cast<llama_token>(i))) logits[i] = -INFINITY;
  }
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);
  EXPECT_NE(sampler->error().find("allows no token"), std::string::npos) << sampler->error();
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);  // spent
}

// Issue 55: grammars written to hurt the node. Each is refused with its reason before it costs
// more than a bound (patch 0013), and the refusal is logged in one short line.
std::string Nested(size_t depth) {
  return "root ::= " + std::string(depth, '(') + "\"x\"" + std::string(depth, ')');
}

// Sixty-four alternatives that each open an array of the same value: every '[' multiplies the
// parse stacks by 64 (the finding: the second token's step never returned).
std::string AmbiguousArrays() {
  std::string grammar = "root ::= v\nv ::= ";
  for (int i = 0; i < 64; ++i) grammar += (i ? " | a" : "a") + std::to_string(i);
  grammar += "\n";
  for (int i = 0; i < 64; ++i) grammar += "a" + std::to_string(i) + " ::= \"[\" v? \"]\"\n";
  return grammar;
}

TEST_F(SamplerGrammarTest, HostileGrammarsAreRefusedWithTheirBound) {
  InstallLlamaLog();
  struct Case {
    std::string grammar;
    std::string want;
  };
  const std::vector<Case> cases = {
      {Nested(17500), "nested deeper than 1024 levels"},  // 35 KB: overflowed the stack
      {Nested(1024), "nested deeper than 1024 levels"},  // a rule and 1024 groups
      {"root ::= \"" + std::string(32000, 'a') + "\"{2000}", "repetitions expand past"},  // 2 GB before
      {"root ::= \"" + std::string(600, 'a') + "\"{1,2000}", "repetitions expand past"},
      {"root ::= [" + std::string(kMaxGrammarBytes - 16, 'a'), "unexpected end of input"},
  };
  for (const Case& c : cases) {
    std::string error;
    TakeLlamaError();
    EXPECT_EQ(Sampler::Make(Constrained(c.grammar.c_str()), vocab(), &error), nullptr) << c.want;
    EXPECT_NE(error.find(c.want), std::string::npos) << error.substr(0, 400);
    EXPECT_LT(error.size(), 400u);
    // What llama.cpp logged for it (to stderr as well): short lines, never the grammar's text.
    const std::string logged = TakeLlamaError();
    EXPECT_LT(logged.size(), 400u) << logged.substr(0, 400);
  }
  // Just inside the bounds: accepted.
  std::string error;
  EXPECT_NE(Sampler::Make(Constrained(Nested(1023).c_str()), vocab(), &error), nullptr) << error;
  EXPECT_NE(Sampler::Make(Constrained(("root ::= \"" + std::string(400, 'a') + "\"{2000}").c_str()), vocab(), &error),
            nullptr) << error;
}

TEST_F(SamplerGrammarTest, ALongChainOfRulesIsParsedWithoutExhaustingTheStack) {
  // llama.cpp's left-recursion check recurses once per rule of a chain: with three-character
  // names, 256 KiB holds about 21,800 rules ("r00 ::= r01", then "y").
  const auto name = [](int i) {
    const char* digits = "abcdefghijklmnopqrstuvwxyz0123456789";
    return std::string{digits[(i / 1296) % 26], digits[(i / 36) % 36], digits[i % 36]};
  };
  std::string grammar = "root ::= " + name(0) + "\n";
  int n = 0;
  while (grammar.size() + 24 < kMaxGrammarBytes) {
    grammar += name(n) + " ::= " + name(n + 1) + "\n";
    ++n;
  }
  grammar += name(n) + " ::= \"y\"\n";
  std::string error;
  std::thread([&] {  // on a thread with the default stack, as the worker's gRPC threads
    auto sampler = Sampler::Make(Constrained(grammar.c_str()), vocab(), &error);
    ASSERT_NE(sampler, nullptr) << error.substr(0, 400);
    std::vector<float> logits(n_vocab(), 0.0f);
    const uint32_t first = sampler->Choose(logits.data(), n_vocab());
    ASSERT_NE(first, kNoToken) << sampler->error();
    EXPECT_EQ(Piece(first).substr(0, 1), "y");
  }).join();
  EXPECT_GT(n, 21000);
}

TEST_F(SamplerGrammarTest, AGrammarPastTheStackBoundEndsItsSamplingAtOnce) {
  InstallLlamaLog();
  const std::string grammar = AmbiguousArrays();
  std::string error;
  auto sampler = Sampler::Make(Constrained(grammar.c_str()), vocab(), &error);
  ASSERT_NE(sampler, nullptr) << error;
  // Every token the grammar allows starts with '[': the first accepted one passes the bound.
  std::vector<float> logits(n_vocab(), 0.0f);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);
  EXPECT_NE(sampler->error().find("more than 1024 parse stacks"), std::string::npos) << sampler->error();
  EXPECT_FALSE(sampler->over_budget());
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);  // spent
  // The same bound when the tokens come as a replay (a ticket holder's grammar_tokens).
  llama_token bracket[4];
  ASSERT_EQ(llama_tokenize(vocab(), "[", 1, bracket, 4, false, false), 1);
  protocol::SamplingParams replay = Constrained(grammar.c_str());
  replay.grammar_tokens = {static_cast<uint32_t>(bracket[0]), static_cast<uint32_t>(bracket[0])};
  EXPECT_EQ(Sampler::Make(replay, vocab(), &error), nullptr);
  EXPECT_NE(error.find("parse stacks"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  // An honest grammar beside it is unharmed.
  auto honest = Sampler::Make(Constrained(kObject), vocab(), &error);
  ASSERT_NE(honest, nullptr) << error;
  EXPECT_TRUE(std::regex_match(Text(Run(*honest, 7, 64)), kObjectText));
}

TEST_F(SamplerGrammarTest, ADrawOverItsCpuBudgetEndsTheSessionsSampling) {
  std::string error;
  auto sampler = Sampler::Make(Constrained(kObject), vocab(), &error, std::chrono::nanoseconds(1));
  ASSERT_NE(sampler, nullptr) << error;
  std::vector<float> logits(n_vocab(), 0.0f);
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);
  EXPECT_TRUE(sampler->over_budget());
  EXPECT_NE(sampler->error().find("sampling budget"), std::string::npos) << sampler->error();
  // A budget no honest draw comes near: the same grammar samples to its end.
  auto roomy = Sampler::Make(Constrained(kObject), vocab(), &error, std::chrono::seconds(5));
  ASSERT_NE(roomy, nullptr) << error;
  EXPECT_TRUE(std::regex_match(Text(Run(*roomy, 3, 64)), kObjectText));
  EXPECT_FALSE(roomy->over_budget());
}

// Many one-character alternatives, repeated: a few kilobytes within every bound of patch 0013
// whose masking takes time exponential in a token's length (each of the 300 stacks retries the
// candidates the others rejected, at every character): more than a minute a draw unbounded.
std::string ExponentialMasking() {
  std::string grammar = "root ::= (";
  for (int i = 0; i < 300; ++i) grammar += (i ? " | a" : "a") + std::to_string(i);
  grammar += ")*\n";
  for (int i = 0; i < 300; ++i) grammar += "a" + std::to_string(i) + " ::= [ -~]\n";
  return grammar;
}

TEST_F(SamplerGrammarTest, ADrawWhoseMaskingWouldTakeMinutesEndsAtItsBudget) {
  const std::string grammar = ExponentialMasking();
  std::string error;
  auto sampler = Sampler::Make(Constrained(grammar.c_str()), vocab(), &error, std::chrono::milliseconds(200));
  ASSERT_NE(sampler, nullptr) << error;
  std::mt19937_64 rng(5);
  const std::vector<float> logits = Logits(rng);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(sampler->Choose(logits.data(), n_vocab()), kNoToken);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_TRUE(sampler->over_budget());
  EXPECT_NE(sampler->error().find("sampling budget"), std::string::npos) << sampler->error();
  EXPECT_GE(sampler->last_draw_cpu(), std::chrono::milliseconds(200));
  EXPECT_LT(sampler->last_draw_cpu(), std::chrono::milliseconds(1000));
  // A replayed token gets the same budget: checking one long token alone is as exponential.
  std::vector<llama_token> word(16);
  const std::string text = "abcdefghijklmnopqrstuvwxyz";
  const int n = llama_tokenize(vocab(), text.c_str(), static_cast<int32_t>(text.size()), word.data(), 16, false, false);
  ASSERT_GT(n, 0);
  protocol::SamplingParams replay = Constrained(grammar.c_str());
  for (int i = 0; i < n; ++i) replay.grammar_tokens.push_back(static_cast<uint32_t>(word[i]));
  const auto replaying = std::chrono::steady_clock::now();
  auto replayed = Sampler::Make(replay, vocab(), &error, std::chrono::milliseconds(200));
  EXPECT_LT(std::chrono::steady_clock::now() - replaying, std::chrono::seconds(5 * n));
  if (replayed == nullptr) {
    EXPECT_NE(error.find("CPU"), std::string::npos) << error;
  }
  // The limit is the draw's own: an honest grammar on the same thread afterwards is unharmed.
  auto honest = Sampler::Make(Constrained(kObject), vocab(), &error, std::chrono::milliseconds(200));
  ASSERT_NE(honest, nullptr) << error;
  EXPECT_TRUE(std::regex_match(Text(Run(*honest, 7, 64)), kObjectText));
  EXPECT_FALSE(honest->over_budget());
}

}  // namespace
}  // namespace meshnet::engine

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    fprintf(stderr, "usage: sampler_grammar_test MODEL.gguf\n");
    return 2;
  }
  meshnet::engine::g_model_path = argv[1];
  return RUN_ALL_TESTS();
}
