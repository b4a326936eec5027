#include "cpp/worker/service.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <utility>

#include "cpp/protocol/seam.h"
#include "cpp/protocol/status.h"

namespace meshnet::worker {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using protocol::FinishReason;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Phase;
using protocol::Status;

namespace {

constexpr char kZlib[] = "compression.zlib";
constexpr char kLogprobs[] = "logprobs";

grpc::Status ToGrpc(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code) {
    case Code::kOk: return grpc::Status::OK;
    case Code::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case Code::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case Code::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
    case Code::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    default: break;
  }
  return grpc::Status(code, status.message);
}

HopIdentity MakeIdentity(const ServiceOptions& options, const Scheduler& scheduler) {
  HopIdentity hop;
  hop.node_id = options.node_id;
  hop.layer_start = options.layer_end != 0 ? options.layer_start : scheduler.layer_start();
  hop.layer_end = options.layer_end != 0 ? options.layer_end : scheduler.layer_end();
  hop.last = scheduler.last();
  hop.tracker_key = options.tracker_key;
  return hop;
}

}  // namespace

ShardService::ShardService(Scheduler* scheduler, const ServiceOptions& options)
    : scheduler_(scheduler),
      options_(options),
      identity_(MakeIdentity(options, *scheduler)),
      table_(options.sessions),
      results_(options.max_results_queues > 0 ? options.max_results_queues
                                              : 2 * options.sessions.max_sessions,
               options.results_grace),
      commitments_(options.commitments),
      strangers_(options.max_stranger_streams, options.max_stranger_streams_per_peer),
      draw_threads_(options.heavy_draw, options.draw_threads),
      hop_{scheduler, &options_, &table_, &results_,
           options.record_commitments ? &commitments_ : nullptr, &counters_, &draw_threads_} {
  reaper_ = std::thread([this] { Reap(); });
}

ShardService::~ShardService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  reaper_wake_.notify_all();
  reaper_.join();
  std::vector<SessionKey> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, session] : sessions_) keys.push_back(key);
  }
  for (const SessionKey& key : keys) {
    End(key, FinishReason::kError, MakeError(Code::kUnavailable, "worker stopping", true));
  }
}

void ShardService::Reap() {
  auto period = std::max<Clock::duration>(
      std::chrono::milliseconds(10),
      std::min<Clock::duration>(
          {std::chrono::seconds(1), options_.sessions.idle / 4, options_.ticket_deadline / 4,
           options_.first_frame_deadline / 4}));
  std::unique_lock<std::mutex> lock(mu_);
  while (!reaper_wake_.wait_for(lock, period, [this] { return stopping_; })) {
    const Clock::time_point now = Clock::now();
    for (auto& [id, call] : calls_) {  // no frame, or no valid ticket, in time: cut the stream
      const Clock::duration age = now - call->opened;
      const bool silent = !call->spoke && age > options_.first_frame_deadline;
      if (!call->authenticated && !call->cancelled && (silent || age > options_.ticket_deadline)) {
        call->cancelled = true;
        call->context->TryCancel();
      }
    }
    lock.unlock();
    results_.Reap(now);
    table_.PruneFences(NowUnixMs());
    for (const SessionKey& key : table_.Idle(now)) {
      End(key, FinishReason::kError,
          MakeError(Code::kDeadlineExceeded, "session idle past the worker's idle timeout"));
    }
    lock.lock();
  }
}

void ShardService::Authenticated(SeamCall& call) {
  if (!call.authenticated.exchange(true)) strangers_.Leave(call.peer);
}

grpc::Status ShardService::Hello(grpc::ServerContext*, const pb::HelloRequest* request,
                                 pb::HelloReply* reply) {
  protocol::HelloRequest in;
  protocol::FromProto(*request, &in);
  protocol::HelloReply out;
  out.peer_id = options_.node_id;
  bool speaks = std::any_of(in.supported_versions.begin(), in.supported_versions.end(),
                            [](const auto& v) { return v.major == protocol::kProtocolMajor; });
  if (!speaks) {
    out.status = protocol::VersionMismatchError("peer offers no major " +
                                                std::to_string(protocol::kProtocolMajor));
  } else {
    out.chosen_version = protocol::CurrentVersion();
    std::vector<std::string> offered = {kLogprobs};
    if (options_.compression) offered.push_back(kZlib);
    for (const std::string& feature : offered) {
      if (std::count(in.features.begin(), in.features.end(), feature)) {
        out.features.push_back(feature);
      }
    }
    std::sort(out.features.begin(), out.features.end());
    out.status = OkStatus();
  }
  protocol::ToProto(out, reply);
  return grpc::Status::OK;
}

grpc::Status ShardService::TakeWork(grpc::ServerContext* context, const pb::TakeWorkRequest*,
                                    pb::TakeWorkReply* reply) {
  const auto& metadata = context->client_metadata();
  auto given = metadata.find(kSupervisorMetadata);
  const std::string& token = options_.supervisor_token;
  bool supervisor = !token.empty() && given != metadata.end() && given->second.size() == token.size() &&
                    CRYPTO_memcmp(given->second.data(), token.data(), token.size()) == 0;
  if (!supervisor) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "TakeWork answers only this node's supervisor");
  }
  for (const SessionWork& taken : table_.TakeWork()) {
    pb::SessionWork* work = reply->add_work();
    work->mutable_session()->set_session_id(taken.key.first);
    work->mutable_session()->set_epoch(taken.key.second);
    work->set_prefill_tokens(taken.prefill);
    work->set_decode_tokens(taken.decode);
  }
  return grpc::Status::OK;
}

grpc::Status ShardService::Health(grpc::ServerContext*, const pb::HealthRequest*,
                                  pb::HealthReply* reply) {
  SchedulerStats stats = scheduler_->Stats();
  protocol::ToProto(OkStatus(), reply->mutable_status());
  reply->set_active_sessions(table_.active());
  reply->set_queue_depth(stats.queue_depth);
  reply->set_kv_cells_used(stats.kv_cells_used);
  reply->set_kv_cells_total(scheduler_->n_ctx());
  reply->set_batches(stats.batches);
  reply->set_mean_batch_rows(
      stats.batches == 0 ? 0.0f : static_cast<float>(double(stats.rows) / double(stats.batches)));
  reply->set_max_batch_sessions(static_cast<uint32_t>(stats.max_batch_items));
  reply->set_compute_us(stats.compute_us);
  reply->set_seam_frames_in(seam_frames_in_.load());
  reply->set_seam_bytes_in(seam_bytes_in_.load());
  reply->set_fence_entries(static_cast<uint32_t>(table_.fence_entries()));
  reply->set_results_readers(static_cast<uint32_t>(results_.readers()));
  reply->set_drafted_tokens(counters_.drafted_tokens.load());
  reply->set_accepted_drafts(counters_.accepted_drafts.load());
  reply->set_rewound_rows(counters_.rewound_rows.load());
  const engine::DeviceInfo device = scheduler_->Device();
  reply->set_device(device.name);
  reply->set_device_description(device.description);
  reply->set_device_memory_used(scheduler_->device_bytes());
  reply->set_device_memory_free(device.memory_free);
  reply->set_device_memory_total(device.memory_total);
  pb::StepTimes* times = reply->mutable_step_times();
  times->set_steps(counters_.steps.load());
  times->set_admit_us(counters_.admit_us.load());
  times->set_wait_us(counters_.wait_us.load());
  times->set_after_us(counters_.after_us.load());
  times->set_send_us(counters_.send_us.load());
  times->set_reply_us(counters_.reply_us.load());
  times->set_queue_us(counters_.queue_us.load());
  times->set_engine_us(counters_.engine_us.load());
  return grpc::Status::OK;
}

grpc::Status ShardService::Results(grpc::ServerContext* context,
                                   const pb::ResultsRequest* request,
                                   grpc::ServerWriter<pb::ResultFrame>* writer) {
  protocol::ResultsRequest in;
  protocol::FromProto(*request, &in);
  protocol::Ticket ticket;
  Status admitted = CheckResultsRequest(in, identity_, NowUnixMs(), &ticket);
  if (!admitted.ok()) return ToGrpc(admitted);
  const SessionKey key{in.session->session_id, in.session->epoch};
  std::shared_ptr<ResultQueue> queue;
  switch (results_.Attach(key, &queue)) {
    case ResultsBoard::Attached::kFull:
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too many results queues");
    case ResultsBoard::Attached::kHasReader:
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "session already has a reader");
    case ResultsBoard::Attached::kOk:
      break;
  }
  while (!context->IsCancelled()) {
    protocol::ResultFrame frame;
    bool closed = false;
    if (!queue->Pop(std::chrono::milliseconds(200), &frame, &closed)) {
      if (closed) break;
      continue;
    }
    pb::ResultFrame message;
    protocol::ToProto(frame, &message);
    if (!writer->Write(message)) break;
  }
  const bool abandoned = context->IsCancelled();
  results_.Detach(key, queue);
  if (abandoned) {  // the client stopped reading (failover, disconnect): its tokens have nowhere to go
    End(key, FinishReason::kCancelled,
        MakeError(Code::kCancelled, "the client stopped reading results", false));
  }
  return grpc::Status::OK;
}

grpc::Status ShardService::Seam(grpc::ServerContext* context,
                                grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* rw) {
  std::string why;
  const std::string peer = PeerHost(context->peer());
  if (!strangers_.Admit(peer, &why)) {  // refused before a frame is read: the thread goes back
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why + "; retry later");
  }
  auto call = std::make_shared<SeamCall>(next_call_id_.fetch_add(1), context, rw, peer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_[call->id] = call;
  }
  std::set<SessionKey> owned;
  pb::SeamFrame message;
  while (rw->Read(&message)) {
    call->spoke = true;
    seam_frames_in_.fetch_add(1);
    seam_bytes_in_.fetch_add(message.ByteSizeLong());
    std::optional<protocol::SeamReply> reply = Handle(message, call, &owned);
    if (reply.has_value()) {
      const Clock::time_point writing = Clock::now();
      call->Write(*reply);
      if (message.phase() == pb::PHASE_DECODE) counters_.reply_us.fetch_add(MicrosSince(writing));
    }
  }
  for (const SessionKey& key : owned) {  // stream loss frees every session still bound to it
    if (table_.Stream(key) != call->id) continue;  // ended, and maybe reopened elsewhere
    End(key, FinishReason::kError,
        MakeError(Code::kUnavailable, "upstream of " + options_.node_id + " lost", true));
  }
  call->Close();
  if (!call->authenticated) strangers_.Leave(peer);
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(call->id);
  return grpc::Status::OK;
}

std::optional<protocol::SeamReply> ShardService::Handle(const pb::SeamFrame& message,
                                                        const std::shared_ptr<SeamCall>& call,
                                                        std::set<SessionKey>* owned) {
  const Clock::time_point received = Clock::now();  // a step's budget counts from here
  protocol::SeamFrame frame;
  protocol::FromProto(message, &frame);
  // ADR 0003's order; nothing below creates state until the ticket and the fence passed.
  Status header = CheckFrameHeader(frame);
  if (!header.ok()) return hop_.Reply(frame, header);
  const SessionKey key{frame.session->session_id, frame.session->epoch};
  const uint64_t now_ms = NowUnixMs();
  const std::optional<uint64_t> holder = table_.Stream(key);
  const bool bound = holder == call->id;
  if (frame.ring && frame.phase == Phase::kDecode && !bound && scheduler_->first()) {
    return AdmitRing(frame, call, received);  // never opens a session
  }
  protocol::Ticket ticket;
  if (!bound && table_.FencedOn(key, call->id)) {
    return hop_.Reply(frame, MakeError(Code::kStaleEpoch, "epoch " + std::to_string(key.second) +
                                                         " was fenced by a newer epoch"));
  }
  if (!bound) {
    Status admitted = CheckTicket(frame.ticket, *frame.session, identity_, now_ms, &ticket);
    if (!admitted.ok()) return hop_.Reply(frame, admitted);
    Authenticated(*call);
    if (holder.has_value()) {
      return hop_.Reply(frame, MakeError(Code::kPermissionDenied,
                                    "session is bound to another stream"));
    }
  }
  if (frame.range.has_value()) {  // a ticket's range passed the same check in CheckTicket
    Status range = CheckEffectiveStart(*frame.range, identity_);
    if (!range.ok()) return hop_.Reply(frame, range);
  }
  std::vector<EndedSession> fenced;
  Status fence = table_.Fence(key.first, key.second, bound ? 0 : ticket.expires_unix_ms, now_ms,
                              &fenced);
  if (!fence.ok()) return hop_.Reply(frame, fence);
  for (const EndedSession& old : fenced) {  // Fence took them out of the table
    scheduler_->Release(old.seq, old.owner, [this, seq = old.seq] { table_.FreeSeq(seq); });
    End(old.key, FinishReason::kError,
        MakeError(Code::kStaleEpoch, "fenced by epoch " + std::to_string(key.second)));
  }
  if (frame.phase == Phase::kRelease || frame.phase == Phase::kCancel) {
    if (!bound) return hop_.Reply(frame, OkStatus());  // not a session here: nothing to end
    bool cancel = frame.phase == Phase::kCancel;
    End(key, cancel ? FinishReason::kCancelled : FinishReason::kUnspecified,
        cancel ? MakeError(Code::kCancelled, "cancelled by the client") : OkStatus(), &frame);
    owned->erase(key);
    return hop_.Reply(frame, OkStatus());
  }
  if (frame.phase != Phase::kPrefill && frame.phase != Phase::kDecode) {
    return hop_.Reply(frame, protocol::InvalidArgumentError(
                            "unknown phase " + std::to_string(static_cast<int>(frame.phase))));
  }
  std::optional<protocol::DownstreamHop> next;  // from the ticket; the frame only lends tickets
  if (!bound) {
    Status route =
        ResolveDownstream(ticket, frame.downstream, identity_.last, !options_.insecure, &next);
    if (!route.ok()) return hop_.Reply(frame, route);
  }
  SessionInfo info;
  Status opened = table_.Open(key, call->id, Clock::now(), &info);
  if (!opened.ok()) return hop_.Reply(frame, opened);
  std::shared_ptr<HopSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<HopSession>& slot = sessions_[key];
    if (slot == nullptr) {
      // On the last hop `next` can only be the ring's target (the first hop).
      slot = std::make_shared<HopSession>(hop_, call, *frame.session, ticket, std::move(next));
      owned->insert(key);
    }
    session = slot;
  }
  std::optional<protocol::SeamReply> reply;
  {
    std::lock_guard<std::mutex> lock(session->mu());
    if (session->ended()) return hop_.Reply(frame, MakeError(Code::kNotFound, "session ended"));
    Status older;
    std::optional<protocol::SeamReply> replayed = table_.Replay(key, frame.step, &older);
    if (replayed.has_value()) return replayed;
    if (!older.ok()) return hop_.Reply(frame, older);
    reply = session->Step(key, info, frame, received);
  }
  // A session whose first step failed (bad input, full queue, next hop lost) holds nothing a
  // retry could use: end it now so it neither keeps a sequence id nor leaves stray KV.
  if (info.last_step == 0 && reply.has_value() && reply->status.has_value() &&
      !reply->status->ok()) {
    End(key, FinishReason::kError, *reply->status, nullptr, /*close_results=*/false);
    owned->erase(key);
  }
  return reply;
}

std::optional<protocol::SeamReply> ShardService::AdmitRing(const protocol::SeamFrame& frame,
                                                           const std::shared_ptr<SeamCall>& call,
                                                           Clock::time_point received) {
  const SessionKey key{frame.session->session_id, frame.session->epoch};
  const Status gone = MakeError(Code::kNotFound, "ring step for a session not open on this hop");
  std::shared_ptr<HopSession> session = Find(key);
  if (session == nullptr) return hop_.Reply(frame, gone);
  std::lock_guard<std::mutex> lock(session->mu());
  FirstHop* first = session->first();
  if (session->ended() || first == nullptr) return hop_.Reply(frame, gone);
  if (first->ring_stream != call->id) {
    if (first->ring_stream != 0) {
      return hop_.Reply(frame, MakeError(Code::kPermissionDenied, "session already has a ring stream"));
    }
    protocol::Ticket ticket;  // this hop's own ticket for the session, as the client presented
    Status admitted = CheckTicket(frame.ticket, *frame.session, identity_, NowUnixMs(), &ticket);
    if (!admitted.ok()) return hop_.Reply(frame, admitted);
    first->ring_stream = call->id;
    Authenticated(*call);
  }
  if (frame.range.has_value()) {
    Status range = CheckEffectiveStart(*frame.range, identity_);
    if (!range.ok()) return hop_.Reply(frame, range);
  }
  const std::optional<uint64_t> holder = table_.Stream(key);
  if (!holder.has_value()) return hop_.Reply(frame, gone);
  SessionInfo info;
  Status opened = table_.Open(key, *holder, Clock::now(), &info);
  if (!opened.ok()) return hop_.Reply(frame, opened);
  Status older;
  std::optional<protocol::SeamReply> replayed = table_.Replay(key, frame.step, &older);
  if (replayed.has_value()) return replayed;
  if (!older.ok()) return hop_.Reply(frame, older);
  return session->Step(key, info, frame, received);
}

void ShardService::End(const SessionKey& key, FinishReason reason, const Status& status,
                       const protocol::SeamFrame* forward, bool close_results) {
  std::shared_ptr<HopSession> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(key);
    if (it != sessions_.end()) {
      session = it->second;
      sessions_.erase(it);
    }
  }
  std::optional<EndedSession> ended = table_.Remove(key);
  if (ended.has_value()) {
    scheduler_->Release(ended->seq, ended->owner,
                        [this, seq = ended->seq] { table_.FreeSeq(seq); });
  }
  if (session == nullptr && !ended.has_value()) return;  // not a session here
  if (session != nullptr) {
    std::lock_guard<std::mutex> lock(session->mu());
    session->Close(forward);
  }
  if (scheduler_->last() && close_results) {
    protocol::ResultFrame result;
    result.version = protocol::CurrentVersion();
    result.session = protocol::RouteSession{key.first, key.second};
    result.finish_reason = reason;
    result.status = status;
    results_.Push(key, std::move(result), true);
  }
}

std::shared_ptr<HopSession> ShardService::Find(const SessionKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  return it == sessions_.end() ? nullptr : it->second;
}

}  // namespace meshnet::worker
