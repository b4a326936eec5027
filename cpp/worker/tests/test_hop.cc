#include "cpp/worker/tests/test_hop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <utility>

#include "cpp/engine/tiny_llama.h"
#include "cpp/worker/hop.h"

namespace meshnet::worker::test_support {

namespace pb = meshnet::shard::v1;

std::string WriteFixture(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::string error;
  EXPECT_TRUE(engine::WriteTinyLlama(path, engine::TinyLlamaOptions(), &error)) << error;
  return path;
}

TestHop::TestHop(const std::string& path, int start, int end, const std::string& hop_id,
                 int n_seq, ServiceOptions service_options, const protocol::TlsIdentity* tls)
    : id(hop_id) {
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
  service_options.insecure = tls == nullptr;
  service = std::make_unique<ShardService>(scheduler.get(), service_options);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls != nullptr) {
    certificate_pem = tls->certificate_pem;
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls->private_key_pem, tls->certificate_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", credentials, &port);
  builder.RegisterService(service.get());
  server = builder.BuildAndStart();
}

TestHop::~TestHop() {
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  service.reset();
  scheduler.reset();
}

std::unique_ptr<pb::Shard::Stub> TestHop::NewStub() const {
  if (certificate_pem.empty()) {
    return pb::Shard::NewStub(grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = certificate_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kNodeTlsName);
  return pb::Shard::NewStub(grpc::CreateCustomChannel(address(), grpc::SslCredentials(ssl), args));
}

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

protocol::Ticket FakeTracker::Body(const std::vector<const TestHop*>& hops, size_t i,
                                   const protocol::RouteSession& session) const {
  const HopIdentity& hop = hops[i]->service->identity();
  protocol::Ticket body;
  body.session_id = session.session_id;
  body.epoch = session.epoch;
  body.node_id = hop.node_id;
  body.range = protocol::ShardRange{hop.layer_start, hop.layer_end, hop.layer_start};
  if (i + 1 < hops.size()) {
    body.downstream_node_id = hops[i + 1]->id;
    body.downstream_address = hops[i + 1]->address();
    body.downstream_public_key = std::string(32, '\x01');
    body.downstream_tls_certificate = hops[i + 1]->certificate_pem;
  }
  body.client_public_key = client.public_key_bytes();
  body.client_principal = "c-test";
  body.expires_unix_ms = NowUnixMs() + 600'000;
  return body;
}

std::vector<protocol::DownstreamHop> FakeTracker::Downstream(
    const std::vector<const TestHop*>& hops, const protocol::RouteSession& session) const {
  std::vector<protocol::DownstreamHop> out;
  for (size_t i = 1; i < hops.size(); ++i) {
    protocol::DownstreamHop next;  // minor 1: the ticket alone (each hop dials its ticket's)
    next.ticket = TicketFor(hops, i, session);
    out.push_back(std::move(next));
  }
  return out;
}

pb::ResultsRequest FakeTracker::Results(const std::vector<const TestHop*>& hops,
                                        const protocol::RouteSession& session) const {
  protocol::ResultsRequest request;
  request.version = protocol::CurrentVersion();
  request.session = session;
  request.ticket = TicketFor(hops, hops.size() - 1, session);
  request.client_signature = client.SignResults(*request.ticket);
  pb::ResultsRequest message;
  protocol::ToProto(request, &message);
  return message;
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

protocol::SeamFrame NewFrame(const protocol::RouteSession& session, protocol::Phase phase,
                             uint64_t step) {
  protocol::SeamFrame frame;
  frame.version = protocol::CurrentVersion();
  frame.session = session;
  frame.phase = phase;
  frame.step = step;
  return frame;
}

protocol::Status Exchange(
    grpc::ClientReaderWriterInterface<meshnet::shard::v1::SeamFrame, meshnet::shard::v1::SeamReply>& seam,
    const protocol::SeamFrame& frame) {
  meshnet::shard::v1::SeamFrame message;
  protocol::ToProto(frame, &message);
  EXPECT_TRUE(seam.Write(message));
  meshnet::shard::v1::SeamReply reply;
  EXPECT_TRUE(seam.Read(&reply));
  protocol::SeamReply out;
  protocol::FromProto(reply, &out);
  return out.status.value_or(protocol::InternalError("no status"));
}

}  // namespace meshnet::worker::test_support
