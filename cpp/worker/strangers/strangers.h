// Seam streams that have not yet presented a valid route ticket ("strangers"), counted per peer
// address and in all, so that streams which never send a frame cannot take every gRPC thread
// (issue 55, finding 5: 40 silent streams over 2 connections left Health no thread, and the
// node's hang detection then killed its own worker).
//
// Invariant: Admit is true at most `max_per_peer` times per peer and `max_total` times in all
// without a matching Leave; every admitted stream is left exactly once, when it authenticates or
// ends unauthenticated. Any thread.
#ifndef MESHNET_CPP_WORKER_STRANGERS_STRANGERS_H_
#define MESHNET_CPP_WORKER_STRANGERS_STRANGERS_H_

#include <map>
#include <mutex>
#include <string>

namespace meshnet::worker {

class StrangerStreams {
 public:
  StrangerStreams(int max_total, int max_per_peer) : max_total_(max_total), max_per_peer_(max_per_peer) {}

  // Counts a new stream from `peer`; false, with `*why` set, when the peer or the worker is at
  // its cap (the stream must then be refused without reading from it).
  bool Admit(const std::string& peer, std::string* why);
  // A stream admitted from `peer` authenticated or ended.
  void Leave(const std::string& peer);

  int total() const;

 private:
  const int max_total_;
  const int max_per_peer_;
  mutable std::mutex mu_;
  int total_ = 0;
  std::map<std::string, int> per_peer_;
};

// The host of a gRPC peer string: "ipv4:1.2.3.4:5678" -> "1.2.3.4", "ipv6:[::1]:5678" -> "::1";
// anything else whole.
std::string PeerHost(const std::string& peer);

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_STRANGERS_STRANGERS_H_
