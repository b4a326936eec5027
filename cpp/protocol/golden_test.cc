// Golden frames: the bytes python/meshnet/protocol writes must decode here and re-encode to
// the identical bytes (ADR 0002: both codecs agree byte for byte). Reads the directory named by
// argv[1] or $MESHNET_GOLDEN_DIR; its MANIFEST lists "<file> <MessageName>" per line (`#`
// comments, blank lines). Each file becomes one test; a SeamFrame that carries a whole
// single-fragment bundle is also reassembled and re-encoded with EncodeBundle.
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/seam.h"
#include "gtest/gtest.h"

namespace meshnet::protocol {
namespace {

struct GoldenEntry {
  std::string file;
  std::string message;
};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

// Parses MANIFEST; on a malformed line returns false with *error set.
bool ParseManifest(const std::string& text, std::vector<GoldenEntry>* entries, std::string* error) {
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    GoldenEntry entry;
    std::string extra;
    if (!(fields >> entry.file)) continue;  // blank or comment
    if (!(fields >> entry.message) || (fields >> extra)) {
      *error = "MANIFEST line " + std::to_string(number) + ": expected '<file> <MessageName>'";
      return false;
    }
    entries->push_back(entry);
  }
  return true;
}

// Where the first difference is, so a mismatch is readable without dumping the frame.
std::string DescribeDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return "golden " + std::to_string(want.size()) + " bytes, re-encoded " +
         std::to_string(got.size()) + " bytes, first difference at offset " + std::to_string(i);
}

template <typename Message>
void ExpectRoundTrip(const std::string& bytes,
                     Status (*decode)(std::string_view, Message*),
                     std::string (*encode)(const Message&), Message* decoded) {
  const Status status = decode(bytes, decoded);
  ASSERT_TRUE(status.ok()) << status.ToString();
  const std::string again = encode(*decoded);
  EXPECT_TRUE(again == bytes) << DescribeDifference(bytes, again);
}

// Reassembles a single-fragment bundle and checks EncodeBundle reproduces the fragment.
void ExpectBundleReencodes(const std::string& file, const TensorFragment& fragment) {
  Reassembler reassembler;
  Status status = reassembler.Add(fragment);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(reassembler.complete());
  std::vector<Tensor> tensors;
  status = reassembler.Take(&tensors);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (const TensorSpec& spec : fragment.header->tensors) {
    // A big-endian bundle is valid input but not canonical output: nothing to compare.
    if (spec.byte_order != ByteOrder::kLittle) {
      std::cout << file << ": big-endian bundle reassembled (not re-encoded)\n";
      return;
    }
  }
  std::vector<TensorFragment> again;
  status = EncodeBundle(tensors, fragment.bundle_id, fragment.header->compression,
                        fragment.data.size(), Limits(), &again);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(again.size(), 1u);
  SeamFrame want;
  want.fragment = fragment;
  SeamFrame got;
  got.fragment = again[0];
  const std::string want_bytes = EncodeSeamFrame(want);
  const std::string got_bytes = EncodeSeamFrame(got);
  EXPECT_TRUE(want_bytes == got_bytes) << "bundle re-encode: "
                                       << DescribeDifference(want_bytes, got_bytes);
  std::cout << file << ": bundle of " << tensors.size() << " tensor(s) re-encoded\n";
}

void CheckGoldenFile(const std::string& dir, const GoldenEntry& entry) {
  std::string bytes;
  ASSERT_TRUE(ReadFile(dir + "/" + entry.file, &bytes)) << "cannot read " << entry.file;
  if (entry.message == "SeamFrame") {
    SeamFrame frame;
    ExpectRoundTrip(bytes, &DecodeSeamFrame, &EncodeSeamFrame, &frame);
    if (frame.fragment.has_value() && frame.fragment->count == 1 &&
        frame.fragment->header.has_value()) {
      ExpectBundleReencodes(entry.file, *frame.fragment);
    }
  } else if (entry.message == "SeamReply") {
    SeamReply reply;
    ExpectRoundTrip(bytes, &DecodeSeamReply, &EncodeSeamReply, &reply);
  } else if (entry.message == "ResultFrame") {
    ResultFrame frame;
    ExpectRoundTrip(bytes, &DecodeResultFrame, &EncodeResultFrame, &frame);
  } else if (entry.message == "ResultsRequest") {
    ResultsRequest request;
    ExpectRoundTrip(bytes, &DecodeResultsRequest, &EncodeResultsRequest, &request);
  } else if (entry.message == "HelloRequest") {
    HelloRequest request;
    ExpectRoundTrip(bytes, &DecodeHelloRequest, &EncodeHelloRequest, &request);
  } else if (entry.message == "HelloReply") {
    HelloReply reply;
    ExpectRoundTrip(bytes, &DecodeHelloReply, &EncodeHelloReply, &reply);
  } else {
    FAIL() << entry.file << ": unknown message name '" << entry.message << "'";
  }
}

class FunctionTest : public ::testing::Test {
 public:
  explicit FunctionTest(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

void Register(const std::string& name, std::function<void()> body) {
  ::testing::RegisterTest("Golden", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new FunctionTest(body); });
}

// Registers one test per MANIFEST entry, or one failing test saying why there are none.
void RegisterGoldenTests(const std::string& dir) {
  if (dir.empty()) {
    Register("Directory", [] { FAIL() << "pass the golden directory as argv[1] or set "
                                         "MESHNET_GOLDEN_DIR"; });
    return;
  }
  std::string manifest;
  std::vector<GoldenEntry> entries;
  std::string error;
  if (!ReadFile(dir + "/MANIFEST", &manifest)) {
    Register("Manifest", [dir] { FAIL() << "cannot read " << dir << "/MANIFEST"; });
    return;
  }
  if (!ParseManifest(manifest, &entries, &error)) {
    Register("Manifest", [error] { FAIL() << error; });
    return;
  }
  if (entries.empty()) {
    Register("Manifest", [dir] { FAIL() << dir << "/MANIFEST lists no frames"; });
    return;
  }
  for (const GoldenEntry& entry : entries) {
    Register(entry.file, [dir, entry] { CheckGoldenFile(dir, entry); });
  }
}

}  // namespace
}  // namespace meshnet::protocol

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // removes gtest's own flags from argv
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else if (const char* env = std::getenv("MESHNET_GOLDEN_DIR")) {
    dir = env;
  }
  meshnet::protocol::RegisterGoldenTests(dir);
  return RUN_ALL_TESTS();
}
