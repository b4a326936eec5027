// Hop admission as pure decisions (ADR 0003): each check's exact code, in isolation from
// streams and the model.
#include "cpp/worker/hop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpp/protocol/ticket_signer_for_tests.h"

namespace meshnet::worker {
namespace {

using protocol::Code;

constexpr uint64_t kNow = 1'800'000'000'000;

struct Fixture {
  protocol::FakeSigner tracker;
  HopIdentity hop;
  protocol::RouteSession session{"s", 4};
  Fixture() {
    hop.node_id = "n-mid";
    hop.layer_start = 2;
    hop.layer_end = 4;
    hop.tracker_key = tracker.public_key();
  }
  protocol::Ticket Body() const {
    protocol::Ticket body;
    body.session_id = "s";
    body.epoch = 4;
    body.node_id = "n-mid";
    body.range = protocol::ShardRange{2, 4, 2};
    body.downstream_node_id = "n-last";
    body.downstream_address = "10.0.0.2:7000";
    body.downstream_tls_certificate = "PEM";
    body.expires_unix_ms = kNow + 1000;
    return body;
  }
  Code Check(const protocol::Ticket& body) const {
    protocol::Ticket out;
    return CheckTicket(tracker.SignTicket(body), session, hop, kNow, &out).code;
  }
};

// A 1.0 sender's downstream entry that names a decoy node and address beside the ticket it lends.
protocol::DownstreamHop DecoyEntry(const std::string& ticket_body, const std::string& signature) {
  protocol::DownstreamHop entry;
  entry.node_id = "n-evil";
  entry.address = "10.6.6.6:7000";
  entry.ticket = protocol::RouteTicket{ticket_body, signature};
  return entry;
}

TEST(HopTest, FrameHeader) {
  protocol::SeamFrame frame;
  EXPECT_EQ(CheckFrameHeader(frame).code, Code::kInvalidArgument);
  frame.version = protocol::ProtocolVersion{2, 0};
  EXPECT_EQ(CheckFrameHeader(frame).code, Code::kVersionMismatch);
  frame.version = protocol::CurrentVersion();
  EXPECT_EQ(CheckFrameHeader(frame).code, Code::kInvalidArgument);
  frame.session = protocol::RouteSession{std::string(64, 'x'), 1};
  EXPECT_TRUE(CheckFrameHeader(frame).ok());
  frame.session->session_id += "x";
  EXPECT_EQ(CheckFrameHeader(frame).code, Code::kInvalidArgument);
}

TEST(HopTest, TicketFields) {
  Fixture f;
  EXPECT_EQ(f.Check(f.Body()), Code::kOk);
  protocol::Ticket out;
  EXPECT_EQ(CheckTicket(std::nullopt, f.session, f.hop, kNow, &out).code, Code::kUnauthenticated);
  protocol::FakeSigner forger;
  EXPECT_EQ(CheckTicket(forger.SignTicket(f.Body()), f.session, f.hop, kNow, &out).code,
            Code::kUnauthenticated);
  auto with = [&](auto mutate) {
    protocol::Ticket body = f.Body();
    mutate(body);
    return f.Check(body);
  };
  EXPECT_EQ(with([](auto& b) { b.session_id = "other"; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.epoch = 5; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.node_id = "n-other"; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.range.layer_start = 1; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.range.layer_end = 5; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.expires_unix_ms = kNow; }), Code::kPermissionDenied);
  EXPECT_EQ(with([](auto& b) { b.range.effective_start = 0; }), Code::kOk);  // unset
  EXPECT_EQ(with([](auto& b) { b.range.effective_start = 3; }), Code::kInvalidArgument);
}

// A GGUF hop always runs its whole registered range, so it refuses any other effective start
// (tickets and frames alike) instead of running layers a previous hop already ran.
TEST(HopTest, EffectiveStartMustBeTheRangesStart) {
  Fixture f;
  EXPECT_TRUE(CheckEffectiveStart({2, 4, 2}, f.hop).ok());
  EXPECT_TRUE(CheckEffectiveStart({2, 4, 0}, f.hop).ok());  // proto3 unset: from layer_start
  for (uint32_t b : {1u, 3u, 4u, 9u}) {
    protocol::Status status = CheckEffectiveStart({2, 4, b}, f.hop);
    EXPECT_EQ(status.code, Code::kInvalidArgument) << b;
    EXPECT_FALSE(status.retryable);
    EXPECT_EQ(status.message, "this GGUF hop runs layers [2, 4) only from 2; effective start " +
                                  std::to_string(b) +
                                  " is not supported (the tracker routes GGUF nodes at exact "
                                  "boundaries)");
  }
  protocol::Ticket body = f.Body();
  body.range.effective_start = 3;
  protocol::Ticket out;
  out.node_id = "untouched";
  protocol::Status status =
      CheckTicket(f.tracker.SignTicket(body), f.session, f.hop, kNow, &out);
  EXPECT_EQ(status.code, Code::kInvalidArgument);
  EXPECT_EQ(out.node_id, "untouched");  // nothing admitted
}

// Minor 1: the hop to dial is the ticket's; a downstream entry lends only the ticket to present,
// and what a 1.0 sender wrote beside it (node, address, range) moves nothing.
TEST(HopTest, DownstreamComesFromTheTicket) {
  Fixture f;
  const protocol::Ticket body = f.Body();
  protocol::DownstreamHop entry = DecoyEntry("next-body", "next-signature");
  entry.range = protocol::ShardRange{0, 9, 0};
  std::optional<protocol::DownstreamHop> next;
  ASSERT_TRUE(ResolveDownstream(body, {entry}, false, true, &next).ok());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->node_id, "n-last");
  EXPECT_EQ(next->address, "10.0.0.2:7000");
  EXPECT_FALSE(next->range.has_value());
  ASSERT_TRUE(next->ticket.has_value());
  EXPECT_EQ(next->ticket->body, "next-body");
  EXPECT_EQ(next->ticket->signature, "next-signature");
  protocol::DownstreamHop bare;  // a 1.1 sender's entry: the ticket alone
  bare.ticket = entry.ticket;
  next.reset();
  ASSERT_TRUE(ResolveDownstream(body, {bare}, false, true, &next).ok());
  EXPECT_EQ(next->node_id, "n-last");
  EXPECT_EQ(next->address, "10.0.0.2:7000");
}

TEST(HopTest, DownstreamRefusals) {
  Fixture f;
  protocol::Ticket body = f.Body();
  protocol::DownstreamHop entry;
  entry.ticket = protocol::RouteTicket{"next-body", "next-signature"};
  std::optional<protocol::DownstreamHop> next;
  auto code = [&](const protocol::Ticket& ticket, std::vector<protocol::DownstreamHop> list,
                  bool last, bool pinned) {
    next = protocol::DownstreamHop();  // a refusal leaves nothing to dial
    Code out = ResolveDownstream(ticket, list, last, pinned, &next).code;
    if (out != Code::kOk) {
      EXPECT_FALSE(next.has_value());
    }
    return out;
  };
  EXPECT_EQ(code(body, {}, false, true), Code::kInvalidArgument);  // nothing to present
  protocol::DownstreamHop unticketed = entry;
  unticketed.ticket.reset();
  unticketed.node_id = "n-last";
  unticketed.address = "10.0.0.2:7000";
  EXPECT_EQ(code(body, {unticketed}, false, true), Code::kInvalidArgument);
  body.downstream_tls_certificate.clear();
  EXPECT_EQ(code(body, {entry}, false, true), Code::kPermissionDenied);
  EXPECT_EQ(code(body, {entry}, false, false), Code::kOk);  // --insecure: no pin
  protocol::Ticket last = f.Body();
  last.downstream_node_id.clear();
  last.downstream_address.clear();
  last.downstream_tls_certificate.clear();
  EXPECT_EQ(code(last, {}, true, true), Code::kOk);
  EXPECT_FALSE(next.has_value());
  EXPECT_EQ(code(last, {entry}, true, true), Code::kPermissionDenied);  // admits no downstream
  EXPECT_EQ(code(last, {}, false, true), Code::kPermissionDenied);  // but this hop forwards
}

// The last hop of a ringing route: its ticket names the first hop; the frame's list holds the
// first hop's ticket alone, or nothing when the route does not ring.
TEST(HopTest, LastHopRingsToTheTicketsFirstHop) {
  Fixture f;
  f.hop.last = true;
  protocol::Ticket body = f.Body();
  body.downstream_node_id = "n-first";
  body.downstream_address = "10.0.0.1:7000";
  protocol::DownstreamHop entry = DecoyEntry("first-body", "first-signature");
  std::optional<protocol::DownstreamHop> next;
  ASSERT_TRUE(ResolveDownstream(body, {entry}, true, true, &next).ok());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->node_id, "n-first");
  EXPECT_EQ(next->address, "10.0.0.1:7000");
  EXPECT_EQ(next->ticket->body, "first-body");
  ASSERT_TRUE(ResolveDownstream(body, {}, true, true, &next).ok());
  EXPECT_FALSE(next.has_value());  // no ring
  entry.ticket.reset();
  EXPECT_EQ(ResolveDownstream(body, {entry}, true, true, &next).code, Code::kInvalidArgument);
  entry.ticket = protocol::RouteTicket{"first-body", "first-signature"};
  body.downstream_tls_certificate.clear();
  EXPECT_EQ(ResolveDownstream(body, {entry}, true, true, &next).code, Code::kPermissionDenied);
}

TEST(HopTest, ResultsRequestNeedsTicketAndClientSignature) {
  Fixture f;
  f.hop.last = true;
  protocol::FakeSigner client, stranger;
  protocol::Ticket body = f.Body();
  body.downstream_node_id.clear();
  body.client_public_key = client.public_key_bytes();
  protocol::ResultsRequest request;
  request.version = protocol::CurrentVersion();
  request.session = f.session;
  protocol::Ticket out;
  EXPECT_EQ(CheckResultsRequest(request, f.hop, kNow, &out).code, Code::kUnauthenticated);
  request.ticket = f.tracker.SignTicket(body);
  EXPECT_EQ(CheckResultsRequest(request, f.hop, kNow, &out).code, Code::kPermissionDenied);
  request.client_signature = stranger.SignResults(*request.ticket);
  EXPECT_EQ(CheckResultsRequest(request, f.hop, kNow, &out).code, Code::kPermissionDenied);
  request.client_signature = client.SignResults(*request.ticket);
  EXPECT_TRUE(CheckResultsRequest(request, f.hop, kNow, &out).ok());
  request.session->epoch = 5;
  EXPECT_EQ(CheckResultsRequest(request, f.hop, kNow, &out).code, Code::kPermissionDenied);
}

TEST(HopTest, StepLimitsBoundTheBundle) {
  EXPECT_EQ(StepLimits(1, 32, false).max_bundle_bytes, 128u);
  EXPECT_EQ(StepLimits(3, 32, false).max_bundle_bytes, 384u);
  EXPECT_GT(StepLimits(1, 32, true).max_bundle_bytes, 128u);
  EXPECT_LT(StepLimits(1, 32, true).max_bundle_bytes, 256u);
  protocol::TensorFragment fragment;
  fragment.header = protocol::BundleHeader();
  fragment.header->compression = protocol::Compression::kZlib;
  EXPECT_EQ(CheckFragment(fragment, false).code, Code::kInvalidArgument);
  EXPECT_TRUE(CheckFragment(fragment, true).ok());
}

TEST(HopTest, NonFiniteActivationsAreRefused) {
  EXPECT_TRUE(CheckFinite({0.0f, -1.0f, 3.5f}, 3).ok());
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    protocol::Status status = CheckFinite({0.0f, 1.0f, 2.0f, bad}, 2);
    EXPECT_EQ(status.code, Code::kInvalidArgument);
    EXPECT_NE(status.message.find("row 1, column 1"), std::string::npos) << status.message;
  }
}

}  // namespace
}  // namespace meshnet::worker
