// The worker's gRPC service meshnet.shard.v1.Shard (Hello, Health, TakeWork, Seam, Results,
// Commitments),
// with the semantics of the Python reference shard (python/meshnet/reference/server.py).
//
// One Seam stream per upstream peer and route session: the handler's reader loop (a gRPC
// thread) decodes each frame, admits it (cpp/worker/hop.h, in ADR 0003's order: header, route
// ticket unless the session is bound to this stream, epoch fence, stream binding, downstream
// named by the ticket), replays repeated steps from the record, submits the step to the
// Scheduler and waits for it, then forwards hidden rows to the next hop (cpp/worker/downstream.h)
// or, on the last hop, samples a token into the session's Results queue (cpp/worker/sessions/results.h).
// A step is bounded by its frame's budget_ms, else by max_step (cpp/worker/scheduler/deadline.h): one
// not done in time is answered DEADLINE_EXCEEDED and leaves no rows in this hop's KV, and the
// next hop gets what is left of the budget. Release, cancel, fencing, upstream stream loss and
// idle timeout all end a session: its KV is dropped on the engine thread, a release/cancel
// travels on, and its Results stream closes. A Seam stream that presents no valid ticket within
// `ticket_deadline` is cancelled.
//
// Ring decode (docs/adr/0005-ring-decode.md): for a frame with `ring` set, the last hop, after
// sampling, sends the next DECODE step itself to the first hop over a Downstream stream it opens
// to the hop its ticket names (the route's first hop), until a stop token, max_tokens or the KV
// budget ends the session's tokens. The first hop admits those steps on that second stream (the
// ring stream: one per session, bound by the first hop's own ticket) through HandleRing, which
// never opens a session; everything after admission is the same Step as a client's frame.
// The ring and speculation are in ring.cc; the handlers and the step in service.cc; the state
// of a Seam call and of a live session, which both use, in service_state.h. Every step records
// what it received and handed on in the commitment log (cpp/worker/commitments/), which the
// Commitments RPC serves to audits (audit.cc, docs/adr/0008-verified-outputs.md).
//
// Protobuf types stop here (and in downstream.cc): below, only cpp/protocol's native structs.
// Threading: the gRPC methods run on gRPC threads; the service owns a reaper thread (idle
// sessions, unread results, expired fences, unauthenticated streams).
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

#include "cpp/protocol/seam.h"
#include "cpp/protocol/ticket.h"
#include "cpp/worker/scheduler/deadline.h"
#include "cpp/worker/commitments/commitment_log.h"
#include "cpp/worker/hop.h"
#include "cpp/worker/sessions/results.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/sessions/sessions.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker {

struct ServiceOptions {
  std::string node_id;                 // this hop's id: tickets must name it; names it in errors
  protocol::PublicKey tracker_key{};   // verifies route tickets (--tracker_key)
  // The registered range [layer_start, layer_end) tickets must name; layer_end 0 takes the
  // scheduler's resolved range (what --layers loaded).
  uint32_t layer_start = 0;
  uint32_t layer_end = 0;
  bool compression = false;  // offer compression.zlib in Hello and accept zlib bundles
  bool insecure = false;     // dial downstream hops in plaintext (--insecure=1), not pinned TLS
  std::optional<protocol::Fingerprints> fingerprints;  // frames must match when set
  SessionTableOptions sessions;                     // max_sessions <= scheduler's n_seq
  uint32_t credits = 8;                             // frames a sender may write per reply
  // How long a closed Results queue waits for a late reader before the reaper drops it.
  std::chrono::milliseconds results_grace{10000};
  // A Seam stream that has not presented a valid ticket by then is cancelled.
  std::chrono::milliseconds ticket_deadline{10000};
  // The longest a step may take on this hop when its frame gives no budget_ms (and the most a
  // budget may claim): past it the step is answered DEADLINE_EXCEEDED (--max_step_ms).
  std::chrono::milliseconds max_step{120000};
  // How long connecting to the next hop may take (--connect_timeout_ms), within the step's own
  // deadline; then the step fails UNAVAILABLE naming that hop.
  std::chrono::milliseconds connect_timeout{10000};
  int max_results_queues = 0;  // queues Results readers may open; 0: 2 * max_sessions
  // TakeWork answers only calls whose "x-meshnet-supervisor" metadata equals this token (the
  // node's, from $MESHNET_SUPERVISOR_TOKEN); empty refuses every caller.
  std::string supervisor_token;
  // The node's identity private key (32 raw bytes, from $MESHNET_NODE_KEY): signs Commitments
  // replies. Empty: Commitments answers UNAVAILABLE.
  std::string node_key;
  CommitmentOptions commitments;
  bool record_commitments = true;  // false (--commitments=0): nothing to audit (benchmarks only)
  // Test only (issue 17's cheating worker, --cheat=...): what this hop does to its output and
  // commits to, so that audits can be shown to catch it. kNone in every real deployment.
  struct Cheat {
    enum class Mode { kNone, kNoise, kGarbage, kForgeTokens } mode = Mode::kNone;
    float noise = 0.0f;  // kNoise: Gaussian noise of this fraction of each row's RMS
  } cheat;
};

inline constexpr char kSupervisorMetadata[] = "x-meshnet-supervisor";
inline constexpr size_t kMaxDraftTokens = 16;  // drafted tokens per speculative ring step
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
  struct Stream;
  struct Live;

  std::optional<protocol::SeamReply> Handle(const meshnet::shard::v1::SeamFrame& message,
                                            const std::shared_ptr<Stream>& stream,
                                            std::set<SessionKey>* owned);
  std::optional<protocol::SeamReply> HandleRing(const protocol::SeamFrame& frame,
                                                const std::shared_ptr<Stream>& stream,
                                                Clock::time_point received);
  std::optional<protocol::SeamReply> Step(const SessionKey& key, SessionInfo info,
                                          Live& live, const protocol::SeamFrame& frame,
                                          Clock::time_point received);
  protocol::Status Hidden(Live& live, const protocol::SeamFrame& frame,
                          std::vector<float>* hidden, bool* complete);
  protocol::Status Forward(Live& live, const protocol::SeamFrame& frame,
                           const std::vector<float>& hidden, const StepDeadline& deadline);
  // First hop: the frame's token ids against its span and the vocabulary.
  protocol::Status CheckTokens(const protocol::SeamFrame& frame) const;
  // A speculative ring step's drafted ids: one fewer than its span, at most kMaxDraftTokens.
  protocol::Status CheckDrafts(const protocol::SeamFrame& frame) const;
  // First hop: for a session that asked for speculation, keeps its token history and, on a ring
  // decode step, returns the step with prompt-lookup drafts appended (else nullopt).
  std::optional<protocol::SeamFrame> Draft(Live& live, const protocol::SeamFrame& in);
  // The step's sampled tokens: with drafts, row by row while the sampler agrees with them (so
  // the tokens are those plain decoding gives), and whether they end the session's tokens.
  struct Sampled {
    struct Token {
      uint32_t id = 0;
      uint64_t position = 0;
      size_t row = 0;  // the logits row it was drawn from
    };
    std::vector<Token> tokens;
    // A stop token; in ring decode also max_tokens or the KV budget.
    protocol::FinishReason finish = protocol::FinishReason::kUnspecified;
  };
  Sampled Accept(Live& live, const protocol::SeamFrame& frame, const std::vector<float>& logits);
  // Describes (logprobs) and pushes them to the session's Results, the finish reason on the last.
  void Publish(Live& live, const protocol::SeamFrame& frame, const std::vector<float>& logits,
               const Sampled& sampled);
  // Ring decode, last hop: sends the step after `frame` (`token` at `position`) to the route's
  // first hop, opening the ring stream on first use.
  protocol::Status Ring(Live& live, const protocol::SeamFrame& frame, uint32_t token,
                        uint64_t position, const StepDeadline& deadline);
  // Writes an error reply for the session's newest step to its upstream (a Downstream reader's
  // report about the next hop, or about the ring).
  static std::function<void(protocol::Status)> ReportUpstream(Live& live);
  void End(const SessionKey& key, protocol::FinishReason reason, const protocol::Status& status,
           const protocol::SeamFrame* forward = nullptr, bool close_results = true);
  protocol::SeamReply Reply(const protocol::SeamFrame& frame, protocol::Status status,
                            std::optional<uint64_t> cache = std::nullopt) const;
  void Reap();
  // Test-only cheats (ServiceOptions::Cheat) on a step's output rows, before they are committed
  // and handed on (audit.cc).
  void CheatOnRows(std::vector<float>* rows, uint64_t start);
  // Last hop: commits to each sampled token and its logit (after the forging cheat, if set).
  void CommitSampled(const SessionKey& key, const Live& live, const std::vector<float>& logits,
                     Sampled* sampled);

  Scheduler* const scheduler_;
  const ServiceOptions options_;
  const HopIdentity identity_;
  SessionTable table_;
  ResultsBoard results_;
  CommitmentLog commitments_;
  std::atomic<uint64_t> seam_frames_in_{0};  // Health counters
  std::atomic<uint64_t> seam_bytes_in_{0};
  std::atomic<uint64_t> drafted_tokens_{0};
  std::atomic<uint64_t> accepted_drafts_{0};
  std::atomic<uint64_t> rewound_rows_{0};
  // Health's StepTimes: where completed steps spent their time (microseconds, summed).
  struct StageTotals {
    std::atomic<uint64_t> steps{0}, admit_us{0}, wait_us{0}, after_us{0}, send_us{0}, reply_us{0};
  } stages_;
  std::atomic<uint64_t> next_stream_id_{1};
  std::mutex mu_;  // guards live_, streams_, stopping_
  std::map<SessionKey, std::shared_ptr<Live>> live_;
  std::map<uint64_t, std::shared_ptr<Stream>> streams_;  // open Seam calls, by id
  bool stopping_ = false;
  std::condition_variable reaper_wake_;
  std::thread reaper_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SERVICE_H_
