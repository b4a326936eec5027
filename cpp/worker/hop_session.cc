#include "cpp/worker/hop_session.h"

#include <future>
#include <string>
#include <utility>

#include "cpp/worker/hop.h"

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Phase;
using protocol::Status;

HopSession::HopSession(const HopContext& hop, std::shared_ptr<SeamCall> upstream,
                       const protocol::RouteSession& session, const protocol::Ticket& ticket,
                       std::optional<protocol::DownstreamHop> next)
    : hop_(hop) {
  link_.upstream = std::move(upstream);
  link_.session = session;
  link_.ticket = ticket;
  if (hop.scheduler->first()) {
    first_.emplace(hop);
  } else {
    receiving_.emplace();
  }
  if (hop.scheduler->last()) {
    last_.emplace(hop, std::move(next));
  } else {
    forwarding_.emplace(std::move(next));
  }
}

HopSession::~HopSession() { Close(nullptr); }

void HopSession::Close(const protocol::SeamFrame* forward) {
  ended_ = true;
  if (forwarding_.has_value()) forwarding_->Close(forward);
  if (last_.has_value()) last_->Close();
}

std::optional<protocol::SeamReply> HopSession::Step(const SessionKey& key, SessionInfo info,
                                                    const protocol::SeamFrame& in,
                                                    Clock::time_point received) {
  if (!in.span.has_value() || in.span->count == 0) {
    return hop_.Reply(in, protocol::InvalidArgumentError("prefill/decode frame without a token span"));
  }
  Rewind(key, in, &info);
  std::optional<protocol::SeamFrame> drafted;  // the first hop's step with its drafts
  if (first_.has_value()) {
    Status checked = first_->CheckTokens(in);
    if (!checked.ok()) return hop_.Reply(in, checked);
    drafted = first_->Draft(in, last_start_);
  }
  const protocol::SeamFrame& frame = drafted.has_value() ? *drafted : in;
  const uint64_t start = frame.span->start, count = frame.span->count;
  Scheduler& scheduler = *hop_.scheduler;
  if (!frame.draft_token_ids.empty()) {
    Status checked = CheckDrafts(frame, scheduler.n_vocab());
    if (!checked.ok()) return hop_.Reply(frame, checked);
  }
  if (start != info.length) {
    return hop_.Reply(frame, MakeError(Code::kCacheMismatch,
                                       "span starts at " + std::to_string(start) +
                                           " but this hop holds " + std::to_string(info.length) +
                                           " positions"));
  }
  if (start + count > static_cast<uint64_t>(scheduler.n_ctx_per_session())) {
    return hop_.Reply(frame, protocol::ResourceExhaustedError(
                                 "span ends past the KV budget of " +
                                 std::to_string(scheduler.n_ctx_per_session()) + " positions"));
  }
  WorkItem item;
  item.seq = info.seq;
  item.owner = info.owner;
  item.pos = static_cast<int32_t>(start);
  item.all_logits = !frame.draft_token_ids.empty();
  item.span = item.all_logits;
  bool complete = true;
  Status input = Input(key, frame, &item, &complete);
  if (!input.ok()) return hop_.Reply(frame, input);
  if (!complete) return std::nullopt;  // more fragments of this step
  if (last_.has_value()) {
    Status configured = last_->Configure(frame);
    if (!configured.ok()) return hop_.Reply(frame, configured);
  }

  const StepDeadline deadline(received, frame.budget_ms, hop_.options->max_step);
  const Status late = deadline.Exceeded(frame.step, hop_.options->node_id);
  if (deadline.Spent(Clock::now())) return hop_.Reply(frame, late);
  const Clock::time_point submitting = Clock::now();
  std::vector<float> out;
  EngineTimes engine;
  Status computed = Compute(std::move(item), deadline, late, &out, &engine);
  if (!computed.ok()) return hop_.Reply(frame, computed);  // Handle ends a new session
  const Clock::time_point done = Clock::now();
  Clock::time_point sending = done;
  Status ringed = OkStatus();
  Status output = Output(key, info, frame, out, deadline, &sending, &ringed);
  if (!output.ok()) return hop_.Reply(frame, output);
  if (frame.phase == Phase::kDecode) {  // Health's StepTimes: the steady state
    HopCounters& counters = *hop_.counters;
    counters.steps.fetch_add(1);
    counters.admit_us.fetch_add(MicrosBetween(received, submitting));
    counters.wait_us.fetch_add(MicrosBetween(submitting, done));
    counters.queue_us.fetch_add(MicrosBetween(submitting, engine.start));
    counters.engine_us.fetch_add(MicrosBetween(engine.start, engine.end));
    counters.after_us.fetch_add(MicrosBetween(done, sending));
    counters.send_us.fetch_add(MicrosSince(sending));
  }
  const uint64_t length = start + count;
  protocol::SeamReply reply = hop_.Reply(frame, OkStatus(), length);
  hop_.table->RecordStep(key, frame.step, reply, length, count, frame.phase == Phase::kDecode);
  link_.last_step = frame.step;
  last_start_ = start;
  last_count_ = count;
  if (!ringed.ok()) return hop_.Reply(frame, ringed, length);  // done here; the ring did not go on
  return reply;
}

void HopSession::Rewind(const SessionKey& key, const protocol::SeamFrame& in, SessionInfo* info) {
  const uint64_t start = in.span->start;
  if (!in.ring || start >= info->length || start <= last_start_ ||
      info->length != last_start_ + last_count_) {
    return;
  }
  hop_.scheduler->Truncate(info->seq, static_cast<int32_t>(start), info->owner);
  hop_.table->Rewind(key, start);
  hop_.counters->rewound_rows.fetch_add(info->length - start);
  info->length = start;
}

Status HopSession::Input(const SessionKey& key, const protocol::SeamFrame& frame, WorkItem* item,
                         bool* complete) {
  const uint32_t start = static_cast<uint32_t>(frame.span->start);
  if (first_.has_value()) {
    item->tokens.assign(frame.token_ids.begin(), frame.token_ids.end());
    // What this hop was given, for audits (ADR 0008).
    if (hop_.commitments != nullptr) hop_.commitments->InputTokens(key, start, item->tokens);
    return OkStatus();
  }
  Status rows = receiving_->Rows(hop_, frame, &item->hidden, complete);
  if (!rows.ok() || !*complete) return rows;
  if (hop_.commitments != nullptr) {
    hop_.commitments->Rows(key, start, item->hidden.data(), frame.span->count,
                           hop_.scheduler->n_embd(), /*input=*/true);
  }
  return OkStatus();
}

Status HopSession::Compute(WorkItem item, const StepDeadline& deadline, const Status& late,
                           std::vector<float>* out, EngineTimes* engine) {
  item.deadline = deadline.deadline();
  item.claim = std::make_shared<StepClaim>();
  std::shared_ptr<StepClaim> claim = item.claim;
  // The engine may finish (or drop) the step after this wait gave up: it owns the promise.
  auto result = std::make_shared<std::promise<StepOutcome>>();
  std::future<StepOutcome> ready = result->get_future();
  item.done = [result](const Status& status, std::vector<float> rows) {
    result->set_value({status, std::move(rows)});
  };
  Status submitted = hop_.scheduler->Submit(std::move(item));
  if (!submitted.ok()) return submitted;
  StepOutcome outcome = WaitForStep(ready, *claim, deadline.deadline(), late);
  if (!outcome.first.ok()) return outcome.first;
  *out = std::move(outcome.second);
  *engine = {claim->engine_start(), claim->engine_end()};  // the engine wrote them before delivering
  return OkStatus();
}

Status HopSession::Output(const SessionKey& key, const SessionInfo& info,
                          const protocol::SeamFrame& frame, std::vector<float>& out,
                          const StepDeadline& deadline, Clock::time_point* sending,
                          Status* ringed) {
  const uint64_t start = frame.span->start;
  if (last_.has_value()) {
    // The ring goes on before the tokens are described (logprobs) and published.
    Sampled sampled = last_->Accept(frame, out);
    if (!sampled.status.ok()) {  // the grammar allowed no token: the step did not happen
      hop_.scheduler->Truncate(info.seq, static_cast<int32_t>(start), info.owner);
      return sampled.status;
    }
    last_->Commit(key, out, &sampled);
    *sending = Clock::now();
    if (frame.ring && sampled.finish == protocol::FinishReason::kUnspecified) {
      const Sampled::Token& next = sampled.tokens.back();
      *ringed = last_->Ring(link_, frame, next.id, next.position, deadline);
    }
    last_->Publish(frame, out, sampled);
    return OkStatus();
  }
  const size_t n_embd = static_cast<size_t>(hop_.scheduler->n_embd());
  if (hop_.options->cheat != nullptr) hop_.options->cheat->Rows(&out, start, n_embd);  // tests only
  if (hop_.commitments != nullptr) {
    hop_.commitments->Rows(key, static_cast<uint32_t>(start), out.data(), frame.span->count,
                           static_cast<int>(n_embd), /*input=*/false);
  }
  *sending = Clock::now();
  Status forwarded = forwarding_->Send(hop_, link_, frame, out, deadline);
  if (!forwarded.ok()) {  // the step did not happen: take its rows back out of the KV
    hop_.scheduler->Truncate(info.seq, static_cast<int32_t>(start), info.owner);
    return forwarded;
  }
  return OkStatus();
}

}  // namespace meshnet::worker
