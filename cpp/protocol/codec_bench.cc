// codec_bench: encode + decode throughput of one f16 [4096, 8192] prefill bundle (64 MiB, 64
// fragments), the largest bundle the seam carries by default. Encode = EncodeBundle plus
// EncodeSeamFrame per fragment; decode = DecodeSeamFrame plus Reassembler::Add per frame and
// Take. Prints one JSON object; a separate check compares it with the performance contract.
//   codec_bench [iterations]   (default 5; zlib runs once)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpp/protocol/bundle.h"
#include "cpp/protocol/seam.h"

namespace meshnet::protocol {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Result {
  double encode_s = 1e30;  // best of the iterations
  double decode_s = 1e30;
  size_t wire_bytes = 0;
  size_t frames = 0;
};

// One encode + decode of `tensors`; aborts the benchmark on any codec error.
void RunOnce(const std::vector<Tensor>& tensors, Compression compression, Result* result) {
  Clock::time_point start = Clock::now();
  std::vector<TensorFragment> fragments;
  Status status = EncodeBundle(tensors, 1, compression, Limits().max_fragment_bytes, Limits(),
                               &fragments);
  if (!status.ok()) {
    std::fprintf(stderr, "encode: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  std::vector<std::string> frames;
  SeamFrame frame;
  frame.version = CurrentVersion();
  frame.work_id = "bench";
  frame.step = 1;
  for (TensorFragment& fragment : fragments) {
    frame.fragment = std::move(fragment);
    frames.push_back(EncodeSeamFrame(frame));
  }
  result->encode_s = std::min(result->encode_s, Seconds(start));

  start = Clock::now();
  Reassembler reassembler;
  for (const std::string& bytes : frames) {
    SeamFrame decoded;
    status = DecodeSeamFrame(bytes, &decoded);
    if (status.ok()) status = reassembler.Add(*decoded.fragment);
    if (!status.ok()) {
      std::fprintf(stderr, "decode: %s\n", status.ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<Tensor> out;
  status = reassembler.Take(&out);
  result->decode_s = std::min(result->decode_s, Seconds(start));
  if (!status.ok() || out[0].bytes != tensors[0].bytes) {
    std::fprintf(stderr, "round trip failed: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  result->frames = frames.size();
  result->wire_bytes = 0;
  for (const std::string& bytes : frames) result->wire_bytes += bytes.size();
}

int Main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::vector<uint64_t> shape = {4096, 8192};
  std::vector<float> values(shape[0] * shape[1]);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  const std::vector<Tensor> tensors = {
      TensorFromFloats("hidden_states", DType::kF16, shape, values.data())};
  const double mib = tensors[0].bytes.size() / double(1 << 20);

  Result none;
  for (int i = 0; i < iterations; ++i) RunOnce(tensors, Compression::kNone, &none);
  Result zlib;
  RunOnce(tensors, Compression::kZlib, &zlib);

  std::printf(
      "{\"bench\": \"codec\", \"dtype\": \"f16\", \"shape\": [4096, 8192], "
      "\"payload_mib\": %.1f, \"iterations\": %d,\n"
      " \"none\": {\"frames\": %zu, \"wire_bytes\": %zu, \"encode_mib_s\": %.1f, "
      "\"decode_mib_s\": %.1f},\n"
      " \"zlib\": {\"frames\": %zu, \"wire_bytes\": %zu, \"encode_mib_s\": %.1f, "
      "\"decode_mib_s\": %.1f}}\n",
      mib, iterations, none.frames, none.wire_bytes, mib / none.encode_s, mib / none.decode_s,
      zlib.frames, zlib.wire_bytes, mib / zlib.encode_s, mib / zlib.decode_s);
  return 0;
}

}  // namespace
}  // namespace meshnet::protocol

int main(int argc, char** argv) { return meshnet::protocol::Main(argc, argv); }
