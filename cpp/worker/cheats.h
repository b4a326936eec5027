// Test only (issue 17): a cheating hop, which the audits of docs/adr/0008-verified-outputs.md
// must catch. The worker builds one only for --cheat=...; a real deployment has none, and a
// session's step then makes no call here (ServiceOptions::cheat is null).
#ifndef MESHNET_CPP_WORKER_CHEATS_H_
#define MESHNET_CPP_WORKER_CHEATS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshnet::worker {

class Cheat {
 public:
  virtual ~Cheat() = default;
  // The output rows of a step starting at `start` (n_embd floats each), before they are
  // committed to and handed on.
  virtual void Rows(std::vector<float>* rows, uint64_t start, size_t n_embd) const = 0;
  // A token the last hop sampled, before it is committed to and published.
  virtual uint32_t Token(uint32_t id, size_t n_vocab) const = 0;
};

// "noise:F" (Gaussian noise of F times each row's RMS), "garbage" (rows replaced by noise of
// their RMS) or "forge_tokens" (each sampled token replaced by the next id). Null, with *error
// set, for anything else ("skip_layer" is the engine's cheat: main.cc loads one layer fewer).
std::shared_ptr<const Cheat> MakeCheat(const std::string& spec, std::string* error);

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_CHEATS_H_
