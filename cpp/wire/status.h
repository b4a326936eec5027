// Structured errors of the seam protocol: the native mirror of meshnet.shard.v1.Status, with no
// protobuf (cpp/protocol/status.h converts).
//
// Every codec function in cpp/protocol, and the worker's scheduler and session table, return a
// Status instead of throwing or aborting; a non-OK Status always carries a non-empty message.
// Code values equal the proto's StatusCode numbers, so a code read from the wire is kept
// verbatim (even one this build does not name) and re-encodes to the same bytes. Plain value
// type; safe to copy between threads.
#ifndef MESHNET_CPP_WIRE_STATUS_H_
#define MESHNET_CPP_WIRE_STATUS_H_

#include <cstdint>
#include <string>

namespace meshnet::protocol {

// Mirrors meshnet.shard.v1.StatusCode, number for number.
enum class Code : int32_t {
  kUnspecified = 0,  // only ever seen on the wire ("unset"); never produced by the codec
  kOk = 1,
  kInvalidArgument = 2,  // malformed frame, bad shape, unknown dtype, missing fragments, ...
  kVersionMismatch = 3,
  kStaleEpoch = 4,
  kFingerprintMismatch = 5,
  kChecksumMismatch = 6,
  kResourceExhausted = 7,  // sessions, KV, queue or bundle limits
  kDeadlineExceeded = 8,
  kCancelled = 9,
  kNotFound = 10,
  kCacheMismatch = 11,
  kUnavailable = 12,
  kInternal = 13,
  kUnauthenticated = 14,   // no route ticket, or a signature that does not verify
  kPermissionDenied = 15,  // a valid ticket that does not admit this request
};

// "INVALID_ARGUMENT" etc.; "CODE_<n>" for a number this build does not know.
std::string CodeName(Code code);

struct Status {
  Code code = Code::kOk;
  std::string message;
  bool retryable = false;
  std::string hop;  // node id of the hop that failed ("" = the one answering)

  bool ok() const { return code == Code::kOk; }
  // "OK" or "INVALID_ARGUMENT: <message>", for logs and test failures.
  std::string ToString() const;
};

inline Status OkStatus() { return Status{}; }
// An error with `code`; `message` must say what was wrong (an empty one becomes the code name).
Status MakeError(Code code, std::string message, bool retryable = false);
Status InvalidArgumentError(std::string message);
Status VersionMismatchError(std::string message);
Status ChecksumMismatchError(std::string message);
Status ResourceExhaustedError(std::string message);
Status InternalError(std::string message);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_WIRE_STATUS_H_
