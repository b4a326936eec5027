// See engine.h. With devices.cc and cpu_switch.h, the only files of the worker that call
// llama.cpp.
#include "engine.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "cpp/engine/cpu_switch.h"
#include "cpp/engine/llama_log/llama_log.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama-ext.h"
#include "llama-model.h"  // llama_internal_get_tensor_map (weight accounting)
#include "llama.h"

namespace meshnet::engine {
namespace {

void InitBackendOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    InstallLlamaLog();
    llama_backend_init();
    RegisterLinkedBackends();
  });
}

// Reads general.architecture and the expert count from the GGUF header (no tensor data) and
// checks them against llama.cpp's adapter table.
bool CheckArchitecture(const std::string& path, std::string* error) {
  gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* gguf = gguf_init_from_file(path.c_str(), params);
  if (gguf == nullptr) {
    *error = "cannot read GGUF header of " + path;
    return false;
  }
  std::string arch;
  const int64_t arch_key = gguf_find_key(gguf, "general.architecture");
  if (arch_key >= 0 && gguf_get_kv_type(gguf, arch_key) == GGUF_TYPE_STRING) {
    arch = gguf_get_val_str(gguf, arch_key);
  }
  uint32_t n_expert = 0;
  const int64_t expert_key = gguf_find_key(gguf, (arch + ".expert_count").c_str());
  if (expert_key >= 0 && gguf_get_kv_type(gguf, expert_key) == GGUF_TYPE_UINT32) {
    n_expert = gguf_get_val_u32(gguf, expert_key);
  }
  gguf_free(gguf);
  // The one list of architectures with a layer-range adapter is the patched llama.cpp's
  // (third_party/llama_cpp/patches/0006): a worker serves only those, whole or in part.
  if (!llama_layer_range_supports(arch.c_str(), n_expert)) {
    *error = "unsupported model " + path + ": architecture '" + arch + "'" +
             (n_expert > 0 ? " with " + std::to_string(n_expert) + " experts" : "") +
             " has no layer-range adapter (adapters: " + llama_layer_range_architectures() + ")";
    return false;
  }
  return true;
}

}  // namespace

// ---- Model ----

std::unique_ptr<Model> Model::Open(const ModelOptions& options, std::string* error) {
  InitBackendOnce();
  if (!CheckArchitecture(options.path, error)) return nullptr;
  ggml_backend_dev_t device = nullptr;
  if (!FindDevice(options.device, &device, error)) return nullptr;

  llama_model_params params = llama_model_default_params();
  params.layer_start = options.layer_start;
  params.layer_end = options.layer_end;
  params.load_mode = options.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  // One device for the whole range: every layer and the head when it owns it (n_gpu_layers -1);
  // the CPU alone when no device is named (an empty device list, so that a linked GPU backend is
  // not picked by llama.cpp's default selection).
  ggml_backend_dev_t devices[2] = {device, nullptr};
  params.devices = devices;
  params.split_mode = LLAMA_SPLIT_MODE_NONE;
  params.main_gpu = 0;
  params.n_gpu_layers = device != nullptr ? -1 : 0;
  params.use_extra_bufts = options.extra_buffer_types;
  TakeLlamaError();
  llama_model* model = llama_model_load_from_file(options.path.c_str(), params);
  if (model == nullptr) {
    const std::string why = TakeLlamaError();
    *error = "cannot load layers [" + std::to_string(options.layer_start) + ", " +
             std::to_string(options.layer_end) + ") of " + options.path +
             (why.empty() ? "" : ": " + why);
    return nullptr;
  }
  return std::unique_ptr<Model>(new Model(model, device));
}

Model::Model(llama_model* model, ggml_backend_dev_t device)
    : model_(model), device_(device), owner_(std::this_thread::get_id()) {}

Model::~Model() {
  CheckThread();
  llama_model_free(model_);
}

void Model::CheckThread() const {
  if (std::this_thread::get_id() != owner_) {
    std::fprintf(stderr, "meshnet engine: Model used off its owning thread\n");
    std::abort();
  }
}

int Model::n_layer() const { return llama_model_n_layer(model_); }
int Model::layer_start() const { return llama_model_layer_start(model_); }
int Model::layer_end() const { return llama_model_layer_end(model_); }
int Model::n_embd() const { return llama_model_n_embd(model_); }
int Model::n_vocab() const { return llama_vocab_n_tokens(llama_model_get_vocab(model_)); }
const llama_vocab* Model::vocab() const { return llama_model_get_vocab(model_); }

size_t Model::weight_bytes() const {
  std::set<const ggml_tensor*> seen;
  size_t total = 0;
  for (const auto& [name, tensor] : llama_internal_get_tensor_map(model_)) {
    if (seen.insert(tensor).second) total += ggml_nbytes(tensor);
  }
  return total;
}

DeviceInfo Model::device() const { return Describe(device_); }

std::vector<int32_t> Model::Tokenize(const std::string& text, bool add_special) const {
  CheckThread();
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::vector<llama_token> tokens(text.size() + 8);
  int n = llama_tokenize(vocab, text.c_str(), static_cast<int32_t>(text.size()), tokens.data(),
                         static_cast<int32_t>(tokens.size()), add_special, /*parse_special=*/true);
  if (n < 0) {
    tokens.resize(-n);
    n = llama_tokenize(vocab, text.c_str(), static_cast<int32_t>(text.size()), tokens.data(),
                       static_cast<int32_t>(tokens.size()), add_special, true);
  }
  tokens.resize(n < 0 ? 0 : n);
  return std::vector<int32_t>(tokens.begin(), tokens.end());
}

// ---- Batch ----

void Batch::AddToken(int32_t seq, int32_t pos, int32_t token, bool output) {
  seq_.push_back(seq);
  pos_.push_back(pos);
  tokens_.push_back(token);
  output_.push_back(output ? 1 : 0);
}

void Batch::AddHidden(int32_t seq, int32_t pos, const float* hidden, int n_embd, bool output) {
  n_embd_ = n_embd;
  seq_.push_back(seq);
  pos_.push_back(pos);
  hidden_.insert(hidden_.end(), hidden, hidden + n_embd);
  output_.push_back(output ? 1 : 0);
}

void Batch::Clear() {
  seq_.clear();
  pos_.clear();
  tokens_.clear();
  hidden_.clear();
  output_.clear();
  n_embd_ = 0;
}

// ---- Context ----

bool UsesF32Attention(const ContextOptions& options) {
  return options.f32_attention && (!options.unified_kv || options.n_seq == 1);
}

std::unique_ptr<Context> Context::Create(Model& model, const ContextOptions& options,
                                         std::string* error) {
  llama_context_params params = llama_context_default_params();
  params.n_ctx = options.n_ctx;
  params.n_batch = options.n_batch;
  params.n_ubatch = options.n_ubatch;
  params.n_seq_max = options.n_seq;
  params.n_threads = options.n_threads;
  params.n_threads_batch = options.n_threads;
  params.kv_unified = options.unified_kv;
  params.no_perf = true;
  // A non-last shard reads every row's residual back (the graph emits it as t_embd).
  params.embeddings = !model.owns_output();
  params.pooling_type = LLAMA_POOLING_TYPE_NONE;
  if (UsesF32Attention(options)) {
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.type_k = GGML_TYPE_F32;
    params.type_v = GGML_TYPE_F32;
  }
  TakeLlamaError();
  llama_context* ctx = llama_init_from_model(model.raw(), params);
  if (ctx == nullptr) {
    const std::string why = TakeLlamaError();
    *error = "cannot create a context" + (why.empty() ? std::string() : ": " + why);
    return nullptr;
  }
  if (options.reference_kernels) SetCpuBackendSwitch(ctx, "ggml_backend_cpu_set_use_ref");
  if (options.f32_matmul_activations && !SetCpuBackendSwitch(ctx, "ggml_backend_cpu_set_f32_activations")) {
    llama_free(ctx);
    *error = "F32 matmul activations asked for, but this llama.cpp build has no "
             "ggml_backend_cpu_set_f32_activations (patch 0010)";
    return nullptr;
  }
  return std::unique_ptr<Context>(new Context(model, ctx));
}

Context::Context(Model& model, llama_context* ctx)
    : model_(model), ctx_(ctx), owner_(std::this_thread::get_id()) {}

Context::~Context() {
  CheckThread();
  llama_free(ctx_);
}

void Context::CheckThread() const {
  if (std::this_thread::get_id() != owner_) {
    std::fprintf(stderr, "meshnet engine: Context used off its owning thread\n");
    std::abort();
  }
}

bool Context::Decode(const Batch& batch, std::string* error) {
  CheckThread();
  const int n = batch.size();
  if (n == 0) {
    *error = "empty batch";
    return false;
  }
  const bool tokens = batch.has_tokens();
  if (tokens != model_.owns_input()) {
    *error = tokens ? "token rows sent to a shard that starts at layer " +
                          std::to_string(model_.layer_start()) + " (it takes hidden states)"
                    : "hidden rows sent to the first shard (it takes token ids)";
    return false;
  }
  if (!tokens && batch.n_embd_ != model_.n_embd()) {
    *error = "hidden rows of width " + std::to_string(batch.n_embd_) + ", the model has n_embd " +
             std::to_string(model_.n_embd());
    return false;
  }

  llama_batch b = llama_batch_init(n, tokens ? 0 : batch.n_embd_, 1);
  b.n_tokens = n;
  for (int i = 0; i < n; ++i) {
    if (tokens) b.token[i] = batch.tokens_[i];
    b.pos[i] = batch.pos_[i];
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = batch.seq_[i];
    // a non-last shard outputs every row (embeddings mode); the flags matter on the last one
    b.logits[i] = model_.owns_output() ? batch.output_[i] : 1;
  }
  if (!tokens) {
    std::memcpy(b.embd, batch.hidden_.data(), batch.hidden_.size() * sizeof(float));
  }
  TakeLlamaError();
  const int ret = llama_decode(ctx_, b);
  llama_batch_free(b);
  if (ret == 0) {
    // A GPU backend returns from llama_decode with its work queued; waiting here (the rows are
    // read right after anyway) makes a Decode's wall time the device's compute too, which the
    // worker reports as compute_us and the bench subtracts from a hop's time (ADR 0015).
    llama_synchronize(ctx_);
    return true;
  }

  // 2 and < -1: earlier ubatches of this batch stay in the KV; take them out again.
  if (ret == 2 || ret < -1) {
    std::set<std::pair<int32_t, int32_t>> first;  // (seq, lowest pos)
    for (int i = 0; i < n; ++i) {
      const int32_t s = batch.seq_[i];
      int32_t p = batch.pos_[i];
      for (int j = 0; j < n; ++j) {
        if (batch.seq_[j] == s && batch.pos_[j] < p) p = batch.pos_[j];
      }
      first.insert({s, p});
    }
    for (const auto& [s, p] : first) llama_memory_seq_rm(llama_get_memory(ctx_), s, p, -1);
  }
  const std::string why = TakeLlamaError();
  *error = "llama_decode returned " + std::to_string(ret) + (why.empty() ? "" : ": " + why);
  return false;
}

const float* Context::Hidden(int row) const {
  CheckThread();
  return model_.owns_output() ? nullptr : llama_get_embeddings_ith(ctx_, row);
}

const float* Context::Logits(int row) const {
  CheckThread();
  return model_.owns_output() ? llama_get_logits_ith(ctx_, row) : nullptr;
}

bool Context::RemoveFrom(int32_t seq, int32_t pos) {
  CheckThread();
  return llama_memory_seq_rm(llama_get_memory(ctx_), seq, pos, -1);
}

void Context::Release(int32_t seq) {
  CheckThread();
  llama_memory_seq_rm(llama_get_memory(ctx_), seq, -1, -1);
}

int32_t Context::PosMax(int32_t seq) const {
  CheckThread();
  return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq);
}

size_t Context::kv_bytes() const {
  CheckThread();
  size_t total = 0;
  for (const auto& [buft, data] : llama_get_memory_breakdown(ctx_)) total += data.context;
  return total;
}

size_t Context::device_bytes() const {
  CheckThread();
  ggml_backend_dev_t device = model_.raw_device();
  if (device == nullptr) device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  size_t total = 0;
  for (const auto& [buft, data] : llama_get_memory_breakdown(ctx_)) {
    if (ggml_backend_buft_get_device(buft) == device) total += data.model + data.context + data.compute;
  }
  return total;
}

size_t CurrentRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace meshnet::engine
