// Turns on a switch of a llama context's CPU backends by its registered name, e.g. the reference
// kernels ("ggml_backend_cpu_set_use_ref") or patch 0010's F32 matmul activations
// ("ggml_backend_cpu_set_f32_activations"), through the CPU backend's registry entry point (as
// llama.cpp itself reaches ggml_backend_set_n_threads).
//
// Header-only and free of any llama.cpp target: the engine (over the patched @llama_cpp) and
// decode_profile_upstream (over @llama_cpp_upstream, which cannot link the engine) both include
// it, each with its own llama.cpp. Call it from the thread that owns the context, before decoding.
#ifndef MESHNET_CPP_ENGINE_CPU_SWITCH_H_
#define MESHNET_CPP_ENGINE_CPU_SWITCH_H_

#include "ggml-backend.h"
#include "llama-context.h"  // llama_context::get_sched
#include "llama.h"

namespace meshnet::engine {

// Sets `setter` to true on every backend of the context that offers it. False when none does
// (upstream's build has neither switch above; a GPU-only context has no CPU backend).
inline bool SetCpuBackendSwitch(llama_context* ctx, const char* setter) {
  using Set = void (*)(ggml_backend_t, bool);
  bool found = false;
  ggml_backend_sched_t sched = ctx->get_sched();
  for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
    ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
    ggml_backend_dev_t device = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = device != nullptr ? ggml_backend_dev_backend_reg(device) : nullptr;
    if (reg == nullptr) continue;
    auto set = reinterpret_cast<Set>(ggml_backend_reg_get_proc_address(reg, setter));
    if (set == nullptr) continue;
    set(backend, true);
    found = true;
  }
  return found;
}

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_CPU_SWITCH_H_
