// What a session's step shares with the rest of its hop (HopContext: the engine's scheduler,
// the options, the session table, the Results board, the commitment log, Health's counters)
// and with the session's other parts (SessionLink: who the session is and where its errors go).
// The ShardService owns everything a HopContext points at and outlives every step.
#ifndef MESHNET_CPP_WORKER_HOP_CONTEXT_H_
#define MESHNET_CPP_WORKER_HOP_CONTEXT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "cpp/protocol/ticket.h"
#include "cpp/wire/seam.h"
#include "cpp/worker/commitments/commitment_log.h"
#include "cpp/worker/draw_threads/draw_threads.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/seam_call.h"
#include "cpp/worker/service_options.h"
#include "cpp/worker/sessions/results.h"
#include "cpp/worker/sessions/sessions.h"

namespace meshnet::worker {

// Microseconds from `from` to `to` (0 if `to` is not later), and until now.
inline uint64_t MicrosBetween(Clock::time_point from, Clock::time_point to) {
  return to > from ? static_cast<uint64_t>(
                         std::chrono::duration_cast<std::chrono::microseconds>(to - from).count())
                   : 0;
}
inline uint64_t MicrosSince(Clock::time_point from) { return MicrosBetween(from, Clock::now()); }

inline uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Health's counters that steps add to (any thread).
struct HopCounters {
  std::atomic<uint64_t> drafted_tokens{0};
  std::atomic<uint64_t> accepted_drafts{0};
  std::atomic<uint64_t> rewound_rows{0};
  // StepTimes: where completed decode steps spent their time (microseconds, summed): from the
  // frame's arrival to the scheduler, waiting for the engine (of which queued, and the engine's
  // batch), after it (sampling, commitments), handing the step on (next hop or ring), and
  // writing the reply upstream.
  std::atomic<uint64_t> steps{0}, admit_us{0}, wait_us{0}, queue_us{0}, engine_us{0};
  std::atomic<uint64_t> after_us{0}, send_us{0}, reply_us{0};
};

struct HopContext {
  Scheduler* scheduler = nullptr;
  const ServiceOptions* options = nullptr;
  SessionTable* table = nullptr;
  ResultsBoard* results = nullptr;
  CommitmentLog* commitments = nullptr;  // null: --commitments=0, nothing recorded
  HopCounters* counters = nullptr;
  DrawThreads* draw_threads = nullptr;  // where constrained draws run (null: on the session's thread)

  // The reply to `frame`: `status` (an error names this hop), the credits a sender gets and,
  // when given, the positions this hop holds.
  protocol::SeamReply Reply(const protocol::SeamFrame& frame, protocol::Status status,
                            std::optional<uint64_t> cache = std::nullopt) const;
};

// Who a session is, the ticket that opened it and the Seam call it is bound to. The parts that
// open streams further on (Forwarding, LastHop's ring) report those streams' errors through it.
struct SessionLink {
  std::shared_ptr<SeamCall> upstream;
  protocol::RouteSession session;
  protocol::Ticket ticket;
  std::atomic<uint64_t> last_step{0};  // the newest step done, which such an error answers

  // Writes an error reply for the newest step upstream. The link must outlive the callback's
  // users (a HopSession closes its streams before its link goes).
  std::function<void(protocol::Status)> ReportUpstream();
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_HOP_CONTEXT_H_
