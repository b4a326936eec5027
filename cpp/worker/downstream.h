// The worker's client of the next hop: one Seam stream per session to the hop its route ticket
// names, over TLS that trusts exactly the certificate in the ticket (target name
// "meshnet-node"), or plaintext when the worker runs --insecure.
//
// Threading: Send and Close from the session's step (serialized by the session's lock); a
// reader thread owned by the object reports the next hop's error replies, and its loss, through
// `on_error`. Protobuf types stay in downstream.cc.
#ifndef MESHNET_CPP_WORKER_DOWNSTREAM_H_
#define MESHNET_CPP_WORKER_DOWNSTREAM_H_

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cpp/protocol/seam.h"
#include "cpp/protocol/status.h"

namespace meshnet::worker {

struct DownstreamCredentials {
  bool insecure = false;        // plaintext (loopback development only)
  std::string pinned_cert_pem;  // TLS: the only trusted certificate (the ticket's)
};

class Downstream {
 public:
  // Dials `hop.address` and opens the Seam stream (gRPC connects lazily; failures surface as
  // a failed Send or through `on_error`).
  Downstream(const protocol::DownstreamHop& hop, const DownstreamCredentials& credentials,
             std::function<void(protocol::Status)> on_error);
  ~Downstream();  // Close()
  Downstream(const Downstream&) = delete;
  Downstream& operator=(const Downstream&) = delete;

  const protocol::DownstreamHop& hop() const { return hop_; }

  // False when the stream is closed or broken.
  bool Send(const protocol::SeamFrame& frame);
  // Half-closes; waits up to 2 s for the next hop to end the stream, then cancels it; joins
  // the reader. Idempotent.
  void Close();

 private:
  struct Stream;  // the gRPC stub, context and stream
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
