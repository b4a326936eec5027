// decode_profile: where one batched decode step's time goes, op by op, in whichever llama.cpp this
// binary links: `decode_profile` the shard build (@llama_cpp, patched, no llamafile), and
// `decode_profile_upstream` upstream's (@llama_cpp_upstream), so both builds run the same steps
// (issue 31: a 1-node route at 8 streams against llama.cpp batched). Only llama.cpp's public API,
// plus its scheduler to reach the CPU backend's switches as the engine does (cpu_switch.h).
//
// It loads the whole model, prefills N sequences of P tokens (one sequence per batch, one KV
// stream per sequence as the worker keeps them), then runs S decode steps of N rows (one per
// sequence, every row's logits out) twice: timed whole, then with ggml's eval callback asking for
// every node, so each op's time is the span from its "ask" to its "done" call. Prints one JSON
// object: step_ms (median of the whole-step pass), profiled_step_ms, and ops: per op kind (the
// op, and for MUL_MAT the weight's type and the node's name without its layer suffix) the mean
// ms per step and its count per step.
//
// Usage: decode_profile MODEL.gguf [--seqs=8] [--prompt=128] [--steps=16] [--threads=1]
//                       [--attention=f32|flash] [--reference_kernels=1|0] [--n_ctx=N] [--n_batch=N]
//                       [--order=sequence|reverse] [--f32_activations=0|1]
// (n_ctx default: enough cells for every sequence; n_batch, also n_ubatch: max(prompt, seqs);
// --order: the decode rows by ascending sequence id, or descending, which llama.cpp splits into
// one ubatch per row, as it splits any rows whose ids do not follow each other).
// --attention=f32 (default): no flash attention, F32 KV, as the worker's certified recipe
// (ADR 0010); flash: flash attention over an F16 KV, upstream's CPU default.
// --f32_activations=1: patch 0010's F32 matmul activations (ADR 0012's recipe), as the worker's
// --f32_matmul_activations.
// Exit status: 0; 1 when the model, context or a decode fails; 2 on bad arguments.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cpp/engine/cpu_switch.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshnet::engine::SetCpuBackendSwitch;

struct OpTotal {
  double ms = 0;
  long count = 0;
};

// Eval-callback state: engine thread only (llama_decode calls it on the calling thread).
struct Profile {
  bool on = false;
  Clock::time_point asked;
  std::map<std::string, OpTotal> ops;
};

// "blk.5.ffn_gate" / "ffn_gate-5" -> "ffn_gate": one row per kind of node, not per layer.
std::string NodeKind(const ggml_tensor* t) {
  std::string name = t->name;
  const size_t dash = name.rfind('-');
  if (dash != std::string::npos && dash + 1 < name.size() &&
      name.find_first_not_of("0123456789", dash + 1) == std::string::npos) {
    name.resize(dash);
  }
  std::string kind = ggml_op_desc(t);
  if (t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_MUL_MAT_ID) {
    kind += std::string("/") + ggml_type_name(t->src[0]->type) + "/" + name;
  }
  return kind;
}

bool OnEval(ggml_tensor* t, bool ask, void* data) {
  auto* profile = static_cast<Profile*>(data);
  if (!profile->on) return false;
  if (ask) {
    profile->asked = Clock::now();
    return true;
  }
  OpTotal& total = profile->ops[NodeKind(t)];
  total.ms += std::chrono::duration<double, std::milli>(Clock::now() - profile->asked).count();
  total.count += 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: decode_profile MODEL.gguf [--seqs=N] [--prompt=P] [--steps=S] [--threads=T] "
                         "[--attention=f32|flash] [--reference_kernels=1|0] [--f32_activations=0|1] "
                         "[--n_ctx=N] [--n_batch=N] [--order=sequence|reverse]\n");
    return 2;
  }
  int seqs = 8, prompt = 128, steps = 16, threads = 1, reference = 1, n_ctx = 0, n_batch = 0, f32_activations = 0;
  std::string attention = "f32", order = "sequence";
  const std::map<std::string, int*> ints = {{"seqs", &seqs}, {"prompt", &prompt}, {"steps", &steps},
                                            {"threads", &threads}, {"reference_kernels", &reference},
                                            {"f32_activations", &f32_activations},
                                            {"n_ctx", &n_ctx}, {"n_batch", &n_batch}};
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.rfind("--", 0) == 0 && eq != std::string::npos ? arg.substr(2, eq - 2) : "";
    const std::string value = eq != std::string::npos ? arg.substr(eq + 1) : "";
    if (name == "attention" || name == "order") {
      (name == "attention" ? attention : order) = value;
      continue;
    }
    const auto it = ints.find(name);
    if (it != ints.end() && !value.empty()) {
      char* end = nullptr;
      const long parsed = std::strtol(value.c_str(), &end, 10);
      if (*end == '\0') {
        *it->second = static_cast<int>(parsed);
        continue;
      }
    }
    std::fprintf(stderr, "decode_profile: bad argument %s\n", arg.c_str());
    return 2;
  }
  if (seqs < 1 || seqs > 64 || prompt < 1 || steps < 1 || threads < 1 || n_ctx < 0 || n_batch < 0 ||
      (attention != "f32" && attention != "flash") || (order != "sequence" && order != "reverse")) {
    std::fprintf(stderr, "decode_profile: bad arguments\n");
    return 2;
  }
  llama_backend_init();
  llama_model_params model_params = llama_model_default_params();
  model_params.use_extra_bufts = false;  // as the engine: no repacked weights (ADR 0009)
  llama_model* model = llama_model_load_from_file(argv[1], model_params);
  if (model == nullptr) {
    std::fprintf(stderr, "decode_profile: cannot load %s\n", argv[1]);
    return 1;
  }
  Profile profile;
  llama_context_params params = llama_context_default_params();
  const int per_seq = ((prompt + 2 * steps + 255) / 256) * 256;
  params.n_ctx = n_ctx > 0 ? n_ctx : per_seq * seqs;
  params.n_batch = params.n_ubatch = n_batch > 0 ? n_batch : std::max(prompt, seqs);
  params.n_seq_max = seqs;
  params.kv_unified = false;
  params.n_threads = params.n_threads_batch = threads;
  params.no_perf = true;
  params.cb_eval = OnEval;
  params.cb_eval_user_data = &profile;
  if (attention == "f32") {
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.type_k = params.type_v = GGML_TYPE_F32;
  } else {
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  }
  llama_context* ctx = llama_init_from_model(model, params);
  if (ctx == nullptr) {
    std::fprintf(stderr, "decode_profile: cannot create a context\n");
    return 1;
  }
  if (reference) SetCpuBackendSwitch(ctx, "ggml_backend_cpu_set_use_ref");
  if (f32_activations && !SetCpuBackendSwitch(ctx, "ggml_backend_cpu_set_f32_activations")) {
    std::fprintf(stderr, "decode_profile: this llama.cpp has no F32 matmul activations (patch 0010)\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  uint32_t lcg = 12345;
  auto next_token = [&]() {
    lcg = lcg * 1664525u + 1013904223u;
    return static_cast<llama_token>(100 + (lcg >> 8) % static_cast<uint32_t>(n_vocab - 200));
  };
  llama_batch batch = llama_batch_init(std::max(prompt, seqs), 0, 1);
  auto decode = [&](const char* what) {
    if (llama_decode(ctx, batch) != 0) {
      std::fprintf(stderr, "decode_profile: %s failed\n", what);
      std::exit(1);
    }
    llama_synchronize(ctx);
  };
  for (int s = 0; s < seqs; ++s) {
    batch.n_tokens = prompt;
    for (int i = 0; i < prompt; ++i) {
      batch.token[i] = next_token();
      batch.pos[i] = i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = s;
      batch.logits[i] = i + 1 == prompt;
    }
    decode("prefill");
  }
  int pos = prompt;
  auto step = [&]() {
    batch.n_tokens = seqs;
    for (int i = 0; i < seqs; ++i) {
      batch.token[i] = next_token();
      batch.pos[i] = pos;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = order == "sequence" ? i : seqs - 1 - i;
      batch.logits[i] = 1;
    }
    ++pos;
    const auto start = Clock::now();
    decode("decode");
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  step();  // warm-up
  std::vector<double> whole;
  for (int i = 0; i < steps; ++i) whole.push_back(step());
  profile.on = true;
  double profiled = 0;
  for (int i = 0; i < steps; ++i) profiled += step();
  std::sort(whole.begin(), whole.end());
  std::printf("{\"seqs\": %d, \"prompt\": %d, \"steps\": %d, \"threads\": %d, \"attention\": \"%s\", \"order\": \"%s\", "
              "\"reference_kernels\": %d, \"step_ms\": %.3f, \"profiled_step_ms\": %.3f, \"ops\": {",
              seqs, prompt, steps, threads, attention.c_str(), order.c_str(), reference, whole[whole.size() / 2],
              profiled / steps);
  std::vector<std::pair<std::string, OpTotal>> ops(profile.ops.begin(), profile.ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  for (size_t i = 0; i < ops.size(); ++i) {
    std::printf("%s\"%s\": {\"ms\": %.3f, \"count\": %ld}", i ? ", " : "", ops[i].first.c_str(),
                ops[i].second.ms / steps, ops[i].second.count / steps);
  }
  std::printf("}}\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
