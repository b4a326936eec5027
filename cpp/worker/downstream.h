// The worker's client of the next hop: one Seam stream per session to the hop its route ticket
// names, over TLS that trusts exactly the certificate in the ticket (target name
// "meshnet-node"), or plaintext when the worker runs --insecure.
//
// Threading: Send and Close from the session's step (serialized by the session's lock); a
// reader thread owned by the object reports the next hop's error replies, and its loss, through
// `on_error`. Protobuf types stay in downstream.cc.
#ifndef MESHNET_CPP_WORKER_DOWNSTREAM_H_
#define MESHNET_CPP_WORKER_DOWNSTREAM_H_

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cpp/wire/seam.h"
#include "cpp/wire/status.h"

namespace meshnet::worker {

struct DownstreamCredentials {
  bool insecure = false;        // plaintext (loopback development only)
  std::string pinned_cert_pem;  // TLS: the only trusted certificate (the ticket's)
};

// The frame the next hop gets for `frame`: its own ticket (the first of `frame`'s downstream
// list), the rest of the route, no token ids and no range (minor 1: the next hop takes its
// range from its ticket).
protocol::SeamFrame NextHopFrame(const protocol::SeamFrame& frame);

class Downstream {
 public:
  // Dials `hop.address` (the ticket's: ResolveDownstream) and, once the channel is connected
  // (TLS handshake included), opens the Seam stream into *out. UNAVAILABLE (retryable, naming
  // the next hop) when it is not connected by `connect_by`. Only connecting has a deadline:
  // the stream lives as long as the session, and later failures surface as a failed Send or
  // through `on_error`. `abandoned` is asked every 100 ms while connecting: true (the
  // upstream went away) stops the wait with CANCELLED, so a session whose client left does not
  // hold its thread and lock.
  static protocol::Status Open(const protocol::DownstreamHop& hop,
                               const DownstreamCredentials& credentials,
                               std::chrono::steady_clock::time_point connect_by,
                               const std::function<bool()>& abandoned,
                               std::function<void(protocol::Status)> on_error,
                               std::unique_ptr<Downstream>* out);
  ~Downstream();  // Close()
  Downstream(const Downstream&) = delete;
  Downstream& operator=(const Downstream&) = delete;

  const protocol::DownstreamHop& hop() const { return hop_; }

  // False when the stream is closed or broken.
  bool Send(const protocol::SeamFrame& frame);
  // Half-closes; waits up to 250 ms for the next hop to end the stream, then cancels it (a
  // cancelled stream frees the session there too); joins the reader. Idempotent.
  void Close();

 private:
  struct Stream;  // the gRPC stub, context and stream
  Downstream(const protocol::DownstreamHop& hop, std::function<void(protocol::Status)> on_error,
             std::unique_ptr<Stream> stream);
  void Read();

  protocol::DownstreamHop hop_;
  std::function<void(protocol::Status)> on_error_;
  std::unique_ptr<Stream> stream_;
  std::mutex write_mu_;  // guards closed_ and writes
  bool closed_ = false;
  std::promise<void> finished_;
  std::thread reader_;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_DOWNSTREAM_H_
