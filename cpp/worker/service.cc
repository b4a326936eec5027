#include "cpp/worker/service.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <future>
#include <utility>

#include "cpp/engine/sampler.h"
#include "cpp/protocol/bundle.h"
#include "cpp/protocol/tensor.h"
#include "cpp/worker/downstream.h"
#include "cpp/worker/service_state.h"

namespace meshnet::worker {

namespace pb = meshnet::shard::v1;
namespace {

constexpr char kHidden[] = "hidden_states";
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

uint64_t MicrosBetween(Clock::time_point from, Clock::time_point to) {
  return to > from ? static_cast<uint64_t>(
                         std::chrono::duration_cast<std::chrono::microseconds>(to - from).count())
                   : 0;
}

uint64_t MicrosSince(Clock::time_point from) { return MicrosBetween(from, Clock::now()); }

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
      commitments_(options.commitments) {
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
    for (const auto& [key, live] : live_) keys.push_back(key);
  }
  for (const SessionKey& key : keys) {
    End(key, FinishReason::kError, MakeError(Code::kUnavailable, "worker stopping", true));
  }
}

void ShardService::Reap() {
  auto period = std::max<Clock::duration>(
      std::chrono::milliseconds(10),
      std::min<Clock::duration>(
          {std::chrono::seconds(1), options_.sessions.idle / 4, options_.ticket_deadline / 4}));
  std::unique_lock<std::mutex> lock(mu_);
  while (!reaper_wake_.wait_for(lock, period, [this] { return stopping_; })) {
    const Clock::time_point now = Clock::now();
    for (auto& [id, stream] : streams_) {  // no valid ticket in time: cut the stream
      if (!stream->authenticated && !stream->cancelled &&
          now - stream->opened > options_.ticket_deadline) {
        stream->cancelled = true;
        stream->context->TryCancel();
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
  reply->set_drafted_tokens(drafted_tokens_.load());
  reply->set_accepted_drafts(accepted_drafts_.load());
  reply->set_rewound_rows(rewound_rows_.load());
  const engine::DeviceInfo device = scheduler_->Device();
  reply->set_device(device.name);
  reply->set_device_description(device.description);
  reply->set_device_memory_used(scheduler_->device_bytes());
  reply->set_device_memory_free(device.memory_free);
  reply->set_device_memory_total(device.memory_total);
  pb::StepTimes* times = reply->mutable_step_times();
  times->set_steps(stages_.steps.load());
  times->set_admit_us(stages_.admit_us.load());
  times->set_wait_us(stages_.wait_us.load());
  times->set_after_us(stages_.after_us.load());
  times->set_send_us(stages_.send_us.load());
  times->set_reply_us(stages_.reply_us.load());
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
  auto stream = std::make_shared<Stream>(next_stream_id_.fetch_add(1), context, rw);
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_[stream->id] = stream;
  }
  std::set<SessionKey> owned;
  pb::SeamFrame message;
  while (rw->Read(&message)) {
    seam_frames_in_.fetch_add(1);
    seam_bytes_in_.fetch_add(message.ByteSizeLong());
    std::optional<protocol::SeamReply> reply = Handle(message, stream, &owned);
    if (reply.has_value()) {
      const Clock::time_point writing = Clock::now();
      stream->Write(*reply);
      stages_.reply_us.fetch_add(MicrosSince(writing));
    }
  }
  for (const SessionKey& key : owned) {  // stream loss frees every session still bound to it
    if (table_.Stream(key) != stream->id) continue;  // ended, and maybe reopened elsewhere
    End(key, FinishReason::kError,
        MakeError(Code::kUnavailable, "upstream of " + options_.node_id + " lost", true));
  }
  stream->Close();
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream->id);
  return grpc::Status::OK;
}

std::optional<protocol::SeamReply> ShardService::Handle(const pb::SeamFrame& message,
                                                        const std::shared_ptr<Stream>& stream,
                                                        std::set<SessionKey>* owned) {
  const Clock::time_point received = Clock::now();  // a step's budget counts from here
  protocol::SeamFrame frame;
  protocol::FromProto(message, &frame);
  // ADR 0003's order; nothing below creates state until the ticket and the fence passed.
  Status header = CheckFrameHeader(frame);
  if (!header.ok()) return Reply(frame, header);
  const SessionKey key{frame.session->session_id, frame.session->epoch};
  const uint64_t now_ms = NowUnixMs();
  const std::optional<uint64_t> holder = table_.Stream(key);
  const bool bound = holder == stream->id;
  if (frame.ring && frame.phase == Phase::kDecode && !bound && scheduler_->first()) {
    return HandleRing(frame, stream, received);  // never opens a session
  }
  protocol::Ticket ticket;
  if (!bound && table_.FencedOn(key, stream->id)) {
    return Reply(frame, MakeError(Code::kStaleEpoch, "epoch " + std::to_string(key.second) +
                                                         " was fenced by a newer epoch"));
  }
  if (!bound) {
    Status admitted = CheckTicket(frame.ticket, *frame.session, identity_, now_ms, &ticket);
    if (!admitted.ok()) return Reply(frame, admitted);
    stream->authenticated = true;
    if (holder.has_value()) {
      return Reply(frame, MakeError(Code::kPermissionDenied,
                                    "session is bound to another stream"));
    }
  }
  if (frame.range.has_value()) {  // a ticket's range passed the same check in CheckTicket
    Status range = CheckEffectiveStart(*frame.range, identity_);
    if (!range.ok()) return Reply(frame, range);
  }
  std::vector<EndedSession> fenced;
  Status fence = table_.Fence(key.first, key.second, bound ? 0 : ticket.expires_unix_ms, now_ms,
                              &fenced);
  if (!fence.ok()) return Reply(frame, fence);
  for (const EndedSession& old : fenced) {  // Fence took them out of the table
    scheduler_->Release(old.seq, old.owner, [this, seq = old.seq] { table_.FreeSeq(seq); });
    End(old.key, FinishReason::kError,
        MakeError(Code::kStaleEpoch, "fenced by epoch " + std::to_string(key.second)));
  }
  if (frame.fingerprints.has_value() && options_.fingerprints.has_value() &&
      (frame.fingerprints->model_artifact != options_.fingerprints->model_artifact ||
       frame.fingerprints->runtime_recipe != options_.fingerprints->runtime_recipe)) {
    return Reply(frame, MakeError(Code::kFingerprintMismatch,
                                  "frame's fingerprints differ from this node's"));
  }
  if (frame.phase == Phase::kRelease || frame.phase == Phase::kCancel) {
    if (!bound) return Reply(frame, OkStatus());  // not a session here: nothing to end
    bool cancel = frame.phase == Phase::kCancel;
    End(key, cancel ? FinishReason::kCancelled : FinishReason::kUnspecified,
        cancel ? MakeError(Code::kCancelled, "cancelled by the client") : OkStatus(), &frame);
    owned->erase(key);
    return Reply(frame, OkStatus());
  }
  if (frame.phase != Phase::kPrefill && frame.phase != Phase::kDecode) {
    return Reply(frame, protocol::InvalidArgumentError(
                            "unknown phase " + std::to_string(static_cast<int>(frame.phase))));
  }
  if (!bound) {
    Status route = CheckDownstream(ticket, frame.downstream, identity_.last, !options_.insecure);
    if (!route.ok()) return Reply(frame, route);
  }
  SessionInfo info;
  Status opened = table_.Open(key, stream->id, Clock::now(), &info);
  if (!opened.ok()) return Reply(frame, opened);
  std::shared_ptr<Live> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Live>& slot = live_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Live>();
      slot->upstream = stream;
      slot->session = *frame.session;
      slot->ticket = ticket;
      // CheckDownstream held it to the ticket: on the last hop it can only be the ring target.
      if (scheduler_->last() && !frame.downstream.empty()) slot->ring_hop = frame.downstream[0];
      owned->insert(key);
    }
    live = slot;
  }
  std::optional<protocol::SeamReply> reply;
  {
    std::lock_guard<std::mutex> lock(live->mu);
    if (live->ended) return Reply(frame, MakeError(Code::kNotFound, "session ended"));
    Status older;
    std::optional<protocol::SeamReply> replayed = table_.Replay(key, frame.step, &older);
    if (replayed.has_value()) return replayed;
    if (!older.ok()) return Reply(frame, older);
    reply = Step(key, info, *live, frame, received);
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

std::optional<protocol::SeamReply> ShardService::Step(const SessionKey& key, SessionInfo info,
                                                      Live& live, const protocol::SeamFrame& in,
                                                      Clock::time_point received) {
  if (!in.span.has_value() || in.span->count == 0) {
    return Reply(in, protocol::InvalidArgumentError("prefill/decode frame without a token span"));
  }
  // Speculation: a ring step that starts inside this hop's previous step drops that step's rows
  // from its start on (the drafts the last hop rejected); it can rewind no further.
  if (in.ring && in.span->start < info.length && in.span->start > live.last_start &&
      info.length == live.last_start + live.last_count) {
    scheduler_->Truncate(info.seq, static_cast<int32_t>(in.span->start), info.owner);
    table_.Rewind(key, in.span->start);
    rewound_rows_.fetch_add(info.length - in.span->start);
    info.length = in.span->start;
  }
  std::optional<protocol::SeamFrame> drafted;  // the first hop's step with its drafts
  if (scheduler_->first()) {
    Status checked = CheckTokens(in);
    if (!checked.ok()) return Reply(in, checked);
    drafted = Draft(live, in);
  }
  const protocol::SeamFrame& frame = drafted.has_value() ? *drafted : in;
  const uint64_t start = frame.span->start, count = frame.span->count;
  if (!frame.draft_token_ids.empty()) {
    Status checked = CheckDrafts(frame);
    if (!checked.ok()) return Reply(frame, checked);
  }
  if (start != info.length) {
    return Reply(frame, MakeError(Code::kCacheMismatch,
                                  "span starts at " + std::to_string(start) + " but this hop holds " +
                                      std::to_string(info.length) + " positions"));
  }
  if (start + count > static_cast<uint64_t>(scheduler_->n_ctx_per_session())) {
    return Reply(frame, protocol::ResourceExhaustedError(
                            "span ends past the KV budget of " +
                            std::to_string(scheduler_->n_ctx_per_session()) + " positions"));
  }
  WorkItem item;
  item.seq = info.seq;
  item.owner = info.owner;
  item.pos = static_cast<int32_t>(start);
  item.all_logits = !frame.draft_token_ids.empty();
  if (scheduler_->first()) {
    item.tokens.assign(frame.token_ids.begin(), frame.token_ids.end());
  } else {
    bool complete = false;
    Status hidden = Hidden(live, frame, &item.hidden, &complete);
    if (!hidden.ok()) return Reply(frame, hidden);
    if (!complete) return std::nullopt;  // more fragments of this step
  }
  if (frame.sampling.has_value()) live.sampler = std::make_unique<engine::Sampler>(*frame.sampling);
  if (!options_.record_commitments) {
  } else if (scheduler_->first()) {  // what this hop was given, for audits (ADR 0008)
    commitments_.InputTokens(key, static_cast<uint32_t>(start), item.tokens);
  } else {
    commitments_.Rows(key, static_cast<uint32_t>(start), item.hidden.data(), static_cast<uint32_t>(count),
                      scheduler_->n_embd(), /*input=*/true);
  }

  const StepDeadline deadline(received, frame.budget_ms, options_.max_step);
  const Status late = deadline.Exceeded(frame.step, options_.node_id);
  if (deadline.Spent(Clock::now())) return Reply(frame, late);
  item.deadline = deadline.deadline();
  item.claim = std::make_shared<StepClaim>();
  std::shared_ptr<StepClaim> claim = item.claim;
  // The engine may finish (or drop) the step after this wait gave up: it owns the promise.
  auto result = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> ready = result->get_future();
  item.done = [result](const Status& status, std::vector<float> out) {
    result->set_value({status, std::move(out)});
  };
  const Clock::time_point submitting = Clock::now();
  Status submitted = scheduler_->Submit(std::move(item));
  if (!submitted.ok()) return Reply(frame, submitted);
  StepOutcome outcome = WaitForStep(ready, *claim, deadline.deadline(), late);
  if (!outcome.first.ok()) return Reply(frame, outcome.first);  // Handle ends a new session
  const Clock::time_point computed = Clock::now();
  Clock::time_point sending = computed;
  const uint64_t length = start + count;
  Status ringed = OkStatus();
  if (scheduler_->last()) {
    // The ring goes on before the tokens are described (logprobs) and published.
    Sampled sampled = Accept(live, frame, outcome.second);
    CommitSampled(key, live, outcome.second, &sampled);
    sending = Clock::now();
    if (frame.ring && sampled.finish == FinishReason::kUnspecified) {
      const Sampled::Token& next = sampled.tokens.back();
      ringed = Ring(live, frame, next.id, next.position, deadline);
    }
    Publish(live, frame, outcome.second, sampled);
  } else {
    CheatOnRows(&outcome.second, start);  // test-only cheats; nothing in a real deployment
    if (options_.record_commitments) {
      commitments_.Rows(key, static_cast<uint32_t>(start), outcome.second.data(), static_cast<uint32_t>(count),
                        scheduler_->n_embd(), /*input=*/false);
    }
    sending = Clock::now();
    Status forwarded = Forward(live, frame, outcome.second, deadline);
    if (!forwarded.ok()) {  // the step did not happen: take its rows back out of the KV
      scheduler_->Truncate(info.seq, static_cast<int32_t>(start), info.owner);
      return Reply(frame, forwarded);
    }
  }
  stages_.steps.fetch_add(1);
  stages_.admit_us.fetch_add(MicrosBetween(received, submitting));
  stages_.wait_us.fetch_add(MicrosBetween(submitting, computed));
  stages_.after_us.fetch_add(MicrosBetween(computed, sending));
  stages_.send_us.fetch_add(MicrosSince(sending));
  protocol::SeamReply reply = Reply(frame, OkStatus(), length);
  table_.RecordStep(key, frame.step, reply, length, count, frame.phase == Phase::kDecode);
  live.last_step = frame.step;
  live.last_start = start;
  live.last_count = count;
  if (!ringed.ok()) return Reply(frame, ringed, length);  // done here; the ring did not go on
  return reply;
}

Status ShardService::Hidden(Live& live, const protocol::SeamFrame& frame,
                            std::vector<float>* hidden, bool* complete) {
  if (!frame.fragment.has_value()) return protocol::InvalidArgumentError("hidden states expected");
  const uint32_t count = frame.span->count;
  const int n_embd = scheduler_->n_embd();
  Status accepted = CheckFragment(*frame.fragment, options_.compression);
  if (!accepted.ok()) {
    live.reassembler.Reset();
    return accepted;
  }
  // Bound this step's bundle by what it may carry, before fragment 0 allocates anything.
  if (frame.fragment->index == 0) {
    live.reassembler.set_limits(StepLimits(count, n_embd, options_.compression));
  }
  Status added = live.reassembler.Add(*frame.fragment);
  if (!added.ok()) return added;
  *complete = live.reassembler.complete();
  if (!*complete) return OkStatus();
  std::vector<protocol::Tensor> tensors;
  Status taken = live.reassembler.Take(&tensors);
  if (!taken.ok()) return taken;
  auto it = std::find_if(tensors.begin(), tensors.end(),
                         [](const protocol::Tensor& t) { return t.name == kHidden; });
  std::vector<uint64_t> shape = {count, static_cast<uint64_t>(n_embd)};
  if (it == tensors.end() || it->shape != shape) {
    return protocol::InvalidArgumentError(std::string("bundle lacks ") + kHidden + " of shape [" +
                                          std::to_string(count) + ", " + std::to_string(n_embd) +
                                          "]");
  }
  *hidden = protocol::TensorToFloats(*it);
  if (hidden->size() != uint64_t{count} * n_embd) {
    return protocol::InvalidArgumentError("unsupported dtype for " + std::string(kHidden));
  }
  return CheckFinite(*hidden, n_embd);
}

Status ShardService::Forward(Live& live, const protocol::SeamFrame& frame,
                             const std::vector<float>& hidden, const StepDeadline& deadline) {
  if (live.downstream == nullptr) {
    // Only the hop the ticket names, and only over TLS that trusts the ticket's certificate.
    Status route = CheckDownstream(live.ticket, frame.downstream, false, !options_.insecure);
    if (!route.ok()) return route;
    std::shared_ptr<Stream> upstream = live.upstream;
    Status opened = Downstream::Open(
        frame.downstream[0],
        DownstreamCredentials{options_.insecure, live.ticket.downstream_tls_certificate},
        std::min(deadline.deadline(), Clock::now() + options_.connect_timeout),
        [upstream] { return upstream->context->IsCancelled(); }, ReportUpstream(live),
        &live.downstream);
    if (!opened.ok()) {
      return deadline.Spent(Clock::now()) ? deadline.Exceeded(frame.step, options_.node_id)
                                          : opened;
    }
  }
  const Clock::time_point now = Clock::now();
  if (deadline.Spent(now)) return deadline.Exceeded(frame.step, options_.node_id);
  const uint64_t rows = frame.span->count;
  std::vector<protocol::Tensor> tensors = {protocol::TensorFromFloats(
      kHidden, protocol::DType::kF32, {rows, static_cast<uint64_t>(scheduler_->n_embd())},
      hidden.data())};
  protocol::Limits limits;
  std::vector<protocol::TensorFragment> fragments;
  Status encoded = protocol::EncodeBundle(tensors, frame.step, protocol::Compression::kNone,
                                          limits.max_fragment_bytes, limits, &fragments);
  if (!encoded.ok()) return encoded;
  protocol::SeamFrame next = NextHopFrame(frame, live.downstream->hop());
  next.budget_ms = deadline.Remaining(now);
  for (protocol::TensorFragment& fragment : fragments) {
    next.fragment = std::move(fragment);
    if (!live.downstream->Send(next)) {
      Status lost = MakeError(Code::kUnavailable,
                              "next hop " + live.downstream->hop().node_id + " lost", true);
      lost.hop = live.downstream->hop().node_id;
      return lost;
    }
    next.ticket.reset();  // the first fragment carried it
  }
  return OkStatus();
}

std::function<void(Status)> ShardService::ReportUpstream(Live& live) {
  std::shared_ptr<Stream> upstream = live.upstream;
  protocol::RouteSession session = live.session;
  std::atomic<uint64_t>* last_step = &live.last_step;  // Live outlives its Downstreams
  return [upstream, session, last_step](Status status) {
    protocol::SeamReply reply;
    reply.version = protocol::CurrentVersion();
    reply.session = session;
    reply.step = last_step->load();
    reply.status = std::move(status);
    upstream->Write(reply);
  };
}

Status ShardService::CheckTokens(const protocol::SeamFrame& frame) const {
  if (frame.token_ids.size() != frame.span->count) {
    return protocol::InvalidArgumentError(std::to_string(frame.token_ids.size()) +
                                          " token ids for a span of " +
                                          std::to_string(frame.span->count));
  }
  for (uint32_t token : frame.token_ids) {
    if (token >= static_cast<uint32_t>(scheduler_->n_vocab())) {
      return protocol::InvalidArgumentError("token id " + std::to_string(token) +
                                            " is outside the vocabulary");
    }
  }
  return OkStatus();
}

void ShardService::End(const SessionKey& key, FinishReason reason, const Status& status,
                       const protocol::SeamFrame* forward, bool close_results) {
  std::shared_ptr<Live> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(key);
    if (it != live_.end()) {
      live = it->second;
      live_.erase(it);
    }
  }
  std::optional<EndedSession> ended = table_.Remove(key);
  if (ended.has_value()) {
    scheduler_->Release(ended->seq, ended->owner,
                        [this, seq = ended->seq] { table_.FreeSeq(seq); });
  }
  if (live == nullptr && !ended.has_value()) return;  // not a session here
  if (live != nullptr) {
    std::lock_guard<std::mutex> lock(live->mu);
    live->ended = true;
    if (live->downstream != nullptr) {
      if (forward != nullptr) live->downstream->Send(NextHopFrame(*forward, live->downstream->hop()));
      live->downstream.reset();  // half-closes and joins its reader
    }
    live->ring.reset();
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

protocol::SeamReply ShardService::Reply(const protocol::SeamFrame& frame, Status status,
                                        std::optional<uint64_t> cache) const {
  if (!status.ok() && status.hop.empty()) status.hop = options_.node_id;
  protocol::SeamReply reply;
  reply.version = protocol::CurrentVersion();
  reply.session = frame.session;
  reply.step = frame.step;
  reply.credits = options_.credits;
  if (cache.has_value()) reply.cache = protocol::CacheState{*cache};
  reply.status = std::move(status);
  return reply;
}

}  // namespace meshnet::worker
