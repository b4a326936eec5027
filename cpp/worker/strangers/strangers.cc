#include "cpp/worker/strangers/strangers.h"

namespace meshnet::worker {

bool StrangerStreams::Admit(const std::string& peer, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  int& mine = per_peer_[peer];
  if (mine >= max_per_peer_) {
    *why = std::to_string(max_per_peer_) + " streams from " + peer + " have presented no ticket yet";
  } else if (total_ >= max_total_) {
    *why = std::to_string(max_total_) + " streams have presented no ticket yet";
  } else {
    ++mine;
    ++total_;
    return true;
  }
  if (mine == 0) per_peer_.erase(peer);
  return false;
}

void StrangerStreams::Leave(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_peer_.find(peer);
  if (it == per_peer_.end()) return;
  --total_;
  if (--it->second <= 0) per_peer_.erase(it);
}

int StrangerStreams::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

std::string PeerHost(const std::string& peer) {
  const bool v4 = peer.rfind("ipv4:", 0) == 0, v6 = peer.rfind("ipv6:", 0) == 0;
  if (!v4 && !v6) return peer;
  std::string rest = peer.substr(5);
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) rest.resize(colon);
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  return rest;
}

}  // namespace meshnet::worker
