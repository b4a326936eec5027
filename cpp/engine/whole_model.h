// The start the engine's command-line tools share (greedy, dump_logits): token ids from the
// command line, and the whole model (no layer range: the library behaves as upstream) with one
// context. Errors are printed as "<tool>: <error>" on stderr.
#ifndef MESHNET_CPP_ENGINE_WHOLE_MODEL_H_
#define MESHNET_CPP_ENGINE_WHOLE_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpp/engine/engine.h"

namespace meshnet::engine {

struct WholeModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> context;  // declared after the model: destroyed before it
};

// argv[first..argc) as token ids.
std::vector<int32_t> TokenArgs(int argc, char** argv, int first);

// Whether argv[1] is `flag`; if so it is taken off (argv[0] moves up one, argc drops by one), so
// the positional arguments keep their indices.
bool TakeLeadingFlag(int* argc, char*** argv, const std::string& flag);

// Whether argv[1] is `flag` followed by a value; if so both are taken off as TakeLeadingFlag
// does, and the value is stored in `value`. False, with `value` untouched, otherwise (a trailing
// `flag` with no value is left in place, for the tool's usage check to refuse).
bool TakeLeadingOption(int* argc, char*** argv, const std::string& flag, std::string* value);

// Opens `path` on `device` ("cpu", "vulkan0", ...; devices.h) and a context of `options` on it;
// nullopt (with the error printed) on failure.
std::optional<WholeModel> OpenWholeModel(const char* tool, const std::string& path,
                                         const ContextOptions& options,
                                         const std::string& device = "cpu");

}  // namespace meshnet::engine

#endif  // MESHNET_CPP_ENGINE_WHOLE_MODEL_H_
