// Test fixture: a tiny seeded random-weight Llama written as an F32 GGUF.
//
// The one maker of the fixture: C++ tests call WriteTinyLlama, Python tests run the
// //cpp/engine:tiny_llama_writer command (python/meshnet/recipe/fixtures.py). Written with ggml's
// gguf API: llama.cpp's tensor names and shapes for the llama architecture, a SentencePiece
// vocabulary of control, byte and character tokens. The same options always write the same
// bytes. Test-only.
#ifndef MESHNET_CPP_ENGINE_TINY_LLAMA_H_
#define MESHNET_CPP_ENGINE_TINY_LLAMA_H_

#include <cstdint>
#include <string>

namespace meshnet::engine {

struct TinyLlamaOptions {
  int n_layer = 4;
  int n_embd = 32;      // multiple of 8: 4 heads, 2 kv heads
  int n_vocab = 64;     // >= 31 (control, byte and letter tokens)
  uint32_t seed = 0;
  bool tied = true;     // no output.weight: the head reuses token_embd.weight
  bool rope_freqs = false;  // a Llama-3 style rope_freqs.weight shared by all layers
};

// Writes the model to `path`; false with `*error` set on failure.
bool WriteTinyLlama(const std::string& path, const TinyLlamaOptions& options, std::string* error);

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_TINY_LLAMA_H_
