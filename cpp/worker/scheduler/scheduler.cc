#include "cpp/worker/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Status;

BatchShape BatchShapeFor(const std::string& device) {
  if (device.empty() || device == "cpu") return {};
  return {kVectorKernelRows, true};
}

int PrefillChunk(int rows_left, int budget, int max_chunk) {
  int count = std::min({rows_left, budget, max_chunk});
  const int rest = rows_left - count;
  const int short_by = kVectorKernelRows + 1 - rest;  // rows the tail lacks to leave the vector kernels
  if (rest > 0 && short_by > 0 && count - short_by > kVectorKernelRows) count -= short_by;
  return count;
}

std::vector<Slice> PlanBatch(const std::vector<PendingView>& pending, int budget,
                             int max_prefill_chunk, const BatchShape& shape) {
  std::vector<Slice> plan;
  if (budget <= 0) return plan;
  const int chunk = std::max(1, max_prefill_chunk);
  if (shape.prefill_alone) {
    const auto oldest = std::find_if(pending.begin(), pending.end(),
                                     [](const PendingView& view) { return view.rows_left > 0; });
    if (oldest != pending.end() && !oldest->decode) {
      const int limit = oldest->span ? std::min(chunk, kVectorKernelRows) : chunk;
      plan.push_back({static_cast<int>(oldest - pending.begin()), PrefillChunk(oldest->rows_left, budget, limit)});
      return plan;
    }
  }
  std::set<int32_t> seqs;
  int left = budget, decode_rows = 0;
  for (int pass = 0; pass < (shape.prefill_alone ? 1 : 2); ++pass) {  // decode steps, then prefill chunks
    for (int i = 0; i < static_cast<int>(pending.size()) && left > 0; ++i) {
      const PendingView& view = pending[i];
      if (view.decode != (pass == 0) || view.rows_left <= 0 || seqs.count(view.seq)) continue;
      if (view.decode && shape.max_decode_rows > 0 && decode_rows >= shape.max_decode_rows) continue;
      int count = std::min(view.rows_left, left);
      if (!view.decode) count = std::min(count, chunk);
      if (view.decode) decode_rows += count;
      plan.push_back({i, count});
      seqs.insert(view.seq);
      left -= count;
    }
  }
  return plan;
}

std::chrono::microseconds BatchWindow(std::chrono::microseconds configured,
                                      std::chrono::microseconds last_decode) {
  if (configured.count() <= 0) return std::chrono::microseconds(0);
  return std::max(configured, last_decode / kBatchWindowShare);
}

void OrderBySequence(std::vector<Slice>* plan, const std::vector<PendingView>& pending) {
  std::stable_sort(plan->begin(), plan->end(), [&pending](const Slice& a, const Slice& b) {
    return pending[a.item].seq < pending[b.item].seq;
  });
}

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  // A Decode never holds more rows than PlanBatch allows: the context's buffers (the graph's
  // compute buffer, the outputs) are sized to that, not to llama.cpp's default of 512.
  options_.max_batch_tokens = std::max(1, options_.max_batch_tokens);
  options_.context.n_batch = options_.context.n_ubatch = options_.max_batch_tokens;
  options_.max_prefill_chunk = std::max(1, options_.max_prefill_chunk);
  lengths_.assign(std::max(1, options_.context.n_seq), 0);
  owner_floor_.assign(lengths_.size(), 0);
}

std::unique_ptr<Scheduler> Scheduler::Start(const SchedulerOptions& options,
                                            std::string* error) {
  std::unique_ptr<Scheduler> scheduler(new Scheduler(options));
  std::promise<bool> opened;
  std::future<bool> ready = opened.get_future();
  Scheduler* raw = scheduler.get();
  scheduler->thread_ = std::thread([raw, error, &opened] { raw->Run(error, &opened); });
  // Not an unbounded wait of ours: Run sets `opened` on every path, right after the model and
  // context open (or fail to). Only the load itself takes time, and a worker that never prints
  // "listening" is killed by the node's start timeout (python/meshnet/node/worker.py).
  if (!ready.get()) {
    scheduler->thread_.join();
    return nullptr;
  }
  return scheduler;
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Scheduler::Submit(WorkItem item) {
  int rows = 0;
  if (first()) {
    if (item.tokens.empty() || !item.hidden.empty()) {
      return protocol::InvalidArgumentError("the first shard takes token ids");
    }
    rows = static_cast<int>(item.tokens.size());
  } else {
    if (item.hidden.empty() || !item.tokens.empty() || item.hidden.size() % n_embd_ != 0) {
      return protocol::InvalidArgumentError("this shard takes hidden rows of " +
                                            std::to_string(n_embd_) + " floats");
    }
    rows = static_cast<int>(item.hidden.size() / n_embd_);
  }
  if (item.seq < 0 || item.seq >= static_cast<int32_t>(lengths_.size())) {
    return protocol::InvalidArgumentError("sequence id out of range");
  }
  auto pending = std::make_shared<Pending>();
  pending->rows = rows;
  pending->item = std::move(item);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return MakeError(Code::kUnavailable, "worker is draining", true);
    if (pending->item.owner != 0 && pending->item.owner < owner_floor_[pending->item.seq]) {
      return MakeError(Code::kCancelled, "sequence released");
    }
    if (static_cast<int>(pending_.size()) >= options_.max_queue) {
      return MakeError(Code::kResourceExhausted,
                       "engine queue full (" + std::to_string(options_.max_queue) + " items)",
                       true);
    }
    pending_.push_back(std::move(pending));
    stats_.queue_depth = static_cast<int>(pending_.size());
  }
  wake_.notify_one();
  return OkStatus();
}

void Scheduler::Release(int32_t seq, uint64_t owner, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (owner != 0 && seq >= 0 && seq < static_cast<int32_t>(owner_floor_.size())) {
      owner_floor_[seq] = std::max(owner_floor_[seq], owner + 1);
    }
    forgets_.push_back({seq, 0, true, std::move(done)});
  }
  wake_.notify_one();
}

void Scheduler::Truncate(int32_t seq, int32_t pos, uint64_t owner) {
  if (seq < 0 || seq >= static_cast<int32_t>(lengths_.size())) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (owner != 0 && owner < owner_floor_[seq]) return;  // released: the rows went with the sequence
    forgets_.push_back({seq, std::max(0, pos), false, nullptr});
  }
  wake_.notify_one();
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::Run(std::string* error, std::promise<bool>* opened) {
  std::unique_ptr<engine::Model> model = engine::Model::Open(options_.model, error);
  std::unique_ptr<engine::Context> ctx;
  if (model != nullptr) ctx = engine::Context::Create(*model, options_.context, error);
  if (ctx == nullptr) {
    opened->set_value(false);
    return;
  }
  n_embd_ = model->n_embd();
  n_vocab_ = model->n_vocab();
  if (model->owns_output()) vocab_ = model->vocab();
  n_layer_ = model->n_layer();
  layer_start_ = model->layer_start();
  layer_end_ = model->layer_end();
  device_ = model->raw_device();
  device_bytes_ = ctx->device_bytes();
  opened->set_value(true);  // `opened` is gone after this
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty() || !forgets_.empty(); });
      if (stopping_ && pending_.empty() && forgets_.empty()) break;
      if (options_.batch_window.count() > 0) {
        const int expected = ExpectedDecoders();
        if (PendingDecodesLocked() > 0 && PendingDecodesLocked() < expected) {
          wake_.wait_for(lock, BatchWindow(options_.batch_window, last_decode_), [this, expected] {
            return stopping_ || !forgets_.empty() || PendingDecodesLocked() >= expected;
          });
        }
      }
    }
    Step(*ctx);
  }
  ctx.reset();
  model.reset();
}

int Scheduler::ExpectedDecoders() const {
  std::vector<int32_t> seqs;
  for (const auto& batch : recent_decoders_) seqs.insert(seqs.end(), batch.begin(), batch.end());
  std::sort(seqs.begin(), seqs.end());
  return static_cast<int>(std::unique(seqs.begin(), seqs.end()) - seqs.begin());
}

int Scheduler::PendingDecodesLocked() const {
  return static_cast<int>(std::count_if(pending_.begin(), pending_.end(),
                                        [](const auto& p) { return p->rows == 1; }));
}

uint64_t Scheduler::KvCells() const {
  uint64_t cells = 0;
  for (int32_t length : lengths_) cells += length;
  return cells;
}

void Scheduler::Undo(engine::Context& ctx, const Pending& p) {
  if (p.done_rows == 0) return;  // never ran: nothing in the KV
  ctx.RemoveFrom(p.item.seq, p.item.pos);
  lengths_[p.item.seq] = std::min(lengths_[p.item.seq], p.item.pos);
}

void Scheduler::Step(engine::Context& ctx) {
  std::vector<Forget> forgets;
  std::vector<std::shared_ptr<Pending>> cancelled, expired, planned;
  std::vector<Slice> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    forgets.swap(forgets_);
    const Clock::time_point now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      const WorkItem& item = (*it)->item;
      const bool released = std::any_of(forgets.begin(), forgets.end(), [&](const Forget& f) {
        return f.release && f.seq == item.seq;
      });
      if (released || now >= item.deadline || (item.claim && item.claim->abandoned())) {
        (released ? cancelled : expired).push_back(*it);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<PendingView> views;
    for (const auto& p : pending_) {
      views.push_back({p->item.seq, p->rows - p->done_rows, p->rows == 1, p->item.span});
    }
    plan = PlanBatch(views, options_.max_batch_tokens, options_.max_prefill_chunk, options_.batch_shape);
    OrderBySequence(&plan, views);
    for (const Slice& slice : plan) planned.push_back(pending_[slice.item]);
    stats_.queue_depth = static_cast<int>(pending_.size());
  }
  for (const Forget& forget : forgets) {
    if (forget.release) {
      ctx.Release(forget.seq);
      lengths_[forget.seq] = 0;
      std::lock_guard<std::mutex> lock(mu_);  // a released session's next step is not expected
      for (auto& decoders : recent_decoders_) {
        decoders.erase(std::remove(decoders.begin(), decoders.end(), forget.seq), decoders.end());
      }
    } else {
      ctx.RemoveFrom(forget.seq, forget.from);
      lengths_[forget.seq] = std::min(lengths_[forget.seq], forget.from);
    }
  }
  for (const auto& p : expired) Undo(ctx, *p);
  if (!forgets.empty() || !expired.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.kv_cells_used = KvCells();
  }
  for (auto& forget : forgets) {
    if (forget.done) forget.done();
  }
  for (const auto& p : cancelled) {
    p->item.done(MakeError(Code::kCancelled, "sequence released"), {});
  }
  for (const auto& p : expired) {
    p->item.done(MakeError(Code::kDeadlineExceeded, "step past its deadline before it was done",
                           true),
                 {});
  }
  if (plan.empty()) return;

  std::vector<int32_t> decoders;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (planned[i]->rows == 1) decoders.push_back(planned[i]->item.seq);
  }
  const bool decode_only = decoders.size() == plan.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    recent_decoders_.push_back(std::move(decoders));
    if (recent_decoders_.size() > static_cast<size_t>(kRecentBatches)) recent_decoders_.pop_front();
  }
  engine::Batch batch;
  for (size_t i = 0; i < plan.size(); ++i) {
    Pending& p = *planned[i];
    for (int r = p.done_rows; r < p.done_rows + plan[i].count; ++r) {
      bool output = !last() || p.item.all_logits || r + 1 == p.rows;
      if (first()) {
        batch.AddToken(p.item.seq, p.item.pos + r, p.item.tokens[r], output);
      } else {
        batch.AddHidden(p.item.seq, p.item.pos + r, p.item.hidden.data() + size_t(r) * n_embd_,
                        n_embd_, output);
      }
    }
  }
  std::string error;
  const Clock::time_point decode_start = Clock::now();
  bool ok = ctx.Decode(batch, &error);
  const Clock::time_point decode_end = Clock::now();
  const auto decode_us =
      std::chrono::duration_cast<std::chrono::microseconds>(decode_end - decode_start).count();
  std::vector<std::shared_ptr<Pending>> finished, abandoned;
  int row = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Pending& p = *planned[i];
    if (!ok) {
      ctx.RemoveFrom(p.item.seq, p.item.pos);
      lengths_[p.item.seq] = p.item.pos;
      finished.push_back(planned[i]);
      continue;
    }
    for (int r = 0; r < plan[i].count; ++r, ++row) {
      if (!last()) {
        const float* hidden = ctx.Hidden(row);
        p.out.insert(p.out.end(), hidden, hidden + n_embd_);
      } else if (p.item.all_logits) {
        const float* logits = ctx.Logits(row);
        p.out.insert(p.out.end(), logits, logits + n_vocab_);
      } else if (p.done_rows + r + 1 == p.rows) {
        const float* logits = ctx.Logits(row);
        p.out.assign(logits, logits + n_vocab_);
      }
    }
    p.done_rows += plan[i].count;
    lengths_[p.item.seq] = p.item.pos + p.done_rows;
    if (p.done_rows < p.rows) continue;
    if (p.item.claim) p.item.claim->SetEngineTimes(decode_start, decode_end);
    if (p.item.claim && !p.item.claim->Claim()) {  // its waiter gave up meanwhile
      Undo(ctx, p);
      abandoned.push_back(planned[i]);
    }
    finished.push_back(planned[i]);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : finished) {
      pending_.erase(std::find(pending_.begin(), pending_.end(), p));
    }
    stats_.queue_depth = static_cast<int>(pending_.size());
    stats_.batches += 1;
    stats_.compute_us += static_cast<uint64_t>(decode_us);
    if (ok && decode_only) last_decode_ = std::chrono::microseconds(decode_us);
    stats_.rows += batch.size();
    stats_.last_batch_rows = batch.size();
    stats_.last_batch_items = static_cast<int>(plan.size());
    stats_.max_batch_items = std::max(stats_.max_batch_items, stats_.last_batch_items);
    stats_.kv_cells_used = KvCells();
  }
  for (const auto& p : finished) {
    if (std::count(abandoned.begin(), abandoned.end(), p)) {
      p->item.done(MakeError(Code::kDeadlineExceeded, "step abandoned by its waiter", true), {});
    } else if (ok) {
      p->item.done(OkStatus(), std::move(p->out));
    } else {
      p->item.done(MakeError(Code::kInternal, "decode failed: " + error, true), {});
    }
  }
}

}  // namespace meshnet::worker
