// Bad input to the worker gets a structured SeamReply error (exact StatusCode, a message, and
// hop = the answering node's id) while a well-behaved session on the same services, interleaved
// with the bad frames, still produces exactly its solo tokens. A 2-hop chain on the tiny F32
// fixture over loopback gRPC: token-level cases go to hop 1, hidden-state cases to hop 2.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/tiny_llama.h"
#include "cpp/protocol/bundle.h"
#include "cpp/protocol/tensor.h"
#include "cpp/worker/service.h"
#include "cpp/worker/test_hop.h"

namespace meshnet::worker {
namespace {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using protocol::Phase;

constexpr int kEmbd = 32, kVocab = 64, kCtx = 256;

protocol::Fingerprints NodeFingerprints() {
  return protocol::Fingerprints{"sha256:" + std::string(64, 'a'), "sha256:" + std::string(64, 'b')};
}

// One client Seam stream to a hop.
class SeamClient {
 public:
  explicit SeamClient(pb::Shard::Stub& stub) : stream_(stub.Seam(&context_)) {}
  ~SeamClient() {
    stream_->WritesDone();
    pb::SeamReply drained;
    while (stream_->Read(&drained)) {
    }
    stream_->Finish();
  }
  void Send(const protocol::SeamFrame& frame) {
    pb::SeamFrame message;
    protocol::ToProto(frame, &message);
    ASSERT_TRUE(stream_->Write(message));
  }
  protocol::SeamReply Read() {
    pb::SeamReply message;
    EXPECT_TRUE(stream_->Read(&message));
    protocol::SeamReply reply;
    protocol::FromProto(message, &reply);
    return reply;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SeamFrame, pb::SeamReply>> stream_;
};

protocol::SeamFrame Frame(const std::string& id, uint64_t epoch, Phase phase, uint64_t step) {
  protocol::SeamFrame frame;
  frame.version = protocol::CurrentVersion();
  frame.session = protocol::RouteSession{id, epoch};
  frame.fingerprints = NodeFingerprints();
  frame.phase = phase;
  frame.step = step;
  return frame;
}

protocol::SeamFrame TokenFrame(const std::string& id, Phase phase, uint64_t step, uint64_t start,
                               std::vector<uint32_t> tokens) {
  protocol::SeamFrame frame = Frame(id, 1, phase, step);
  frame.span = protocol::TokenSpan{start, static_cast<uint32_t>(tokens.size())};
  frame.token_ids = std::move(tokens);
  return frame;
}

// A hop-2 frame for span [start, start + count) carrying one f32 "hidden_states" of `shape`;
// `mutate` may corrupt the encoded fragment's header.
protocol::SeamFrame HiddenFrame(const std::string& id, uint64_t epoch, uint64_t step,
                                uint64_t start, uint32_t count, std::vector<uint64_t> shape,
                                std::function<void(protocol::TensorFragment*)> mutate = nullptr) {
  protocol::SeamFrame frame = Frame(id, epoch, start == 0 ? Phase::kPrefill : Phase::kDecode, step);
  frame.span = protocol::TokenSpan{start, count};
  frame.range = protocol::ShardRange{2, 4, 2};
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i) values[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  std::vector<protocol::Tensor> tensors = {
      protocol::TensorFromFloats("hidden_states", protocol::DType::kF32, shape, values.data())};
  protocol::Limits limits;
  std::vector<protocol::TensorFragment> fragments;
  protocol::Status encoded = protocol::EncodeBundle(tensors, step, protocol::Compression::kNone,
                                                    limits.max_fragment_bytes, limits, &fragments);
  EXPECT_TRUE(encoded.ok()) << encoded.ToString();
  EXPECT_EQ(fragments.size(), 1u);
  if (mutate) mutate(&fragments[0]);
  frame.fragment = fragments[0];
  return frame;
}

struct BadCase {
  std::string name;
  int hop;                                  // 1 or 2
  std::vector<protocol::SeamFrame> setup;   // sent first, each must be answered OK
  protocol::SeamFrame frame;                // the bad one
  Code code;
};

TEST(BadInputTest, StructuredErrorsAndOtherSessionsUnaffected) {
  std::string path = test_support::WriteFixture("bad_input_test_tiny.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3, 5, 30};
  std::vector<BadCase> cases;
  {
    cases.push_back({"token id outside the vocabulary", 1, {},
                     TokenFrame("bad-vocab", Phase::kPrefill, 1, 0, {1, kVocab, 2}),
                     Code::kInvalidArgument});
    cases.push_back({"token count != span.count", 1, {}, [] {
                       auto f = TokenFrame("bad-count", Phase::kPrefill, 1, 0, {1, 2, 3});
                       f.span->count = 2;
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"oversized prefill (span beyond n_ctx)", 1, {},
                     TokenFrame("bad-oversized", Phase::kPrefill, 1, 0,
                                std::vector<uint32_t>(kCtx + 8, 5)),
                     Code::kResourceExhausted});
    cases.push_back({"positions out of order (first hop)", 1, {},
                     TokenFrame("bad-order", Phase::kDecode, 1, 5, {4}), Code::kCacheMismatch});
    cases.push_back({"wrong fingerprint", 1, {}, [] {
                       auto f = TokenFrame("bad-fp", Phase::kPrefill, 1, 0, {1, 2});
                       f.fingerprints->model_artifact = "sha256:" + std::string(64, 'f');
                       return f;
                     }(),
                     Code::kFingerprintMismatch});
    cases.push_back({"wrong runtime recipe", 1, {}, [] {
                       auto f = TokenFrame("bad-fp2", Phase::kPrefill, 1, 0, {1, 2});
                       f.fingerprints->runtime_recipe = "sha256:" + std::string(64, '0');
                       return f;
                     }(),
                     Code::kFingerprintMismatch});
    cases.push_back({"unknown phase", 1, {}, [] {
                       auto f = TokenFrame("bad-phase", Phase::kPrefill, 1, 0, {1, 2});
                       f.phase = static_cast<Phase>(9);
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"hidden rows != span.count", 2, {},
                     HiddenFrame("bad-rows", 1, 1, 0, 2, {1, kEmbd}), Code::kInvalidArgument});
    cases.push_back({"hidden width != n_embd", 2, {},
                     HiddenFrame("bad-width", 1, 1, 0, 1, {1, kEmbd + 1}),
                     Code::kInvalidArgument});
    cases.push_back({"hidden rank 1", 2, {}, HiddenFrame("bad-rank", 1, 1, 0, 1, {kEmbd}),
                     Code::kInvalidArgument});
    cases.push_back({"unknown dtype", 2, {},
                     HiddenFrame("bad-dtype", 1, 1, 0, 1, {1, kEmbd},
                                 [](protocol::TensorFragment* f) {
                                   f->header->tensors[0].dtype = static_cast<protocol::DType>(7);
                                 }),
                     Code::kInvalidArgument});
    cases.push_back({"f16 dtype over f32 bytes", 2, {},
                     HiddenFrame("bad-width-dtype", 1, 1, 0, 1, {1, kEmbd},
                                 [](protocol::TensorFragment* f) {
                                   f->header->tensors[0].dtype = protocol::DType::kF16;
                                 }),
                     Code::kInvalidArgument});
    cases.push_back({"no hidden states on a later hop", 2, {}, [] {
                       auto f = HiddenFrame("bad-nohidden", 1, 1, 0, 1, {1, kEmbd});
                       f.fragment.reset();
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"positions out of order (later hop, after a good step)", 2,
                     {HiddenFrame("bad-order2", 1, 1, 0, 2, {2, kEmbd})},
                     HiddenFrame("bad-order2", 1, 2, 3, 1, {1, kEmbd}), Code::kCacheMismatch});
    cases.push_back({"stale epoch", 2, {HiddenFrame("bad-epoch", 2, 1, 0, 1, {1, kEmbd})},
                     HiddenFrame("bad-epoch", 1, 2, 1, 1, {1, kEmbd}), Code::kStaleEpoch});
  }
  const int n = static_cast<int>(cases.size());
  std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, n + 1);

  ServiceOptions service_options;
  service_options.fingerprints = NodeFingerprints();
  // Room for the good session and the two bad ones that legitimately hold KV on hop 2; a bad
  // first frame must not keep a sequence id, or hop 1 would run out of them.
  service_options.sessions.max_sessions = 3;
  test_support::TestHop hop1(path, 0, 2, "hop-1", 3, service_options),
      hop2(path, 2, -1, "hop-2", 3, service_options);
  ASSERT_TRUE(hop1.server && hop2.server);
  auto stub1 = pb::Shard::NewStub(
      grpc::CreateChannel(hop1.address(), grpc::InsecureChannelCredentials()));
  auto stub2 = pb::Shard::NewStub(
      grpc::CreateChannel(hop2.address(), grpc::InsecureChannelCredentials()));

  grpc::ClientContext results_context;
  pb::ResultsRequest request;
  protocol::ToProto(protocol::ResultsRequest{protocol::CurrentVersion(),
                                             protocol::RouteSession{"good", 1}},
                    &request);
  auto results = stub2->Results(&results_context, request);
  auto good = std::make_unique<SeamClient>(*stub1);
  SeamClient bad1(*stub1), bad2(*stub2);

  protocol::DownstreamHop next;
  next.node_id = "hop-2";
  next.address = hop2.address();
  next.range = protocol::ShardRange{2, 4, 2};
  protocol::SeamFrame prefill = TokenFrame("good", Phase::kPrefill, 1, 0,
                                           std::vector<uint32_t>(prompt.begin(), prompt.end()));
  prefill.sampling = protocol::SamplingParams();
  prefill.downstream = {next};

  std::vector<uint32_t> tokens;
  uint64_t position = 0;
  protocol::SeamFrame step = prefill;
  for (int i = 0; i <= n; ++i) {
    good->Send(step);  // in flight while the bad frame is handled
    if (i < n) {
      const BadCase& bad = cases[i];
      SCOPED_TRACE(bad.name);
      SeamClient& client = bad.hop == 1 ? bad1 : bad2;
      for (const protocol::SeamFrame& setup : bad.setup) {
        client.Send(setup);
        protocol::SeamReply reply = client.Read();
        ASSERT_TRUE(reply.status.has_value());
        EXPECT_TRUE(reply.status->ok()) << reply.status->ToString();
      }
      client.Send(bad.frame);
      protocol::SeamReply reply = client.Read();
      ASSERT_TRUE(reply.status.has_value());
      EXPECT_EQ(reply.status->code, bad.code) << reply.status->ToString();
      EXPECT_FALSE(reply.status->message.empty());
      EXPECT_EQ(reply.status->hop, bad.hop == 1 ? "hop-1" : "hop-2");
      ASSERT_TRUE(reply.session.has_value());
      EXPECT_EQ(reply.session->session_id, bad.frame.session->session_id);
      EXPECT_EQ(reply.step, bad.frame.step);
      std::printf("  %-55s -> %s\n", bad.name.c_str(), reply.status->ToString().c_str());
    }
    protocol::SeamReply reply = good->Read();
    ASSERT_TRUE(reply.status.has_value());
    ASSERT_TRUE(reply.status->ok()) << reply.status->ToString();
    position += step.span->count;
    EXPECT_EQ(reply.cache->length, position);
    pb::ResultFrame message;
    ASSERT_TRUE(results->Read(&message));
    protocol::ResultFrame result;
    protocol::FromProto(message, &result);
    ASSERT_EQ(result.tokens.size(), 1u) << (result.status ? result.status->ToString() : "");
    EXPECT_EQ(result.tokens[0].position, position);
    tokens.push_back(result.tokens[0].token_id);
    step = TokenFrame("good", Phase::kDecode, i + 2, position, {result.tokens[0].token_id});
  }
  EXPECT_EQ(tokens, expected);
  // Bad first frames hold nothing: only the good session (hop 1) and the two bad sessions
  // whose setup step succeeded (hop 2) are live.
  EXPECT_EQ(hop1.service->active_sessions(), 1);
  EXPECT_EQ(hop2.service->active_sessions(), 3);

  for (const char* id : {"bad-order2"}) {
    bad2.Send(Frame(id, 1, Phase::kRelease, 100));
    EXPECT_TRUE(bad2.Read().status->ok());
  }
  bad2.Send(Frame("bad-epoch", 2, Phase::kRelease, 100));
  EXPECT_TRUE(bad2.Read().status->ok());
  good->Send(Frame("good", 1, Phase::kRelease, 1000));
  EXPECT_TRUE(good->Read().status->ok());
  pb::ResultFrame message;
  ASSERT_TRUE(results->Read(&message));
  EXPECT_EQ(message.tokens_size(), 0);
  EXPECT_EQ(message.status().code(), pb::STATUS_CODE_OK);

  pb::HealthReply health1, health2;
  for (int i = 0; i < 100; ++i) {
    health1 = test_support::Health(*stub1);
    health2 = test_support::Health(*stub2);
    if (health1.active_sessions() == 0 && health2.active_sessions() == 0 &&
        health1.kv_cells_used() == 0 && health2.kv_cells_used() == 0 &&
        hop1.service->free_seqs() == 3 && hop2.service->free_seqs() == 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(health1.active_sessions(), 0u);
  EXPECT_EQ(health2.active_sessions(), 0u);
  EXPECT_EQ(health1.kv_cells_used(), 0u);
  EXPECT_EQ(health2.kv_cells_used(), 0u);
  EXPECT_EQ(hop1.service->free_seqs(), 3);
  EXPECT_EQ(hop2.service->free_seqs(), 3);
  EXPECT_GT(health1.batches(), 0u);
  EXPECT_GE(health1.mean_batch_rows(), 1.0f);
  EXPECT_GE(health2.max_batch_sessions(), 1u);
  std::printf("hop-1: batches %llu, mean rows %.2f, max sessions %u; hop-2: batches %llu, mean "
              "rows %.2f, max sessions %u\n",
              (unsigned long long)health1.batches(), health1.mean_batch_rows(),
              health1.max_batch_sessions(), (unsigned long long)health2.batches(),
              health2.mean_batch_rows(), health2.max_batch_sessions());
  good.reset();
  results_context.TryCancel();
}

}  // namespace
}  // namespace meshnet::worker
