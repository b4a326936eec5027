// See devices.h.
#include "cpp/engine/devices.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>
#include <utility>

namespace meshnet::engine {
namespace {

struct LinkedBackend {
  std::string name;
  BackendRegistryFn registry;
};

// Function-local, so static registrars in other translation units can add to it at any point
// of static initialisation.
std::vector<LinkedBackend>& Linked() {
  static std::vector<LinkedBackend> linked;
  return linked;
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool IsAccelerator(ggml_backend_dev_t device) {
  const enum ggml_backend_dev_type type = ggml_backend_dev_type(device);
  return type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
}

bool IsRpc(ggml_backend_dev_t device) {
  return std::string(ggml_backend_reg_name(ggml_backend_dev_backend_reg(device))) == "RPC";
}

}  // namespace

bool LinkBackend(const char* name, BackendRegistryFn registry) {
  Linked().push_back({name, registry});
  return true;
}

void RegisterLinkedBackends() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const LinkedBackend& backend : Linked()) {
      ggml_backend_reg_t reg = backend.registry();
      if (reg == nullptr) {
        std::fprintf(stderr, "meshnet engine: the %s backend found no usable device\n",
                     backend.name.c_str());
        continue;
      }
      ggml_backend_register(reg);
    }
  });
}

std::vector<std::string> LinkedBackendNames() {
  std::vector<std::string> names;
  for (const LinkedBackend& backend : Linked()) names.push_back(backend.name);
  return names;
}

DeviceInfo Describe(ggml_backend_dev_t device) {
  DeviceInfo info;
  ggml_backend_dev_t dev = device;
  if (dev == nullptr) {
    info.name = "cpu";
    dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  } else {
    info.name = Lower(ggml_backend_dev_name(device));
  }
  if (dev == nullptr) return info;
  info.description = ggml_backend_dev_description(dev);
  info.backend = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
  ggml_backend_dev_memory(dev, &info.memory_free, &info.memory_total);
  return info;
}

std::vector<DeviceInfo> ListDevices() {
  RegisterLinkedBackends();
  std::vector<DeviceInfo> devices = {Describe(nullptr)};
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    if (IsAccelerator(dev) && !IsRpc(dev)) devices.push_back(Describe(dev));
  }
  return devices;
}

bool FindDevice(const std::string& name, ggml_backend_dev_t* device, std::string* error) {
  RegisterLinkedBackends();
  const std::string wanted = Lower(name);
  if (wanted.empty() || wanted == "cpu") {
    *device = nullptr;
    return true;
  }
  std::string known = "cpu";
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    if (!IsAccelerator(dev) || IsRpc(dev)) continue;
    const std::string dev_name = Lower(ggml_backend_dev_name(dev));
    if (dev_name == wanted) {
      *device = dev;
      return true;
    }
    known += ", " + dev_name;
  }
  std::string linked;
  for (const std::string& backend : LinkedBackendNames()) {
    linked += (linked.empty() ? "" : ", ") + backend;
  }
  *error = "no device '" + name + "' in this process (devices: " + known + "; GPU backends " +
           "linked into this binary: " + (linked.empty() ? "none, a CPU-only build" : linked) + ")";
  return false;
}

}  // namespace meshnet::engine
