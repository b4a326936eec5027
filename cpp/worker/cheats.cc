#include "cpp/worker/cheats.h"

#include <cmath>
#include <cstdlib>
#include <random>

namespace meshnet::worker {
namespace {

// Perturbs (noise > 0) or replaces (garbage) every row with Gaussian noise scaled by its RMS.
class RowCheat final : public Cheat {
 public:
  RowCheat(bool garbage, float noise) : garbage_(garbage), noise_(noise) {}
  void Rows(std::vector<float>* rows, uint64_t start, size_t n_embd) const override {
    std::mt19937_64 rng(0x6d657368ULL ^ start);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t r = 0; r * n_embd < rows->size(); ++r) {
      float* row = rows->data() + r * n_embd;
      double sum = 0;
      for (size_t i = 0; i < n_embd; ++i) sum += double(row[i]) * row[i];
      const float rms = static_cast<float>(std::sqrt(sum / double(n_embd)));
      for (size_t i = 0; i < n_embd; ++i) {
        row[i] = garbage_ ? normal(rng) * rms : row[i] + normal(rng) * rms * noise_;
      }
    }
  }
  uint32_t Token(uint32_t id, size_t) const override { return id; }

 private:
  const bool garbage_;
  const float noise_;
};

class TokenCheat final : public Cheat {
 public:
  void Rows(std::vector<float>*, uint64_t, size_t) const override {}
  uint32_t Token(uint32_t id, size_t n_vocab) const override {
    return static_cast<uint32_t>((id + 1) % n_vocab);
  }
};

}  // namespace

std::shared_ptr<const Cheat> MakeCheat(const std::string& spec, std::string* error) {
  if (spec == "garbage") return std::make_shared<RowCheat>(true, 0.0f);
  if (spec == "forge_tokens") return std::make_shared<TokenCheat>();
  if (spec.rfind("noise:", 0) == 0 && std::atof(spec.c_str() + 6) > 0) {
    return std::make_shared<RowCheat>(false, static_cast<float>(std::atof(spec.c_str() + 6)));
  }
  *error = "cheat must be noise:FRACTION, garbage or forge_tokens, not \"" + spec + "\"";
  return nullptr;
}

}  // namespace meshnet::worker
