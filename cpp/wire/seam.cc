#include "cpp/wire/seam.h"

namespace meshnet::protocol {

ProtocolVersion CurrentVersion() { return ProtocolVersion{kProtocolMajor, kProtocolMinor}; }

}  // namespace meshnet::protocol
