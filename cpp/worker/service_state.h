// Internal to the Shard service (service.cc, ring.cc): the state of one Seam call and of one
// live session, which both files' member functions use. Not part of the worker's API.
#ifndef MESHNET_CPP_WORKER_SERVICE_STATE_H_
#define MESHNET_CPP_WORKER_SERVICE_STATE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cpp/engine/sampler.h"
#include "cpp/protocol/bundle.h"
#include "cpp/worker/downstream.h"
#include "cpp/worker/draft.h"
#include "cpp/worker/service.h"

namespace meshnet::worker {

// The protocol names both files use unqualified (this header is theirs alone).
using protocol::Code;
using protocol::FinishReason;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Phase;
using protocol::Status;

inline uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// One Seam call. Replies may be written from the reader loop and from a Downstream reader;
// writes after the handler returned are dropped. `cancelled` is guarded by the service's mu_,
// and `context` is valid while the stream is registered in streams_.
struct ShardService::Stream {
  Stream(uint64_t id, grpc::ServerContext* context,
         grpc::ServerReaderWriter<meshnet::shard::v1::SeamReply,
                                  meshnet::shard::v1::SeamFrame>* stream)
      : id(id), context(context), opened(Clock::now()), stream_(stream) {}
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
  const uint64_t id;
  grpc::ServerContext* const context;
  const Clock::time_point opened;
  std::atomic<bool> authenticated{false};  // presented a valid ticket
  bool cancelled = false;

 private:
  std::mutex mu_;
  grpc::ServerReaderWriter<meshnet::shard::v1::SeamReply, meshnet::shard::v1::SeamFrame>*
      stream_;
};

// A session's state beyond the table; `mu` serializes its steps against End.
struct ShardService::Live {
  std::mutex mu;
  bool ended = false;
  std::shared_ptr<Stream> upstream;  // the stream it is bound to
  protocol::RouteSession session;
  protocol::Ticket ticket;           // the ticket that opened it
  std::atomic<uint64_t> last_step{0};
  std::unique_ptr<Downstream> downstream;
  std::unique_ptr<engine::Sampler> sampler;
  protocol::Reassembler reassembler;
  // Ring decode. Last hop: the first hop its ticket names (from the session's first frame), the
  // stream to it once opened, and the tokens sampled so far. First hop: the ring stream's id.
  std::optional<protocol::DownstreamHop> ring_hop;
  std::unique_ptr<Downstream> ring;
  uint64_t generated = 0;
  uint64_t ring_stream = 0;
  // Speculation. Every hop: the span of its newest step (a ring step may drop that step's rows
  // past its first). First hop: the tokens its KV holds, the draft budget, what it drafted last
  // step, and the session's prompt length and max_tokens (drafts stop at max_tokens).
  uint64_t last_start = 0;
  uint64_t last_count = 0;
  std::vector<int32_t> history;
  DraftBudget drafts;
  uint32_t last_drafted = 0;
  uint64_t prompt_length = 0;
  uint64_t max_tokens = 0;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SERVICE_STATE_H_
