// Tests for seam.h and status.h: field-for-field round trips of every top-level message,
// presence of empty sub-messages, canonical bytes, and the version checks of ADR 0002.
#include "cpp/protocol/seam.h"

#include <cmath>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace {

SeamFrame FullSeamFrame() {
  SeamFrame frame;
  frame.version = CurrentVersion();
  frame.work_id = "w-1";
  frame.session = RouteSession{"s-abc", 3};
  frame.fingerprints = Fingerprints{"sha256:aa", "sha256:bb"};
  frame.range = ShardRange{0, 12, 4};
  frame.phase = Phase::kPrefill;
  frame.span = TokenSpan{10, 3};
  frame.step = 2;
  frame.token_ids = {1, 300, 70000};
  frame.expected_cache = CacheState{10};
  frame.budget_ms = 250;
  SamplingParams sampling;
  sampling.temperature = 0.7f;
  sampling.top_k = 40;
  sampling.top_p = -0.0f;  // -0.0 is on the wire (bit pattern != 0) and must come back
  sampling.seed = 1ull << 60;
  sampling.max_tokens = 64;
  sampling.stop_token_ids = {2, 0};
  sampling.top_logprobs = 5;
  sampling.grammar = "root ::= \"{\" [0-9]+ \"}\"";
  sampling.grammar_tokens = {7, 0, 49151};
  frame.sampling = sampling;
  TensorFragment fragment;
  fragment.bundle_id = 9;
  fragment.index = 0;
  fragment.count = 1;
  fragment.header.emplace();
  fragment.header->compression = Compression::kNone;
  fragment.data = std::string("\x00\x01\x02", 3);
  frame.fragment = fragment;
  frame.downstream.push_back(DownstreamHop{"node-b", "127.0.0.1:7702", ShardRange{12, 24, 12}});
  frame.downstream.push_back(DownstreamHop{"node-c", "", std::nullopt});
  return frame;
}

TEST(SeamTest, SeamFrameRoundTripsEveryField) {
  const SeamFrame frame = FullSeamFrame();
  const std::string bytes = EncodeSeamFrame(frame);
  SeamFrame back;
  Status status = DecodeSeamFrame(bytes, &back);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(EncodeSeamFrame(back), bytes);
  EXPECT_EQ(back.work_id, "w-1");
  EXPECT_EQ(back.session->session_id, "s-abc");
  EXPECT_EQ(back.session->epoch, 3u);
  EXPECT_EQ(back.range->effective_start, 4u);
  EXPECT_EQ(back.phase, Phase::kPrefill);
  EXPECT_EQ(back.token_ids, frame.token_ids);
  EXPECT_EQ(back.sampling->stop_token_ids, frame.sampling->stop_token_ids);
  EXPECT_EQ(back.sampling->temperature, 0.7f);
  EXPECT_TRUE(std::signbit(back.sampling->top_p));
  EXPECT_EQ(back.sampling->grammar, frame.sampling->grammar);
  EXPECT_EQ(back.sampling->grammar_tokens, frame.sampling->grammar_tokens);
  EXPECT_EQ(back.fragment->data, frame.fragment->data);
  EXPECT_TRUE(back.fragment->header.has_value());
  EXPECT_TRUE(back.fragment->header->tensors.empty());
  ASSERT_EQ(back.downstream.size(), 2u);
  EXPECT_EQ(back.downstream[0].address, "127.0.0.1:7702");
  EXPECT_EQ(back.downstream[0].range->layer_end, 24u);
  EXPECT_FALSE(back.downstream[1].range.has_value());
}

TEST(SeamTest, EmptyAndAbsentSubMessagesStayDistinct) {
  SeamFrame frame;
  frame.version = ProtocolVersion{1, 0};
  frame.session.emplace();
  frame.expected_cache.emplace();
  frame.fragment.emplace();
  const std::string bytes = EncodeSeamFrame(frame);
  // version {major: 1}; session {}; expected_cache {}; fragment {} (fields 1, 3, 10, 13).
  EXPECT_EQ(bytes, std::string("\x0a\x02\x08\x01\x1a\x00\x52\x00\x6a\x00", 10));
  SeamFrame back;
  ASSERT_TRUE(DecodeSeamFrame(bytes, &back).ok());
  EXPECT_TRUE(back.session.has_value());
  EXPECT_TRUE(back.expected_cache.has_value());
  EXPECT_TRUE(back.fragment.has_value());
  EXPECT_FALSE(back.fragment->header.has_value());
  EXPECT_FALSE(back.fingerprints.has_value());
  EXPECT_FALSE(back.range.has_value());
  EXPECT_FALSE(back.span.has_value());
  EXPECT_FALSE(back.sampling.has_value());
}

TEST(SeamTest, DecodeSeamFrameChecksTheVersion) {
  SeamFrame frame = FullSeamFrame();
  SeamFrame out;
  out.work_id = "untouched";

  frame.version = ProtocolVersion{2, 0};
  Status status = DecodeSeamFrame(EncodeSeamFrame(frame), &out);
  EXPECT_EQ(status.code, Code::kVersionMismatch) << status.ToString();
  EXPECT_FALSE(status.retryable);
  EXPECT_FALSE(status.message.empty());
  EXPECT_EQ(out.work_id, "untouched");

  frame.version = ProtocolVersion{0, 9};
  EXPECT_EQ(DecodeSeamFrame(EncodeSeamFrame(frame), &out).code, Code::kVersionMismatch);

  frame.version.reset();
  status = DecodeSeamFrame(EncodeSeamFrame(frame), &out);
  EXPECT_EQ(status.code, Code::kInvalidArgument) << status.ToString();

  frame.version = ProtocolVersion{1, 7};  // any minor of major 1
  EXPECT_TRUE(DecodeSeamFrame(EncodeSeamFrame(frame), &out).ok());
  EXPECT_EQ(out.version->minor, 7u);
}

TEST(SeamTest, MalformedBytesAreInvalidArgument) {
  SeamFrame out;
  for (const std::string& bytes :
       {std::string("\xff\xff\xff", 3), std::string("\x0a\x05\x08", 3), std::string("\x6a", 1)}) {
    const Status status = DecodeSeamFrame(bytes, &out);
    EXPECT_EQ(status.code, Code::kInvalidArgument) << status.ToString();
    EXPECT_FALSE(status.message.empty());
  }
  EXPECT_EQ(DecodeSeamFrame("", &out).code, Code::kInvalidArgument);  // no version
}

TEST(SeamTest, UnknownFieldsAreIgnored) {
  std::string bytes = EncodeSeamFrame(FullSeamFrame());
  bytes += std::string("\xa0\x06\x2a", 3);  // field 100, varint 42: a newer minor's field
  SeamFrame out;
  ASSERT_TRUE(DecodeSeamFrame(bytes, &out).ok());
  EXPECT_EQ(EncodeSeamFrame(out), EncodeSeamFrame(FullSeamFrame()));
}

TEST(SeamTest, SeamReplyAndResultFrameRoundTrip) {
  SeamReply reply;
  reply.version = CurrentVersion();
  reply.session = RouteSession{"s", 1};
  reply.step = 4;
  reply.credits = 8;
  reply.cache = CacheState{0};
  reply.status = MakeError(Code::kCacheMismatch, "expected 10, hold 9");
  reply.status->hop = "node-b";
  reply.replayed = true;
  SeamReply reply_back;
  ASSERT_TRUE(DecodeSeamReply(EncodeSeamReply(reply), &reply_back).ok());
  EXPECT_EQ(EncodeSeamReply(reply_back), EncodeSeamReply(reply));
  EXPECT_EQ(reply_back.status->code, Code::kCacheMismatch);
  EXPECT_EQ(reply_back.status->hop, "node-b");
  EXPECT_TRUE(reply_back.cache.has_value());
  reply.version = ProtocolVersion{3, 0};
  EXPECT_EQ(DecodeSeamReply(EncodeSeamReply(reply), &reply_back).code, Code::kVersionMismatch);

  ResultFrame result;
  result.version = CurrentVersion();
  result.step = 9;
  result.tokens.push_back(SampledToken{17, 40, -0.25f, {{17, -0.25f}, {3, -2.5f}}});
  result.tokens.push_back(SampledToken{});
  result.finish_reason = FinishReason::kStop;
  result.status = OkStatus();
  ResultFrame result_back;
  ASSERT_TRUE(DecodeResultFrame(EncodeResultFrame(result), &result_back).ok());
  EXPECT_EQ(EncodeResultFrame(result_back), EncodeResultFrame(result));
  ASSERT_EQ(result_back.tokens.size(), 2u);
  EXPECT_EQ(result_back.tokens[0].top[1].logprob, -2.5f);
  EXPECT_EQ(result_back.finish_reason, FinishReason::kStop);
  EXPECT_TRUE(result_back.status->ok());
  result.version.reset();
  EXPECT_EQ(DecodeResultFrame(EncodeResultFrame(result), &result_back).code,
            Code::kInvalidArgument);
}

TEST(SeamTest, ResultsRequestRoundTripsAndNeedsVersion) {
  ResultsRequest request{CurrentVersion(), RouteSession{"s-1", 2}};
  ResultsRequest back;
  ASSERT_TRUE(DecodeResultsRequest(EncodeResultsRequest(request), &back).ok());
  EXPECT_EQ(back.session->session_id, "s-1");
  EXPECT_EQ(EncodeResultsRequest(back), EncodeResultsRequest(request));
  request.version = ProtocolVersion{2, 0};
  EXPECT_EQ(DecodeResultsRequest(EncodeResultsRequest(request), &back).code,
            Code::kVersionMismatch);
}

TEST(SeamTest, HelloRoundTripsAndVersionRules) {
  HelloRequest request;
  request.supported_versions = {ProtocolVersion{1, 0}, ProtocolVersion{2, 1}};
  request.features = {"compression.zlib", "logprobs"};
  request.peer_id = "node-a";
  HelloRequest request_back;
  ASSERT_TRUE(DecodeHelloRequest(EncodeHelloRequest(request), &request_back).ok());
  EXPECT_EQ(EncodeHelloRequest(request_back), EncodeHelloRequest(request));
  EXPECT_EQ(request_back.supported_versions[1].major, 2u);  // negotiation, not refusal

  HelloReply reply;
  reply.features = {"logprobs"};
  reply.peer_id = "node-b";
  reply.status = MakeError(Code::kVersionMismatch, "no common major");
  HelloReply reply_back;
  ASSERT_TRUE(DecodeHelloReply(EncodeHelloReply(reply), &reply_back).ok());
  EXPECT_FALSE(reply_back.chosen_version.has_value());
  EXPECT_EQ(EncodeHelloReply(reply_back), EncodeHelloReply(reply));
  reply.chosen_version = ProtocolVersion{2, 0};
  EXPECT_EQ(DecodeHelloReply(EncodeHelloReply(reply), &reply_back).code, Code::kVersionMismatch);
}

TEST(StatusTest, ProtoConversionKeepsEveryField) {
  Status status = MakeError(Code::kUnavailable, "draining", /*retryable=*/true);
  status.hop = "n1";
  meshnet::shard::v1::Status proto;
  ToProto(status, &proto);
  EXPECT_EQ(proto.code(), meshnet::shard::v1::STATUS_CODE_UNAVAILABLE);
  EXPECT_TRUE(proto.retryable());
  const Status back = FromProto(proto);
  EXPECT_EQ(back.code, Code::kUnavailable);
  EXPECT_EQ(back.message, "draining");
  EXPECT_EQ(back.hop, "n1");
  EXPECT_TRUE(back.retryable);
  EXPECT_EQ(back.ToString(), "UNAVAILABLE: draining (hop n1)");

  proto.set_code(static_cast<meshnet::shard::v1::StatusCode>(99));  // a newer minor's code
  EXPECT_EQ(static_cast<int>(FromProto(proto).code), 99);
  EXPECT_FALSE(FromProto(proto).ok());
  EXPECT_EQ(CodeName(static_cast<Code>(99)), "CODE_99");
  EXPECT_TRUE(OkStatus().ok());
  EXPECT_EQ(InvalidArgumentError("").message, "INVALID_ARGUMENT");
  EXPECT_EQ(static_cast<int>(Code::kInternal), meshnet::shard::v1::STATUS_CODE_INTERNAL);
}

}  // namespace
}  // namespace meshnet::protocol
