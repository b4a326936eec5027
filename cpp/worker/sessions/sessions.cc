#include "cpp/worker/sessions/sessions.h"

#include <algorithm>
#include <functional>

namespace meshnet::worker {

using protocol::Code;
using protocol::MakeError;
using protocol::OkStatus;
using protocol::Status;

SessionTable::SessionTable(const SessionTableOptions& options) : options_(options) {
  for (int32_t seq = options.max_sessions - 1; seq >= 0; --seq) free_.push_back(seq);
}

Status SessionTable::Fence(const std::string& id, uint64_t epoch, uint64_t expires_unix_ms,
                           uint64_t now_unix_ms, std::vector<EndedSession>* fenced) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fences_.find(id);
  if (it == fences_.end()) {
    if (expires_unix_ms == 0) return OkStatus();  // a bound session's frame creates no fence
    if (fences_.size() >= options_.max_fences) {
      for (auto old = fences_.begin(); old != fences_.end();) {
        old = old->second.expires_unix_ms <= now_unix_ms ? fences_.erase(old) : std::next(old);
      }
    }
    if (fences_.size() >= options_.max_fences) {
      return MakeError(Code::kResourceExhausted,
                       "all " + std::to_string(options_.max_fences) + " epoch fences are held",
                       /*retryable=*/true);
    }
    it = fences_.emplace(id, FenceEntry{epoch, expires_unix_ms}).first;
  }
  FenceEntry& fence = it->second;
  if (epoch < fence.newest_epoch) {
    return MakeError(Code::kStaleEpoch, "epoch " + std::to_string(epoch) + " is fenced by " +
                                            std::to_string(fence.newest_epoch));
  }
  fence.newest_epoch = epoch;
  fence.expires_unix_ms = std::max(fence.expires_unix_ms, expires_unix_ms);
  for (auto s = sessions_.lower_bound({id, 0}); s != sessions_.end() && s->first.first == id &&
                                                s->first.second < epoch;) {
    fenced->push_back({s->first, s->second.seq, s->second.owner, s->second.tokens});
    fenced_streams_[s->first] = s->second.stream;
    fenced_order_.push_back(s->first);
    while (fenced_order_.size() > options_.max_fences) {
      fenced_streams_.erase(fenced_order_.front());
      fenced_order_.pop_front();
    }
    s = sessions_.erase(s);
  }
  return OkStatus();
}

bool SessionTable::FencedOn(const SessionKey& key, uint64_t stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fenced_streams_.find(key);
  return it != fenced_streams_.end() && it->second == stream;
}

void SessionTable::PruneFences(uint64_t now_unix_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = fences_.begin(); it != fences_.end();) {
    it = it->second.expires_unix_ms <= now_unix_ms ? fences_.erase(it) : std::next(it);
  }
}

Status SessionTable::Open(const SessionKey& key, uint64_t stream, Clock::time_point now,
                          SessionInfo* info) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  bool created = false;
  if (it != sessions_.end() && it->second.stream != stream) {
    return MakeError(Code::kPermissionDenied, "session is bound to another stream");
  }
  if (it == sessions_.end()) {
    if (free_.empty()) {
      return MakeError(Code::kResourceExhausted,
                       "all " + std::to_string(options_.max_sessions) + " sessions are in use",
                       /*retryable=*/true);
    }
    Entry entry;
    entry.seq = free_.back();
    entry.stream = stream;
    entry.owner = next_owner_++;
    free_.pop_back();
    it = sessions_.emplace(key, std::move(entry)).first;
    created = true;
  }
  it->second.last_active = now;
  info->seq = it->second.seq;
  info->length = it->second.length;
  info->last_step = it->second.last_step;
  info->created = created;
  info->owner = it->second.owner;
  return OkStatus();
}

std::optional<uint64_t> SessionTable::Stream(const SessionKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return std::nullopt;
  return it->second.stream;
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
                              uint64_t tokens, bool decode) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;  // ended while the step ran: its KV is gone, not counted
  it->second.last_step = step;
  it->second.last_reply = reply;
  it->second.length = length;
  it->second.tokens += tokens;
  auto& [prefill, decoded] = untaken_[key];
  (decode ? decoded : prefill) += tokens;
}

void SessionTable::Rewind(const SessionKey& key, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it != sessions_.end()) it->second.length = std::min(it->second.length, length);
}

std::vector<SessionWork> SessionTable::TakeWork() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SessionWork> work;
  for (const auto& [key, counts] : untaken_) work.push_back({key, counts.first, counts.second});
  untaken_.clear();
  return work;
}

std::optional<EndedSession> SessionTable::Remove(const SessionKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return std::nullopt;
  EndedSession ended{it->first, it->second.seq, it->second.owner, it->second.tokens};
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
  free_.insert(std::upper_bound(free_.begin(), free_.end(), seq, std::greater<int32_t>()), seq);
}

int SessionTable::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(sessions_.size());
}

int SessionTable::free_seqs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

int SessionTable::fence_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(fences_.size());
}

std::map<SessionKey, uint64_t> SessionTable::TokenCounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<SessionKey, uint64_t> counts;
  for (const auto& [key, entry] : sessions_) counts[key] = entry.tokens;
  return counts;
}

}  // namespace meshnet::worker
