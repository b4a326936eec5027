// greedy: the single-process llama.cpp baseline for route parity tests. Loads the whole model
// (no layer range: the library behaves as upstream), feeds the prompt token ids given on the
// command line, decodes greedily and prints the new token ids as one JSON line.
//
// Usage: greedy [--f32-matmul-activations] [--device D] MODEL.gguf N_NEW TOKEN_ID...
//   ($MESHNET_THREADS sets the compute threads; the flag: quantized weights dequantized and dotted
//   with F32 activations, as a model certified that way is served, ADR 0012; --device: where the
//   model computes, "cpu" or a GPU device of a backend linked into the binary, e.g. vulkan0 in
//   greedy_vulkan, ADR 0014)
// The JSON line also carries ttft_ms (prompt decode + first token) and decode_tok_s.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cpp/engine/whole_model.h"

int main(int argc, char** argv) {
  meshnet::engine::ContextOptions context_options;
  std::string device = "cpu";
  while (true) {
    if (meshnet::engine::TakeLeadingFlag(&argc, &argv, "--f32-matmul-activations")) {
      context_options.f32_matmul_activations = true;
    } else if (!meshnet::engine::TakeLeadingOption(&argc, &argv, "--device", &device)) {
      break;
    }
  }
  if (argc < 4) {
    std::cerr << "usage: greedy [--f32-matmul-activations] [--device D] MODEL.gguf N_NEW TOKEN_ID...\n";
    return 2;
  }
  const int n_new = std::atoi(argv[2]);
  const std::vector<int32_t> prompt = meshnet::engine::TokenArgs(argc, argv, 3);
  context_options.n_ctx = static_cast<int>(prompt.size()) + n_new + 8;
  if (const char* threads = std::getenv("MESHNET_THREADS")) context_options.n_threads = std::atoi(threads);
  auto whole = meshnet::engine::OpenWholeModel("greedy", argv[1], context_options, device);
  if (!whole) return 1;
  meshnet::engine::Model* model = whole->model.get();
  meshnet::engine::Context* context = whole->context.get();
  std::string error;
  meshnet::engine::Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.AddToken(0, static_cast<int32_t>(i), prompt[i], i + 1 == prompt.size());
  }
  std::vector<int32_t> out;
  int32_t pos = static_cast<int32_t>(prompt.size());
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto first = started;
  for (int step = 0; step < n_new; ++step) {
    if (!context->Decode(batch, &error)) {
      std::cerr << "greedy: " << error << "\n";
      return 1;
    }
    const float* logits = context->Logits(batch.size() - 1);
    int32_t best = 0;
    for (int v = 1; v < model->n_vocab(); ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.push_back(best);
    if (step == 0) first = Clock::now();
    batch.Clear();
    batch.AddToken(0, pos++, best, true);
  }
  const double ttft = std::chrono::duration<double>(first - started).count();
  const double rest = std::chrono::duration<double>(Clock::now() - first).count();
  std::cout << "{\"ttft_ms\": " << ttft * 1000 << ", \"decode_tok_s\": "
            << (n_new > 1 && rest > 0 ? (n_new - 1) / rest : 0) << ", \"tokens\": [";
  for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? ", " : "") << out[i];
  std::cout << "]}" << std::endl;
  return 0;
}
