// Compute devices of the engine: the CPU, and the GPU backends linked into this binary
// (//cpp/engine:vulkan; ADR 0014). A device is named as `--device` takes it: "cpu", or the
// lower-cased ggml device name ("vulkan0", "cuda0", ...). A model's layers and its contexts' KV
// live on its device; token embeddings stay on the CPU (llama.cpp keeps its input layer there)
// and hidden states cross between host and device at the range's edges.
#ifndef MESHNET_CPP_ENGINE_DEVICES_H_
#define MESHNET_CPP_ENGINE_DEVICES_H_

#include <cstddef>
#include <string>
#include <vector>

#include "ggml-backend.h"

namespace meshnet::engine {

// A backend library's registry entry point (e.g. ggml_backend_vk_reg); nullptr when the backend
// finds no usable device.
using BackendRegistryFn = ggml_backend_reg_t (*)();

// Called once per backend library by its static registrar (an alwayslink library); returns
// true so that it can initialise a namespace-scope constant.
bool LinkBackend(const char* name, BackendRegistryFn registry);

// Registers every linked backend with ggml, once per process. The engine calls it before it
// loads a model; tools that list devices call it first too.
void RegisterLinkedBackends();

// Names of the backends linked into this binary ("vulkan", ...), in link order.
std::vector<std::string> LinkedBackendNames();

struct DeviceInfo {
  std::string name;         // "cpu", "vulkan0", ...
  std::string description;  // the driver's name for it ("llvmpipe (LLVM 15.0.6, 256 bits)")
  std::string backend;      // "CPU", "Vulkan", ...
  size_t memory_free = 0;   // bytes, as the backend reports them (system memory for the CPU)
  size_t memory_total = 0;
};

// The devices this process can compute on: "cpu" first, then every GPU device of the linked
// backends.
std::vector<DeviceInfo> ListDevices();

// Resolves `name` (case-insensitive; "" means "cpu"). On success `*device` is the ggml device,
// or nullptr for the CPU. False with `*error` naming the devices there are otherwise.
bool FindDevice(const std::string& name, ggml_backend_dev_t* device, std::string* error);

// What `device` (nullptr: the CPU) is, with its memory now.
DeviceInfo Describe(ggml_backend_dev_t device);

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_DEVICES_H_
