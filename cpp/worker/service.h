// The worker's gRPC service meshnet.shard.v1.Shard (Hello, Health, TakeWork, Seam, Results,
// Commitments), with the semantics of the Python reference shard
// (python/meshnet/reference/server.py).
//
// The service parses, admits and dispatches; a session's step is its HopSession's
// (cpp/worker/hop_session.h, docs/adr/0018-hop-session.md). One Seam stream per upstream peer
// and route session: the handler's reader loop (a gRPC thread) decodes each frame, admits it
// (cpp/worker/hop.h, in ADR 0003's order: header, route ticket unless the session is bound to
// this stream, epoch fence, stream binding, downstream named by the ticket), replays repeated
// steps from the record, and hands the step to the session, which runs it on the engine and
// hands its output on. Release, cancel, fencing, upstream stream loss and idle timeout all end
// a session: its KV is dropped on the engine thread, a release/cancel travels on, and its
// Results stream closes. A Seam stream that presents no valid ticket within `ticket_deadline`
// is cancelled, and one that sends no frame within `first_frame_deadline`; streams without a
// valid ticket yet are capped per peer and in all (strangers.h), past which a new stream is
// refused before it is read.
//
// Ring decode (docs/adr/0005-ring-decode.md): the last hop sends each next DECODE step to the
// first hop itself (LastHop); the first hop admits those steps on that second stream (the ring
// stream: one per session, bound by the first hop's own ticket) through AdmitRing, which never
// opens a session; everything after admission is the same HopSession::Step as a client's frame.
// Every step records what it received and handed on in the commitment log
// (cpp/worker/commitments/), which the Commitments RPC serves to audits (audit.cc,
// docs/adr/0008-verified-outputs.md).
//
// Protobuf types stop here (and in downstream.cc, seam_call.h): below, only cpp/protocol's
// native structs. Threading: the gRPC methods run on gRPC threads; the service owns a reaper
// thread (idle sessions, unread results, expired fences, unauthenticated streams).
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
#include <vector>

#include "cpp/protocol/ticket.h"
#include "cpp/wire/seam.h"
#include "cpp/worker/scheduler/deadline.h"
#include "cpp/worker/commitments/commitment_log.h"
#include "cpp/worker/hop.h"
#include "cpp/worker/hop_context.h"
#include "cpp/worker/hop_session.h"
#include "cpp/worker/seam_call.h"
#include "cpp/worker/service_options.h"
#include "cpp/worker/sessions/results.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/sessions/sessions.h"
#include "cpp/worker/strangers/strangers.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker {

inline constexpr char kSupervisorMetadata[] = "x-meshnet-supervisor";
inline constexpr uint32_t kMaxAuditPositions = 4096;  // positions one Commitments call returns

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
  // What this hop committed to for positions of a session, for an audit the tracker signed
  // (UNAUTHENTICATED: the audit ticket does not verify; PERMISSION_DENIED: it names another node
  // or has expired; INVALID_ARGUMENT: count outside 1..kMaxAuditPositions; NOT_FOUND: no
  // commitments held for the session; UNAVAILABLE: no node key). The body is signed with the
  // node's key (audit.cc).
  grpc::Status Commitments(grpc::ServerContext* context,
                           const meshnet::shard::v1::CommitmentsRequest* request,
                           meshnet::shard::v1::CommitmentsReply* reply) override;

  // Any thread.
  int active_sessions() const { return table_.active(); }
  int free_seqs() const { return table_.free_seqs(); }
  int fence_entries() const { return table_.fence_entries(); }
  std::map<SessionKey, uint64_t> TokenCounts() const { return table_.TokenCounts(); }
  const HopIdentity& identity() const { return identity_; }

 private:
  // Admits a prefill, decode, release or cancel frame and dispatches it (nullopt: a step's
  // fragments are still arriving).
  std::optional<protocol::SeamReply> Handle(const meshnet::shard::v1::SeamFrame& message,
                                            const std::shared_ptr<SeamCall>& call,
                                            std::set<SessionKey>* owned);
  // First hop: a ring decode step from the last hop, on the session's ring stream.
  std::optional<protocol::SeamReply> AdmitRing(const protocol::SeamFrame& frame,
                                               const std::shared_ptr<SeamCall>& call,
                                               Clock::time_point received);
  void End(const SessionKey& key, protocol::FinishReason reason, const protocol::Status& status,
           const protocol::SeamFrame* forward = nullptr, bool close_results = true);
  std::shared_ptr<HopSession> Find(const SessionKey& key);
  void Reap();
  void Authenticated(SeamCall& call);  // the call presented a valid ticket (its thread only)

  Scheduler* const scheduler_;
  const ServiceOptions options_;
  const HopIdentity identity_;
  SessionTable table_;
  ResultsBoard results_;
  CommitmentLog commitments_;
  StrangerStreams strangers_;
  HopCounters counters_;
  DrawThreads draw_threads_;
  const HopContext hop_;  // the above, as sessions see them
  std::atomic<uint64_t> seam_frames_in_{0};  // Health counters
  std::atomic<uint64_t> seam_bytes_in_{0};
  std::atomic<uint64_t> next_call_id_{1};
  std::mutex mu_;  // guards sessions_, calls_, stopping_
  std::map<SessionKey, std::shared_ptr<HopSession>> sessions_;
  std::map<uint64_t, std::shared_ptr<SeamCall>> calls_;  // open Seam calls, by id
  bool stopping_ = false;
  std::condition_variable reaper_wake_;
  std::thread reaper_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SERVICE_H_
