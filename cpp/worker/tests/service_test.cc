// The seam service as a 2-hop chain over loopback gRPC on the tiny F32 fixture, with route
// tickets, in plaintext (--insecure) and over TLS pinned to a self-signed certificate: greedy
// tokens equal a whole-model run, the token at max_tokens carries LENGTH without a ring, release
// frees sequences on both hops, a repeated step is replayed, the ledger counts each token once, a
// stream without a ticket is cut, a hop forwards to the address its ticket names.
#include "cpp/worker/service.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/engine/tiny_llama.h"
#include "cpp/protocol/ticket_signer_for_tests.h"
#include "cpp/worker/scheduler/engine_gate.h"
#include "cpp/worker/tests/test_hop.h"

namespace meshnet::worker {
namespace {

namespace pb = meshnet::shard::v1;
using protocol::Code;

const protocol::RouteSession kSession{"s1", 1};

protocol::SeamFrame Frame(protocol::Phase phase, uint64_t step) {
  return test_support::NewFrame(kSession, phase, step);
}

using test_support::Exchange;

class ServiceTest : public ::testing::TestWithParam<bool> {};  // param: TLS on every link

TEST_P(ServiceTest, TwoHopChainMatchesWholeModelAndReleases) {
  const bool tls = GetParam();
  std::string path = test_support::WriteFixture("service_test_tiny.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3};
  const int n = 6;
  std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, n);

  test_support::FakeTracker tracker;
  ServiceOptions service_options;
  service_options.tracker_key = tracker.key.public_key();
  service_options.sessions.max_sessions = 2;
  service_options.supervisor_token = "the-node's-token";
  const protocol::TlsIdentity tls1 = protocol::MakeSelfSignedTls(),
                              tls2 = protocol::MakeSelfSignedTls();
  test_support::TestHop hop1(path, 0, 2, "hop-1", 2, service_options, tls ? &tls1 : nullptr),
      hop2(path, 2, -1, "hop-2", 2, service_options, tls ? &tls2 : nullptr);
  ASSERT_TRUE(hop1.server && hop2.server);
  const std::vector<const test_support::TestHop*> route = {&hop1, &hop2};
  auto stub1 = hop1.NewStub();
  auto stub2 = hop2.NewStub();

  grpc::ClientContext results_context;
  auto results = stub2->Results(&results_context, tracker.Results(route, kSession));
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
  prefill.sampling->max_tokens = n;  // the last hop ends the tokens, ring or not (minor 1)
  prefill.ticket = tracker.TicketFor(route, 0, kSession);
  prefill.downstream = tracker.Downstream(route, kSession);
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
    EXPECT_EQ(result.finish_reason,
              i + 1 == n ? protocol::FinishReason::kLength : protocol::FinishReason::kUnspecified);
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
  // The ledger counts each position once, split by phase, and is taken once.
  for (auto* stub : {stub1.get(), stub2.get()}) {
    for (const char* guess : {"", "a-guess"}) {  // only the node's supervisor takes the counters
      grpc::ClientContext intruder;
      if (*guess) intruder.AddMetadata(kSupervisorMetadata, guess);
      pb::TakeWorkReply nothing;
      EXPECT_EQ(stub->TakeWork(&intruder, pb::TakeWorkRequest(), &nothing).error_code(),
                grpc::StatusCode::PERMISSION_DENIED);
    }
    grpc::ClientContext context;
    context.AddMetadata(kSupervisorMetadata, "the-node's-token");
    pb::TakeWorkReply work;
    ASSERT_TRUE(stub->TakeWork(&context, pb::TakeWorkRequest(), &work).ok());
    ASSERT_EQ(work.work_size(), 1);
    EXPECT_EQ(work.work(0).prefill_tokens(), prompt.size());
    EXPECT_EQ(work.work(0).decode_tokens(), position - prompt.size());
  }
  pb::HealthReply health2 = test_support::Health(*stub2);
  EXPECT_EQ(health2.results_readers(), 1u);
  EXPECT_EQ(health2.fence_entries(), 1u);
  // Where the decode steps' time went (issue 31): every completed decode step timed on both hops
  // (the prefill, the replayed and the refused frames are not), the engine wait at least the
  // engine's own decode, and queue and engine within the wait.
  for (auto* stub : {stub1.get(), stub2.get()}) {
    const pb::StepTimes times = test_support::Health(*stub).step_times();
    EXPECT_EQ(times.steps(), static_cast<uint64_t>(n - 1));
    EXPECT_GT(times.engine_us(), 0u);
    EXPECT_GE(times.wait_us(), times.queue_us() + times.engine_us());
    EXPECT_GT(times.admit_us() + times.send_us(), 0u);
  }

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

  // The session is gone: a frame for it needs a ticket again; an older epoch's valid ticket
  // meets the fence.
  send(Frame(protocol::Phase::kDecode, 9));
  EXPECT_EQ(read_reply().status->code, Code::kUnauthenticated);
  protocol::SeamFrame stale = Frame(protocol::Phase::kDecode, 9);
  stale.session->epoch = 0;
  stale.ticket = tracker.TicketFor(route, 0, *stale.session);
  send(stale);
  EXPECT_EQ(read_reply().status->code, Code::kStaleEpoch);
  seam->WritesDone();
  EXPECT_TRUE(seam->Finish().ok());
  results_context.TryCancel();
}

INSTANTIATE_TEST_SUITE_P(Links, ServiceTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tls" : "Plaintext"; });

// A Seam stream that presents no valid ticket within the deadline is cancelled; one that did
// is left alone.
TEST(ServiceDeadlineTest, StreamWithoutTicketIsCut) {
  std::string path = test_support::WriteFixture("service_test_deadline.gguf");
  test_support::FakeTracker tracker;
  ServiceOptions service_options;
  service_options.tracker_key = tracker.key.public_key();
  service_options.ticket_deadline = std::chrono::milliseconds(300);
  test_support::TestHop hop(path, 0, -1, "hop", 1, service_options);
  ASSERT_TRUE(hop.server);
  auto stub = hop.NewStub();
  grpc::ClientContext silent_context, honest_context;
  auto silent = stub->Seam(&silent_context);
  auto honest = stub->Seam(&honest_context);
  pb::SeamFrame message;
  protocol::SeamFrame release = Frame(protocol::Phase::kRelease, 1);
  release.ticket = tracker.TicketFor({&hop}, 0, kSession);  // valid: OK, a no-op
  protocol::ToProto(release, &message);
  ASSERT_TRUE(honest->Write(message));
  pb::SeamReply reply;
  ASSERT_TRUE(honest->Read(&reply));
  EXPECT_EQ(reply.status().code(), pb::STATUS_CODE_OK);
  auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(silent->Read(&reply));  // cut by the worker, not by us
  EXPECT_EQ(silent->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_TRUE(honest->Write(message));  // still open
  ASSERT_TRUE(honest->Read(&reply));
  honest->WritesDone();
  EXPECT_TRUE(honest->Finish().ok());
}

// A step whose budget runs out while it waits for the engine is answered DEADLINE_EXCEEDED and
// leaves nothing behind: a later step of the same session gives the whole model's token, and a
// session whose first step it was holds no sequence.
TEST(ServiceDeadlineTest, BudgetSpentInTheQueueLeavesTheSessionAsItWas) {
  std::string path = test_support::WriteFixture("service_test_budget.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3};
  std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, 2);
  test_support::FakeTracker tracker;
  ServiceOptions service_options;
  service_options.tracker_key = tracker.key.public_key();
  service_options.sessions.max_sessions = 2;  // sequence 2 is the gate's
  test_support::TestHop hop(path, 0, -1, "hop", 3, service_options);
  ASSERT_TRUE(hop.server);
  const std::vector<const test_support::TestHop*> route = {&hop};
  auto stub = hop.NewStub();
  grpc::ClientContext results_context, seam_context;
  auto results = stub->Results(&results_context, tracker.Results(route, kSession));
  auto seam = stub->Seam(&seam_context);
  auto token = [&] {
    pb::ResultFrame message;
    EXPECT_TRUE(results->Read(&message));
    return message.tokens_size() == 1 ? message.tokens(0).token_id() : ~0u;
  };
  protocol::SeamFrame prefill = Frame(protocol::Phase::kPrefill, 1);
  prefill.span = protocol::TokenSpan{0, static_cast<uint32_t>(prompt.size())};
  prefill.token_ids.assign(prompt.begin(), prompt.end());
  prefill.ticket = tracker.TicketFor(route, 0, kSession);
  ASSERT_TRUE(Exchange(*seam, prefill).ok());
  const uint32_t first = token();
  EXPECT_EQ(first, expected[0]);
  const uint64_t cells = hop.scheduler->Stats().kv_cells_used;

  protocol::SeamFrame decode = Frame(protocol::Phase::kDecode, 2);
  decode.span = protocol::TokenSpan{prompt.size(), 1};
  decode.token_ids = {first};
  protocol::SeamFrame budgeted = decode;
  budgeted.budget_ms = 1;
  protocol::SeamFrame other = prefill;  // a new session's first step
  other.session = protocol::RouteSession{"s2", 1};
  other.ticket = tracker.TicketFor(route, 0, *other.session);
  other.budget_ms = 1;
  {
    test_support::EngineGate busy(*hop.scheduler, 2);
    busy.WaitEntered();
    protocol::Status late = Exchange(*seam, budgeted);
    EXPECT_EQ(late.code, Code::kDeadlineExceeded) << late.ToString();
    EXPECT_TRUE(late.retryable);
    EXPECT_EQ(late.hop, "hop");
    EXPECT_EQ(late.message, "step 2 not done on hop within its budget of 1 ms");
    EXPECT_EQ(Exchange(*seam, other).code, Code::kDeadlineExceeded);
    EXPECT_EQ(hop.service->active_sessions(), 1);  // s2 is gone, s1 stays
  }
  for (int i = 0; i < 500 && hop.service->free_seqs() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hop.service->free_seqs(), 1);
  EXPECT_EQ(hop.scheduler->Stats().kv_cells_used, cells + 1);  // + the gate's token only
  protocol::Status again = Exchange(*seam, decode);  // the same step, no budget
  ASSERT_TRUE(again.ok()) << again.ToString();
  EXPECT_EQ(token(), expected[1]);
  seam->WritesDone();
  seam->Finish();
  results_context.TryCancel();
}

// A stand-in next hop that records the frames it is sent.
class RecordingHop final : public pb::Shard::Service {
 public:
  grpc::Status Seam(grpc::ServerContext*,
                    grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* stream) override {
    pb::SeamFrame frame;
    while (stream->Read(&frame)) {
      std::lock_guard<std::mutex> lock(mu_);
      frames_.push_back(frame);
      arrived_.notify_all();
    }
    return grpc::Status::OK;
  }
  std::optional<pb::SeamFrame> Frame(size_t i) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!arrived_.wait_for(lock, std::chrono::seconds(10), [&] { return frames_.size() > i; })) {
      return std::nullopt;
    }
    return frames_[i];
  }

 private:
  std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<pb::SeamFrame> frames_;
};

// The next hop gets what is left of the step's budget (none when none was given) and its own
// ticket, no range; the hop dials the address its ticket names, whatever the frame's downstream
// entry says; connecting to a next hop that does not answer fails UNAVAILABLE naming it, or
// DEADLINE_EXCEEDED when the step's own budget ran out first.
TEST(ServiceDeadlineTest, ForwardsTheRestOfTheBudgetAndBoundsConnecting) {
  std::string path = test_support::WriteFixture("service_test_forward.gguf");
  RecordingHop next;
  int next_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &next_port);
  builder.RegisterService(&next);
  std::unique_ptr<grpc::Server> next_server = builder.BuildAndStart();
  ASSERT_TRUE(next_server);
  test_support::FakeTracker tracker;
  ServiceOptions service_options;
  service_options.tracker_key = tracker.key.public_key();
  service_options.connect_timeout = std::chrono::milliseconds(200);
  test_support::TestHop hop(path, 0, 2, "hop-1", 3, service_options);
  ASSERT_TRUE(hop.server);
  auto stub = hop.NewStub();
  grpc::ClientContext seam_context;
  auto seam = stub->Seam(&seam_context);
  const std::string next_address = "127.0.0.1:" + std::to_string(next_port);
  // A prefill of session `id` whose ticket sends it on to `node` at `address`. Its downstream
  // entry names another node at `decoy`, as a 1.0 sender could: minor 1 dials the ticket's.
  auto prefill = [&](const std::string& id, const std::string& node, const std::string& address,
                     uint32_t budget_ms, const std::string& decoy) {
    protocol::SeamFrame frame = Frame(protocol::Phase::kPrefill, 1);
    frame.session = protocol::RouteSession{id, 1};
    frame.span = protocol::TokenSpan{0, 3};
    frame.token_ids = {1, 7, 9};
    frame.budget_ms = budget_ms;
    protocol::Ticket body = tracker.Body({&hop}, 0, *frame.session);
    body.downstream_node_id = node;
    body.downstream_address = address;
    frame.ticket = tracker.Sign(body);
    frame.downstream = {protocol::DownstreamHop{"hop-decoy", decoy, protocol::ShardRange{0, 9, 0},
                                                protocol::RouteTicket{"body", "signature"}}};
    return frame;
  };
  ASSERT_TRUE(Exchange(*seam, prefill("s1", "hop-2", next_address, 600000, "127.0.0.1:1")).ok());
  std::optional<pb::SeamFrame> forwarded = next.Frame(0);
  ASSERT_TRUE(forwarded.has_value());
  EXPECT_GT(forwarded->budget_ms(), 0u);
  EXPECT_LE(forwarded->budget_ms(), 600000u);
  EXPECT_EQ(forwarded->ticket().body(), "body");  // the next hop's own ticket
  EXPECT_FALSE(forwarded->has_range());  // minor 1: the next hop's range is its ticket's
  EXPECT_EQ(forwarded->downstream_size(), 0);
  EXPECT_TRUE(forwarded->work_id().empty());
  EXPECT_FALSE(forwarded->has_expected_cache());
  EXPECT_EQ(forwarded->version().minor(), 1u);
  protocol::SeamFrame decode = Frame(protocol::Phase::kDecode, 2);
  decode.session = protocol::RouteSession{"s1", 1};
  decode.span = protocol::TokenSpan{3, 1};
  decode.token_ids = {4};
  ASSERT_TRUE(Exchange(*seam, decode).ok());
  forwarded = next.Frame(1);
  ASSERT_TRUE(forwarded.has_value());
  EXPECT_EQ(forwarded->budget_ms(), 0u);  // none given, none forwarded

  // Nothing listens on port 1, where the ticket points (the frame names the live next hop): the
  // refused connection fails the step at once.
  protocol::Status unreachable =
      Exchange(*seam, prefill("s2", "hop-x", "127.0.0.1:1", 0, next_address));
  EXPECT_EQ(unreachable.code, Code::kUnavailable) << unreachable.ToString();
  EXPECT_TRUE(unreachable.retryable);
  EXPECT_EQ(unreachable.hop, "hop-x");
  // A peer that takes the TCP connection and never speaks HTTP/2 keeps the channel connecting;
  // a budget shorter than --connect_timeout_ms ends the wait, and this hop answers for it.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(any);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&any), sizeof(any)), 0);
  ASSERT_EQ(listen(silent, 8), 0);
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&any), &length), 0);
  const std::string silent_address = "127.0.0.1:" + std::to_string(ntohs(any.sin_port));
  protocol::Status late = Exchange(*seam, prefill("s3", "hop-x", silent_address, 50, next_address));
  close(silent);
  EXPECT_EQ(late.code, Code::kDeadlineExceeded) << late.ToString();
  EXPECT_EQ(late.hop, "hop-1");
  EXPECT_EQ(hop.service->active_sessions(), 1);  // only s1: failed first steps hold nothing
  seam->WritesDone();
  seam->Finish();
  next_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace meshnet::worker
