// dump_boundaries: the hidden state at every range boundary of a shard chain, for every position
// of a teacher-forced token sequence: what each hop of a route commits to, and what an audit
// replays (issue 17's calibration, python/meshnet/verify/calibrate.py).
//
// Usage: dump_boundaries [--f32-matmul-activations] [--device D] [--input-rows FILE] MODEL.gguf OUT_PREFIX
//                       RANGES BATCH THREADS TOKEN_ID...
//   --f32-matmul-activations  quantized weights dequantized and dotted with F32 activations, for a
//            model certified that way (ADR 0012)
//   --device D  where every range computes: "cpu" (the default) or a GPU device of a backend
//            linked into the binary (vulkan0 in //cpp/engine:dump_boundaries_vulkan; ADR 0014), as
//            a shard on that device computes it
//   --input-rows FILE  the first range takes its input from FILE (float32 [n_tokens, n_embd]: an
//            earlier run's OUT_PREFIX.<i>.f32) instead of embedding the tokens, which then only
//            give the sequence its length; that range must not start at layer 0. A chain run
//            range by range this way, one process per range, gives the same bytes as one run of
//            the whole chain, with each process holding one range (audits and certification of
//            models no machine holds).
//   RANGES   the chain, e.g. 0:10,10:20,20:30; a range may leave layers out (0:10,10:15,16:30
//            skips layer 15), which is how the calibration makes a hop that skips a layer, and
//            may name its own GGUF (10:20@OTHER.gguf: another quantization of the same model).
//   BATCH    rows per Decode: the sequence goes through the chain in chunks of BATCH positions,
//            each chunk through every range before the next (1: one position at a time, as
//            decode steps are computed; the sequence length: one prefill). FIRST:REST makes the
//            first chunk FIRST rows and the others REST (12:1 is a 12-token prompt's prefill,
//            then decode steps).
//   THREADS  compute threads.
// Writes OUT_PREFIX.<i>.f32 (float32 [n_tokens, n_embd], row-major: the residual leaving range
// i) for every range that does not own the model's output, and, when the last range owns it,
// OUT_PREFIX.logits.f32 (float32 [n_tokens, n_vocab]) and OUT_PREFIX.last.json ({"argmax":
// [...], "logit": [...]}: per position, the top token and its logit). Exit 1 on any failure, with the reason on stderr.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cpp/engine/engine.h"
#include "cpp/engine/whole_model.h"

namespace {

using meshnet::engine::Batch;
using meshnet::engine::Context;
using meshnet::engine::ContextOptions;
using meshnet::engine::Model;
using meshnet::engine::ModelOptions;

struct Shard {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> context;
  std::vector<float> out;  // every position's output (non-last), appended chunk by chunk
};

struct Range {
  int start = 0, end = 0;
  std::string path;  // "" = MODEL.gguf
};

bool ParseRanges(const std::string& text, std::vector<Range>* ranges) {
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    Range range;
    const size_t at = part.find('@');
    if (at != std::string::npos) {
      range.path = part.substr(at + 1);
      part = part.substr(0, at);
    }
    const size_t colon = part.find(':');
    if (colon == std::string::npos) return false;
    range.start = std::atoi(part.substr(0, colon).c_str());
    range.end = std::atoi(part.substr(colon + 1).c_str());
    if (range.start < 0 || range.end <= range.start) return false;
    ranges->push_back(range);
  }
  return !ranges->empty();
}

bool WriteFloats(const std::string& file, const std::vector<float>& values) {
  FILE* out = std::fopen(file.c_str(), "wb");
  if (out == nullptr) return false;
  const bool ok = std::fwrite(values.data(), sizeof(float), values.size(), out) == values.size();
  return std::fclose(out) == 0 && ok;
}

int Fail(const std::string& message) {
  std::cerr << "dump_boundaries: " << message << "\n";
  return 1;
}

bool ReadFloats(const std::string& file, size_t count, std::vector<float>* values, std::string* error) {
  FILE* in = std::fopen(file.c_str(), "rb");
  if (in == nullptr) {
    *error = "cannot open " + file;
    return false;
  }
  values->assign(count, 0.0f);
  const bool read_all = std::fread(values->data(), sizeof(float), count, in) == count;
  const bool at_end = read_all && std::fgetc(in) == EOF;
  std::fclose(in);
  if (!at_end) *error = file + " does not hold exactly " + std::to_string(count) + " floats ([n_tokens, n_embd])";
  return at_end;
}

}  // namespace

int main(int argc, char** argv) {
  bool f32_matmul_activations = false;
  std::string input_rows, device = "cpu";
  for (bool took = true; took;) {  // the flags, in any order, before the positional arguments
    took = false;
    if (meshnet::engine::TakeLeadingFlag(&argc, &argv, "--f32-matmul-activations")) {
      f32_matmul_activations = took = true;
    }
    if (meshnet::engine::TakeLeadingOption(&argc, &argv, "--input-rows", &input_rows)) took = true;
    if (meshnet::engine::TakeLeadingOption(&argc, &argv, "--device", &device)) took = true;
  }
  if (argc < 7) {
    std::cerr << "usage: dump_boundaries [--f32-matmul-activations] [--device D] [--input-rows FILE] MODEL.gguf "
                 "OUT_PREFIX RANGES BATCH THREADS TOKEN_ID...\n";
    return 2;
  }
  const std::string path = argv[1], prefix = argv[2];
  std::vector<Range> ranges;
  if (!ParseRanges(argv[3], &ranges)) return Fail(std::string("bad RANGES ") + argv[3]);
  const std::string batch_spec = argv[4];
  const size_t colon = batch_spec.find(':');
  const int first_rows = std::atoi(batch_spec.substr(0, colon).c_str());
  const int batch_rows = colon == std::string::npos ? first_rows : std::atoi(batch_spec.substr(colon + 1).c_str());
  const int threads = std::atoi(argv[5]);
  if (first_rows <= 0 || batch_rows <= 0 || threads <= 0) return Fail("BATCH and THREADS must be positive");
  const std::vector<int32_t> tokens = meshnet::engine::TokenArgs(argc, argv, 6);
  const int n = static_cast<int>(tokens.size());

  std::vector<Shard> chain;
  std::string error;
  for (const Range& range : ranges) {
    ModelOptions model_options;
    model_options.path = range.path.empty() ? path : range.path;
    model_options.layer_start = range.start;
    model_options.layer_end = range.end;
    model_options.device = device;
    Shard shard;
    shard.model = Model::Open(model_options, &error);
    if (!shard.model) return Fail(error);
    ContextOptions context_options;
    context_options.n_ctx = n + 8;
    context_options.n_batch = context_options.n_ubatch = std::min(std::max(first_rows, batch_rows), n);
    context_options.n_threads = threads;
    context_options.f32_matmul_activations = f32_matmul_activations;
    shard.context = Context::Create(*shard.model, context_options, &error);
    if (!shard.context) return Fail(error);
    chain.push_back(std::move(shard));
  }
  const bool owns_output = chain.back().model->owns_output();
  const int n_embd = chain.front().model->n_embd(), n_vocab = chain.back().model->n_vocab();
  std::vector<float> given;  // --input-rows: the first range's input
  if (!input_rows.empty()) {
    if (chain.front().model->owns_input()) return Fail("--input-rows needs a first range that starts past layer 0");
    if (!ReadFloats(input_rows, static_cast<size_t>(n) * n_embd, &given, &error)) return Fail(error);
  }
  std::vector<int32_t> argmax;
  std::vector<float> top_logit, all_logits;

  for (int first = 0; first < n; first += first == 0 ? first_rows : batch_rows) {
    const int rows = std::min(first == 0 ? first_rows : batch_rows, n - first);
    for (size_t i = 0; i < chain.size(); ++i) {
      Shard& shard = chain[i];
      const bool last = i + 1 == chain.size() && owns_output;
      Batch batch;
      for (int r = 0; r < rows; ++r) {
        if (i == 0 && input_rows.empty()) {
          batch.AddToken(0, first + r, tokens[first + r], true);
        } else {
          const std::vector<float>& in = i == 0 ? given : chain[i - 1].out;
          batch.AddHidden(0, first + r, in.data() + static_cast<size_t>(first + r) * n_embd, n_embd, true);
        }
      }
      if (!shard.context->Decode(batch, &error)) return Fail(error);
      for (int r = 0; r < rows; ++r) {
        if (last) {
          const float* logits = shard.context->Logits(r);
          const float* best = std::max_element(logits, logits + n_vocab);
          argmax.push_back(static_cast<int32_t>(best - logits));
          top_logit.push_back(*best);
          all_logits.insert(all_logits.end(), logits, logits + n_vocab);
        } else {
          const float* hidden = shard.context->Hidden(r);
          shard.out.insert(shard.out.end(), hidden, hidden + n_embd);
        }
      }
    }
  }

  for (size_t i = 0; i < chain.size(); ++i) {
    if (i + 1 == chain.size() && owns_output) break;
    if (!WriteFloats(prefix + "." + std::to_string(i) + ".f32", chain[i].out)) {
      return Fail("cannot write " + prefix + "." + std::to_string(i) + ".f32");
    }
  }
  if (owns_output) {
    if (!WriteFloats(prefix + ".logits.f32", all_logits)) return Fail("cannot write " + prefix + ".logits.f32");
    const std::string file = prefix + ".last.json";
    FILE* out = std::fopen(file.c_str(), "w");
    if (out == nullptr) return Fail("cannot write " + file);
    std::fprintf(out, "{\"argmax\": [");
    for (int r = 0; r < n; ++r) std::fprintf(out, "%s%d", r ? ", " : "", argmax[r]);
    std::fprintf(out, "], \"logit\": [");
    for (int r = 0; r < n; ++r) std::fprintf(out, "%s%.9g", r ? ", " : "", top_logit[r]);
    std::fprintf(out, "]}\n");
    if (std::fclose(out) != 0) return Fail("cannot write " + file);
  }
  return 0;
}
