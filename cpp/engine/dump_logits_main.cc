// dump_logits: the whole model's logits for every position of a token sequence, for drift
// measurements against other runtimes. Writes float32 [n_tokens, n_vocab] row-major to OUT.
//
// Usage: dump_logits [--optimized-kernels] [--f16-flash-attention] [--f32-matmul-activations]
//                    MODEL.gguf OUT TOKEN_ID...
//   --f32-matmul-activations  quantized weights dequantized and dotted with F32 activations (ADR 0012)
//   --f16-flash-attention  flash attention over an F16 KV cache (upstream's CPU default) instead
//                          of the shards' F32 attention (diagnostic, ADR 0010)
//   --optimized-kernels  ggml's optimized CPU kernels (tiled flash attention, op fusion) instead
//                        of the reference ones the shards run for batch invariance (diagnostic;
//                        llamafile's GEMM stays compiled out of this build)
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cpp/engine/whole_model.h"

int main(int argc, char** argv) {
  meshnet::engine::ContextOptions context_options;
  int first = 1;
  for (; first < argc && std::string(argv[first]).rfind("--", 0) == 0; ++first) {
    const std::string flag = argv[first];
    if (flag == "--optimized-kernels") {
      context_options.reference_kernels = false;
    } else if (flag == "--f16-flash-attention") {
      context_options.f32_attention = false;
    } else if (flag == "--f32-matmul-activations") {
      context_options.f32_matmul_activations = true;
    } else {
      std::cerr << "dump_logits: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (argc - first < 3) {
    std::cerr << "usage: dump_logits [--optimized-kernels] [--f16-flash-attention] [--f32-matmul-activations] "
                 "MODEL.gguf OUT TOKEN_ID...\n";
    return 2;
  }
  argv += first - 1;
  argc -= first - 1;
  const std::vector<int32_t> tokens = meshnet::engine::TokenArgs(argc, argv, 3);
  context_options.n_ctx = static_cast<int>(tokens.size()) + 8;
  context_options.n_batch = context_options.n_ubatch = static_cast<int>(tokens.size());
  auto whole = meshnet::engine::OpenWholeModel("dump_logits", argv[1], context_options);
  if (!whole) return 1;
  meshnet::engine::Model* model = whole->model.get();
  meshnet::engine::Context* context = whole->context.get();
  std::string error;
  meshnet::engine::Batch batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.AddToken(0, static_cast<int32_t>(i), tokens[i], true);
  if (!context->Decode(batch, &error)) {
    std::cerr << "dump_logits: " << error << "\n";
    return 1;
  }
  FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::cerr << "dump_logits: cannot write " << argv[2] << "\n";
    return 1;
  }
  for (int row = 0; row < batch.size(); ++row) {
    std::fwrite(context->Logits(row), sizeof(float), model->n_vocab(), out);
  }
  std::fclose(out);
  return 0;
}
