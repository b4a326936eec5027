// The first hop's part of a session: the token ids it is given, checked against the vocabulary,
// and speculation's drafts (docs/adr/0005-ring-decode.md): for a session that asked for them,
// the tokens its KV holds, so that a ring decode step gets prompt-lookup drafts appended.
// Also which Seam call is the session's ring stream, once the last hop opened it.
// Threading: called under the session's lock (HopSession).
#ifndef MESHNET_CPP_WORKER_FIRST_HOP_H_
#define MESHNET_CPP_WORKER_FIRST_HOP_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "cpp/wire/seam.h"
#include "cpp/worker/draft.h"
#include "cpp/worker/hop_context.h"

namespace meshnet::worker {

class FirstHop {
 public:
  explicit FirstHop(const HopContext& hop) : hop_(hop) {}

  // The frame's token ids against its span and the vocabulary.
  protocol::Status CheckTokens(const protocol::SeamFrame& frame) const;
  // The step to run for `in`: on a ring decode step of a session that asked for speculation,
  // `in` with drafts appended; else nullopt (run `in`). `last_start` is where the session's
  // previous step started (how many of last step's drafts the last hop accepted).
  std::optional<protocol::SeamFrame> Draft(const protocol::SeamFrame& in, uint64_t last_start);

  uint64_t ring_stream = 0;  // the ring stream's SeamCall id; 0 until the last hop opened it

 private:
  const HopContext& hop_;
  std::vector<int32_t> history_;  // the tokens the KV holds (only while drafting)
  DraftBudget drafts_;
  uint32_t last_drafted_ = 0;
  std::optional<std::chrono::steady_clock::time_point> last_step_at_;  // the latest ring step's start
  uint64_t prompt_length_ = 0;
  uint64_t max_tokens_ = 0;  // drafts stop at the session's max_tokens
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_FIRST_HOP_H_
