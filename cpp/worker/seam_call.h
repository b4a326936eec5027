// One Seam call a peer opened to this hop (a client or the previous hop; on the first hop also
// the last hop's ring stream). Replies are written by the call's reader loop and by the
// Downstream readers of the sessions bound to it; writes after the handler returned are
// dropped. `cancelled` is guarded by the service's lock, and `context` is valid while the call
// is registered with the service.
#ifndef MESHNET_CPP_WORKER_SEAM_CALL_H_
#define MESHNET_CPP_WORKER_SEAM_CALL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "cpp/protocol/seam.h"
#include "cpp/worker/scheduler/deadline.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker {

class SeamCall {
 public:
  using Stream =
      grpc::ServerReaderWriter<meshnet::shard::v1::SeamReply, meshnet::shard::v1::SeamFrame>;
  SeamCall(uint64_t id, grpc::ServerContext* context, Stream* stream, std::string peer)
      : id(id), context(context), opened(Clock::now()), peer(std::move(peer)), stream_(stream) {}
  void Write(const protocol::SeamReply& reply) {
    meshnet::shard::v1::SeamReply message;
    protocol::ToProto(reply, &message);
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ != nullptr) stream_->Write(message);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
  }
  bool Abandoned() const { return context->IsCancelled(); }

  const uint64_t id;
  grpc::ServerContext* const context;
  const Clock::time_point opened;
  const std::string peer;  // the peer's host (strangers.h)
  std::atomic<bool> authenticated{false};  // presented a valid ticket
  std::atomic<bool> spoke{false};          // sent a frame
  bool cancelled = false;

 private:
  std::mutex mu_;
  Stream* stream_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SEAM_CALL_H_
