// Links ggml's CUDA backend into the engine (ADR 0014): a binary that depends on
// //cpp/engine/cuda can open models with `--device cudaN`. Built by nvcc from the pinned
// llama.cpp sources (@llama_cpp//:ggml_cuda); runs where an NVIDIA driver is installed, and on a
// machine without one the backend lists no device, so `--device cuda0` is refused by name.
#include "cpp/engine/devices.h"
#include "ggml-cuda.h"

namespace meshnet::engine {
namespace {

[[maybe_unused]] const bool kLinked = LinkBackend("cuda", ggml_backend_cuda_reg);

}  // namespace
}  // namespace meshnet::engine
