// measure_shard: what one layer-range shard of a GGUF holds, in a fresh process. Loads
// [START, END) with mmap off (the owned tensors are read into memory, so RSS follows the range),
// creates a context of 1024 cells, prefills 512 rows (tokens on a first shard, a constant residual
// elsewhere: this measures memory, not numbers) and prints one JSON object:
//   {"start", "end", "n_layer", "weights", "kv", "rss_base", "rss_load", "rss_prefill"}
// weights and kv are the engine's byte counts; RSS is VmRSS before load, after load, after the
// prefill. The engine's memory test (engine_test) and the certification suite
// (python/meshnet/certify) run it once per range.
//
// Usage: measure_shard MODEL.gguf START END   (END -1: to the last layer)
// Exit status: 0; 1 when the model, context or prefill fails; 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpp/engine/engine.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: measure_shard MODEL.gguf START END\n");
    return 2;
  }
  using meshnet::engine::CurrentRssBytes;
  std::string error;
  meshnet::engine::ModelOptions options;
  options.path = argv[1];
  options.layer_start = std::atoi(argv[2]);
  options.layer_end = std::atoi(argv[3]);
  options.use_mmap = false;
  const size_t rss_base = CurrentRssBytes();
  auto model = meshnet::engine::Model::Open(options, &error);
  if (model == nullptr) {
    std::fprintf(stderr, "measure_shard: %s\n", error.c_str());
    return 1;
  }
  const size_t rss_load = CurrentRssBytes();
  meshnet::engine::ContextOptions context_options;
  context_options.n_ctx = 1024;
  context_options.n_batch = context_options.n_ubatch = 512;
  context_options.n_threads = 2;
  auto context = meshnet::engine::Context::Create(*model, context_options, &error);
  if (context == nullptr) {
    std::fprintf(stderr, "measure_shard: %s\n", error.c_str());
    return 1;
  }
  std::vector<int32_t> prompt = model->Tokenize("Tell me about the history of Rome. ", /*add_special=*/true);
  std::vector<float> hidden(model->n_embd(), 0.01f);
  meshnet::engine::Batch batch;
  for (int i = 0; i < 512; ++i) {
    if (model->owns_input()) {
      batch.AddToken(0, i, prompt[i % prompt.size()], i == 511);
    } else {
      batch.AddHidden(0, i, hidden.data(), model->n_embd(), i == 511);
    }
  }
  if (!context->Decode(batch, &error)) {
    std::fprintf(stderr, "measure_shard: %s\n", error.c_str());
    return 1;
  }
  std::printf(
      "{\"start\": %d, \"end\": %d, \"n_layer\": %d, \"weights\": %zu, \"kv\": %zu, \"rss_base\": %zu, "
      "\"rss_load\": %zu, \"rss_prefill\": %zu}\n",
      model->layer_start(), model->layer_end(), model->n_layer(), model->weight_bytes(), context->kv_bytes(),
      rss_base, rss_load, CurrentRssBytes());
  return 0;
}
