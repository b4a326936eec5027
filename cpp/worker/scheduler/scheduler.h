// The scheduler: owns the engine thread (the llama model and context) and runs continuous
// batching over every session's pending work.
//
// gRPC threads Submit work items (one session step: token ids on the first shard, hidden rows
// on the others) into a bounded queue; the engine thread repeatedly forms ONE batch from all
// pending items within `max_batch_tokens` (PlanBatch: decode steps first, one row each, then
// prefill chunks of at most `max_prefill_chunk` rows, oldest first), runs one Decode, and when an
// item's last row is done hands its output to the item's callback: every row's hidden state
// (non-last shard) or the logits of its last row (last shard; of every row with all_logits).
//
// Invariants: at most one slice of a sequence per batch, and an item's rows enter the KV in
// order; Submit never waits for room (RESOURCE_EXHAUSTED when `max_queue` items are pending);
// Release(seq, owner) fails that sequence's pending items with CANCELLED and drops its KV before
// any later batch, and from the call on refuses every item and Truncate of that owner or an older
// one (a session's step still on its way when the session ended cannot write into the sequence
// after it was dropped, nor into the next session's); Truncate(seq, pos) drops positions >= pos
// before any later batch. An item past
// its deadline before a batch, or abandoned by its waiter (cpp/worker/scheduler/deadline.h), is dropped
// with DEADLINE_EXCEEDED, and so is one whose waiter abandoned it while its last batch ran:
// either way none of its rows stay in the KV (the sequence holds what it held before it). Threading: Submit/Release/Stats/Stop from any thread; callbacks run on the engine
// thread and must not block or call back into the scheduler.
#ifndef MESHNET_CPP_WORKER_SCHEDULER_SCHEDULER_H_
#define MESHNET_CPP_WORKER_SCHEDULER_SCHEDULER_H_

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/engine.h"
#include "cpp/wire/status.h"
#include "cpp/worker/scheduler/deadline.h"

namespace meshnet::worker {

// ---- batching decisions (pure) --------------------------------------------------------------

struct PendingView {  // one pending item as PlanBatch sees it
  int32_t seq = 0;
  int rows_left = 0;    // rows not yet decoded
  bool decode = false;  // a one-row decode step
  bool span = false;    // a speculative verify span: decode rows, several at once
};

struct Slice {  // rows [offset, offset + count) of the item's remaining rows in this batch
  int item = 0;  // index into the pending list
  int count = 0;
};

// What keeps a row's numbers independent of the batch it is in, where the kernels do not (ADR
// 0015). The CPU's reference kernels compute every row alike whatever its company: no limits.
// ggml-vulkan picks its kernel per matmul from the batch: up to kVectorKernelRows activation
// rows go through mul_mat_vec (each row's dot products summed in one order), more through the
// tiled mul_mm; and with one KV stream per session a batch is split into ubatches of equal rows
// per sequence, so a prefill batched with decode steps would be computed a row at a time. On such
// a device a prefill chunk runs alone (as it does solo) and decode steps share a batch only up
// to kVectorKernelRows rows.
struct BatchShape {
  int max_decode_rows = 0;     // one-row decode steps per batch (0: as many as the budget holds)
  bool prefill_alone = false;  // a prefill chunk shares its batch with nothing
};
inline constexpr int kVectorKernelRows = 8;  // ggml-vulkan's mul_mat_vec_max_cols at the pin
// The shape for a range computing on `device` ("cpu", "vulkan0", ...).
BatchShape BatchShapeFor(const std::string& device);

// A speculative verify span on such a device is computed kVectorKernelRows rows at a time, as
// decode steps are (an audit replays it one row at a time).
// The rows of a prefill's next chunk on such a device: min(rows_left, budget, max_chunk), less
// what keeps the rest off the vector kernels: a tail of kVectorKernelRows rows or fewer behind a
// larger chunk would compute with other kernels than one prefill of the whole prompt (what an
// audit replays on a GPU, ADR 0015), so it is made kVectorKernelRows + 1 rows.
int PrefillChunk(int rows_left, int budget, int max_chunk);

// Which rows of `pending` (in queue order) go into the next batch: decode items first, then
// prefill chunks (each <= max_prefill_chunk), never two slices of one seq, at most `budget`
// rows. Empty only when `pending` is empty or budget <= 0. Under `shape.prefill_alone` a batch
// is the oldest item's prefill chunk alone when that item is a prefill (so decode steps that
// keep arriving cannot starve it), else decode steps only, at most `shape.max_decode_rows`.
std::vector<Slice> PlanBatch(const std::vector<PendingView>& pending, int budget,
                             int max_prefill_chunk, const BatchShape& shape = {});

// Puts a plan's slices in the order their rows enter the Decode: by sequence id. With one KV
// stream per sequence llama.cpp puts into one ubatch only sequences whose ids follow each other
// (n, n+1, ...) in batch order (llama_batch_allocr::split_equal, sequential), and every ubatch
// reads all the weights: 8 decode steps in arrival order took 107 ms against 83 ms sorted
// (docs/evidence/seam/). Which slices a batch holds is PlanBatch's choice; this only orders them.
void OrderBySequence(std::vector<Slice>* plan, const std::vector<PendingView>& pending);

// ---- the engine thread ----------------------------------------------------------------------

struct SchedulerOptions {
  engine::ModelOptions model;
  engine::ContextOptions context;  // n_batch/n_ubatch are set to max_batch_tokens
  int max_batch_tokens = 256;      // rows per Decode
  int max_prefill_chunk = 128;     // rows of one prefill per Decode (bounds decode latency)
  int max_queue = 64;              // pending items before Submit refuses
  // Batching window: when fewer one-row decode items are pending than distinct sessions sent
  // decode items in the last kRecentBatches batches, the engine waits for the rest before it
  // decodes, up to this long or 1/kBatchWindowShare of its latest decode-only batch, whichever
  // is longer (BatchWindow; 0: never waits). Sessions that arrive a little apart then share a
  // batch instead of taking turns; a lone session never waits, and a released one is not waited for.
  std::chrono::microseconds batch_window{0};
  BatchShape batch_shape;  // BatchShapeFor(model.device) unless a caller knows better
};

inline constexpr int kRecentBatches = 4;
// A batch of decode steps costs nearly as much as the same rows split in two batches minus one
// step's weight reading (decode_profile: 8 rows 89 ms, 4 rows 47 ms), so waiting up to an eighth
// of a batch for sessions whose next step is on its way (on a 2-core VM: 2-4 ms) pays, and a
// session that does not come back costs at most that share.
inline constexpr int kBatchWindowShare = 8;
// How long the engine may wait for expected decode steps: `configured`, or 1/kBatchWindowShare of
// `last_decode` (the latest decode-only batch's time) when that is longer; zero when `configured`
// is zero (the window is off).
std::chrono::microseconds BatchWindow(std::chrono::microseconds configured, std::chrono::microseconds last_decode);

struct WorkItem {
  int32_t seq = 0;
  int32_t pos = 0;                   // position of the first row; rows are pos, pos+1, ...
  std::vector<int32_t> tokens;       // first shard: one per row
  std::vector<float> hidden;         // other shards: rows * n_embd floats
  // Which holder of `seq` this is for (SessionTable gives each session a new, larger one): an
  // owner older than the seq's latest Release is refused. 0: unchecked (a caller that never
  // hands a sequence to a new holder while an old one's steps may still arrive).
  uint64_t owner = 0;
  // Not fully decoded by then: dropped (its rows taken back out) with DEADLINE_EXCEEDED.
  Clock::time_point deadline = Clock::time_point::max();
  std::shared_ptr<StepClaim> claim;  // optional: claimed before `done` gets an OK
  // Last shard: the logits of every row (rows * n_vocab), not only the last row's (speculation).
  bool all_logits = false;
  // A speculative verify span (drafted rows after the session's last token): on a GPU computed
  // at most kVectorKernelRows rows per batch, in the kernels decode steps take (ADR 0015).
  bool span = false;
  // Engine thread: OK with hidden rows (rows * n_embd) or the last row's logits (n_vocab; every
  // row's with all_logits).
  std::function<void(const protocol::Status&, std::vector<float>)> done;
};

struct SchedulerStats {
  int queue_depth = 0;          // items pending
  uint64_t batches = 0;         // Decode calls
  uint64_t rows = 0;            // rows decoded in all
  int last_batch_rows = 0;      // batch occupancy of the latest Decode
  int last_batch_items = 0;     // sessions in the latest Decode
  int max_batch_items = 0;      // most sessions in one Decode since start
  uint64_t kv_cells_used = 0;   // positions held over all live sequences
  uint64_t compute_us = 0;      // wall time inside Decode calls
};

class Scheduler {
 public:
  // Starts the engine thread, which opens the model and context; nullptr with *error set when
  // they cannot be opened.
  static std::unique_ptr<Scheduler> Start(const SchedulerOptions& options, std::string* error);
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Model facts, fixed after Start.
  int n_embd() const { return n_embd_; }
  int n_vocab() const { return n_vocab_; }
  // The model's vocabulary (a grammar's tokens, engine/sampler/sampler.h); read-only, any
  // thread, until the engine thread ends (Stop). nullptr on a shard that does not hold the output.
  const llama_vocab* vocab() const { return vocab_; }
  int n_layer() const { return n_layer_; }
  int layer_start() const { return layer_start_; }
  int layer_end() const { return layer_end_; }
  bool first() const { return layer_start_ == 0; }
  bool last() const { return layer_end_ == n_layer_; }
  int n_ctx() const { return options_.context.n_ctx; }  // KV cells in all
  // The device the range computes on, with its memory now, and what this worker holds there
  // (weights, KV and compute buffers, measured once the context exists).
  engine::DeviceInfo Device() const { return engine::Describe(device_); }
  size_t device_bytes() const { return device_bytes_; }
  // Positions one session may hold: n_ctx, or its share when each sequence has its own stream.
  int n_ctx_per_session() const {
    return options_.context.unified_kv ? options_.context.n_ctx
                                       : options_.context.n_ctx / std::max(1, options_.context.n_seq);
  }

  // Queues one item; RESOURCE_EXHAUSTED (queue full), INVALID_ARGUMENT (wrong row content),
  // CANCELLED (its owner's sequence was released) or UNAVAILABLE (stopping) without queueing,
  // in which case `done` is never called.
  protocol::Status Submit(WorkItem item);
  // Drops `seq`'s KV on the engine thread, then calls `done` there; `owner` and older owners of
  // `seq` are refused from now on.
  void Release(int32_t seq, uint64_t owner, std::function<void()> done);
  // Drops `seq`'s positions >= `pos` on the engine thread before any later batch (a step that
  // was computed but then failed on this hop); pending items are kept. Ignored when `owner` no
  // longer holds `seq`.
  void Truncate(int32_t seq, int32_t pos, uint64_t owner = 0);
  SchedulerStats Stats() const;
  // Finishes pending work, then joins the engine thread. Idempotent.
  void Stop();

 private:
  struct Pending {
    WorkItem item;
    int rows = 0;        // total rows
    int done_rows = 0;   // rows already decoded
    std::vector<float> out;
  };

  struct Forget {  // a Release (drops everything, cancels pending) or a Truncate
    int32_t seq = 0;
    int32_t from = 0;
    bool release = false;
    std::function<void()> done;
  };

  explicit Scheduler(const SchedulerOptions& options);
  void Run(std::string* error, std::promise<bool>* opened);
  void Step(engine::Context& ctx);   // engine thread only
  // Engine thread: takes `p`'s rows back out of the KV.
  void Undo(engine::Context& ctx, const Pending& p);
  uint64_t KvCells() const;          // engine thread only

  SchedulerOptions options_;
  int n_embd_ = 0, n_vocab_ = 0, n_layer_ = 0, layer_start_ = 0, layer_end_ = 0;
  const llama_vocab* vocab_ = nullptr;  // fixed after Start
  ggml_backend_dev_t device_ = nullptr;  // fixed after Start
  size_t device_bytes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::vector<Forget> forgets_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::vector<int32_t> lengths_;  // engine thread: positions held per seq
  // Engine thread (read under mu_ in the window's wait): the seqs with a decode item in each of
  // the last kRecentBatches batches.
  std::deque<std::vector<int32_t>> recent_decoders_;
  std::chrono::microseconds last_decode_{0};  // the latest decode-only batch's time (guarded by mu_)
  int ExpectedDecoders() const;  // distinct seqs in recent_decoders_
  int PendingDecodesLocked() const;  // one-row items in pending_ (mu_ held)
  std::vector<uint64_t> owner_floor_;  // per seq: owners below this were released (guarded by mu_)
  std::thread thread_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_SCHEDULER_SCHEDULER_H_
