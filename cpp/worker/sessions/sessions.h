// The worker's session table: which llama sequence each route session (id, epoch) holds, which
// Seam stream it is bound to, the epoch fences, and the token ledger.
//
// Called by the seam service (gRPC threads and the reaper). Invariants: at most `max_sessions`
// sessions hold a sequence id; a sequence id returns to the pool only through FreeSeq, which the
// caller invokes after the engine thread has dropped that sequence's KV (so a new session never
// sees an old one's cache); a session belongs to the stream that opened it (Open refuses any
// other with PERMISSION_DENIED); for each session id only the newest epoch seen is admitted, an
// older epoch is refused with STALE_EPOCH, and at most `max_fences` ids hold a fence, each
// dropped once every ticket seen for that id has expired (ADR 0003). Tokens are counted here
// and nowhere else. Pure C++ (no gRPC, no llama).
//
// Threading: every method is thread-safe (one internal mutex; no callbacks under it).
#ifndef MESHNET_CPP_WORKER_SESSIONS_SESSIONS_H_
#define MESHNET_CPP_WORKER_SESSIONS_SESSIONS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpp/wire/seam.h"
#include "cpp/wire/status.h"

namespace meshnet::worker {

using Clock = std::chrono::steady_clock;
using SessionKey = std::pair<std::string, uint64_t>;  // (session id, epoch)

struct SessionTableOptions {
  int max_sessions = 8;                          // sequence ids 0..max_sessions-1
  Clock::duration idle = std::chrono::seconds(300);  // no frame for this long: reapable
  size_t max_fences = 16384;                     // session ids with an unexpired epoch fence
};

// What the caller needs to know about an admitted session.
struct SessionInfo {
  int32_t seq = -1;       // llama sequence id
  uint64_t length = 0;    // KV positions [0, length) held for it
  uint64_t last_step = 0; // newest completed step (0: none yet)
  bool created = false;   // true when Open allocated it just now
  uint64_t owner = 0;     // this session's tenure of `seq`: larger than every earlier holder's
};

// A session that left the table; its seq is "releasing" until FreeSeq(seq).
struct EndedSession {
  SessionKey key;
  int32_t seq = -1;
  uint64_t owner = 0;   // as SessionInfo::owner (the scheduler refuses its later items)
  uint64_t tokens = 0;  // tokens processed for it (ledger)
};

// Tokens processed for one session since the last TakeWork.
struct SessionWork {
  SessionKey key;
  uint64_t prefill = 0;
  uint64_t decode = 0;
};

class SessionTable {
 public:
  explicit SessionTable(const SessionTableOptions& options);

  // Epoch fencing for a frame of (id, epoch), whose ticket expires at `expires_unix_ms` (0: a
  // frame of a bound session, which carries none). STALE_EPOCH when a newer epoch of `id` was
  // seen; RESOURCE_EXHAUSTED when `id` is new and max_fences unexpired fences are held;
  // otherwise records `epoch` as the newest and removes every older-epoch session of `id`,
  // appending them to *fenced (the caller releases their KV, then calls FreeSeq).
  protocol::Status Fence(const std::string& id, uint64_t epoch, uint64_t expires_unix_ms,
                         uint64_t now_unix_ms, std::vector<EndedSession>* fenced);
  // Drops the fences whose tickets have all expired at `now_unix_ms`.
  void PruneFences(uint64_t now_unix_ms);

  // Finds or creates the session (allocating a sequence id, binding it to `stream`) and marks it
  // active at `now`. RESOURCE_EXHAUSTED when it is new and no sequence id is free;
  // PERMISSION_DENIED when it exists and is bound to another stream.
  protocol::Status Open(const SessionKey& key, uint64_t stream, Clock::time_point now,
                        SessionInfo* info);
  // The stream the session is bound to; std::nullopt when it is not in the table.
  std::optional<uint64_t> Stream(const SessionKey& key) const;
  // True when the session was fenced by a newer epoch while bound to `stream`: that stream's
  // later frames for it are STALE_EPOCH (remembered for the last max_fences fenced sessions).
  bool FencedOn(const SessionKey& key, uint64_t stream) const;

  // Idempotency: for step <= last_step, the recorded reply (with replayed = true) when
  // step == last_step, else INVALID_ARGUMENT (an older step). std::nullopt for a new step or
  // an unknown session (then *status stays OK).
  std::optional<protocol::SeamReply> Replay(const SessionKey& key, uint64_t step,
                                            protocol::Status* status) const;

  // Records a completed step: its reply, the new KV length, and `tokens` processed (counted
  // as decode or prefill work in the ledger).
  void RecordStep(const SessionKey& key, uint64_t step, const protocol::SeamReply& reply,
                  uint64_t length, uint64_t tokens, bool decode);
  // The session now holds positions [0, length) (rows past it were dropped: rejected drafts).
  void Rewind(const SessionKey& key, uint64_t length);
  // Takes (returns and resets) the work recorded since the last call, ended sessions included.
  std::vector<SessionWork> TakeWork();

  // Removes the session; std::nullopt when it is not in the table.
  std::optional<EndedSession> Remove(const SessionKey& key);
  // Sessions with no Open for longer than the idle timeout at `now` (not removed).
  std::vector<SessionKey> Idle(Clock::time_point now) const;
  // Returns a released sequence id to the pool.
  void FreeSeq(int32_t seq);

  int active() const;          // sessions in the table
  int free_seqs() const;       // ids available to new sessions
  int fence_entries() const;   // session ids holding a fence
  // Tokens processed per live session (ledger), by key.
  std::map<SessionKey, uint64_t> TokenCounts() const;

 private:
  struct Entry {
    int32_t seq = -1;
    uint64_t length = 0;
    uint64_t last_step = 0;
    std::optional<protocol::SeamReply> last_reply;
    Clock::time_point last_active;
    uint64_t tokens = 0;
    uint64_t stream = 0;  // the Seam stream the session is bound to
    uint64_t owner = 0;
  };
  struct FenceEntry {
    uint64_t newest_epoch = 0;
    uint64_t expires_unix_ms = 0;  // latest expiry of the tickets seen for the id
  };

  const SessionTableOptions options_;
  mutable std::mutex mu_;
  std::map<SessionKey, Entry> sessions_;
  std::map<std::string, FenceEntry> fences_;
  std::map<SessionKey, uint64_t> fenced_streams_;  // fenced session -> the stream it was bound to
  std::deque<SessionKey> fenced_order_;            // oldest first; bounded by max_fences
  std::map<SessionKey, std::pair<uint64_t, uint64_t>> untaken_;  // (prefill, decode)
  // Free sequence ids, highest first: a new session takes the lowest (back()), so live sessions
  // keep neighbouring ids, which llama.cpp decodes in one ubatch (scheduler.h, OrderBySequence).
  std::vector<int32_t> free_;
  uint64_t next_owner_ = 1;    // SessionInfo::owner of the next session
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SESSIONS_SESSIONS_H_
