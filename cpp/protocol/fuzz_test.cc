// Seeded mutation fuzzing of DecodeSeamFrame and Reassembler: random bytes, byte-level
// mutations of valid frames, and field tampering through the proto API. Every input must be
// answered with a Status (non-OK ones with a message), never a crash or a sanitizer report;
// a bundle that is taken successfully must be self-consistent. Deterministic (fixed seed).
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/seam.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace {

namespace pb = ::meshnet::shard::v1;

constexpr uint64_t kSeed = 0x5eed'0002;
constexpr int kDefaultIterations = 50000;  // $MESHNET_FUZZ_ITERATIONS overrides (longer runs)

int Iterations() {
  const char* env = std::getenv("MESHNET_FUZZ_ITERATIONS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : kDefaultIterations;
}

struct Counts {
  int ok = 0;
  int error = 0;
};

class FuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Parsing malformed UTF-8 makes protobuf log an error per input; keep the output short.
    google::protobuf::SetLogHandler(+[](google::protobuf::LogLevel, const char*, int,
                                        const std::string&) {});
    BuildCorpus();
  }
  void TearDown() override { google::protobuf::SetLogHandler(nullptr); }

  // Records a result; a non-OK Status must carry a message and a known code.
  void Check(const Status& status, Counts* counts) {
    if (status.ok()) {
      ++counts->ok;
      return;
    }
    ++counts->error;
    EXPECT_FALSE(status.message.empty()) << CodeName(status.code);
    EXPECT_TRUE(status.code == Code::kInvalidArgument || status.code == Code::kVersionMismatch ||
                status.code == Code::kResourceExhausted || status.code == Code::kChecksumMismatch)
        << status.ToString();
  }

  void BuildCorpus() {
    std::mt19937_64 rng(kSeed);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
    for (int b = 0; b < 12; ++b) {
      std::vector<Tensor> tensors;
      const int n = 1 + b % 3;
      for (int t = 0; t < n; ++t) {
        std::vector<uint64_t> shape = {1 + rng() % 4, 1 + rng() % 24};
        std::vector<float> values(shape[0] * shape[1]);
        for (float& v : values) v = normal(rng);
        tensors.push_back(TensorFromFloats("t" + std::to_string(t), dtypes[(b + t) % 3], shape,
                                           values.data()));
      }
      const Compression compression = b % 4 == 3 ? Compression::kZlib : Compression::kNone;
      std::vector<pb::TensorFragment> fragments;
      const Status status =
          EncodeBundle(tensors, 100 + b, compression, 16 + rng() % 64, Limits(), &fragments);
      ASSERT_TRUE(status.ok()) << status.ToString();
      bundles_.push_back(fragments);
      for (const pb::TensorFragment& fragment : fragments) {
        pb::SeamFrame frame;
        frame.mutable_version()->set_major(1);
        frame.set_work_id("w" + std::to_string(b));
        frame.mutable_session()->set_session_id("s");
        frame.mutable_session()->set_epoch(b);
        frame.set_phase(pb::PHASE_PREFILL);
        frame.set_step(1 + b);
        frame.add_token_ids(b);
        *frame.mutable_fragment() = fragment;
        frames_.push_back(frame.SerializeAsString());
      }
    }
    // Unmutated bundles must reassemble: the fuzz baseline is valid input.
    for (const auto& fragments : bundles_) {
      Reassembler reassembler;
      for (const auto& fragment : fragments) ASSERT_TRUE(reassembler.Add(fragment).ok());
      std::vector<Tensor> tensors;
      ASSERT_TRUE(reassembler.Take(&tensors).ok());
    }
  }

  std::vector<std::vector<pb::TensorFragment>> bundles_;
  std::vector<std::string> frames_;  // one valid SeamFrame per fragment of every bundle
};

uint64_t Pick(std::mt19937_64& rng, uint64_t n) { return n == 0 ? 0 : rng() % n; }

// Mostly small numbers, sometimes the boundaries the codec must survive.
uint64_t NastyNumber(std::mt19937_64& rng) {
  static const uint64_t kEdges[] = {0,          1,          2,          3,
                                    4,          255,        1ull << 20, (1ull << 20) + 1,
                                    256ull << 20, (256ull << 20) + 1, UINT32_MAX, UINT64_MAX,
                                    1ull << 32, 1ull << 62};
  if (rng() % 3 == 0) return kEdges[Pick(rng, sizeof(kEdges) / sizeof(kEdges[0]))];
  return rng() % 600;
}

void MutateBytes(std::mt19937_64& rng, std::string* bytes) {
  const int rounds = 1 + static_cast<int>(Pick(rng, 3));
  for (int r = 0; r < rounds; ++r) {
    switch (Pick(rng, 5)) {
      case 0:  // bit flips
        for (int k = 1 + Pick(rng, 8); k > 0 && !bytes->empty(); --k) {
          (*bytes)[Pick(rng, bytes->size())] ^= static_cast<char>(1 << Pick(rng, 8));
        }
        break;
      case 1:  // truncation
        bytes->resize(Pick(rng, bytes->size() + 1));
        break;
      case 2: {  // insertion
        std::string extra(1 + Pick(rng, 16), '\0');
        for (char& c : extra) c = static_cast<char>(rng());
        bytes->insert(Pick(rng, bytes->size() + 1), extra);
        break;
      }
      case 3:  // overwrite one byte
        if (!bytes->empty()) (*bytes)[Pick(rng, bytes->size())] = static_cast<char>(rng());
        break;
      default: {  // duplicate a slice
        const size_t start = Pick(rng, bytes->size() + 1);
        const size_t length = Pick(rng, bytes->size() - start + 1);
        bytes->insert(Pick(rng, bytes->size() + 1), bytes->substr(start, length));
      }
    }
  }
}

// Changes one field of one fragment of a bundle through the proto API.
void TamperField(std::mt19937_64& rng, std::vector<pb::TensorFragment>* fragments) {
  pb::TensorFragment& fragment = (*fragments)[Pick(rng, fragments->size())];
  pb::TensorFragment& first = (*fragments)[0];
  const bool has_spec = first.has_header() && first.header().tensors_size() > 0;
  pb::BundleHeader* header = has_spec ? first.mutable_header() : nullptr;
  pb::TensorSpec* spec =
      has_spec ? header->mutable_tensors(Pick(rng, header->tensors_size())) : nullptr;
  const uint64_t field = Pick(rng, 20);
  if (!has_spec && field >= 5 && field <= 18) {  // header fields need a header: add one
    *fragment.mutable_header() = pb::BundleHeader();
    return;
  }
  switch (field) {
    case 0: fragment.set_bundle_id(NastyNumber(rng)); break;
    case 1: fragment.set_index(static_cast<uint32_t>(NastyNumber(rng))); break;
    case 2: fragment.set_count(static_cast<uint32_t>(NastyNumber(rng))); break;
    case 3: fragment.mutable_data()->resize(NastyNumber(rng) % 200); break;
    case 4: fragment.clear_header(); break;
    case 5: *fragment.mutable_header() = *header; break;
    case 6: header->set_compression(static_cast<pb::Compression>(Pick(rng, 5))); break;
    case 7: header->set_payload_bytes(NastyNumber(rng)); break;
    case 8: header->set_wire_bytes(NastyNumber(rng)); break;
    case 9: *header->add_tensors() = *spec; break;
    case 10: header->mutable_tensors()->RemoveLast(); break;
    case 11: {
      spec->clear_shape();
      for (uint64_t rank = Pick(rng, 7); rank > 0; --rank) spec->add_shape(NastyNumber(rng));
      break;
    }
    case 12:
      if (spec->shape_size() > 0) spec->set_shape(Pick(rng, spec->shape_size()), NastyNumber(rng));
      break;
    case 13: spec->set_dtype(static_cast<pb::DType>(Pick(rng, 6))); break;
    case 14: spec->set_byte_order(static_cast<pb::ByteOrder>(Pick(rng, 4))); break;
    case 15: spec->set_offset(NastyNumber(rng)); break;
    case 16: spec->set_length(NastyNumber(rng)); break;
    case 17: spec->set_crc32(static_cast<uint32_t>(rng())); break;
    case 18: spec->set_name(std::string(Pick(rng, 140), static_cast<char>(rng()))); break;
    default: {  // swap two fragments
      std::swap((*fragments)[Pick(rng, fragments->size())],
                (*fragments)[Pick(rng, fragments->size())]);
    }
  }
}

// Adds every fragment (stopping at the first error), then takes or finishes.
void Feed(const std::vector<pb::TensorFragment>& fragments, Reassembler* reassembler,
          Counts* add, Counts* take);

TEST_F(FuzzTest, NoCrashAndEveryErrorExplainsItself) {
  std::mt19937_64 rng(kSeed);
  Counts decode, other, add, take;  // other: SeamReply/HelloReply decoders on the same bytes
  Reassembler stream;  // one long-lived reassembler fed by mutated frames, as on a seam
  int inputs = 0;
  const int iterations = Iterations();
  for (int i = 0; i < iterations; ++i, ++inputs) {
    const uint64_t mode = Pick(rng, 4);
    if (mode == 0 || mode == 1) {
      std::string bytes;
      if (mode == 0) {  // random bytes
        bytes.resize(Pick(rng, 300));
        for (char& c : bytes) c = static_cast<char>(rng());
      } else {  // a valid frame, mutated
        bytes = frames_[Pick(rng, frames_.size())];
        MutateBytes(rng, &bytes);
      }
      SeamFrame frame;
      const Status status = DecodeSeamFrame(bytes, &frame);
      Check(status, &decode);
      SeamReply reply;
      Check(DecodeSeamReply(bytes, &reply), &other);
      HelloReply hello;
      Check(DecodeHelloReply(bytes, &hello), &other);
      if (status.ok() && frame.fragment.has_value()) {
        Check(stream.Add(*frame.fragment), &add);
        if (stream.complete()) {
          std::vector<Tensor> tensors;
          Check(stream.Take(&tensors), &take);
        }
      }
      if (Pick(rng, 50) == 0) Check(stream.Finish(), &take);
    } else if (mode == 2) {  // field tampering through the proto API
      std::vector<pb::TensorFragment> fragments = bundles_[Pick(rng, bundles_.size())];
      for (int k = 1 + Pick(rng, 2); k > 0; --k) TamperField(rng, &fragments);
      Reassembler reassembler;
      Feed(fragments, &reassembler, &add, &take);
    } else {  // tampered SeamFrame fields, then a round trip through bytes
      pb::SeamFrame frame;
      frame.ParseFromString(frames_[Pick(rng, frames_.size())]);
      if (Pick(rng, 2) == 0) frame.mutable_version()->set_major(Pick(rng, 3));
      if (Pick(rng, 4) == 0) frame.clear_version();
      std::vector<pb::TensorFragment> one = {frame.fragment()};
      TamperField(rng, &one);
      *frame.mutable_fragment() = one[0];
      SeamFrame native;
      const Status status = DecodeSeamFrame(frame.SerializeAsString(), &native);
      Check(status, &decode);
      if (status.ok()) {
        EXPECT_EQ(native.version->major, kProtocolMajor);
        Reassembler reassembler;
        Check(reassembler.Add(*native.fragment), &add);
        if (reassembler.complete()) {
          std::vector<Tensor> tensors;
          Check(reassembler.Take(&tensors), &take);
        }
      }
    }
  }
  std::cout << "fuzz: inputs=" << inputs << "; DecodeSeamFrame ok=" << decode.ok
            << " error=" << decode.error << "; other decoders ok=" << other.ok
            << " error=" << other.error << "; Reassembler::Add ok=" << add.ok
            << " error=" << add.error
            << "; take/finish ok=" << take.ok << " error=" << take.error << std::endl;
  RecordProperty("inputs", inputs);
  RecordProperty("decode_ok", decode.ok);
  RecordProperty("decode_error", decode.error);
  RecordProperty("add_ok", add.ok);
  RecordProperty("add_error", add.error);
  EXPECT_GE(inputs, 10000);
  // The loop must exercise both outcomes of each stage, or it tests nothing.
  EXPECT_GT(decode.ok, 0);
  EXPECT_GT(decode.error, 0);
  EXPECT_GT(add.ok, 0);
  EXPECT_GT(add.error, 0);
  EXPECT_GT(take.ok, 0);
  EXPECT_GT(take.error, 0);
}

void Feed(const std::vector<pb::TensorFragment>& fragments, Reassembler* reassembler,
          Counts* add, Counts* take) {
  for (const pb::TensorFragment& fragment : fragments) {
    const Status status = reassembler->Add(fragment);
    if (status.ok()) {
      ++add->ok;
    } else {
      ++add->error;
      EXPECT_FALSE(status.message.empty());
      return;
    }
  }
  std::vector<Tensor> tensors;
  const Status status = reassembler->complete() ? reassembler->Take(&tensors)
                                                : reassembler->Finish();
  if (!status.ok()) {
    ++take->error;
    EXPECT_FALSE(status.message.empty());
    return;
  }
  ++take->ok;
  for (const Tensor& tensor : tensors) {  // a taken bundle is self-consistent
    uint64_t length = ItemSize(tensor.dtype);
    for (uint64_t dim : tensor.shape) length *= dim;
    EXPECT_GT(length, 0u);
    EXPECT_EQ(tensor.bytes.size(), length);
  }
}

}  // namespace
}  // namespace meshnet::protocol
