#include "cpp/worker/sessions/results.h"

#include <utility>

namespace meshnet::worker {

void ResultQueue::Push(protocol::ResultFrame frame, bool close) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    frames_.push_back(std::move(frame));
    if (close && !closed_) closed_at_ = Clock::now();
    closed_ = closed_ || close;
  }
  cv_.notify_all();
}

bool ResultQueue::Pop(std::chrono::milliseconds timeout, protocol::ResultFrame* out,
                      bool* closed) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !frames_.empty() || closed_; });
  *closed = closed_;
  if (frames_.empty()) return false;
  *out = std::move(frames_.front());
  frames_.pop_front();
  return true;
}

ResultsBoard::ResultsBoard(size_t max_queues, Clock::duration grace)
    : max_queues_(max_queues), grace_(grace) {}

ResultsBoard::Attached ResultsBoard::Attach(const SessionKey& key,
                                            std::shared_ptr<ResultQueue>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(key);
  if (it == queues_.end()) {
    if (queues_.size() >= max_queues_) DropClosedUnreadLocked(Clock::now(), Clock::duration(0));
    if (queues_.size() >= max_queues_) return Attached::kFull;
    it = queues_.emplace(key, std::make_shared<ResultQueue>()).first;
  }
  if (it->second->reader_) return Attached::kHasReader;
  it->second->reader_ = true;
  ++readers_;
  *out = it->second;
  return Attached::kOk;
}

void ResultsBoard::Detach(const SessionKey& key, const std::shared_ptr<ResultQueue>& queue) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue->reader_) {
    queue->reader_ = false;
    --readers_;
  }
  auto it = queues_.find(key);
  if (it != queues_.end() && it->second == queue) queues_.erase(it);
}

void ResultsBoard::Push(const SessionKey& key, protocol::ResultFrame frame, bool close) {
  std::shared_ptr<ResultQueue> queue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<ResultQueue>& slot = queues_[key];
    if (slot == nullptr) {
      if (queues_.size() > max_queues_) DropClosedUnreadLocked(Clock::now(), Clock::duration(0));
      slot = std::make_shared<ResultQueue>();
    }
    queue = slot;
  }
  queue->Push(std::move(frame), close);
}

void ResultsBoard::Reap(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  DropClosedUnreadLocked(now, grace_);
}

void ResultsBoard::DropClosedUnreadLocked(Clock::time_point now, Clock::duration older_than) {
  for (auto it = queues_.begin(); it != queues_.end();) {
    std::lock_guard<std::mutex> queue_lock(it->second->mu_);
    bool drop = !it->second->reader_ && it->second->closed_ &&
                now - it->second->closed_at_ >= older_than;
    it = drop ? queues_.erase(it) : std::next(it);
  }
}

int ResultsBoard::readers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return readers_;
}

int ResultsBoard::queues() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queues_.size());
}

}  // namespace meshnet::worker
