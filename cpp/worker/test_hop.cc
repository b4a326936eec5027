#include "cpp/worker/test_hop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <utility>

#include "cpp/engine/tiny_llama.h"

namespace meshnet::worker::test_support {

std::string WriteFixture(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::string error;
  EXPECT_TRUE(engine::WriteTinyLlama(path, engine::TinyLlamaOptions(), &error)) << error;
  return path;
}

TestHop::TestHop(const std::string& path, int start, int end, const std::string& id, int n_seq,
                 ServiceOptions service_options) {
  SchedulerOptions options;
  options.model.path = path;
  options.model.layer_start = start;
  options.model.layer_end = end;
  options.context.n_seq = n_seq;
  options.context.n_ctx = 256;
  options.context.n_threads = 1;
  options.max_batch_tokens = 16;
  options.max_prefill_chunk = 4;
  std::string error;
  scheduler = Scheduler::Start(options, &error);
  EXPECT_NE(scheduler, nullptr) << error;
  service_options.node_id = id;
  service = std::make_unique<ShardService>(scheduler.get(), service_options);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  server = builder.BuildAndStart();
}

TestHop::~TestHop() {
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  service.reset();
  scheduler.reset();
}

std::vector<uint32_t> WholeModelGreedy(const std::string& path, std::vector<int32_t> prompt, int n) {
  SchedulerOptions options;
  options.model.path = path;
  options.context.n_threads = 1;
  std::string error;
  auto scheduler = Scheduler::Start(options, &error);
  EXPECT_NE(scheduler, nullptr) << error;
  std::vector<uint32_t> out;
  int32_t pos = 0;
  for (int i = 0; i < n; ++i) {
    std::promise<std::vector<float>> done;
    WorkItem item;
    item.seq = 0;
    item.pos = pos;
    item.tokens = prompt;
    item.done = [&done](const protocol::Status&, std::vector<float> logits) {
      done.set_value(std::move(logits));
    };
    EXPECT_TRUE(scheduler->Submit(std::move(item)).ok());
    std::vector<float> logits = done.get_future().get();
    pos += static_cast<int32_t>(prompt.size());
    int32_t token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(token);
    prompt = {token};
  }
  return out;
}

meshnet::shard::v1::HealthReply Health(meshnet::shard::v1::Shard::Stub& stub,
                                       std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  meshnet::shard::v1::HealthReply reply;
  EXPECT_TRUE(stub.Health(&context, meshnet::shard::v1::HealthRequest(), &reply).ok());
  return reply;
}

}  // namespace meshnet::worker::test_support
