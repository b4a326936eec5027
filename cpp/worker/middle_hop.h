// The parts of a session that carry hidden states between hops: Receiving (every hop but the
// first) reassembles a step's rows from the previous hop's fragments, within limits set before
// anything is allocated; Forwarding (every hop but the last) sends a step's output rows to the
// next hop its ticket names, over a Downstream stream opened on the first step. A middle hop
// has both. Threading: called under the session's lock (HopSession).
#ifndef MESHNET_CPP_WORKER_MIDDLE_HOP_H_
#define MESHNET_CPP_WORKER_MIDDLE_HOP_H_

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/seam.h"
#include "cpp/worker/downstream.h"
#include "cpp/worker/hop_context.h"
#include "cpp/worker/scheduler/deadline.h"

namespace meshnet::worker {

class Receiving {
 public:
  // Adds the frame's fragment; once the step's bundle is complete (*complete), its
  // hidden_states of shape [span count, n_embd] into *hidden, every value finite.
  protocol::Status Rows(const HopContext& hop, const protocol::SeamFrame& frame,
                        std::vector<float>* hidden, bool* complete);

 private:
  protocol::Reassembler reassembler_;
};

class Forwarding {
 public:
  // `next`: the hop after this one, resolved from the session's ticket (ResolveDownstream).
  explicit Forwarding(std::optional<protocol::DownstreamHop> next) : next_(std::move(next)) {}

  // Sends `rows` (the step's output, span count x n_embd) on as `frame`'s next-hop frame, with
  // what is left of `deadline`; opens the stream on first use. UNAVAILABLE naming the next hop
  // when it cannot be reached or the stream broke.
  protocol::Status Send(const HopContext& hop, SessionLink& link, const protocol::SeamFrame& frame,
                        const std::vector<float>& rows, const StepDeadline& deadline);
  // Sends `forward` on (a release or cancel), if given, then closes the stream (half-close, and
  // joins its reader).
  void Close(const protocol::SeamFrame* forward);

 private:
  const std::optional<protocol::DownstreamHop> next_;
  std::unique_ptr<Downstream> downstream_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_MIDDLE_HOP_H_
