#include "cpp/wire/status.h"

#include <utility>

namespace meshnet::protocol {

std::string CodeName(Code code) {
  switch (code) {
    case Code::kUnspecified: return "UNSPECIFIED";
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kVersionMismatch: return "VERSION_MISMATCH";
    case Code::kStaleEpoch: return "STALE_EPOCH";
    case Code::kFingerprintMismatch: return "FINGERPRINT_MISMATCH";
    case Code::kChecksumMismatch: return "CHECKSUM_MISMATCH";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kCancelled: return "CANCELLED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kCacheMismatch: return "CACHE_MISMATCH";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kInternal: return "INTERNAL";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "CODE_" + std::to_string(static_cast<int32_t>(code));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out = CodeName(code) + ": " + message;
  if (!hop.empty()) out += " (hop " + hop + ")";
  return out;
}

Status MakeError(Code code, std::string message, bool retryable) {
  Status status;
  status.code = code;
  status.message = message.empty() ? CodeName(code) : std::move(message);
  status.retryable = retryable;
  return status;
}

Status InvalidArgumentError(std::string message) {
  return MakeError(Code::kInvalidArgument, std::move(message));
}
Status VersionMismatchError(std::string message) {
  return MakeError(Code::kVersionMismatch, std::move(message));
}
Status ChecksumMismatchError(std::string message) {
  return MakeError(Code::kChecksumMismatch, std::move(message));
}
Status ResourceExhaustedError(std::string message) {
  return MakeError(Code::kResourceExhausted, std::move(message));
}
Status InternalError(std::string message) {
  return MakeError(Code::kInternal, std::move(message));
}

}  // namespace meshnet::protocol
