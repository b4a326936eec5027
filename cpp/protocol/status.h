// Status <-> meshnet.shard.v1.Status. The native type is in cpp/wire/status.h; this header is
// for code that holds protobuf messages (the codecs here and the worker's gRPC service).
#ifndef MESHNET_CPP_PROTOCOL_STATUS_H_
#define MESHNET_CPP_PROTOCOL_STATUS_H_

#include "cpp/wire/status.h"

namespace meshnet::shard::v1 {
class Status;
}  // namespace meshnet::shard::v1

namespace meshnet::protocol {

// Field for field; codes are kept verbatim (ToProto clears *out first).
void ToProto(const Status& in, meshnet::shard::v1::Status* out);
Status FromProto(const meshnet::shard::v1::Status& in);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_STATUS_H_
