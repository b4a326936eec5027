// The last hop's Results queues: sampled tokens per session, waiting for the client's one
// Results reader (ADR 0003: one reader per session).
//
// Invariants: at most one reader is attached to a session's queue (the service answers a
// second one ALREADY_EXISTS); a reader attaches only after its request was admitted, and never
// past `max_queues` queues; the worker side may add a queue for a live session beyond that
// (live sessions are themselves bounded), first dropping closed unread ones; a closed queue
// nobody reads is dropped `grace` after it closed (Reap). Pure C++ (no gRPC).
//
// Threading: every method is thread-safe; Pop blocks only on the queue's own lock.
#ifndef MESHNET_CPP_WORKER_SESSIONS_RESULTS_H_
#define MESHNET_CPP_WORKER_SESSIONS_RESULTS_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "cpp/wire/seam.h"
#include "cpp/worker/sessions/sessions.h"

namespace meshnet::worker {

class ResultQueue {
 public:
  // Appends a frame; `close` marks the session's last one.
  void Push(protocol::ResultFrame frame, bool close);
  // Waits up to `timeout` for a frame. True with *out set; false when none arrived (then
  // *closed says whether none ever will).
  bool Pop(std::chrono::milliseconds timeout, protocol::ResultFrame* out, bool* closed);

 private:
  friend class ResultsBoard;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<protocol::ResultFrame> frames_;
  bool closed_ = false;
  Clock::time_point closed_at_;  // when closed_ became true
  bool reader_ = false;          // a Results stream is attached (guarded by the board's lock)
};

class ResultsBoard {
 public:
  ResultsBoard(size_t max_queues, Clock::duration grace);

  enum class Attached { kOk, kFull, kHasReader };
  // Reader side, after admission: the session's queue with this reader attached (kOk), or
  // kFull (max_queues queues) or kHasReader (another reader holds it), changing nothing.
  Attached Attach(const SessionKey& key, std::shared_ptr<ResultQueue>* out);
  // The reader left: its queue goes (a late frame starts a new, unread queue).
  void Detach(const SessionKey& key, const std::shared_ptr<ResultQueue>& queue);
  // Worker side: appends to the session's queue, creating it when absent.
  void Push(const SessionKey& key, protocol::ResultFrame frame, bool close);
  // Drops closed queues without a reader whose grace period ended at `now`.
  void Reap(Clock::time_point now);

  int readers() const;
  int queues() const;

 private:
  void DropClosedUnreadLocked(Clock::time_point now, Clock::duration older_than);

  const size_t max_queues_;
  const Clock::duration grace_;
  mutable std::mutex mu_;
  std::map<SessionKey, std::shared_ptr<ResultQueue>> queues_;
  int readers_ = 0;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SESSIONS_RESULTS_H_
