// The seam service as a 2-hop chain over loopback gRPC on the tiny F32 fixture: greedy tokens
// equal a whole-model run, release frees sequences on both hops, a repeated step is replayed.
#include "cpp/worker/service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/tiny_llama.h"
#include "cpp/worker/test_hop.h"

namespace meshnet::worker {
namespace {

namespace pb = meshnet::shard::v1;
using protocol::Code;

protocol::SeamFrame Frame(protocol::Phase phase, uint64_t step) {
  protocol::SeamFrame frame;
  frame.version = protocol::CurrentVersion();
  frame.session = protocol::RouteSession{"s1", 1};
  frame.phase = phase;
  frame.step = step;
  return frame;
}

TEST(ServiceTest, TwoHopChainMatchesWholeModelAndReleases) {
  std::string path = test_support::WriteFixture("service_test_tiny.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3};
  const int n = 6;
  std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, n);

  ServiceOptions service_options;
  service_options.sessions.max_sessions = 2;
  test_support::TestHop hop1(path, 0, 2, "hop-1", 2, service_options),
      hop2(path, 2, -1, "hop-2", 2, service_options);
  ASSERT_TRUE(hop1.server && hop2.server);
  auto channel1 = grpc::CreateChannel(hop1.address(), grpc::InsecureChannelCredentials());
  auto channel2 = grpc::CreateChannel(hop2.address(), grpc::InsecureChannelCredentials());
  auto stub1 = pb::Shard::NewStub(channel1);
  auto stub2 = pb::Shard::NewStub(channel2);

  grpc::ClientContext results_context;
  pb::ResultsRequest request;
  protocol::ToProto(protocol::ResultsRequest{protocol::CurrentVersion(),
                                             protocol::RouteSession{"s1", 1}},
                    &request);
  auto results = stub2->Results(&results_context, request);
  grpc::ClientContext seam_context;
  auto seam = stub1->Seam(&seam_context);

  auto send = [&](const protocol::SeamFrame& frame) {
    pb::SeamFrame message;
    protocol::ToProto(frame, &message);
    ASSERT_TRUE(seam->Write(message));
  };
  auto read_reply = [&]() {
    pb::SeamReply message;
    EXPECT_TRUE(seam->Read(&message));
    protocol::SeamReply reply;
    protocol::FromProto(message, &reply);
    return reply;
  };
  auto read_token = [&](protocol::ResultFrame* frame) {
    pb::ResultFrame message;
    EXPECT_TRUE(results->Read(&message));
    protocol::FromProto(message, frame);
  };

  protocol::SeamFrame prefill = Frame(protocol::Phase::kPrefill, 1);
  prefill.span = protocol::TokenSpan{0, static_cast<uint32_t>(prompt.size())};
  prefill.token_ids.assign(prompt.begin(), prompt.end());
  prefill.sampling = protocol::SamplingParams();
  protocol::DownstreamHop next;
  next.node_id = "hop-2";
  next.address = hop2.address();
  next.range = protocol::ShardRange{2, 4, 2};
  prefill.downstream = {next};
  send(prefill);
  protocol::SeamReply reply = read_reply();
  ASSERT_TRUE(reply.status->ok()) << reply.status->ToString();
  EXPECT_EQ(reply.cache->length, prompt.size());

  std::vector<uint32_t> tokens;
  uint64_t position = prompt.size();
  for (int i = 0; i < n; ++i) {
    protocol::ResultFrame result;
    read_token(&result);
    ASSERT_EQ(result.tokens.size(), 1u) << (result.status ? result.status->ToString() : "");
    EXPECT_EQ(result.tokens[0].position, position);
    tokens.push_back(result.tokens[0].token_id);
    if (i + 1 == n) break;
    protocol::SeamFrame decode = Frame(protocol::Phase::kDecode, i + 2);
    decode.span = protocol::TokenSpan{position, 1};
    decode.token_ids = {result.tokens[0].token_id};
    send(decode);
    reply = read_reply();
    ASSERT_TRUE(reply.status->ok()) << reply.status->ToString();
    EXPECT_FALSE(reply.replayed);
    ++position;
  }
  EXPECT_EQ(tokens, expected);

  // The last step again: answered from the record, nothing recomputed or forwarded.
  uint64_t batches1 = hop1.scheduler->Stats().batches, batches2 = hop2.scheduler->Stats().batches;
  protocol::SeamFrame repeat = Frame(protocol::Phase::kDecode, n);
  repeat.span = protocol::TokenSpan{position - 1, 1};
  repeat.token_ids = {tokens[n - 2]};
  send(repeat);
  reply = read_reply();
  EXPECT_TRUE(reply.replayed);
  EXPECT_TRUE(reply.status->ok());
  EXPECT_EQ(reply.cache->length, position);
  EXPECT_EQ(hop1.scheduler->Stats().batches, batches1);
  EXPECT_EQ(hop2.scheduler->Stats().batches, batches2);
  // An older step is refused; a stale epoch is refused.
  send(Frame(protocol::Phase::kDecode, 1));
  EXPECT_EQ(read_reply().status->code, Code::kInvalidArgument);
  EXPECT_EQ(hop1.service->active_sessions(), 1);
  EXPECT_EQ(hop2.service->active_sessions(), 1);
  EXPECT_EQ(hop1.service->TokenCounts().begin()->second, position);

  send(Frame(protocol::Phase::kRelease, uint64_t{1} << 62));
  EXPECT_TRUE(read_reply().status->ok());
  protocol::ResultFrame last;
  read_token(&last);
  EXPECT_TRUE(last.tokens.empty());
  EXPECT_TRUE(last.status->ok()) << last.status->ToString();
  for (int i = 0; i < 100 && (hop2.service->free_seqs() < 2 || hop1.service->free_seqs() < 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hop1.service->active_sessions(), 0);
  EXPECT_EQ(hop2.service->active_sessions(), 0);
  EXPECT_EQ(hop1.service->free_seqs(), 2);
  EXPECT_EQ(hop2.service->free_seqs(), 2);
  EXPECT_EQ(hop1.scheduler->Stats().kv_cells_used, 0u);
  EXPECT_EQ(hop2.scheduler->Stats().kv_cells_used, 0u);

  protocol::SeamFrame stale = Frame(protocol::Phase::kDecode, 9);
  stale.session->epoch = 0;
  send(stale);
  EXPECT_EQ(read_reply().status->code, Code::kStaleEpoch);
  seam->WritesDone();
  EXPECT_TRUE(seam->Finish().ok());
  results_context.TryCancel();
}

}  // namespace
}  // namespace meshnet::worker
