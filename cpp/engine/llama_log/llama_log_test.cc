// The per-thread error text is what the thread's own failed calls logged, bounded however many
// failures a thread never takes.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "cpp/engine/llama_log/llama_log.h"
#include "llama.h"

namespace meshnet::engine {
namespace {

// A grammar that does not parse: llama.cpp logs why (no vocabulary is needed to parse).
void RefuseOneGrammar() {
  llama_sampler* sampler = llama_sampler_init_grammar(nullptr, "root ::= [", "root");
  EXPECT_EQ(sampler, nullptr);
}

TEST(LlamaLogTest, AFailedCallSaysWhyOnItsOwnThreadOnly) {
  InstallLlamaLog();
  TakeLlamaError();
  RefuseOneGrammar();
  std::string other;
  std::thread([&] { other = TakeLlamaError(); }).join();
  EXPECT_EQ(other, "");
  const std::string mine = TakeLlamaError();
  EXPECT_NE(mine.find("error parsing grammar"), std::string::npos) << mine;
  EXPECT_EQ(TakeLlamaError(), "");  // taken
}

TEST(LlamaLogTest, AThreadThatNeverTakesItsErrorsHoldsABoundedTail) {
  InstallLlamaLog();
  TakeLlamaError();
  for (int i = 0; i < 2000; ++i) RefuseOneGrammar();
  const std::string kept = TakeLlamaError();
  EXPECT_LE(kept.size(), kMaxKeptBytes);
  EXPECT_GT(kept.size(), kMaxKeptBytes / 2);
  EXPECT_NE(kept.find("failed to parse grammar"), std::string::npos) << kept;
}

}  // namespace
}  // namespace meshnet::engine
