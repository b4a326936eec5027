// The shard engine: a small C++ API over the patched llama.cpp (third_party/llama_cpp/patches).
//
// A Model is the layer range [layer_start, layer_end) of a GGUF whose architecture has a
// layer-range adapter (llama, qwen3, qwen3moe, gemma3: patches 0006-0009); a Context holds
// the KV of that range for up to n_seq sequences (one per session). One Decode runs one batch of
// rows from many sessions: token ids on the first shard (layer_start == 0), hidden states
// (the residual stream entering layer_start, n_embd floats per row) on every other shard. After
// Decode, a non-last shard exposes every row's residual leaving layer_end - 1 (before the final
// norm), which is the next shard's input; the last shard exposes logits for rows marked output.
//
// Invariants: a shard chain [0,a), [a,b), [b,n) fed the same rows (same seq, pos, order) gives
// the same logits as the whole model (see engine_test.cc for the measured exactness). An
// architecture without an adapter (the list is llama_layer_range_architectures(), from patch
// 0006's table) is refused at Open with a message naming it and the adapters there are.
//
// Threading: a Model and its Contexts belong to one thread, the engine thread; every method
// must be called on the thread that created the object (checked, aborts otherwise). No
// protobuf types here; the worker's service layer converts.
#ifndef MESHNET_CPP_ENGINE_ENGINE_H_
#define MESHNET_CPP_ENGINE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/devices.h"

struct llama_context;
struct llama_model;
struct llama_vocab;

namespace meshnet::engine {

struct ModelOptions {
  std::string path;       // a GGUF whose architecture has a layer-range adapter
  int layer_start = 0;    // first owned layer
  int layer_end = -1;     // one past the last owned layer; -1: the model's last layer
  bool use_mmap = true;   // false: read the owned tensors into allocated memory
  // Where the range's layers (and its contexts' KV) live: "cpu", or a GPU device of a backend
  // linked into this binary ("vulkan0", "cuda0"; devices.h). Token embeddings stay on the CPU.
  std::string device = "cpu";
  // llama.cpp's extra CPU buffer types (weights repacked for Q4_0/Q4_K/IQ4_NL GEMM kernels).
  // Off by default: the repacked kernels take a different path for batches of 4+ rows than for
  // the rest, so a session's numbers would depend on where its rows fall in a mixed batch, and
  // sessions batched together must compute exactly what each computes alone.
  bool extra_buffer_types = false;
};

class Model {
 public:
  // Loads the range; nullptr with `*error` set when the file, the architecture or the range is
  // not acceptable.
  static std::unique_ptr<Model> Open(const ModelOptions& options, std::string* error);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  int n_layer() const;      // layers of the whole model
  int layer_start() const;  // owned range [layer_start, layer_end)
  int layer_end() const;
  bool owns_input() const { return layer_start() == 0; }            // token embeddings
  bool owns_output() const { return layer_end() == n_layer(); }     // final norm and head
  int n_embd() const;
  int n_vocab() const;
  // Bytes of the weight tensors this shard holds (a tied head counts on the last shard).
  size_t weight_bytes() const;
  // The device the layers live on, with its memory now; the ggml device (nullptr: the CPU).
  DeviceInfo device() const;
  ggml_backend_dev_t raw_device() const { return device_; }

  std::vector<int32_t> Tokenize(const std::string& text, bool add_special) const;

  llama_model* raw() const { return model_; }
  // The vocabulary: read-only, safe from any thread while the model lives (a sampler's grammar).
  const llama_vocab* vocab() const;

 private:
  Model(llama_model* model, ggml_backend_dev_t device);
  void CheckThread() const;

  llama_model* model_;
  ggml_backend_dev_t device_;  // nullptr: the CPU
  std::thread::id owner_;
};

struct ContextOptions {
  int n_seq = 1;          // concurrent sequences (sessions), <= 256
  int n_ctx = 2048;       // KV cells, shared by all sequences (unified KV)
  int n_batch = 512;      // most rows per Decode
  int n_ubatch = 512;     // rows per graph run
  int n_threads = 2;
  // true: one KV stream shared by all sequences (n_ctx cells in all). false: one stream per
  // sequence (n_ctx / n_seq cells each), so a session's KV layout, and with it the exact
  // attention arithmetic, does not depend on which other sessions share the batches.
  bool unified_kv = true;
  // ggml's reference CPU kernels (ggml_backend_cpu_set_use_ref). The optimized flash attention
  // takes a KV-split path for a lone decode row once a stream holds 512 cells and a tiled one for
  // 64+ rows of one stream, but the per-row path when sessions share the ubatch, so a session's
  // numbers would depend on its company (seen on Gemma 3: 6 of 8 batched sessions kept their solo
  // tokens). The reference kernels take the per-row path always. Cost: op fusion and the tiled
  // prefill; with flash attention the per-row path also sums V in F16 (f32_attention avoids it; KL
  // against Transformers fp32 rises, docs/evidence/architectures/).
  bool reference_kernels = true;
  // Attention without flash attention over an F32 KV cache: K.Q, softmax and V.KQ all in F32 (ggml's
  // mul_mat and soft_max, whose per-element results do not depend on the batch), ADR 0010. It
  // applies to one sequence or one KV stream per sequence (unified_kv false): in a stream shared
  // by several sequences a session's cells sit where its company put them, and the F32 dot
  // products over the cells then sum in another order than alone (measured: logits 0.87 apart on
  // SmolLM2 Q4_1, whose quantized activations amplify the last bits). There the flash-attention
  // per-row kernel, which visits only the session's own cells in order, stays (UsesF32Attention).
  // false: flash attention over an F16 cache, as upstream runs it on CPU.
  bool f32_attention = true;
  // Matmuls with quantized weights take F32 activations: each weight row is dequantized to F32 and
  // dotted with the F32 activations (patch 0010), where llama.cpp otherwise quantizes the
  // activations to the weight type's dot type (Q8_0, Q8_1, Q8_K). What Transformers computes on
  // the dequantized weights, up to summation order; several times the CPU cost of a decode step.
  // Part of a model's certified recipe (ADR 0012): false is llama.cpp's arithmetic.
  bool f32_matmul_activations = false;
};

// Whether a context made with `options` computes attention in F32 (see f32_attention).
bool UsesF32Attention(const ContextOptions& options);

// Rows of one Decode: all token rows (first shard) or all hidden rows (other shards).
class Batch {
 public:
  void AddToken(int32_t seq, int32_t pos, int32_t token, bool output);
  // `hidden` holds n_embd floats; every hidden row of a batch has the same width.
  void AddHidden(int32_t seq, int32_t pos, const float* hidden, int n_embd, bool output);
  int size() const { return static_cast<int>(seq_.size()); }
  bool has_tokens() const { return !tokens_.empty(); }
  void Clear();

 private:
  friend class Context;
  std::vector<int32_t> seq_, pos_, tokens_;
  std::vector<float> hidden_;
  std::vector<int8_t> output_;
  int n_embd_ = 0;
};

class Context {
 public:
  static std::unique_ptr<Context> Create(Model& model, const ContextOptions& options,
                                         std::string* error);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Runs the batch through the owned layers; true on success, else `*error` is set. On
  // failure no row of this batch stays in the KV.
  bool Decode(const Batch& batch, std::string* error);
  // Row `row` of the last Decode, valid until the next Decode: the residual leaving
  // layer_end - 1 (n_embd floats; non-last shard, every row) or logits (n_vocab floats; last
  // shard, rows added with output = true).
  const float* Hidden(int row) const;
  const float* Logits(int row) const;

  // Forgets sequence `seq` from position `pos` on (pos 0: everything).
  bool RemoveFrom(int32_t seq, int32_t pos);
  // Frees sequence `seq` for reuse by another session.
  void Release(int32_t seq);
  // Highest position held for `seq`, -1 when empty.
  int32_t PosMax(int32_t seq) const;

  size_t kv_bytes() const;  // KV cache memory of this context
  // Bytes this context and its model hold on the model's device (weights, KV, compute buffers);
  // on the CPU, the host buffers.
  size_t device_bytes() const;

  const Model& model() const { return model_; }

 private:
  Context(Model& model, llama_context* ctx);
  void CheckThread() const;

  Model& model_;
  llama_context* ctx_;
  std::thread::id owner_;
};

// Resident set size of this process (VmRSS), bytes.
size_t CurrentRssBytes();

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_ENGINE_H_
