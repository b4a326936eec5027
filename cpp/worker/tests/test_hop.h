// Test support for the worker's in-process tests (testonly): the tiny F32 fixture, a shard
// hop (scheduler + ShardService + a loopback gRPC server, plaintext or TLS), a fake tracker that
// signs route tickets for a chain of such hops, a whole-model greedy baseline and a Health
// call. Each TestHop owns its own engine thread (through its Scheduler).
#ifndef MESHNET_CPP_WORKER_TESTS_TEST_HOP_H_
#define MESHNET_CPP_WORKER_TESTS_TEST_HOP_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpp/protocol/ticket.h"
#include "cpp/protocol/ticket_signer_for_tests.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/service.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker::test_support {

// Writes the seeded tiny F32 llama (engine::TinyLlamaOptions defaults) to $TEST_TMPDIR/name.
std::string WriteFixture(const std::string& name);

// Layers [start, end) of `path` served on 127.0.0.1:<port>; `service` gets node_id = id. With
// `tls`, the hop serves that certificate and dials its downstream over pinned TLS; without,
// both are plaintext (the worker's --insecure=1).
struct TestHop {
  TestHop(const std::string& path, int start, int end, const std::string& id, int n_seq,
          ServiceOptions service, const protocol::TlsIdentity* tls = nullptr);
  ~TestHop();
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  // A stub for this hop, trusting exactly its certificate when it serves TLS.
  std::unique_ptr<meshnet::shard::v1::Shard::Stub> NewStub() const;

  std::string id;
  std::string certificate_pem;  // "" when plaintext
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ShardService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// The tracker's ticket key and one client's key; signs tickets for routes over TestHops.
struct FakeTracker {
  // The ticket body for hops[i] of `session` (downstream = hops[i + 1]), valid for 10 minutes.
  protocol::Ticket Body(const std::vector<const TestHop*>& hops, size_t i,
                        const protocol::RouteSession& session) const;
  protocol::RouteTicket Sign(const protocol::Ticket& body) const { return key.SignTicket(body); }
  protocol::RouteTicket TicketFor(const std::vector<const TestHop*>& hops, size_t i,
                                  const protocol::RouteSession& session) const {
    return Sign(Body(hops, i, session));
  }
  // The first frame's downstream list for hops[1:]: their tickets, nothing else (minor 1).
  std::vector<protocol::DownstreamHop> Downstream(const std::vector<const TestHop*>& hops,
                                                  const protocol::RouteSession& session) const;
  // A signed Results request for the last hop of `hops`.
  meshnet::shard::v1::ResultsRequest Results(const std::vector<const TestHop*>& hops,
                                             const protocol::RouteSession& session) const;

  protocol::FakeSigner key;     // ServiceOptions::tracker_key = key.public_key()
  protocol::FakeSigner client;  // the client that opened the routes
};

// Milliseconds since the Unix epoch (ticket expiry is wall clock).
uint64_t NowUnixMs();

// A frame of the current version for `session`, `phase` and `step`, nothing else set.
protocol::SeamFrame NewFrame(const protocol::RouteSession& session, protocol::Phase phase,
                             uint64_t step);

// Writes `frame` on `seam`, reads one reply and returns its status.
protocol::Status Exchange(
    grpc::ClientReaderWriterInterface<meshnet::shard::v1::SeamFrame, meshnet::shard::v1::SeamReply>& seam,
    const protocol::SeamFrame& frame);

// Greedy continuation of `prompt` (n tokens) by the whole model, through a scheduler.
std::vector<uint32_t> WholeModelGreedy(const std::string& path, std::vector<int32_t> prompt, int n);

// Health of a hop (expects success within `deadline`).
meshnet::shard::v1::HealthReply Health(meshnet::shard::v1::Shard::Stub& stub,
                                       std::chrono::milliseconds deadline = std::chrono::seconds(5));

}  // namespace meshnet::worker::test_support

#endif  // MESHNET_CPP_WORKER_TESTS_TEST_HOP_H_
