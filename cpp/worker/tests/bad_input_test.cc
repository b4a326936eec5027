// Bad input to the worker gets a structured SeamReply error (exact StatusCode, a message, and
// hop = the answering node's id) while a well-behaved session on the same services, interleaved
// with the bad frames, still produces exactly its solo tokens. A 2-hop chain on the tiny F32
// fixture over loopback gRPC: token-level cases go to hop 1, hidden-state cases to hop 2. Every
// frame carries a valid route ticket unless its case is about tickets (ADR 0003): missing,
// forged, for another session / node / epoch / range, with an effective start the GGUF hop
// cannot run from (ticket or frame), expired, a fence attack with epoch 2^64-1, foreign-stream
// RELEASE and CANCEL of the good session, a downstream entry without the next hop's ticket, NaN
// activations, a 256 MiB bundle announced for one row, zlib when compression is off; Results
// readers without a ticket, without or with a wrong client signature, and a second reader for
// the good session are refused with the exact gRPC code.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/tiny_llama.h"
#include "cpp/protocol/bundle.h"
#include "cpp/protocol/ticket_signer_for_tests.h"
#include "cpp/wire/tensor.h"
#include "cpp/worker/service.h"
#include "cpp/worker/tests/test_hop.h"

namespace meshnet::worker {
namespace {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using protocol::Phase;

constexpr int kEmbd = 32, kVocab = 64, kCtx = 256;

// Seam 1.0 frames carried fingerprints; since minor 1 no hop reads them (ADR 0021), and every
// frame here still carries them, as a 1.0 sender's would.
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
  protocol::SeamFrame frame = test_support::NewFrame(protocol::RouteSession{id, epoch}, phase, step);
  frame.fingerprints = NodeFingerprints();
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
                                std::function<void(protocol::TensorFragment*)> mutate = nullptr,
                                protocol::Compression compression = protocol::Compression::kNone,
                                float poison = 0) {
  protocol::SeamFrame frame = Frame(id, epoch, start == 0 ? Phase::kPrefill : Phase::kDecode, step);
  frame.span = protocol::TokenSpan{start, count};
  frame.range = protocol::ShardRange{2, 4, 2};
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i) values[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  if (poison != 0) values[n / 2] = poison;
  std::vector<protocol::Tensor> tensors = {
      protocol::TensorFromFloats("hidden_states", protocol::DType::kF32, shape, values.data())};
  protocol::Limits limits;
  std::vector<protocol::TensorFragment> fragments;
  protocol::Status encoded = protocol::EncodeBundle(tensors, step, compression,
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
  bool sign = true;  // give frames without a ticket a valid one (and hop 1 its downstream)
};

// Results on hop 2 with `request`; the gRPC status it ends with (after no frame).
grpc::StatusCode ResultsRefusal(pb::Shard::Stub& stub, const pb::ResultsRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto reader = stub.Results(&context, request);
  pb::ResultFrame frame;
  EXPECT_FALSE(reader->Read(&frame));
  return reader->Finish().error_code();
}

TEST(BadInputTest, StructuredErrorsAndOtherSessionsUnaffected) {
  std::string path = test_support::WriteFixture("bad_input_test_tiny.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3, 5, 30};
  test_support::FakeTracker tracker;
  protocol::FakeSigner forger;
  ServiceOptions service_options;
  service_options.tracker_key = tracker.key.public_key();
  // Room for the good session and the two bad ones that legitimately hold KV on hop 2; a bad
  // first frame must not keep a sequence id, or hop 1 would run out of them.
  service_options.sessions.max_sessions = 3;
  test_support::TestHop hop1(path, 0, 2, "hop-1", 3, service_options),
      hop2(path, 2, -1, "hop-2", 3, service_options);
  ASSERT_TRUE(hop1.server && hop2.server);
  const std::vector<const test_support::TestHop*> route = {&hop1, &hop2};
  auto stub1 = hop1.NewStub();
  auto stub2 = hop2.NewStub();
  const protocol::RouteSession good_session{"good", 1};
  // A frame with hop `hop`'s ticket for its session, the body changed by `mutate`.
  auto ticketed = [&](protocol::SeamFrame frame, int hop,
                      std::function<void(protocol::Ticket&)> mutate,
                      const protocol::FakeSigner* signer = nullptr) {
    protocol::Ticket body = tracker.Body(route, hop - 1, *frame.session);
    if (mutate) mutate(body);
    frame.ticket = (signer ? *signer : tracker.key).SignTicket(body);
    return frame;
  };
  auto hidden = [](const std::string& id) { return HiddenFrame(id, 1, 1, 0, 1, {1, kEmbd}); };

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
    cases.push_back({"unknown phase", 1, {}, [] {
                       auto f = TokenFrame("bad-phase", Phase::kPrefill, 1, 0, {1, 2});
                       f.phase = static_cast<Phase>(9);
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"hidden rows != span.count", 2, {},
                     HiddenFrame("bad-rows", 1, 1, 0, 2, {1, kEmbd}), Code::kInvalidArgument});
    cases.push_back({"hidden width != n_embd", 2, {},
                     HiddenFrame("bad-width", 1, 1, 0, 1, {1, kEmbd - 1}),
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
    // ---- ADR 0003 -----------------------------------------------------------------------
    cases.push_back({"no ticket", 2, {}, hidden("t-none"), Code::kUnauthenticated, false});
    cases.push_back({"no ticket (first hop)", 1, {},
                     TokenFrame("t-none1", Phase::kPrefill, 1, 0, {1, 2}),
                     Code::kUnauthenticated, false});
    cases.push_back({"forged ticket signature", 2, {},
                     ticketed(hidden("t-forged"), 2, nullptr, &forger), Code::kUnauthenticated});
    cases.push_back({"ticket body tampered after signing", 2, {}, [&] {
                       auto f = ticketed(hidden("t-tampered"), 2, nullptr);
                       f.ticket->body.back() ^= 1;
                       return f;
                     }(),
                     Code::kUnauthenticated});
    cases.push_back({"ticket for another session", 2, {},
                     ticketed(hidden("t-session"), 2,
                              [](protocol::Ticket& t) { t.session_id = "someone-else"; }),
                     Code::kPermissionDenied});
    cases.push_back({"ticket for another node", 2, {},
                     ticketed(hidden("t-node"), 2, [](protocol::Ticket& t) { t.node_id = "hop-1"; }),
                     Code::kPermissionDenied});
    cases.push_back({"ticket for another epoch", 2, {},
                     ticketed(hidden("t-epoch"), 2, [](protocol::Ticket& t) { t.epoch = 2; }),
                     Code::kPermissionDenied});
    cases.push_back({"ticket for another range", 2, {},
                     ticketed(hidden("t-range"), 2,
                              [](protocol::Ticket& t) { t.range.layer_start = 1; }),
                     Code::kPermissionDenied});
    cases.push_back({"ticket with an effective start inside the range (overlap)", 2, {},
                     ticketed(hidden("t-effective"), 2,
                              [](protocol::Ticket& t) { t.range.effective_start = 3; }),
                     Code::kInvalidArgument});
    cases.push_back({"frame range with an effective start inside the range", 2, {}, [&] {
                       auto f = hidden("f-effective");
                       f.range->effective_start = 3;
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"expired ticket", 2, {},
                     ticketed(hidden("t-expired"), 2,
                              [](protocol::Ticket& t) {
                                t.expires_unix_ms = test_support::NowUnixMs() - 1;
                              }),
                     Code::kPermissionDenied});
    cases.push_back({"session id over 64 bytes", 2, {}, hidden(std::string(65, 'x')),
                     Code::kInvalidArgument});
    cases.push_back({"foreign-stream RELEASE of the good session", 1, {},
                     Frame("good", 1, Phase::kRelease, 50), Code::kPermissionDenied});
    cases.push_back({"foreign-stream CANCEL of the good session (hop 2)", 2, {},
                     Frame("good", 1, Phase::kCancel, 50), Code::kPermissionDenied});
    cases.push_back({"foreign-stream decode for the good session", 2, {},
                     HiddenFrame("good", 1, 99, 0, 1, {1, kEmbd}), Code::kPermissionDenied});
    cases.push_back({"epoch 2^64-1 without a ticket (fence attack)", 1, {},
                     Frame("good", UINT64_MAX, Phase::kRelease, 1), Code::kUnauthenticated,
                     false});
    cases.push_back({"epoch 2^64-1 with a forged ticket (fence attack)", 2, {},
                     ticketed(HiddenFrame("good", UINT64_MAX, 1, 0, 1, {1, kEmbd}), 2, nullptr,
                              &forger),
                     Code::kUnauthenticated});
    // Minor 1: a downstream entry's node and address are ignored (the hop dials its ticket's),
    // so only an entry without the next hop's ticket is bad.
    cases.push_back({"downstream entry without a ticket", 1, {}, [&] {
                       auto f = TokenFrame("t-downstream", Phase::kPrefill, 1, 0, {1, 2});
                       f.downstream = tracker.Downstream(route, *f.session);
                       f.downstream[0].ticket.reset();
                       return f;
                     }(),
                     Code::kInvalidArgument});
    cases.push_back({"last-hop ticket on a hop that forwards", 1, {},
                     ticketed(TokenFrame("t-nodown", Phase::kPrefill, 1, 0, {1, 2}), 1,
                              [](protocol::Ticket& t) {
                                t.downstream_node_id.clear();
                                t.downstream_address.clear();
                              }),
                     Code::kPermissionDenied});
    cases.push_back({"NaN activations", 2, {},
                     HiddenFrame("t-nan", 1, 1, 0, 1, {1, kEmbd}, nullptr,
                                 protocol::Compression::kNone, std::nanf("")),
                     Code::kInvalidArgument});
    cases.push_back({"infinite activations", 2, {},
                     HiddenFrame("t-inf", 1, 1, 0, 1, {1, kEmbd}, nullptr,
                                 protocol::Compression::kNone, INFINITY),
                     Code::kInvalidArgument});
    cases.push_back({"fragment 0 announces 256 MiB for span.count 1", 2, {},
                     HiddenFrame("t-huge", 1, 1, 0, 1, {1, kEmbd},
                                 [](protocol::TensorFragment* f) {
                                   const uint64_t huge = 256ull << 20;
                                   f->header->tensors[0].shape = {huge / 4 / kEmbd, kEmbd};
                                   f->header->tensors[0].length = huge;
                                   f->header->payload_bytes = huge;
                                   f->header->wire_bytes = huge;
                                 }),
                     Code::kResourceExhausted});
    cases.push_back({"zlib bundle while compression is off", 2, {},
                     HiddenFrame("t-zlib", 1, 1, 0, 1, {1, kEmbd}, nullptr,
                                 protocol::Compression::kZlib),
                     Code::kInvalidArgument});
  }
  // Cases whose setup leaves a session holding KV on hop 2 go last: hop 2 has room for the
  // good session and those two only, and every other case needs a sequence id to be judged.
  std::stable_partition(cases.begin(), cases.end(),
                        [](const BadCase& bad) { return bad.setup.empty(); });
  for (BadCase& bad : cases) {  // valid tickets (and hop 1's downstream) where not the point
    if (!bad.sign) continue;
    auto complete = [&](protocol::SeamFrame& f) {
      if (!f.ticket.has_value()) f.ticket = tracker.TicketFor(route, bad.hop - 1, *f.session);
      if (bad.hop == 1 && f.downstream.empty() &&
          (f.phase == Phase::kPrefill || f.phase == Phase::kDecode)) {
        f.downstream = tracker.Downstream(route, *f.session);
      }
    };
    for (protocol::SeamFrame& f : bad.setup) complete(f);
    complete(bad.frame);
  }
  const int n = static_cast<int>(cases.size());
  std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, n + 1);

  grpc::ClientContext results_context;
  auto results = stub2->Results(&results_context, tracker.Results(route, good_session));
  for (int i = 0; i < 500 && test_support::Health(*stub2).results_readers() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {  // Results readers that must be refused, before the good session starts.
    pb::ResultsRequest second = tracker.Results(route, good_session);
    EXPECT_EQ(ResultsRefusal(*stub2, second), grpc::StatusCode::ALREADY_EXISTS);
    pb::ResultsRequest unsigned_request = second;
    unsigned_request.clear_client_signature();
    EXPECT_EQ(ResultsRefusal(*stub2, unsigned_request), grpc::StatusCode::PERMISSION_DENIED);
    pb::ResultsRequest stranger = second;
    stranger.set_client_signature(forger.Sign(protocol::kResultsContext,
                                              stranger.ticket().signature()));
    EXPECT_EQ(ResultsRefusal(*stub2, stranger), grpc::StatusCode::PERMISSION_DENIED);
    pb::ResultsRequest no_ticket = second;
    no_ticket.clear_ticket();
    EXPECT_EQ(ResultsRefusal(*stub2, no_ticket), grpc::StatusCode::UNAUTHENTICATED);
    pb::ResultsRequest hop1_ticket = second;  // hop 1's ticket, signed by the client
    protocol::RouteTicket wrong = tracker.TicketFor(route, 0, good_session);
    hop1_ticket.mutable_ticket()->set_body(wrong.body);
    hop1_ticket.mutable_ticket()->set_signature(wrong.signature);
    hop1_ticket.set_client_signature(tracker.client.SignResults(wrong));
    EXPECT_EQ(ResultsRefusal(*stub2, hop1_ticket), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(test_support::Health(*stub2).results_readers(), 1u);
  }
  auto good = std::make_unique<SeamClient>(*stub1);
  SeamClient bad1(*stub1), bad2(*stub2);

  protocol::SeamFrame prefill = TokenFrame("good", Phase::kPrefill, 1, 0,
                                           std::vector<uint32_t>(prompt.begin(), prompt.end()));
  prefill.sampling = protocol::SamplingParams();
  prefill.ticket = tracker.TicketFor(route, 0, good_session);
  prefill.downstream = tracker.Downstream(route, good_session);

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
