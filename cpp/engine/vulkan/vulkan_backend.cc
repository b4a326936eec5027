// Links ggml's Vulkan backend into the engine (ADR 0014): a binary that depends on
// //cpp/engine:vulkan can open models with `--device vulkanN`.
//
// ggml-vulkan, left to itself, uses the discrete GPUs, else the first integrated or virtual one,
// and never a device whose type is CPU (a software driver such as Mesa's lavapipe). A binary
// linked with this library is one an operator chose for Vulkan, so where the Vulkan loader
// offers no hardware device at all but software ones, those are made visible (through ggml's own
// GGML_VK_VISIBLE_DEVICES, unless it is set), and a line on stderr says so. CI runs the Vulkan
// shards this way on lavapipe.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

#include "cpp/engine/devices.h"
#include "ggml-vulkan.h"

namespace meshnet::engine {
namespace {

// Indices of the Vulkan loader's physical devices, when all of them are software (CPU-type)
// devices; empty when there is a hardware device or no device at all.
std::vector<int> SoftwareOnlyDevices() {
  VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "meshnet-device-probe";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  create.pApplicationInfo = &app;
  VkInstance instance = VK_NULL_HANDLE;
  if (vkCreateInstance(&create, nullptr, &instance) != VK_SUCCESS) return {};
  uint32_t count = 0;
  vkEnumeratePhysicalDevices(instance, &count, nullptr);
  std::vector<VkPhysicalDevice> devices(count);
  vkEnumeratePhysicalDevices(instance, &count, devices.data());
  std::vector<int> software;
  bool hardware = false;
  for (uint32_t i = 0; i < count; ++i) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(devices[i], &props);
    if (props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
      software.push_back(static_cast<int>(i));
    } else {
      hardware = true;
    }
  }
  vkDestroyInstance(instance, nullptr);
  return hardware ? std::vector<int>() : software;
}

ggml_backend_reg_t VulkanRegistry() {
  if (std::getenv("GGML_VK_VISIBLE_DEVICES") == nullptr) {
    const std::vector<int> software = SoftwareOnlyDevices();
    if (!software.empty()) {
      std::string indices;
      for (int i : software) indices += (indices.empty() ? "" : ",") + std::to_string(i);
      setenv("GGML_VK_VISIBLE_DEVICES", indices.c_str(), /*overwrite=*/0);
      std::fprintf(stderr,
                   "meshnet engine: the Vulkan loader offers only software devices (CPU type, "
                   "e.g. lavapipe); using them (GGML_VK_VISIBLE_DEVICES=%s)\n",
                   indices.c_str());
    }
  }
  return ggml_backend_vk_reg();
}

[[maybe_unused]] const bool kLinked = LinkBackend("vulkan", VulkanRegistry);

}  // namespace
}  // namespace meshnet::engine
