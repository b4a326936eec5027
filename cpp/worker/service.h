// The worker's gRPC service meshnet.shard.v1.Shard (Hello, Health, Seam, Results), with the
// semantics of the Python reference shard (python/meshnet/reference/server.py).
//
// One Seam stream per upstream peer and route session: the handler's reader loop (a gRPC
// thread) decodes each frame, fences epochs, replays repeated steps from the record, submits the
// step to the Scheduler and waits for it, then forwards hidden rows to the next hop over one
// downstream Seam stream per session (a reader thread relays its error replies upstream) or, on
// the last hop, samples a token into the session's Results stream. Release, cancel, fencing,
// upstream stream loss and idle timeout all end a session: its KV is dropped on the engine
// thread, a release/cancel travels on, and its Results stream closes.
//
// Protobuf types stop here: everything below the service uses cpp/protocol's native structs.
// Threading: the gRPC methods run on gRPC threads; the service owns an idle-reaper thread.
#ifndef MESHNET_CPP_WORKER_SERVICE_H_
#define MESHNET_CPP_WORKER_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "cpp/protocol/seam.h"
#include "cpp/worker/scheduler.h"
#include "cpp/worker/sessions.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker {

struct ServiceOptions {
  std::string node_id;                              // names this hop in errors
  std::optional<protocol::Fingerprints> fingerprints;  // frames must match when set
  SessionTableOptions sessions;                     // max_sessions <= scheduler's n_seq
  uint32_t credits = 8;                             // frames a sender may write per reply
  // How long a closed Results queue waits for a late reader before the reaper drops it.
  std::chrono::milliseconds results_grace{10000};
};

class ShardService final : public meshnet::shard::v1::Shard::Service {
 public:
  // `scheduler` must outlive the service.
  ShardService(Scheduler* scheduler, const ServiceOptions& options);
  ~ShardService() override;  // stops the reaper; the gRPC server must be shut down first

  grpc::Status Hello(grpc::ServerContext* context, const meshnet::shard::v1::HelloRequest* request,
                     meshnet::shard::v1::HelloReply* reply) override;
  grpc::Status Health(grpc::ServerContext* context,
                      const meshnet::shard::v1::HealthRequest* request,
                      meshnet::shard::v1::HealthReply* reply) override;
  grpc::Status Seam(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<meshnet::shard::v1::SeamReply,
                                             meshnet::shard::v1::SeamFrame>* stream) override;
  grpc::Status Results(grpc::ServerContext* context,
                       const meshnet::shard::v1::ResultsRequest* request,
                       grpc::ServerWriter<meshnet::shard::v1::ResultFrame>* writer) override;
  // Takes (returns and resets) the tokens processed per session since the last call.
  grpc::Status TakeWork(grpc::ServerContext* context,
                        const meshnet::shard::v1::TakeWorkRequest* request,
                        meshnet::shard::v1::TakeWorkReply* reply) override;

  // Any thread.
  int active_sessions() const { return table_.active(); }
  int free_seqs() const { return table_.free_seqs(); }
  std::map<SessionKey, uint64_t> TokenCounts() const { return table_.TokenCounts(); }

 private:
  struct Upstream;
  struct Live;
  struct ResultQueue;

  std::optional<protocol::SeamReply> Handle(const meshnet::shard::v1::SeamFrame& message,
                                            const std::shared_ptr<Upstream>& upstream,
                                            std::set<SessionKey>* owned);
  std::optional<protocol::SeamReply> Step(const SessionKey& key, const SessionInfo& info,
                                          Live& live, const protocol::SeamFrame& frame);
  protocol::Status Forward(Live& live, const protocol::SeamFrame& frame,
                           const std::vector<float>& hidden);
  void Emit(Live& live, const protocol::SeamFrame& frame, const std::vector<float>& logits,
            uint64_t length);
  void End(const SessionKey& key, protocol::FinishReason reason, const protocol::Status& status,
           const protocol::SeamFrame* forward = nullptr, bool close_results = true);
  protocol::SeamReply Reply(const protocol::SeamFrame& frame, protocol::Status status,
                            std::optional<uint64_t> cache = std::nullopt) const;
  std::shared_ptr<ResultQueue> Results(const SessionKey& key);
  void ReapIdle();

  Scheduler* const scheduler_;
  const ServiceOptions options_;
  SessionTable table_;
  std::atomic<uint64_t> seam_frames_in_{0};  // Health counters
  std::atomic<uint64_t> seam_bytes_in_{0};
  std::mutex mu_;  // guards live_, results_, stopping_
  std::map<SessionKey, std::shared_ptr<Live>> live_;
  std::map<SessionKey, std::shared_ptr<ResultQueue>> results_;
  bool stopping_ = false;
  std::mutex work_mu_;  // guards work_
  std::map<SessionKey, std::pair<uint64_t, uint64_t>> work_;  // (prefill, decode) not yet taken
  std::condition_variable reaper_wake_;
  std::thread reaper_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SERVICE_H_
