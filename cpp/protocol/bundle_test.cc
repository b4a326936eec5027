// Tests for tensor.h and bundle.h: round trips at the sizes the seam carries, the canonical
// layout of ADR 0002, f16/bf16 rounding edge cases, and every reassembly error class.
#include "cpp/protocol/bundle.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace {

constexpr uint64_t kMiB = 1 << 20;

Tensor RandomTensor(const std::string& name, DType dtype, std::vector<uint64_t> shape,
                    uint64_t seed) {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  std::vector<float> values(count);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : values) v = normal(rng);
  return TensorFromFloats(name, dtype, std::move(shape), values.data());
}

void ExpectSameTensors(const std::vector<Tensor>& want, const std::vector<Tensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].name, got[i].name);
    EXPECT_EQ(want[i].dtype, got[i].dtype);
    EXPECT_EQ(want[i].shape, got[i].shape);
    EXPECT_TRUE(want[i].bytes == got[i].bytes) << "tensor " << i << " bytes differ";
  }
}

std::vector<TensorFragment> MustEncode(const std::vector<Tensor>& tensors, uint64_t fragment_bytes,
                                       Compression compression = Compression::kNone,
                                       uint64_t bundle_id = 7) {
  std::vector<TensorFragment> fragments;
  Status status = EncodeBundle(tensors, bundle_id, compression, fragment_bytes, Limits(),
                               &fragments);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return fragments;
}

// Feeds every fragment; returns the first non-OK status of Add, else Take's.
Status Reassemble(const std::vector<TensorFragment>& fragments, std::vector<Tensor>* out,
                  Limits limits = Limits()) {
  Reassembler reassembler(limits);
  for (const TensorFragment& fragment : fragments) {
    Status status = reassembler.Add(fragment);
    if (!status.ok()) return status;
  }
  if (!reassembler.complete()) return InvalidArgumentError("test: bundle not complete");
  return reassembler.Take(out);
}

// ---- round trips ------------------------------------------------------------------------

using RoundTripParam = std::tuple<DType, std::vector<uint64_t>, Compression>;
class RoundTripTest : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(RoundTripTest, ReassemblesIdenticalBytesWithinFragmentLimit) {
  const auto& [dtype, shape, compression] = GetParam();
  const std::vector<Tensor> tensors = {RandomTensor("hidden_states", dtype, shape, 42)};
  Limits limits;
  std::vector<meshnet::shard::v1::TensorFragment> fragments;
  Status status =
      EncodeBundle(tensors, 99, compression, limits.max_fragment_bytes, limits, &fragments);
  ASSERT_TRUE(status.ok()) << status.ToString();

  const auto& header = fragments[0].header();
  const uint64_t expected_count =
      (header.wire_bytes() + limits.max_fragment_bytes - 1) / limits.max_fragment_bytes;
  ASSERT_EQ(fragments.size(), expected_count);
  EXPECT_EQ(header.payload_bytes(), tensors[0].bytes.size());
  EXPECT_EQ(header.compression(), static_cast<int>(compression));
  if (compression == Compression::kNone) {
    EXPECT_EQ(header.wire_bytes(), header.payload_bytes());
  }
  uint64_t total = 0;
  Reassembler reassembler(limits);
  for (size_t i = 0; i < fragments.size(); ++i) {
    EXPECT_LE(fragments[i].data().size(), limits.max_fragment_bytes);
    EXPECT_EQ(fragments[i].has_header(), i == 0);
    EXPECT_EQ(fragments[i].index(), i);
    EXPECT_EQ(fragments[i].count(), fragments.size());
    EXPECT_EQ(fragments[i].bundle_id(), 99u);
    total += fragments[i].data().size();
    EXPECT_FALSE(reassembler.complete());
    status = reassembler.Add(fragments[i]);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  EXPECT_EQ(total, header.wire_bytes());
  ASSERT_TRUE(reassembler.complete());
  std::vector<Tensor> got;
  status = reassembler.Take(&got);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectSameTensors(tensors, got);
  EXPECT_FALSE(reassembler.complete());
  EXPECT_TRUE(reassembler.Finish().ok());
}

const std::vector<uint64_t> kSmall = {1, 576};
const std::vector<uint64_t> kStep = {7, 576};
const std::vector<uint64_t> kChunk = {128, 2048};
const std::vector<uint64_t> kPrefill = {4096, 8192};

INSTANTIATE_TEST_SUITE_P(
    Shapes, RoundTripTest,
    ::testing::Values(
        RoundTripParam{DType::kF32, kSmall, Compression::kNone},
        RoundTripParam{DType::kF16, kSmall, Compression::kNone},
        RoundTripParam{DType::kBF16, kSmall, Compression::kNone},
        RoundTripParam{DType::kF32, kStep, Compression::kNone},
        RoundTripParam{DType::kF16, kStep, Compression::kNone},
        RoundTripParam{DType::kBF16, kStep, Compression::kNone},
        RoundTripParam{DType::kF32, kChunk, Compression::kNone},
        RoundTripParam{DType::kF16, kChunk, Compression::kNone},
        RoundTripParam{DType::kBF16, kChunk, Compression::kNone},
        RoundTripParam{DType::kF32, kPrefill, Compression::kNone},
        RoundTripParam{DType::kF16, kPrefill, Compression::kNone},
        RoundTripParam{DType::kBF16, kPrefill, Compression::kNone},
        RoundTripParam{DType::kF32, kSmall, Compression::kZlib},
        RoundTripParam{DType::kF16, kStep, Compression::kZlib},
        RoundTripParam{DType::kBF16, kStep, Compression::kZlib},
        RoundTripParam{DType::kF32, kChunk, Compression::kZlib},
        RoundTripParam{DType::kF16, kChunk, Compression::kZlib},
        RoundTripParam{DType::kBF16, kChunk, Compression::kZlib}));

TEST(BundleTest, F16PrefillIsSixtyFourFullFragments) {
  std::vector<TensorFragment> fragments =
      MustEncode({RandomTensor("h", DType::kF16, kPrefill, 1)}, kMiB);
  ASSERT_EQ(fragments.size(), 64u);
  for (const TensorFragment& fragment : fragments) EXPECT_EQ(fragment.data.size(), kMiB);
}

TEST(BundleTest, MultipleTensorsKeepOrderAndOffsets) {
  const std::vector<Tensor> tensors = {
      RandomTensor("hidden_states", DType::kF32, {7, 576}, 1),
      RandomTensor("residual", DType::kF16, {7, 576}, 2),
      RandomTensor("attn_bias", DType::kBF16, {1, 7, 2, 3}, 3),
  };
  for (Compression compression : {Compression::kNone, Compression::kZlib}) {
    std::vector<TensorFragment> fragments = MustEncode(tensors, 1000, compression);
    ASSERT_FALSE(fragments.empty());
    const BundleHeader& header = *fragments[0].header;
    ASSERT_EQ(header.tensors.size(), 3u);
    EXPECT_EQ(header.tensors[0].offset, 0u);
    EXPECT_EQ(header.tensors[1].offset, 7u * 576 * 4);
    EXPECT_EQ(header.tensors[2].offset, 7u * 576 * 4 + 7u * 576 * 2);
    EXPECT_EQ(header.payload_bytes, 7u * 576 * 6 + 42 * 2);
    for (const TensorFragment& fragment : fragments) EXPECT_LE(fragment.data.size(), 1000u);
    std::vector<Tensor> got;
    Status status = Reassemble(fragments, &got);
    ASSERT_TRUE(status.ok()) << status.ToString();
    ExpectSameTensors(tensors, got);
  }
}

TEST(BundleTest, CanonicalLayoutOfASmallBundle) {
  const float values[] = {1.0f, -2.0f, 0.5f, 65504.0f, 0.0f};
  const std::vector<Tensor> tensors = {TensorFromFloats("x", DType::kF16, {5}, values)};
  const std::vector<uint8_t> bytes = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b, 0x00, 0x00};
  ASSERT_EQ(tensors[0].bytes, bytes);
  std::vector<TensorFragment> fragments = MustEncode(tensors, 4, Compression::kNone, 5);
  ASSERT_EQ(fragments.size(), 3u);
  EXPECT_EQ(fragments[0].data, std::string("\x00\x3c\x00\xc0", 4));
  EXPECT_EQ(fragments[1].data, std::string("\x00\x38\xff\x7b", 4));
  EXPECT_EQ(fragments[2].data, std::string("\x00\x00", 2));
  const TensorSpec& spec = fragments[0].header->tensors[0];
  EXPECT_EQ(spec.byte_order, ByteOrder::kLittle);
  EXPECT_EQ(spec.length, 10u);
  EXPECT_EQ(spec.crc32, crc32(0, bytes.data(), bytes.size()));
  EXPECT_EQ(fragments[0].header->compression, Compression::kNone);
  EXPECT_EQ(fragments[0].header->wire_bytes, 10u);
  EXPECT_FALSE(fragments[1].header.has_value());
  // CRC-32/ISO-HDLC check value, the one the ADR names.
  const char kCheck[] = "123456789";
  EXPECT_EQ(crc32(0, reinterpret_cast<const Bytef*>(kCheck), 9), 0xcbf43926u);
}

TEST(BundleTest, ZlibWirePayloadIsLevelOneStreamOfPayload) {
  const std::vector<Tensor> tensors = {RandomTensor("x", DType::kBF16, {7, 576}, 9)};
  std::vector<TensorFragment> fragments = MustEncode(tensors, kMiB, Compression::kZlib);
  ASSERT_EQ(fragments.size(), 1u);
  std::vector<uint8_t> expected(compressBound(tensors[0].bytes.size()));
  uLongf size = expected.size();
  ASSERT_EQ(compress2(expected.data(), &size, tensors[0].bytes.data(), tensors[0].bytes.size(), 1),
            Z_OK);
  expected.resize(size);
  EXPECT_EQ(fragments[0].data, std::string(expected.begin(), expected.end()));
  EXPECT_EQ(fragments[0].header->wire_bytes, size);
}

TEST(BundleTest, FragmentsAfterTheFirstMayArriveInAnyOrder) {
  const std::vector<Tensor> tensors = {RandomTensor("h", DType::kF32, {5, 9}, 8)};
  std::vector<TensorFragment> fragments = MustEncode(tensors, 40);
  ASSERT_EQ(fragments.size(), 5u);
  std::swap(fragments[1], fragments[4]);
  std::swap(fragments[2], fragments[3]);
  std::vector<Tensor> got;
  Status status = Reassemble(fragments, &got);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectSameTensors(tensors, got);
}

TEST(BundleTest, BigEndianTensorsComeOutLittleEndian) {
  const Tensor f32 = RandomTensor("a", DType::kF32, {3, 5}, 4);
  const Tensor f16 = RandomTensor("b", DType::kF16, {4}, 5);
  std::vector<TensorFragment> fragments = MustEncode({f32, f16}, kMiB);
  ASSERT_EQ(fragments.size(), 1u);
  std::string& data = fragments[0].data;
  for (size_t i = 0; i < f32.bytes.size(); i += 4) std::reverse(&data[i], &data[i + 4]);
  for (size_t i = f32.bytes.size(); i < data.size(); i += 2) std::swap(data[i], data[i + 1]);
  for (TensorSpec& spec : fragments[0].header->tensors) {
    spec.byte_order = ByteOrder::kBig;
    spec.crc32 = crc32(0, reinterpret_cast<const Bytef*>(data.data()) + spec.offset, spec.length);
  }
  std::vector<Tensor> got;
  Status status = Reassemble(fragments, &got);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectSameTensors({f32, f16}, got);
}

TEST(BundleTest, ProtoConversionRoundTripsFragments) {
  std::vector<TensorFragment> fragments =
      MustEncode({RandomTensor("x", DType::kF16, {3, 3}, 2)}, 4, Compression::kNone);
  for (const TensorFragment& fragment : fragments) {
    meshnet::shard::v1::TensorFragment proto;
    ToProto(fragment, &proto);
    TensorFragment back;
    FromProto(proto, &back);
    meshnet::shard::v1::TensorFragment again;
    ToProto(back, &again);
    EXPECT_EQ(proto.SerializeAsString(), again.SerializeAsString());
    EXPECT_EQ(back.header.has_value(), fragment.index == 0);
  }
  TensorFragment empty_header;
  empty_header.header.emplace();
  meshnet::shard::v1::TensorFragment proto;
  ToProto(empty_header, &proto);
  EXPECT_TRUE(proto.has_header());
}

TEST(BundleTest, LimitsDefaultsMatchTheAdr) {
  Limits limits;
  EXPECT_EQ(limits.max_fragment_bytes, 1048576u);
  EXPECT_EQ(limits.max_bundle_bytes, 268435456u);
  EXPECT_EQ(limits.max_tensors, 16u);
  EXPECT_EQ(limits.max_rank, 4u);
  EXPECT_EQ(limits.max_name_bytes, 128u);
  EXPECT_EQ(limits.max_fragments(), 256u);
  limits.max_fragment_bytes = 1000;
  limits.max_bundle_bytes = 2001;
  EXPECT_EQ(limits.max_fragments(), 3u);
}

// ---- f16 / bf16 conversions -------------------------------------------------------------

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

TEST(ConversionTest, HalfEdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalfBits(inf), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalfBits(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);     // max finite
  EXPECT_EQ(FloatToHalfBits(65519.99f), 0x7bff);    // below the halfway point to 2^16
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);     // halfway: ties to even = inf
  EXPECT_EQ(FloatToHalfBits(-1e9f), 0xfc00);        // overflow
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(FloatToHalfBits(std::ldexp(3.0f, -25)), 0x0002);  // tie to even (2)
  EXPECT_EQ(FloatToHalfBits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalfBits(-std::ldexp(1023.0f, -24)), 0x83ff);  // largest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(2047.0f, -25)), 0x0400);   // rounds up to normal
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even stays
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, rounds to even
  EXPECT_EQ(FloatToHalfBits(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalfBits(FromBits(0x7fc00000)), 0x7e00);  // quiet NaN
  EXPECT_EQ(FloatToHalfBits(FromBits(0xff800001)), 0xfc01);  // payload only in low bits
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(std::nanf("")))));
}

TEST(ConversionTest, HalfWideningIsExact) {
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfBitsToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(HalfBitsToFloat(0x8000)));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {  // f16 -> f32 -> f16 is the identity
    ASSERT_EQ(FloatToHalfBits(HalfBitsToFloat(static_cast<uint16_t>(bits))), bits);
  }
}

TEST(ConversionTest, BFloat16EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // tie, rounds up
  EXPECT_EQ(FloatToBFloat16Bits(inf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16Bits(-inf), 0xff80);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7f7f0000)), 0x7f7f);               // max finite
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x000116c2)), 0x0001);               // subnormal
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0xffc00001)), 0x7fc0);               // NaN
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7f800001)), 0x7fc0);               // NaN
  EXPECT_EQ(BFloat16BitsToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(0x7fc0)));
}

TEST(ConversionTest, TensorsConvertAndWiden) {
  const float values[] = {1.5f, -0.0f, 3.14159265f, 1e-6f};
  const Tensor f32 = TensorFromFloats("a", DType::kF32, {2, 2}, values);
  EXPECT_EQ(f32.bytes.size(), 16u);
  const std::vector<float> back = TensorToFloats(f32);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(std::memcmp(back.data(), values, 16), 0);
  const Tensor f16 = TensorFromFloats("b", DType::kF16, {4}, values);
  EXPECT_EQ(f16.bytes[0], 0x00);
  EXPECT_EQ(f16.bytes[1], 0x3e);  // 1.5 = 0x3e00, little-endian
  const std::vector<float> widened = TensorToFloats(f16);
  ASSERT_EQ(widened.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(widened[i], HalfBitsToFloat(FloatToHalfBits(values[i])));
  const Tensor bf16 = TensorFromFloats("c", DType::kBF16, {4}, values);
  EXPECT_EQ(TensorToFloats(bf16)[2], BFloat16BitsToFloat(FloatToBFloat16Bits(values[2])));
  EXPECT_TRUE(TensorFromFloats("d", static_cast<DType>(9), {4}, values).bytes.empty());
  EXPECT_EQ(ItemSize(DType::kF32), 4u);
  EXPECT_EQ(ItemSize(DType::kBF16), 2u);
  EXPECT_EQ(ItemSize(DType::kUnspecified), 0u);
}

// ---- errors -----------------------------------------------------------------------------

#define EXPECT_CODE(expr, want_code)                                        \
  do {                                                                      \
    const Status status_ = (expr);                                          \
    EXPECT_EQ(status_.code, want_code) << status_.ToString();               \
    EXPECT_EQ(status_.message.empty(), status_.ok());                       \
  } while (0)

// A valid bundle of 64 payload bytes in fragments of 25, 25 and 14 bytes.
std::vector<TensorFragment> ThreeFragments(uint64_t bundle_id = 7) {
  return MustEncode({RandomTensor("h", DType::kF16, {4, 8}, 1)}, 25, Compression::kNone,
                    bundle_id);
}

// Adds fragments in order and returns the first error, or Take's status.
Status AddAllAndTake(const std::vector<TensorFragment>& fragments, Limits limits = Limits()) {
  std::vector<Tensor> got;
  return Reassemble(fragments, &got, limits);
}

Status AddOnly(const std::vector<TensorFragment>& fragments) {
  Reassembler reassembler;
  for (const TensorFragment& fragment : fragments) {
    Status status = reassembler.Add(fragment);
    if (!status.ok()) return status;
  }
  return OkStatus();
}

TEST(EncodeErrorTest, RefusesBadTensors) {
  const Limits limits;
  std::vector<TensorFragment> out;
  auto encode = [&](std::vector<Tensor> tensors, uint64_t fragment_bytes = kMiB) {
    return EncodeBundle(tensors, 1, Compression::kNone, fragment_bytes, limits, &out);
  };
  Tensor good = RandomTensor("x", DType::kF16, {2, 3}, 1);
  EXPECT_CODE(encode({good}), Code::kOk);

  Tensor short_bytes = good;
  short_bytes.bytes.pop_back();
  EXPECT_CODE(encode({short_bytes}), Code::kInvalidArgument);  // shape/byte-count mismatch
  Tensor unknown_dtype = good;
  unknown_dtype.dtype = static_cast<DType>(7);
  EXPECT_CODE(encode({unknown_dtype}), Code::kInvalidArgument);
  EXPECT_CODE(encode({RandomTensor("x", DType::kF32, {1, 1, 1, 1, 2}, 1)}),
              Code::kInvalidArgument);  // rank 5
  EXPECT_CODE(encode({RandomTensor("x", DType::kF32, {}, 1)}), Code::kInvalidArgument);
  EXPECT_CODE(encode({RandomTensor("x", DType::kF32, {2, 0}, 1)}), Code::kInvalidArgument);
  EXPECT_CODE(encode({RandomTensor("", DType::kF32, {2}, 1)}), Code::kInvalidArgument);
  EXPECT_CODE(encode({RandomTensor(std::string(129, 'n'), DType::kF32, {2}, 1)}),
              Code::kInvalidArgument);
  EXPECT_CODE(encode({RandomTensor(std::string(128, 'n'), DType::kF32, {2}, 1)}), Code::kOk);
  EXPECT_CODE(encode({RandomTensor("bad\xff", DType::kF32, {2}, 1)}), Code::kInvalidArgument);
  EXPECT_CODE(encode({}), Code::kInvalidArgument);
  EXPECT_CODE(encode(std::vector<Tensor>(17, good)), Code::kResourceExhausted);
  EXPECT_CODE(encode(std::vector<Tensor>(16, good)), Code::kOk);
  EXPECT_CODE(encode({good}, 0), Code::kInvalidArgument);
  EXPECT_CODE(encode({good}, kMiB + 1), Code::kResourceExhausted);
  EXPECT_CODE(EncodeBundle({good}, 1, static_cast<Compression>(3), kMiB, limits, &out),
              Code::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

TEST(EncodeErrorTest, RefusesOversizedBundles) {
  Limits limits;
  limits.max_bundle_bytes = 1000;
  limits.max_fragment_bytes = 100;
  std::vector<TensorFragment> out;
  const Tensor big = RandomTensor("x", DType::kF32, {251}, 1);  // 1004 bytes
  EXPECT_CODE(EncodeBundle({big}, 1, Compression::kNone, 100, limits, &out),
              Code::kResourceExhausted);
  const Tensor fits = RandomTensor("x", DType::kF32, {250}, 1);
  EXPECT_CODE(EncodeBundle({fits}, 1, Compression::kNone, 100, limits, &out), Code::kOk);
  EXPECT_EQ(out.size(), 10u);
  // 1000 bytes in 9-byte fragments would need 112 > max_fragments() = 10.
  EXPECT_CODE(EncodeBundle({fits}, 1, Compression::kNone, 9, limits, &out),
              Code::kResourceExhausted);
}

TEST(ReassemblyErrorTest, TruncatedFragmentData) {
  std::vector<TensorFragment> middle = ThreeFragments();
  middle[1].data.pop_back();
  EXPECT_CODE(AddOnly(middle), Code::kInvalidArgument);
  std::vector<TensorFragment> last = ThreeFragments();
  last[2].data.resize(3);
  EXPECT_CODE(AddOnly(last), Code::kInvalidArgument);  // underruns wire_bytes
  std::vector<TensorFragment> first = ThreeFragments();
  first[0].data.resize(10);  // count 3 no longer fits wire_bytes in 10-byte slices
  EXPECT_CODE(AddOnly(first), Code::kInvalidArgument);
  std::vector<TensorFragment> longer = ThreeFragments();
  longer[2].data += "xx";
  EXPECT_CODE(AddOnly(longer), Code::kInvalidArgument);  // overruns wire_bytes
  std::vector<TensorFragment> empty = ThreeFragments();
  empty[0].data.clear();
  EXPECT_CODE(AddOnly(empty), Code::kInvalidArgument);
}

TEST(ReassemblyErrorTest, ShapeLengthAndOffsetMismatches) {
  auto tamper = [](auto edit) {
    std::vector<TensorFragment> fragments = ThreeFragments();
    edit(&fragments[0].header.value());
    return AddOnly(fragments);
  };
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].shape = {4, 9}; }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].length = 62; }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].offset = 2; }), Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].dtype = DType::kUnspecified; }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].dtype = static_cast<DType>(4); }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].byte_order = ByteOrder::kUnspecified; }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->compression = static_cast<Compression>(5); }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].shape = {1, 1, 1, 4, 8}; }),
              Code::kInvalidArgument);  // rank over the limit
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].shape = {}; }), Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].shape = {0, 8}; }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].name.clear(); }),
              Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->payload_bytes = 66; }), Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors.clear(); }), Code::kInvalidArgument);
  EXPECT_CODE(tamper([](BundleHeader* h) {
                h->tensors.push_back(h->tensors[0]);
                h->tensors[1].offset = 64;
              }),
              Code::kInvalidArgument);  // tensors cover more than payload_bytes
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors[0].shape = {1ull << 62, 1ull << 62}; }),
              Code::kResourceExhausted);  // a tensor larger than the bundle limit
}

TEST(ReassemblyErrorTest, LimitsAreResourceExhausted) {
  auto tamper = [](auto edit) {
    std::vector<TensorFragment> fragments = ThreeFragments();
    edit(&fragments[0].header.value());
    return AddOnly(fragments);
  };
  EXPECT_CODE(tamper([](BundleHeader* h) { h->wire_bytes = (256ull << 20) + 1; }),
              Code::kResourceExhausted);  // oversized bundle
  Limits small_bundle;
  small_bundle.max_bundle_bytes = 63;  // the 64-byte bundle no longer fits
  EXPECT_CODE(AddAllAndTake(ThreeFragments(), small_bundle), Code::kResourceExhausted);
  EXPECT_CODE(tamper([](BundleHeader* h) { h->tensors.resize(17, h->tensors[0]); }),
              Code::kResourceExhausted);  // too many tensors
  std::vector<TensorFragment> many = ThreeFragments();
  for (TensorFragment& fragment : many) fragment.count = 257;
  EXPECT_CODE(AddOnly(many), Code::kResourceExhausted);
  Limits small;
  small.max_fragment_bytes = 22;  // 3 x 22 bytes could carry 64, but the slices are 25
  EXPECT_CODE(AddAllAndTake(ThreeFragments(), small), Code::kResourceExhausted);
  small.max_fragment_bytes = 21;  // 3 x 21 bytes cannot carry 64 at all
  EXPECT_CODE(AddAllAndTake(ThreeFragments(), small), Code::kInvalidArgument);
}

TEST(ReassemblyErrorTest, ChecksumMismatch) {
  std::vector<TensorFragment> flipped = ThreeFragments();
  flipped[1].data[3] ^= 0x01;
  Reassembler reassembler;
  for (const TensorFragment& fragment : flipped) ASSERT_TRUE(reassembler.Add(fragment).ok());
  std::vector<Tensor> got;
  EXPECT_CODE(reassembler.Take(&got), Code::kChecksumMismatch);
  EXPECT_TRUE(got.empty());
  std::vector<TensorFragment> wrong_crc = ThreeFragments();
  wrong_crc[0].header->tensors[0].crc32 ^= 1;
  EXPECT_CODE(AddAllAndTake(wrong_crc), Code::kChecksumMismatch);
}

TEST(ReassemblyErrorTest, CorruptZlibPayload) {
  const std::vector<Tensor> tensors = {RandomTensor("h", DType::kF16, {16, 16}, 3)};
  std::vector<TensorFragment> corrupt = MustEncode(tensors, kMiB, Compression::kZlib);
  corrupt[0].data[corrupt[0].data.size() / 2] ^= 0x5a;
  const Status status = AddAllAndTake(corrupt);
  EXPECT_TRUE(status.code == Code::kInvalidArgument || status.code == Code::kChecksumMismatch)
      << status.ToString();
  std::vector<TensorFragment> short_payload = MustEncode(tensors, kMiB, Compression::kZlib);
  short_payload[0].header->payload_bytes -= 2;  // stream inflates past the declared size
  short_payload[0].header->tensors[0].shape = {255};
  short_payload[0].header->tensors[0].length = 510;
  const Status overflow = AddAllAndTake(short_payload);
  EXPECT_CODE(overflow, Code::kInvalidArgument);
  EXPECT_NE(overflow.message.find("more than payload_bytes"), std::string::npos)
      << overflow.message;
  std::vector<TensorFragment> truncated = MustEncode(tensors, kMiB, Compression::kZlib);
  truncated[0].data.resize(truncated[0].data.size() - 4);
  truncated[0].header->wire_bytes -= 4;
  EXPECT_CODE(AddAllAndTake(truncated), Code::kInvalidArgument);
  std::vector<TensorFragment> trailing = MustEncode(tensors, kMiB, Compression::kZlib);
  trailing[0].data += "zz";
  trailing[0].header->wire_bytes += 2;
  EXPECT_CODE(AddAllAndTake(trailing), Code::kInvalidArgument);
}

TEST(ReassemblyErrorTest, MissingFragments) {
  std::vector<TensorFragment> fragments = ThreeFragments(7);
  Reassembler reassembler;
  ASSERT_TRUE(reassembler.Add(fragments[0]).ok());
  ASSERT_TRUE(reassembler.Add(fragments[1]).ok());
  Status finish = reassembler.Finish();
  EXPECT_CODE(finish, Code::kInvalidArgument);
  EXPECT_NE(finish.message.find("missing fragments"), std::string::npos) << finish.message;
  EXPECT_TRUE(reassembler.Finish().ok());  // Finish empties

  std::vector<TensorFragment> next = ThreeFragments(8);
  ASSERT_TRUE(reassembler.Add(fragments[0]).ok());
  Status new_bundle = reassembler.Add(next[0]);
  EXPECT_CODE(new_bundle, Code::kInvalidArgument);
  EXPECT_NE(new_bundle.message.find("missing fragments"), std::string::npos) << new_bundle.message;

  Reassembler gap;
  ASSERT_TRUE(gap.Add(fragments[0]).ok());
  ASSERT_TRUE(gap.Add(fragments[2]).ok());
  EXPECT_FALSE(gap.complete());
  EXPECT_CODE(gap.Finish(), Code::kInvalidArgument);
  EXPECT_CODE(AddOnly({fragments[1]}), Code::kInvalidArgument);  // no fragment 0
  Reassembler early;
  ASSERT_TRUE(early.Add(fragments[0]).ok());
  std::vector<Tensor> got;
  EXPECT_CODE(early.Take(&got), Code::kInvalidArgument);
}

TEST(ReassemblyErrorTest, StructuralErrors) {
  const std::vector<TensorFragment> fragments = ThreeFragments();
  EXPECT_CODE(AddOnly({fragments[0], fragments[1], fragments[1]}), Code::kInvalidArgument);
  EXPECT_CODE(AddOnly({fragments[0], fragments[0]}), Code::kInvalidArgument);  // second header

  std::vector<TensorFragment> header_on_one = fragments;
  header_on_one[1].header = header_on_one[0].header;
  EXPECT_CODE(AddOnly(header_on_one), Code::kInvalidArgument);

  std::vector<TensorFragment> no_header = fragments;
  no_header[0].header.reset();
  EXPECT_CODE(AddOnly(no_header), Code::kInvalidArgument);

  std::vector<TensorFragment> index_past = fragments;
  index_past[2].index = 3;
  EXPECT_CODE(AddOnly(index_past), Code::kInvalidArgument);
  TensorFragment zero_count = fragments[0];
  zero_count.count = 0;
  EXPECT_CODE(AddOnly({zero_count}), Code::kInvalidArgument);

  std::vector<TensorFragment> count_changes = fragments;
  count_changes[1].count = 4;
  EXPECT_CODE(AddOnly(count_changes), Code::kInvalidArgument);
}

TEST(ReassemblyTest, ProtoFragmentsReassembleAndErrorsReset) {
  const std::vector<Tensor> tensors = {RandomTensor("h", DType::kBF16, {3, 7}, 5)};
  std::vector<meshnet::shard::v1::TensorFragment> fragments;
  ASSERT_TRUE(EncodeBundle(tensors, 3, Compression::kZlib, 8, Limits(), &fragments).ok());
  Reassembler reassembler;
  // A broken bundle first: the error empties the reassembler, the next bundle is clean.
  ASSERT_TRUE(reassembler.Add(fragments[0]).ok());
  EXPECT_CODE(reassembler.Add(fragments[0]), Code::kInvalidArgument);
  EXPECT_FALSE(reassembler.complete());
  EXPECT_TRUE(reassembler.Finish().ok());
  for (const auto& fragment : fragments) ASSERT_TRUE(reassembler.Add(fragment).ok());
  ASSERT_TRUE(reassembler.complete());
  EXPECT_CODE(reassembler.Finish(), Code::kInvalidArgument);  // complete but not taken
  for (const auto& fragment : fragments) ASSERT_TRUE(reassembler.Add(fragment).ok());
  std::vector<Tensor> got;
  ASSERT_TRUE(reassembler.Take(&got).ok());
  ExpectSameTensors(tensors, got);
  // A new bundle while a complete one waits to be taken.
  for (const auto& fragment : fragments) ASSERT_TRUE(reassembler.Add(fragment).ok());
  auto other = fragments[0];
  other.set_bundle_id(4);
  EXPECT_CODE(reassembler.Add(other), Code::kInvalidArgument);
}

}  // namespace
}  // namespace meshnet::protocol
