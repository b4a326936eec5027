// What one hop checks before it lets a frame or a Results request create any state
// (docs/adr/0003-identities-and-route-tickets.md, "A hop checks"): the frame's header, the
// route ticket (signature, then session, epoch, node, range and expiry), the downstream the
// ticket names, the Results client's signature, and the per-step bounds on activations.
//
// Called by the seam service (cpp/worker/service.cc) in the ADR's order: CheckFrameHeader,
// then, for a session not bound to the frame's stream, CheckTicket; then the epoch fence
// (SessionTable::Fence); ResolveDownstream before a new session opens (the session keeps the
// hop it returns). Pure functions of their arguments (no gRPC, no llama, no clock: callers pass
// the wall time); any thread.
#ifndef MESHNET_CPP_WORKER_HOP_H_
#define MESHNET_CPP_WORKER_HOP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/seam.h"
#include "cpp/protocol/ticket.h"
#include "cpp/wire/status.h"

namespace meshnet::worker {

inline constexpr size_t kMaxSessionIdBytes = 64;
// The name every shard service's certificate carries (its SAN); dialers pin the certificate
// from the ticket and check this name.
inline constexpr char kNodeTlsName[] = "meshnet-node";

// Who this hop is, as the tracker registered it.
struct HopIdentity {
  std::string node_id;
  uint32_t layer_start = 0;  // registered range [layer_start, layer_end)
  uint32_t layer_end = 0;
  bool last = false;         // runs the model's last layer (samples; forwards nowhere)
  protocol::PublicKey tracker_key{};  // verifies route tickets
};

// Step 1: a version of major 1 (else INVALID_ARGUMENT / VERSION_MISMATCH), a session, and a
// session id of at most kMaxSessionIdBytes bytes (else INVALID_ARGUMENT).
protocol::Status CheckFrameHeader(const protocol::SeamFrame& frame);

// Step 2: `ticket` admits `session` on this hop at `now_unix_ms`. UNAUTHENTICATED when it is
// absent or its signature does not verify; PERMISSION_DENIED when it is for another session,
// epoch, node or range, or has expired; INVALID_ARGUMENT when its range has an effective start
// this hop cannot run from (CheckEffectiveStart). Fills *out on success.
protocol::Status CheckTicket(const std::optional<protocol::RouteTicket>& ticket,
                             const protocol::RouteSession& session, const HopIdentity& hop,
                             uint64_t now_unix_ms, protocol::Ticket* out);

// A range (a ticket's, or a frame's when it carries one) this hop can run: input entering at
// layer_start. The GGUF hop always runs its whole registered range, so an effective start b
// other than layer_start (a previous hop already ran [layer_start, b)) would run layers twice:
// INVALID_ARGUMENT, not retryable. effective_start 0 is proto3's "unset" and reads as
// layer_start (every honest sender fills it; 0 < layer_start names no real route).
protocol::Status CheckEffectiveStart(const protocol::ShardRange& range, const HopIdentity& hop);

// Step 5: the hop after this one, from the verified ticket alone (minor 1): *next is the
// ticket's downstream_node_id at downstream_address, presenting downstream[0]'s ticket (TLS
// pins the ticket's certificate). The frame's node_id, address and range are ignored, so what
// a 1.0 sender wrote there cannot move where this hop dials. A last-hop ticket (no
// downstream_node_id) admits no downstream list, and a non-last hop needs a ticket naming a
// downstream (PERMISSION_DENIED), a downstream list (INVALID_ARGUMENT when empty) and a ticket
// in its first entry (INVALID_ARGUMENT); with `pinned_tls` the ticket must name a certificate
// (PERMISSION_DENIED). On the last hop of a ringing route the ticket names the first hop and
// the list holds that hop's ticket alone: *next is the ring's target; with an empty list the
// route does not ring and *next stays empty.
protocol::Status ResolveDownstream(const protocol::Ticket& ticket,
                                   const std::vector<protocol::DownstreamHop>& downstream,
                                   bool last, bool pinned_tls,
                                   std::optional<protocol::DownstreamHop>* next);

// Step 6: a Results request for this (last) hop: a session, the hop's ticket for it (as in
// CheckTicket) and the client's signature over the ticket's signature (PERMISSION_DENIED).
protocol::Status CheckResultsRequest(const protocol::ResultsRequest& request,
                                     const HopIdentity& hop, uint64_t now_unix_ms,
                                     protocol::Ticket* out);

// The reassembly limits for one step of `rows` hidden rows of `n_embd` f32: a bundle may carry
// at most rows * n_embd * 4 payload bytes (plus zlib's worst-case overhead on the wire when
// `compression` is on), so a header announcing more is refused before anything is allocated.
protocol::Limits StepLimits(uint32_t rows, int n_embd, bool compression);

// Fragment 0's header against what this hop accepts: zlib only when `compression` is on
// (else INVALID_ARGUMENT). Other fragments pass.
protocol::Status CheckFragment(const protocol::TensorFragment& fragment, bool compression);

// A speculative ring step's drafted ids: one fewer than its span, at most kMaxDraftTokens
// (draft.h), each inside a vocabulary of `n_vocab`.
protocol::Status CheckDrafts(const protocol::SeamFrame& frame, int n_vocab);

// INVALID_ARGUMENT naming the first NaN or infinity in `values` (rows of `width`).
protocol::Status CheckFinite(const std::vector<float>& values, int width);

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_HOP_H_
