// What the worker's Shard service is configured with (main.cc's flags), apart from the service
// itself so that a session's parts (hop_session.h) read the same options without the service.
#ifndef MESHNET_CPP_WORKER_SERVICE_OPTIONS_H_
#define MESHNET_CPP_WORKER_SERVICE_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cpp/protocol/ticket.h"
#include "cpp/wire/seam.h"
#include "cpp/worker/cheats.h"
#include "cpp/worker/commitments/commitment_log.h"
#include "cpp/worker/sessions/sessions.h"

namespace meshnet::worker {

struct ServiceOptions {
  std::string node_id;                 // this hop's id: tickets must name it; names it in errors
  protocol::PublicKey tracker_key{};   // verifies route tickets (--tracker_key)
  // The registered range [layer_start, layer_end) tickets must name; layer_end 0 takes the
  // scheduler's resolved range (what --layers loaded).
  uint32_t layer_start = 0;
  uint32_t layer_end = 0;
  bool compression = false;  // offer compression.zlib in Hello and accept zlib bundles
  bool insecure = false;     // dial downstream hops in plaintext (--insecure=1), not pinned TLS
  SessionTableOptions sessions;                     // max_sessions <= scheduler's n_seq
  uint32_t credits = 8;                             // frames a sender may write per reply
  // How long a closed Results queue waits for a late reader before the reaper drops it.
  std::chrono::milliseconds results_grace{10000};
  // A Seam stream that has not presented a valid ticket by then is cancelled.
  std::chrono::milliseconds ticket_deadline{10000};
  // A Seam stream that has sent no frame by then is cancelled (--first_frame_ms).
  std::chrono::milliseconds first_frame_deadline{2000};
  // Seam streams without a valid ticket yet, in all and from one peer address
  // (--max_stranger_streams, --max_stranger_streams_per_peer): past either, a new stream is
  // refused RESOURCE_EXHAUSTED before anything is read from it, so that streams that never send
  // cannot take the threads Health and admitted sessions need.
  int max_stranger_streams = 16;
  int max_stranger_streams_per_peer = 8;
  // The longest a step may take on this hop when its frame gives no budget_ms (and the most a
  // budget may claim): past it the step is answered DEADLINE_EXCEEDED (--max_step_ms).
  std::chrono::milliseconds max_step{120000};
  // How long connecting to the next hop may take (--connect_timeout_ms), within the step's own
  // deadline; then the step fails UNAVAILABLE naming that hop.
  std::chrono::milliseconds connect_timeout{10000};
  // The most CPU time one constrained draw may take on the last
  // hop (--sampling_budget_ms; 0: no limit): past it the session's sampling ends
  // RESOURCE_EXHAUSTED. The honest worst case measured is about 180 ms (a 256-value enum).
  std::chrono::milliseconds sampling_budget{1000};
  // Constrained draws run on draw threads (cpp/worker/draw_threads): a draw that has used this
  // much CPU (--heavy_draw_ms; 0: every draw) goes on at the lowest CPU priority, and so do the
  // session's later draws from their start, so that such a grammar costs its neighbours only CPU
  // they leave unused (issue 55, finding 7). --draw_threads idle threads are kept.
  std::chrono::milliseconds heavy_draw{20};
  int draw_threads = 4;
  int max_results_queues = 0;  // queues Results readers may open; 0: 2 * max_sessions
  // TakeWork answers only calls whose "x-meshnet-supervisor" metadata equals this token (the
  // node's, from $MESHNET_SUPERVISOR_TOKEN); empty refuses every caller.
  std::string supervisor_token;
  // The node's identity private key (32 raw bytes, from $MESHNET_NODE_KEY): signs Commitments
  // replies. Empty: Commitments answers UNAVAILABLE.
  std::string node_key;
  CommitmentOptions commitments;
  bool record_commitments = true;  // false (--commitments=0): nothing to audit (benchmarks only)
  // Test only (issue 17's cheating worker, --cheat=...; cheats.h): what this hop does to its
  // output and commits to, so that audits can be shown to catch it. Null in every real
  // deployment.
  std::shared_ptr<const Cheat> cheat;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SERVICE_OPTIONS_H_
