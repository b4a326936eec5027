// The --name=value command lines of the worker's binaries (the worker, seam_echo).
#ifndef MESHNET_CPP_WORKER_FLAGS_H_
#define MESHNET_CPP_WORKER_FLAGS_H_

#include <map>
#include <string>

namespace meshnet::worker {

using Flags = std::map<std::string, std::string>;

// Every argument must be --name=value; false, with a line on stderr naming `program`, otherwise.
bool ParseFlags(int argc, char** argv, const std::string& program, Flags* flags);
// The flag's value as an int (atoi), or `fallback` when it was not given.
int IntFlag(const Flags& flags, const std::string& name, int fallback);
// The flag's value, or `fallback` when it was not given.
std::string StringFlag(const Flags& flags, const std::string& name, const std::string& fallback);

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_FLAGS_H_
