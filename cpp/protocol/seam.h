// The seam protocol's wire codec: the native messages of cpp/wire/seam.h to and from
// meshnet.shard.v1 protobufs and bytes. Callers inside the worker hold only the native structs;
// *.pb.h stops in cpp/protocol (the pb types below are forward-declared for the conversion
// functions only).
//
// Invariants: Encode* is deterministic, so Decode then Encode reproduces canonical bytes (fields
// unknown to this build are dropped on decode); absent sub-messages stay std::nullopt.
#ifndef MESHNET_CPP_PROTOCOL_SEAM_H_
#define MESHNET_CPP_PROTOCOL_SEAM_H_

#include <string>
#include <string_view>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/status.h"
#include "cpp/wire/seam.h"

namespace meshnet::shard::v1 {
class CacheState;
class DownstreamHop;
class Fingerprints;
class HelloReply;
class HelloRequest;
class ProtocolVersion;
class ResultFrame;
class ResultsRequest;
class RouteSession;
class RouteTicket;
class SampledToken;
class SamplingParams;
class SeamFrame;
class SeamReply;
class ShardRange;
class TokenLogprob;
class TokenSpan;
}  // namespace meshnet::shard::v1

namespace meshnet::protocol {

// Field-for-field conversions (ToProto clears *out first; FromProto replaces *out).
void ToProto(const ProtocolVersion& in, meshnet::shard::v1::ProtocolVersion* out);
void ToProto(const RouteSession& in, meshnet::shard::v1::RouteSession* out);
void ToProto(const Fingerprints& in, meshnet::shard::v1::Fingerprints* out);
void ToProto(const ShardRange& in, meshnet::shard::v1::ShardRange* out);
void ToProto(const TokenSpan& in, meshnet::shard::v1::TokenSpan* out);
void ToProto(const CacheState& in, meshnet::shard::v1::CacheState* out);
void ToProto(const SamplingParams& in, meshnet::shard::v1::SamplingParams* out);
void ToProto(const TokenLogprob& in, meshnet::shard::v1::TokenLogprob* out);
void ToProto(const SampledToken& in, meshnet::shard::v1::SampledToken* out);
void ToProto(const RouteTicket& in, meshnet::shard::v1::RouteTicket* out);
void ToProto(const DownstreamHop& in, meshnet::shard::v1::DownstreamHop* out);
void ToProto(const SeamFrame& in, meshnet::shard::v1::SeamFrame* out);
void ToProto(const SeamReply& in, meshnet::shard::v1::SeamReply* out);
void ToProto(const ResultFrame& in, meshnet::shard::v1::ResultFrame* out);
void ToProto(const ResultsRequest& in, meshnet::shard::v1::ResultsRequest* out);
void ToProto(const HelloRequest& in, meshnet::shard::v1::HelloRequest* out);
void ToProto(const HelloReply& in, meshnet::shard::v1::HelloReply* out);
void FromProto(const meshnet::shard::v1::ProtocolVersion& in, ProtocolVersion* out);
void FromProto(const meshnet::shard::v1::RouteSession& in, RouteSession* out);
void FromProto(const meshnet::shard::v1::Fingerprints& in, Fingerprints* out);
void FromProto(const meshnet::shard::v1::ShardRange& in, ShardRange* out);
void FromProto(const meshnet::shard::v1::TokenSpan& in, TokenSpan* out);
void FromProto(const meshnet::shard::v1::CacheState& in, CacheState* out);
void FromProto(const meshnet::shard::v1::SamplingParams& in, SamplingParams* out);
void FromProto(const meshnet::shard::v1::TokenLogprob& in, TokenLogprob* out);
void FromProto(const meshnet::shard::v1::SampledToken& in, SampledToken* out);
void FromProto(const meshnet::shard::v1::RouteTicket& in, RouteTicket* out);
void FromProto(const meshnet::shard::v1::DownstreamHop& in, DownstreamHop* out);
void FromProto(const meshnet::shard::v1::SeamFrame& in, SeamFrame* out);
void FromProto(const meshnet::shard::v1::SeamReply& in, SeamReply* out);
void FromProto(const meshnet::shard::v1::ResultFrame& in, ResultFrame* out);
void FromProto(const meshnet::shard::v1::ResultsRequest& in, ResultsRequest* out);
void FromProto(const meshnet::shard::v1::HelloRequest& in, HelloRequest* out);
void FromProto(const meshnet::shard::v1::HelloReply& in, HelloReply* out);

// Decode*: INVALID_ARGUMENT for bytes that do not parse. SeamFrame, SeamReply, ResultFrame and
// ResultsRequest need a version (absent: INVALID_ARGUMENT) of major 1 (else VERSION_MISMATCH);
// a HelloReply's chosen_version, if present, must be major 1; a HelloRequest is not refused
// (its versions are for negotiation). *out is replaced only on success.
// Encode*: deterministic serialization.
Status DecodeSeamFrame(std::string_view bytes, SeamFrame* out);
Status DecodeSeamReply(std::string_view bytes, SeamReply* out);
Status DecodeResultFrame(std::string_view bytes, ResultFrame* out);
Status DecodeResultsRequest(std::string_view bytes, ResultsRequest* out);
Status DecodeHelloRequest(std::string_view bytes, HelloRequest* out);
Status DecodeHelloReply(std::string_view bytes, HelloReply* out);
std::string EncodeSeamFrame(const SeamFrame& frame);
std::string EncodeSeamReply(const SeamReply& reply);
std::string EncodeResultFrame(const ResultFrame& frame);
std::string EncodeResultsRequest(const ResultsRequest& request);
std::string EncodeHelloRequest(const HelloRequest& request);
std::string EncodeHelloReply(const HelloReply& reply);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_SEAM_H_
