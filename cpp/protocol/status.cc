#include "cpp/protocol/status.h"

#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {

void ToProto(const Status& in, meshnet::shard::v1::Status* out) {
  out->Clear();
  out->set_code(static_cast<meshnet::shard::v1::StatusCode>(in.code));
  out->set_message(in.message);
  out->set_retryable(in.retryable);
  out->set_hop(in.hop);
}

Status FromProto(const meshnet::shard::v1::Status& in) {
  Status out;
  out.code = static_cast<Code>(in.code());
  out.message = in.message();
  out.retryable = in.retryable();
  out.hop = in.hop();
  return out;
}

}  // namespace meshnet::protocol
