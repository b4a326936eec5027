#include "cpp/worker/service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <future>
#include <utility>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/tensor.h"
#include "llama.h"

namespace meshnet::worker {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using protocol::FinishReason;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Phase;
using protocol::Status;

namespace {

constexpr char kHidden[] = "hidden_states";
const char* const kFeatures[] = {"compression.zlib", "logprobs"};

// The session's sampler: llama.cpp's sampler chain over one row of logits.
class Sampler {
 public:
  explicit Sampler(const protocol::SamplingParams& params) : params_(params) {
    chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (params.temperature <= 0) {
      llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
      return;
    }
    if (params.top_k > 0) llama_sampler_chain_add(chain_, llama_sampler_init_top_k(params.top_k));
    if (params.top_p > 0 && params.top_p < 1) {
      llama_sampler_chain_add(chain_, llama_sampler_init_top_p(params.top_p, 1));
    }
    llama_sampler_chain_add(chain_, llama_sampler_init_temp(params.temperature));
    llama_sampler_chain_add(chain_, llama_sampler_init_dist(static_cast<uint32_t>(params.seed)));
  }
  ~Sampler() { llama_sampler_free(chain_); }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  const protocol::SamplingParams& params() const { return params_; }

  protocol::SampledToken Sample(const std::vector<float>& logits, uint64_t position) {
    std::vector<llama_token_data> data(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      data[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
    }
    llama_token_data_array array{data.data(), data.size(), -1, false};
    llama_sampler_apply(chain_, &array);
    protocol::SampledToken token;
    token.token_id = static_cast<uint32_t>(array.data[array.selected].id);
    token.position = position;
    float max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float logit : logits) sum += std::exp(double(logit) - max);
    float log_z = max + static_cast<float>(std::log(sum));
    token.logprob = logits[token.token_id] - log_z;
    std::vector<uint32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i);
    size_t top = std::min<size_t>(params_.top_logprobs, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(),
                      [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
    for (size_t i = 0; i < top; ++i) token.top.push_back({ids[i], logits[ids[i]] - log_z});
    return token;
  }

 private:
  protocol::SamplingParams params_;
  llama_sampler* chain_ = nullptr;
};

}  // namespace

// Replies to whoever sends a session's frames; writes after the handler returned are dropped.
struct ShardService::Upstream {
  explicit Upstream(grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* s) : stream(s) {}
  void Write(const protocol::SeamReply& reply) {
    pb::SeamReply message;
    protocol::ToProto(reply, &message);
    std::lock_guard<std::mutex> lock(mu);
    if (stream != nullptr) stream->Write(message);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    stream = nullptr;
  }
  std::mutex mu;
  grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* stream;
};

// One Seam stream to the next hop for one session; a reader thread reports error replies.
class Downstream {
 public:
  Downstream(const protocol::DownstreamHop& hop, std::function<void(Status)> on_error)
      : hop_(hop), on_error_(std::move(on_error)) {
    channel_ = grpc::CreateChannel(hop.address, grpc::InsecureChannelCredentials());
    stub_ = pb::Shard::NewStub(channel_);
    stream_ = stub_->Seam(&context_);
    reader_ = std::thread([this] { Read(); });
  }
  ~Downstream() { Close(); }

  const protocol::DownstreamHop& hop() const { return hop_; }

  bool Send(const protocol::SeamFrame& frame) {
    pb::SeamFrame message;
    protocol::ToProto(frame, &message);
    std::lock_guard<std::mutex> lock(write_mu_);
    return !closed_ && stream_->Write(message);
  }

  // Half-closes; waits up to 2 s for the next hop to end the stream, then cancels it.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      if (closed_) return;
      closed_ = true;
      stream_->WritesDone();
    }
    if (finished_.get_future().wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      context_.TryCancel();
    }
    reader_.join();
  }

 private:
  void Read() {
    pb::SeamReply message;
    while (stream_->Read(&message)) {
      protocol::SeamReply reply;
      protocol::FromProto(message, &reply);
      if (reply.status.has_value() && !reply.status->ok()) {
        Status status = *reply.status;
        if (status.hop.empty()) status.hop = hop_.node_id;
        on_error_(status);
      }
    }
    grpc::Status status = stream_->Finish();
    bool closed;
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      closed = closed_;
    }
    if (!closed) {  // the next hop is gone: name it, so the client reports the right node
      Status lost = MakeError(Code::kUnavailable,
                              "next hop " + hop_.node_id + " lost: " + status.error_message(), true);
      lost.hop = hop_.node_id;
      on_error_(lost);
    }
    finished_.set_value();
  }

  protocol::DownstreamHop hop_;
  std::function<void(Status)> on_error_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Shard::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SeamFrame, pb::SeamReply>> stream_;
  std::mutex write_mu_;
  bool closed_ = false;
  std::promise<void> finished_;
  std::thread reader_;
};

// A session's state beyond the table; `mu` serializes its steps against End.
struct ShardService::Live {
  std::mutex mu;
  bool ended = false;
  std::shared_ptr<Upstream> upstream;
  std::optional<protocol::RouteSession> session;
  std::atomic<uint64_t> last_step{0};
  std::unique_ptr<Downstream> downstream;
  std::unique_ptr<Sampler> sampler;
  protocol::Reassembler reassembler;
};

struct ShardService::ResultQueue {
  void Push(protocol::ResultFrame frame, bool close) {
    {
      std::lock_guard<std::mutex> lock(mu);
      frames.push_back(std::move(frame));
      if (close && !closed) closed_at = Clock::now();
      closed = closed || close;
    }
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<protocol::ResultFrame> frames;
  bool closed = false;
  Clock::time_point closed_at;  // when `closed` became true
};

ShardService::ShardService(Scheduler* scheduler, const ServiceOptions& options)
    : scheduler_(scheduler), options_(options), table_(options.sessions) {
  reaper_ = std::thread([this] { ReapIdle(); });
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

void ShardService::ReapIdle() {
  auto period = std::min<Clock::duration>(std::chrono::seconds(1), options_.sessions.idle / 4);
  std::unique_lock<std::mutex> lock(mu_);
  while (!reaper_wake_.wait_for(lock, period, [this] { return stopping_; })) {
    // A closed queue nobody reads (the client left first, or never subscribed) goes after a
    // grace period for late readers; without this, results_ grows by one per such session.
    for (auto it = results_.begin(); it != results_.end();) {
      std::lock_guard<std::mutex> queue_lock(it->second->mu);
      bool expired = it->second->closed && Clock::now() - it->second->closed_at > options_.results_grace;
      it = expired ? results_.erase(it) : std::next(it);
    }
    lock.unlock();
    for (const SessionKey& key : table_.Idle(Clock::now())) {
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
    for (const char* feature : kFeatures) {
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

grpc::Status ShardService::TakeWork(grpc::ServerContext*, const pb::TakeWorkRequest*,
                                    pb::TakeWorkReply* reply) {
  std::map<SessionKey, std::pair<uint64_t, uint64_t>> taken;
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    taken.swap(work_);
  }
  for (const auto& [key, counts] : taken) {
    pb::SessionWork* work = reply->add_work();
    work->mutable_session()->set_session_id(key.first);
    work->mutable_session()->set_epoch(key.second);
    work->set_prefill_tokens(counts.first);
    work->set_decode_tokens(counts.second);
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
  return grpc::Status::OK;
}

std::shared_ptr<ShardService::ResultQueue> ShardService::Results(const SessionKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<ResultQueue>& queue = results_[key];
  if (queue == nullptr) queue = std::make_shared<ResultQueue>();
  return queue;
}

grpc::Status ShardService::Results(grpc::ServerContext* context,
                                   const pb::ResultsRequest* request,
                                   grpc::ServerWriter<pb::ResultFrame>* writer) {
  protocol::ResultsRequest in;
  protocol::FromProto(*request, &in);
  if (!in.session.has_value()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "results request without a session");
  }
  SessionKey key{in.session->session_id, in.session->epoch};
  std::shared_ptr<ResultQueue> queue = Results(key);
  while (!context->IsCancelled()) {
    std::unique_lock<std::mutex> lock(queue->mu);
    queue->cv.wait_for(lock, std::chrono::milliseconds(200),
                       [&] { return !queue->frames.empty() || queue->closed; });
    if (queue->frames.empty()) {
      if (queue->closed) break;
      continue;
    }
    protocol::ResultFrame frame = std::move(queue->frames.front());
    queue->frames.pop_front();
    lock.unlock();
    pb::ResultFrame message;
    protocol::ToProto(frame, &message);
    if (!writer->Write(message)) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = results_.find(key);
  if (it != results_.end() && it->second == queue) results_.erase(it);
  return grpc::Status::OK;
}

grpc::Status ShardService::Seam(grpc::ServerContext*,
                                grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* stream) {
  auto upstream = std::make_shared<Upstream>(stream);
  std::set<SessionKey> owned;
  pb::SeamFrame message;
  while (stream->Read(&message)) {
    seam_frames_in_.fetch_add(1);
    seam_bytes_in_.fetch_add(message.ByteSizeLong());
    std::optional<protocol::SeamReply> reply = Handle(message, upstream, &owned);
    if (reply.has_value()) upstream->Write(*reply);
  }
  for (const SessionKey& key : owned) {  // stream loss frees every session that came through it
    End(key, FinishReason::kError,
        MakeError(Code::kUnavailable, "upstream of " + options_.node_id + " lost", true));
  }
  upstream->Close();
  return grpc::Status::OK;
}

std::optional<protocol::SeamReply> ShardService::Handle(const pb::SeamFrame& message,
                                                        const std::shared_ptr<Upstream>& upstream,
                                                        std::set<SessionKey>* owned) {
  protocol::SeamFrame frame;
  protocol::FromProto(message, &frame);
  if (!frame.version.has_value()) {
    return Reply(frame, protocol::InvalidArgumentError("frame without a protocol version"));
  }
  if (frame.version->major != protocol::kProtocolMajor) {
    return Reply(frame, protocol::VersionMismatchError(
                            "major " + std::to_string(frame.version->major) + " is not spoken"));
  }
  if (!frame.session.has_value()) {
    return Reply(frame, protocol::InvalidArgumentError("frame without a route session"));
  }
  SessionKey key{frame.session->session_id, frame.session->epoch};
  std::vector<EndedSession> fenced;
  Status fence = table_.Fence(key.first, key.second, &fenced);
  if (!fence.ok()) return Reply(frame, fence);
  for (const EndedSession& old : fenced) {  // Fence took them out of the table
    scheduler_->Release(old.seq, [this, seq = old.seq] { table_.FreeSeq(seq); });
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
  SessionInfo info;
  Status opened = table_.Open(key, Clock::now(), &info);
  if (!opened.ok()) return Reply(frame, opened);
  std::shared_ptr<Live> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Live>& slot = live_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Live>();
      slot->upstream = upstream;
      slot->session = frame.session;
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
    reply = Step(key, info, *live, frame);
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

std::optional<protocol::SeamReply> ShardService::Step(const SessionKey& key,
                                                      const SessionInfo& info, Live& live,
                                                      const protocol::SeamFrame& frame) {
  if (!frame.span.has_value() || frame.span->count == 0) {
    return Reply(frame, protocol::InvalidArgumentError("prefill/decode frame without a token span"));
  }
  const uint64_t start = frame.span->start, count = frame.span->count;
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
  item.pos = static_cast<int32_t>(start);
  if (scheduler_->first()) {
    if (frame.token_ids.size() != count) {
      return Reply(frame, protocol::InvalidArgumentError(
                              std::to_string(frame.token_ids.size()) + " token ids for a span of " +
                              std::to_string(count)));
    }
    for (uint32_t token : frame.token_ids) {
      if (token >= static_cast<uint32_t>(scheduler_->n_vocab())) {
        return Reply(frame, protocol::InvalidArgumentError("token id " + std::to_string(token) +
                                                           " is outside the vocabulary"));
      }
      item.tokens.push_back(static_cast<int32_t>(token));
    }
  } else {
    if (!frame.fragment.has_value()) {
      return Reply(frame, protocol::InvalidArgumentError("hidden states expected"));
    }
    Status added = live.reassembler.Add(*frame.fragment);
    if (!added.ok()) return Reply(frame, added);
    if (!live.reassembler.complete()) return std::nullopt;  // more fragments of this step
    std::vector<protocol::Tensor> tensors;
    Status taken = live.reassembler.Take(&tensors);
    if (!taken.ok()) return Reply(frame, taken);
    auto hidden = std::find_if(tensors.begin(), tensors.end(),
                               [](const protocol::Tensor& t) { return t.name == kHidden; });
    std::vector<uint64_t> shape = {count, static_cast<uint64_t>(scheduler_->n_embd())};
    if (hidden == tensors.end() || hidden->shape != shape) {
      return Reply(frame, protocol::InvalidArgumentError(
                              std::string("bundle lacks ") + kHidden + " of shape [" +
                              std::to_string(count) + ", " +
                              std::to_string(scheduler_->n_embd()) + "]"));
    }
    item.hidden = protocol::TensorToFloats(*hidden);
    if (item.hidden.size() != count * scheduler_->n_embd()) {
      return Reply(frame, protocol::InvalidArgumentError("unsupported dtype for " +
                                                         std::string(kHidden)));
    }
  }
  if (frame.sampling.has_value()) live.sampler = std::make_unique<Sampler>(*frame.sampling);

  auto result = std::make_shared<std::promise<std::pair<Status, std::vector<float>>>>();
  auto ready = result->get_future();
  item.done = [result](const Status& status, std::vector<float> out) {
    result->set_value({status, std::move(out)});
  };
  Status submitted = scheduler_->Submit(std::move(item));
  std::pair<Status, std::vector<float>> outcome =
      submitted.ok() ? ready.get() : std::make_pair(submitted, std::vector<float>());
  if (!outcome.first.ok()) return Reply(frame, outcome.first);  // Handle ends a new session
  const uint64_t length = start + count;
  if (scheduler_->last()) {
    Emit(live, frame, outcome.second, length);
  } else {
    Status forwarded = Forward(live, frame, outcome.second);
    if (!forwarded.ok()) return Reply(frame, forwarded);
  }
  protocol::SeamReply reply = Reply(frame, OkStatus(), length);
  table_.RecordStep(key, frame.step, reply, length, count);
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    auto& [prefill, decode] = work_[key];
    (frame.phase == protocol::Phase::kDecode ? decode : prefill) += count;
  }
  live.last_step = frame.step;
  return reply;
}

Status ShardService::Forward(Live& live, const protocol::SeamFrame& frame,
                             const std::vector<float>& hidden) {
  if (live.downstream == nullptr) {
    if (frame.downstream.empty()) {
      return protocol::InvalidArgumentError("not the last hop, but no downstream hop given");
    }
    std::shared_ptr<Upstream> upstream = live.upstream;
    std::optional<protocol::RouteSession> session = live.session;
    std::atomic<uint64_t>* last_step = &live.last_step;
    live.downstream = std::make_unique<Downstream>(
        frame.downstream[0], [upstream, session, last_step](Status status) {
          protocol::SeamReply reply;
          reply.version = protocol::CurrentVersion();
          reply.session = session;
          reply.step = last_step->load();
          reply.status = std::move(status);
          upstream->Write(reply);
        });
  }
  const uint64_t rows = frame.span->count;
  std::vector<protocol::Tensor> tensors = {protocol::TensorFromFloats(
      kHidden, protocol::DType::kF32, {rows, static_cast<uint64_t>(scheduler_->n_embd())},
      hidden.data())};
  protocol::Limits limits;
  std::vector<protocol::TensorFragment> fragments;
  Status encoded = protocol::EncodeBundle(tensors, frame.step, protocol::Compression::kNone,
                                          limits.max_fragment_bytes, limits, &fragments);
  if (!encoded.ok()) return encoded;
  protocol::SeamFrame next = frame;
  next.token_ids.clear();
  next.range = live.downstream->hop().range;
  next.downstream.assign(frame.downstream.begin() + (frame.downstream.empty() ? 0 : 1),
                         frame.downstream.end());
  for (protocol::TensorFragment& fragment : fragments) {
    next.fragment = std::move(fragment);
    if (!live.downstream->Send(next)) {
      Status lost = MakeError(Code::kUnavailable,
                              "next hop " + live.downstream->hop().node_id + " lost", true);
      lost.hop = live.downstream->hop().node_id;
      return lost;
    }
  }
  return OkStatus();
}

void ShardService::Emit(Live& live, const protocol::SeamFrame& frame,
                        const std::vector<float>& logits, uint64_t length) {
  if (live.sampler == nullptr) live.sampler = std::make_unique<Sampler>(protocol::SamplingParams());
  protocol::ResultFrame result;
  result.version = protocol::CurrentVersion();
  result.session = frame.session;
  result.step = frame.step;
  result.tokens.push_back(live.sampler->Sample(logits, length));
  const auto& stops = live.sampler->params().stop_token_ids;
  if (std::count(stops.begin(), stops.end(), result.tokens[0].token_id)) {
    result.finish_reason = FinishReason::kStop;
  }
  result.status = OkStatus();
  SessionKey key{frame.session->session_id, frame.session->epoch};
  Results(key)->Push(std::move(result), false);
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
  if (std::optional<EndedSession> ended = table_.Remove(key)) {
    scheduler_->Release(ended->seq, [this, seq = ended->seq] { table_.FreeSeq(seq); });
  }
  if (live != nullptr) {
    std::lock_guard<std::mutex> lock(live->mu);
    live->ended = true;
    if (live->downstream != nullptr) {
      if (forward != nullptr) {
        protocol::SeamFrame next = *forward;
        next.range = live->downstream->hop().range;
        next.downstream.assign(forward->downstream.begin() + (forward->downstream.empty() ? 0 : 1),
                               forward->downstream.end());
        live->downstream->Send(next);
      }
      live->downstream.reset();  // half-closes and joins its reader
    }
  }
  if (scheduler_->last() && close_results) {
    protocol::ResultFrame result;
    result.version = protocol::CurrentVersion();
    result.session = protocol::RouteSession{key.first, key.second};
    result.finish_reason = reason;
    result.status = status;
    Results(key)->Push(std::move(result), true);
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
