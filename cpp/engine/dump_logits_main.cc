// dump_logits: the whole model's logits for every position of a token sequence, for drift
// measurements against other runtimes. Writes float32 [n_tokens, n_vocab] row-major to OUT.
//
// Usage: dump_logits MODEL.gguf OUT TOKEN_ID...
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cpp/engine/whole_model.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: dump_logits MODEL.gguf OUT TOKEN_ID...\n";
    return 2;
  }
  const std::vector<int32_t> tokens = meshnet::engine::TokenArgs(argc, argv, 3);
  meshnet::engine::ContextOptions context_options;
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
