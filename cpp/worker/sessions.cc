#include "cpp/worker/sessions.h"

#include <algorithm>

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Status;

SessionTable::SessionTable(const SessionTableOptions& options) : options_(options) {
  for (int32_t seq = options.max_sessions - 1; seq >= 0; --seq) free_.push_back(seq);
}

Status SessionTable::Fence(const std::string& id, uint64_t epoch,
                           std::vector<EndedSession>* fenced) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& newest = newest_epoch_[id];
  if (epoch < newest) {
    return MakeError(Code::kStaleEpoch, "epoch " + std::to_string(epoch) + " is fenced by " +
                                            std::to_string(newest));
  }
  newest = epoch;
  for (auto it = sessions_.lower_bound({id, 0}); it != sessions_.end() && it->first.first == id &&
                                                 it->first.second < epoch;) {
    fenced->push_back({it->first, it->second.seq, it->second.tokens});
    it = sessions_.erase(it);
  }
  return OkStatus();
}

Status SessionTable::Open(const SessionKey& key, Clock::time_point now, SessionInfo* info) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  bool created = false;
  if (it == sessions_.end()) {
    if (free_.empty()) {
      return MakeError(Code::kResourceExhausted,
                       "all " + std::to_string(options_.max_sessions) + " sessions are in use",
                       /*retryable=*/true);
    }
    Entry entry;
    entry.seq = free_.back();
    free_.pop_back();
    it = sessions_.emplace(key, std::move(entry)).first;
    created = true;
  }
  it->second.last_active = now;
  info->seq = it->second.seq;
  info->length = it->second.length;
  info->last_step = it->second.last_step;
  info->created = created;
  return OkStatus();
}

std::optional<protocol::SeamReply> SessionTable::Replay(const SessionKey& key, uint64_t step,
                                                        Status* status) const {
  std::lock_guard<std::mutex> lock(mu_);
  *status = OkStatus();
  auto it = sessions_.find(key);
  if (it == sessions_.end() || step > it->second.last_step) return std::nullopt;
  if (step == it->second.last_step && it->second.last_reply.has_value()) {
    protocol::SeamReply reply = *it->second.last_reply;
    reply.replayed = true;
    return reply;
  }
  *status = MakeError(Code::kInvalidArgument, "step " + std::to_string(step) +
                                                  " is older than " +
                                                  std::to_string(it->second.last_step));
  return std::nullopt;
}

void SessionTable::RecordStep(const SessionKey& key, uint64_t step,
                              const protocol::SeamReply& reply, uint64_t length,
                              uint64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;  // ended while the step ran
  it->second.last_step = step;
  it->second.last_reply = reply;
  it->second.length = length;
  it->second.tokens += tokens;
}

std::optional<EndedSession> SessionTable::Remove(const SessionKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return std::nullopt;
  EndedSession ended{it->first, it->second.seq, it->second.tokens};
  sessions_.erase(it);
  return ended;
}

std::vector<SessionKey> SessionTable::Idle(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SessionKey> idle;
  for (const auto& [key, entry] : sessions_) {
    if (now - entry.last_active > options_.idle) idle.push_back(key);
  }
  return idle;
}

void SessionTable::FreeSeq(int32_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq < 0 || seq >= options_.max_sessions) return;
  if (std::find(free_.begin(), free_.end(), seq) != free_.end()) return;
  free_.push_back(seq);
}

int SessionTable::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(sessions_.size());
}

int SessionTable::free_seqs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

std::map<SessionKey, uint64_t> SessionTable::TokenCounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<SessionKey, uint64_t> counts;
  for (const auto& [key, entry] : sessions_) counts[key] = entry.tokens;
  return counts;
}

}  // namespace meshnet::worker
