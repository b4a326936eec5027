// One route session on this hop (docs/adr/0018-hop-session.md), in the shape of a llama.cpp
// server slot: the ShardService parses a frame, admits it (ticket, fence, binding) and
// dispatches it here; the session runs the step. Its parts follow the hop's place in the
// route: FirstHop (token ids, drafts) or Receiving (hidden rows from the previous hop) on the
// way in, Forwarding (rows to the next hop) or LastHop (sampling, Results, the ring) on the way
// out; a middle hop has Receiving and Forwarding, a one-hop route FirstHop and LastHop.
//
// A step: span and KV checks, the input (tokens, or the reassembled rows), its commitment, the
// engine (Scheduler::Submit, waited for within the step's deadline), then the output. A step
// not done in time is answered DEADLINE_EXCEEDED and leaves no rows in this hop's KV; a step
// whose rows could not be handed on is taken back out of the KV.
//
// Threading: Step and Close run under mu(), which serializes a session's steps against its end.
#ifndef MESHNET_CPP_WORKER_HOP_SESSION_H_
#define MESHNET_CPP_WORKER_HOP_SESSION_H_

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cpp/wire/seam.h"
#include "cpp/worker/first_hop.h"
#include "cpp/worker/hop_context.h"
#include "cpp/worker/last_hop.h"
#include "cpp/worker/middle_hop.h"
#include "cpp/worker/scheduler/deadline.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/sessions/sessions.h"

namespace meshnet::worker {

class HopSession {
 public:
  // `hop` must outlive the session. `next`: the hop after this one that ResolveDownstream made
  // from `ticket` (and the ticket to present there): where this hop forwards, or on the last
  // hop the first hop it rings to (none when the route does not ring).
  HopSession(const HopContext& hop, std::shared_ptr<SeamCall> upstream,
             const protocol::RouteSession& session, const protocol::Ticket& ticket,
             std::optional<protocol::DownstreamHop> next);
  ~HopSession();  // Close(nullptr)
  HopSession(const HopSession&) = delete;
  HopSession& operator=(const HopSession&) = delete;

  std::mutex& mu() { return mu_; }
  bool ended() const { return ended_; }  // under mu()
  const std::shared_ptr<SeamCall>& upstream() const { return link_.upstream; }
  FirstHop* first() { return first_.has_value() ? &*first_ : nullptr; }  // null past the first hop

  // Runs the admitted prefill or decode step `in` (the table holds the session as `info`);
  // nullopt while a step's fragments are still arriving.
  std::optional<protocol::SeamReply> Step(const SessionKey& key, SessionInfo info,
                                          const protocol::SeamFrame& in, Clock::time_point received);
  // Ends the session here (under mu()): sends `forward` (a release or cancel) on, if given, and
  // closes the streams to the next hop and the ring. Later steps are refused.
  void Close(const protocol::SeamFrame* forward);

 private:
  // Where the step's input came from: the engine's work item, filled (false: more fragments).
  protocol::Status Input(const SessionKey& key, const protocol::SeamFrame& frame, WorkItem* item,
                         bool* complete);
  // When the engine's batch that finished a step started and ended.
  struct EngineTimes {
    Clock::time_point start, end;
  };
  // Submits `item` and waits for it within `deadline`: the engine's output rows (or logits).
  protocol::Status Compute(WorkItem item, const StepDeadline& deadline, const protocol::Status& late,
                           std::vector<float>* out, EngineTimes* engine);
  // Samples, commits, rings and publishes (last hop) or commits and forwards (else); *sending is
  // when the step started handing on.
  protocol::Status Output(const SessionKey& key, const SessionInfo& info,
                          const protocol::SeamFrame& frame, std::vector<float>& out,
                          const StepDeadline& deadline, Clock::time_point* sending,
                          protocol::Status* ringed);
  // Speculation: a ring step that starts inside this hop's previous step drops that step's rows
  // from its start on (the drafts the last hop rejected); it can rewind no further.
  void Rewind(const SessionKey& key, const protocol::SeamFrame& in, SessionInfo* info);

  const HopContext& hop_;
  std::mutex mu_;
  bool ended_ = false;
  SessionLink link_;  // declared before the parts: their streams report through it
  std::optional<FirstHop> first_;
  std::optional<Receiving> receiving_;
  std::optional<Forwarding> forwarding_;
  std::optional<LastHop> last_;
  uint64_t last_start_ = 0;  // the span of the newest step (a ring step may drop its drafts)
  uint64_t last_count_ = 0;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_HOP_SESSION_H_
