// See whole_model.h.
#include "cpp/engine/whole_model.h"

#include <cstdlib>
#include <iostream>
#include <utility>

namespace meshnet::engine {

std::vector<int32_t> TokenArgs(int argc, char** argv, int first) {
  std::vector<int32_t> tokens;
  for (int i = first; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  return tokens;
}

bool TakeLeadingFlag(int* argc, char*** argv, const std::string& flag) {
  if (*argc < 2 || flag != (*argv)[1]) return false;
  (*argv)[1] = (*argv)[0];
  ++*argv;
  --*argc;
  return true;
}

bool TakeLeadingOption(int* argc, char*** argv, const std::string& flag, std::string* value) {
  if (*argc < 3 || flag != (*argv)[1]) return false;
  *value = (*argv)[2];
  (*argv)[2] = (*argv)[0];
  *argv += 2;
  *argc -= 2;
  return true;
}

std::optional<WholeModel> OpenWholeModel(const char* tool, const std::string& path,
                                         const ContextOptions& options,
                                         const std::string& device) {
  std::string error;
  ModelOptions model_options;
  model_options.path = path;
  model_options.device = device;
  WholeModel whole;
  whole.model = Model::Open(model_options, &error);
  if (whole.model) whole.context = Context::Create(*whole.model, options, &error);
  if (!whole.model || !whole.context) {
    std::cerr << tool << ": " << error << "\n";
    return std::nullopt;
  }
  return whole;
}

}  // namespace meshnet::engine
