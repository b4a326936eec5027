// The last hop's part of a session: the session's sampler (only this hop builds one), choosing
// tokens (with speculation, row by row against the drafts, so that the tokens are those plain
// decoding gives), committing to them for audits, publishing them to the session's Results, and
// ring decode (docs/adr/0005-ring-decode.md): sending the next decode step to the route's first
// hop over a stream opened on first use. A session one of whose constrained draws cost more CPU
// than --heavy_draw_ms draws at the lowest CPU priority from then on (draw_threads.h; issue 55,
// finding 7).
// Threading: called under the session's lock.
#ifndef MESHNET_CPP_WORKER_LAST_HOP_H_
#define MESHNET_CPP_WORKER_LAST_HOP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cpp/engine/sampler/sampler.h"
#include "cpp/wire/seam.h"
#include "cpp/worker/downstream.h"
#include "cpp/worker/hop_context.h"
#include "cpp/worker/scheduler/deadline.h"

namespace meshnet::worker {

// A step's sampled tokens and whether they end the session's tokens.
struct Sampled {
  struct Token {
    uint32_t id = 0;
    uint64_t position = 0;
    size_t row = 0;  // the logits row it was drawn from
  };
  std::vector<Token> tokens;
  // A stop token, max_tokens or the KV budget (minor 1: ring or not, this hop decides).
  protocol::FinishReason finish = protocol::FinishReason::kUnspecified;
  // Not OK when the session's grammar allowed no token (tokens then end before that row).
  protocol::Status status = protocol::OkStatus();
};

class LastHop {
 public:
  // `ring_hop`: the first hop, as this hop's ticket names it, with the first hop's ticket from
  // the session's first frame (ResolveDownstream), where ring steps go; none when the route
  // does not ring.
  LastHop(const HopContext& hop, std::optional<protocol::DownstreamHop> ring_hop)
      : hop_(hop), ring_hop_(std::move(ring_hop)) {}

  // A frame's sampling parameters replace the session's sampler (greedy until one came);
  // INVALID_ARGUMENT when its grammar cannot be used (sampler.h).
  protocol::Status Configure(const protocol::SeamFrame& frame);
  // The tokens `logits` (a row per drafted token plus one) give for the step `frame`.
  Sampled Accept(const protocol::SeamFrame& frame, const std::vector<float>& logits);
  // Commits to each sampled token and its logit (after a test-only cheat, if set).
  void Commit(const SessionKey& key, const std::vector<float>& logits, Sampled* sampled);
  // Describes the tokens (logprobs) and pushes them to the session's Results, the finish reason
  // with the last.
  void Publish(const protocol::SeamFrame& frame, const std::vector<float>& logits,
               const Sampled& sampled);
  // Sends the step after `frame` (`token` at `position`) to the first hop.
  protocol::Status Ring(SessionLink& link, const protocol::SeamFrame& frame, uint32_t token,
                        uint64_t position, const StepDeadline& deadline);
  void Close() { ring_.reset(); }

 private:
  engine::Sampler& sampler();
  // One row's draw; a constrained one on the hop's draw threads, lowered from its start once
  // one of the session's draws proved heavy.
  uint32_t Draw(const float* row, size_t n_vocab);

  const HopContext& hop_;
  const std::optional<protocol::DownstreamHop> ring_hop_;
  std::unique_ptr<engine::Sampler> sampler_;
  std::unique_ptr<Downstream> ring_;  // to the first hop, once opened
  uint64_t generated_ = 0;            // tokens sampled so far
  bool heavy_ = false;                // a draw cost more than --heavy_draw_ms: later ones start lowered
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_LAST_HOP_H_
