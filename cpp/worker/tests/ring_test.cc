// Ring decode's trust boundary (docs/adr/0005-ring-decode.md) on one whole-model hop that rings
// to itself: an honest ring session gets the whole model's greedy tokens without the client
// sending a decode step, and ring steps are refused with the exact code when they name a
// session that is not open here (NOT_FOUND, nothing created), bring no ticket
// (UNAUTHENTICATED), or come on a second ring stream (PERMISSION_DENIED); drafts outside a ring
// step are INVALID_ARGUMENT. The honest session beside them is unharmed.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpp/worker/service.h"
#include "cpp/worker/tests/test_hop.h"

namespace meshnet::worker {
namespace {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using test_support::Exchange;

protocol::SeamFrame Frame(const protocol::RouteSession& session, protocol::Phase phase, uint64_t step) {
  return test_support::NewFrame(session, phase, step);
}

struct Harness {
  explicit Harness(const std::string& path) {
    ServiceOptions options;
    options.tracker_key = tracker.key.public_key();
    options.sessions.max_sessions = 4;
    hop = std::make_unique<test_support::TestHop>(path, 0, -1, "hop-1", 4, options);
    route = {hop.get()};
    stub = hop->NewStub();
  }
  // The hop's ticket for `session`; with `ring`, it names the hop itself as its downstream, as
  // the tracker does for the last hop of a ring-capable route.
  protocol::RouteTicket Ticket(const protocol::RouteSession& session, bool ring) const {
    protocol::Ticket body = tracker.Body(route, 0, session);
    if (ring) {
      body.downstream_node_id = hop->id;
      body.downstream_address = hop->address();
    }
    return tracker.Sign(body);
  }
  protocol::SeamFrame Prefill(const protocol::RouteSession& session, const std::vector<int32_t>& prompt,
                              bool ring, uint32_t max_tokens) const {
    protocol::SeamFrame frame = Frame(session, protocol::Phase::kPrefill, 1);
    frame.span = protocol::TokenSpan{0, static_cast<uint32_t>(prompt.size())};
    frame.token_ids.assign(prompt.begin(), prompt.end());
    frame.sampling = protocol::SamplingParams();
    frame.sampling->max_tokens = max_tokens;
    frame.ticket = Ticket(session, ring);
    frame.ring = ring;
    if (ring) {
      protocol::DownstreamHop self;
      self.ticket = frame.ticket;
      // What a 1.0 sender may have written beside the ticket; the ring dials the ticket's.
      self.node_id = "hop-elsewhere";
      self.address = "127.0.0.1:1";
      frame.downstream = {self};
    }
    return frame;
  }

  test_support::FakeTracker tracker;
  std::unique_ptr<test_support::TestHop> hop;
  std::vector<const test_support::TestHop*> route;
  std::unique_ptr<pb::Shard::Stub> stub;
};

TEST(RingTest, RingStepsNeedALiveSessionTheHopsTicketAndOneRingStream) {
  const std::string path = test_support::WriteFixture("ring_test_tiny.gguf");
  const std::vector<int32_t> prompt = {1, 7, 9, 12, 20, 3};
  const int n = 4;
  const std::vector<uint32_t> expected = test_support::WholeModelGreedy(path, prompt, n);
  Harness h(path);
  ASSERT_TRUE(h.hop->server);

  // The honest ring session: the client sends the prefill and reads n tokens; the hop ends the
  // ring at max_tokens with LENGTH.
  const protocol::RouteSession honest{"honest", 1};
  grpc::ClientContext results_context;
  auto results = h.stub->Results(&results_context, h.tracker.Results(h.route, honest));
  grpc::ClientContext client_context;
  auto client = h.stub->Seam(&client_context);
  ASSERT_TRUE(Exchange(*client, h.Prefill(honest, prompt, true, n)).ok());
  std::vector<uint32_t> tokens;
  protocol::FinishReason finish = protocol::FinishReason::kUnspecified;
  while (finish == protocol::FinishReason::kUnspecified) {
    pb::ResultFrame message;
    ASSERT_TRUE(results->Read(&message));
    protocol::ResultFrame frame;
    protocol::FromProto(message, &frame);
    ASSERT_EQ(frame.tokens.size(), 1u);
    tokens.push_back(frame.tokens[0].token_id);
    finish = frame.finish_reason;
  }
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(finish, protocol::FinishReason::kLength);
  const uint64_t length = prompt.size() + n - 1;  // the last token was never fed back
  EXPECT_EQ(h.hop->scheduler->Stats().kv_cells_used, length);

  auto ring_step = [&](const protocol::RouteSession& session, uint64_t position, bool ticket) {
    protocol::SeamFrame frame = Frame(session, protocol::Phase::kDecode, 100);
    frame.ring = true;
    frame.span = protocol::TokenSpan{position, 1};
    frame.token_ids = {5};
    if (ticket) frame.ticket = h.Ticket(session, true);
    return frame;
  };
  {  // a session that is not open here: refused, and nothing is created for it
    grpc::ClientContext context;
    auto intruder = h.stub->Seam(&context);
    EXPECT_EQ(Exchange(*intruder, ring_step({"ghost", 1}, 0, true)).code, Code::kNotFound);
    EXPECT_EQ(h.hop->service->active_sessions(), 1);
    intruder->WritesDone();
    intruder->Finish();
  }
  {  // the honest session already has its ring stream (the hop's own): a second one is refused
    grpc::ClientContext context;
    auto intruder = h.stub->Seam(&context);
    EXPECT_EQ(Exchange(*intruder, ring_step(honest, length, true)).code, Code::kPermissionDenied);
    intruder->WritesDone();
    intruder->Finish();
  }
  // A second session, client-driven: a ring step for it without a ticket is refused.
  const protocol::RouteSession other{"other", 1};
  grpc::ClientContext other_context;
  auto other_client = h.stub->Seam(&other_context);
  ASSERT_TRUE(Exchange(*other_client, h.Prefill(other, prompt, false, 0)).ok());
  {
    grpc::ClientContext context;
    auto intruder = h.stub->Seam(&context);
    EXPECT_EQ(Exchange(*intruder, ring_step(other, prompt.size(), false)).code, Code::kUnauthenticated);
    intruder->WritesDone();
    intruder->Finish();
  }
  // Drafts ride only on ring decode steps.
  protocol::SeamFrame drafted = Frame(other, protocol::Phase::kDecode, 2);
  drafted.span = protocol::TokenSpan{prompt.size(), 2};
  drafted.token_ids = {5, 6};
  drafted.draft_token_ids = {6};
  EXPECT_EQ(Exchange(*other_client, drafted).code, Code::kInvalidArgument);

  // Nothing above touched the honest session: it still holds its KV and releases cleanly.
  EXPECT_EQ(h.hop->service->active_sessions(), 2);
  EXPECT_TRUE(Exchange(*client, Frame(honest, protocol::Phase::kRelease, uint64_t{1} << 62)).ok());
  EXPECT_TRUE(Exchange(*other_client, Frame(other, protocol::Phase::kRelease, uint64_t{1} << 62)).ok());
  for (int i = 0; i < 100 && h.hop->scheduler->Stats().kv_cells_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(h.hop->service->active_sessions(), 0);
  EXPECT_EQ(h.hop->scheduler->Stats().kv_cells_used, 0u);
  for (auto* stream : {client.get(), other_client.get()}) {
    stream->WritesDone();
    stream->Finish();
  }
  results_context.TryCancel();
}

}  // namespace
}  // namespace meshnet::worker
