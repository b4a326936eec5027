// See tiny_llama.h.
#include "tiny_llama.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ggml.h"
#include "gguf.h"

namespace meshnet::engine {
namespace {

constexpr int kHead = 4;
constexpr int kHeadKv = 2;
constexpr float kWeightStd = 0.02f;

std::vector<std::string> Vocabulary(int n_vocab) {
  const std::string boundary = "\xe2\x96\x81";  // U+2581, SentencePiece word boundary
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0x0A>", boundary};
  const std::string chars =
      "abcdefghijklmnopqrstuvwxyz0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
      "ABCDEFGHIJKLMNOPQRSTUVWXYZ ";
  for (char c : chars) tokens.emplace_back(1, c);
  for (int i = static_cast<int>(tokens.size()); i < n_vocab; ++i) {
    tokens.push_back(boundary + "t" + std::to_string(i));
  }
  tokens.resize(n_vocab);
  return tokens;
}

int32_t TokenType(const std::string& token) {
  if (token == "<unk>") return 2;                      // unknown
  if (token == "<s>" || token == "</s>") return 3;     // control
  if (token == "<0x0A>") return 6;                     // byte
  return 1;                                            // normal
}

}  // namespace

bool WriteTinyLlama(const std::string& path, const TinyLlamaOptions& o, std::string* error) {
  if (o.n_layer < 1 || o.n_embd <= 0 || o.n_embd % (2 * kHead) != 0 || o.n_vocab < 31) {
    *error = "tiny llama: need n_layer >= 1, n_embd a positive multiple of 8, n_vocab >= 31";
    return false;
  }
  const int n_ff = 2 * o.n_embd;
  const int n_embd_kv = o.n_embd / kHead * kHeadKv;
  const int n_rot = o.n_embd / kHead;

  gguf_context* gguf = gguf_init_empty();
  gguf_set_val_str(gguf, "general.architecture", "llama");
  gguf_set_val_str(gguf, "general.name", "meshnet-tiny-llama");
  gguf_set_val_u32(gguf, "general.file_type", 0);  // all F32
  gguf_set_val_u32(gguf, "llama.block_count", o.n_layer);
  gguf_set_val_u32(gguf, "llama.context_length", 4096);
  gguf_set_val_u32(gguf, "llama.embedding_length", o.n_embd);
  gguf_set_val_u32(gguf, "llama.feed_forward_length", n_ff);
  gguf_set_val_u32(gguf, "llama.attention.head_count", kHead);
  gguf_set_val_u32(gguf, "llama.attention.head_count_kv", kHeadKv);
  gguf_set_val_f32(gguf, "llama.rope.freq_base", 10000.0f);
  gguf_set_val_f32(gguf, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_set_val_u32(gguf, "llama.vocab_size", o.n_vocab);

  const std::vector<std::string> tokens = Vocabulary(o.n_vocab);
  std::vector<const char*> token_ptrs;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < o.n_vocab; ++i) {
    token_ptrs.push_back(tokens[i].c_str());
    scores.push_back(-static_cast<float>(i));
    types.push_back(TokenType(tokens[i]));
  }
  gguf_set_val_str(gguf, "tokenizer.ggml.model", "llama");
  gguf_set_arr_str(gguf, "tokenizer.ggml.tokens", token_ptrs.data(), token_ptrs.size());
  gguf_set_arr_data(gguf, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
  gguf_set_arr_data(gguf, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
  gguf_set_val_u32(gguf, "tokenizer.ggml.unknown_token_id", 0);
  gguf_set_val_u32(gguf, "tokenizer.ggml.bos_token_id", 1);
  gguf_set_val_u32(gguf, "tokenizer.ggml.eos_token_id", 2);
  gguf_set_val_bool(gguf, "tokenizer.ggml.add_bos_token", true);

  // (name, ne0, ne1); ne1 == 0: a vector
  std::vector<std::pair<std::string, std::pair<int, int>>> shapes = {
      {"token_embd.weight", {o.n_embd, o.n_vocab}}};
  if (o.rope_freqs) shapes.push_back({"rope_freqs.weight", {n_rot / 2, 0}});
  for (int i = 0; i < o.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    shapes.push_back({b + "attn_norm.weight", {o.n_embd, 0}});
    shapes.push_back({b + "attn_q.weight", {o.n_embd, o.n_embd}});
    shapes.push_back({b + "attn_k.weight", {o.n_embd, n_embd_kv}});
    shapes.push_back({b + "attn_v.weight", {o.n_embd, n_embd_kv}});
    shapes.push_back({b + "attn_output.weight", {o.n_embd, o.n_embd}});
    shapes.push_back({b + "ffn_norm.weight", {o.n_embd, 0}});
    shapes.push_back({b + "ffn_gate.weight", {o.n_embd, n_ff}});
    shapes.push_back({b + "ffn_up.weight", {o.n_embd, n_ff}});
    shapes.push_back({b + "ffn_down.weight", {n_ff, o.n_embd}});
  }
  shapes.push_back({"output_norm.weight", {o.n_embd, 0}});
  if (!o.tied) shapes.push_back({"output.weight", {o.n_embd, o.n_vocab}});

  size_t n_floats = 0;
  for (const auto& [name, ne] : shapes) n_floats += static_cast<size_t>(ne.first) * std::max(ne.second, 1);
  ggml_init_params params = {
      /*mem_size=*/n_floats * sizeof(float) + shapes.size() * ggml_tensor_overhead() + 1024,
      /*mem_buffer=*/nullptr,
      /*no_alloc=*/false,
  };
  ggml_context* ctx = ggml_init(params);
  std::mt19937 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, kWeightStd);
  for (const auto& [name, ne] : shapes) {
    ggml_tensor* t = ne.second == 0 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ne.first)
                                    : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne.first, ne.second);
    ggml_set_name(t, name.c_str());
    float* data = static_cast<float*>(t->data);
    const bool is_norm = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool is_rope = name == "rope_freqs.weight";
    for (int64_t i = 0; i < ggml_nelements(t); ++i) {
      // rope_freqs are frequency divisors (>= 1), like Llama-3's long-context factors
      data[i] = is_rope ? 1.0f + static_cast<float>(i) : (is_norm ? 1.0f : 0.0f) + normal(rng);
    }
    gguf_add_tensor(gguf, t);
  }
  const bool ok = gguf_write_to_file(gguf, path.c_str(), /*only_meta=*/false);
  gguf_free(gguf);
  ggml_free(ctx);
  if (!ok) *error = "tiny llama: cannot write " + path;
  return ok;
}

}  // namespace meshnet::engine
