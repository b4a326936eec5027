#include "cpp/worker/flags.h"

#include <cstdlib>
#include <iostream>

namespace meshnet::worker {

bool ParseFlags(int argc, char** argv, const std::string& program, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::cerr << program << ": expected --name=value, got " << arg << "\n";
      return false;
    }
    (*flags)[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return true;
}

int IntFlag(const Flags& flags, const std::string& name, int fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : std::atoi(it->second.c_str());
}

std::string StringFlag(const Flags& flags, const std::string& name, const std::string& fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

}  // namespace meshnet::worker
