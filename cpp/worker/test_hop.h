// Test support for the worker's in-process tests (testonly): the tiny F32 fixture, a shard
// hop (scheduler + ShardService + a loopback gRPC server), a whole-model greedy baseline and a
// Health call. Each TestHop owns its own engine thread (through its Scheduler).
#ifndef MESHNET_CPP_WORKER_TEST_HOP_H_
#define MESHNET_CPP_WORKER_TEST_HOP_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpp/worker/scheduler.h"
#include "cpp/worker/service.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker::test_support {

// Writes the seeded tiny F32 llama (engine::TinyLlamaOptions defaults) to $TEST_TMPDIR/name.
std::string WriteFixture(const std::string& name);

// Layers [start, end) of `path` served on 127.0.0.1:<port>; `service` gets node_id = id.
struct TestHop {
  TestHop(const std::string& path, int start, int end, const std::string& id, int n_seq,
          ServiceOptions service);
  ~TestHop();
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ShardService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Greedy continuation of `prompt` (n tokens) by the whole model, through a scheduler.
std::vector<uint32_t> WholeModelGreedy(const std::string& path, std::vector<int32_t> prompt, int n);

// Health of a hop (expects success within `deadline`).
meshnet::shard::v1::HealthReply Health(meshnet::shard::v1::Shard::Stub& stub,
                                       std::chrono::milliseconds deadline = std::chrono::seconds(5));

}  // namespace meshnet::worker::test_support

#endif  // MESHNET_CPP_WORKER_TEST_HOP_H_
