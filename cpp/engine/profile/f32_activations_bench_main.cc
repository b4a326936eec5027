// f32_activations_bench: one weight matrix times 1, 8 or 128 activation columns (a decode row, 8
// streams, a prefill chunk), per quantized type, in three arithmetics of the pinned ggml-cpu:
//   quantized  the columns quantized to the type's dot type, then its vec_dot (llama.cpp's default)
//   generic    patch 0010: each row dequantized by the type's to_float, then ggml_vec_dot_f32
//   fused      patch 0012 as ggml-cpu calls it: the fused dot up to 4 columns, else its unpacking
//              into the row buffer, then ggml_vec_dot_f32 (the same numbers as generic)
// One thread, the best of --reps runs each; one JSON line per (type, shape, columns) with ns per
// weight per column and the ratios the bar is about (quantized time / fused time).
//
// Usage: f32_activations_bench [--reps=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "f32-activations.h"
#include "ggml-cpu.h"
#include "ggml.h"

extern "C" void ggml_vec_dot_f32(int n, float* s, size_t bs, const float* x, size_t bx, const float* y,
                                 size_t by, int nrc);

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFusedCols = 4;      // ggml-cpu.c's F32_ACTIVATION_FUSED_COLS
constexpr int64_t kRowsPerCall = 16;  // ggml-cpu.c's F32_ACTIVATION_ROWS

template <typename F>
double BestMicros(int reps, F f) {
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0 && std::atoi(arg.c_str() + 7) > 0) {
      reps = std::atoi(arg.c_str() + 7);
    } else {
      std::fprintf(stderr, "usage: f32_activations_bench [--reps=N]\n");
      return 2;
    }
  }
  ggml_cpu_init();
  if (!ggml_f32_activations_has_kernels(GGML_TYPE_Q8_0)) {
    std::fprintf(stderr, "f32_activations_bench: this build has no fused kernels\n");
    return 1;
  }
  struct Shape { ggml_type type; int64_t n, rows; };
  const Shape shapes[] = {
      {GGML_TYPE_Q4_1, 576, 1536}, {GGML_TYPE_Q4_1, 1536, 576},    // SmolLM2's ffn_up, ffn_down
      {GGML_TYPE_Q8_0, 576, 4096}, {GGML_TYPE_Q8_0, 640, 4096},    // slices of tied output heads
      {GGML_TYPE_Q4_K, 2048, 640}, {GGML_TYPE_Q6_K, 2048, 640},    // Gemma 3 270M's ffn_down
      {GGML_TYPE_Q4_K, 768, 2048}, {GGML_TYPE_Q6_K, 768, 2048},
      {GGML_TYPE_Q5_0, 640, 2048}, {GGML_TYPE_Q5_0, 1024, 640},    // Gemma 3 270M's ffn_up, attn_q
      {GGML_TYPE_Q4_0, 2048, 2048}, {GGML_TYPE_Q5_1, 576, 1536},   // Q4_0 and Q5_1 files' layers
      {GGML_TYPE_Q5_K, 2048, 640}, {GGML_TYPE_Q5_K, 768, 2048},    // Q5_K_M files' layers
      {GGML_TYPE_Q8_0, 640, 262144}};                              // Gemma 3's whole tied head
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.rows));
    for (float& v : w) v = normal(rng);
    const size_t row_bytes = ggml_row_size(s.type, s.n);
    std::vector<char> q(row_bytes * s.rows);
    ggml_quantize_chunk(s.type, w.data(), q.data(), 0, s.rows, s.n, nullptr);
    const auto* traits = ggml_get_type_traits(s.type);
    const auto* cpu = ggml_get_type_traits_cpu(s.type);
    for (int cols : {1, 8, 128}) {
      if (cols == 128 && s.rows > 65536) continue;  // the whole head as a prefill chunk: minutes, no news
      std::vector<float> x(static_cast<size_t>(s.n * cols)), y(static_cast<size_t>(s.rows * cols));
      for (float& v : x) v = normal(rng);
      std::vector<const float*> columns(cols);
      for (int c = 0; c < cols; ++c) columns[c] = x.data() + c * s.n;
      const size_t dot_row = ggml_row_size(cpu->vec_dot_type, s.n);
      std::vector<char> xq(dot_row * cols);
      std::vector<float> row(s.n);
      const double quantized = BestMicros(reps, [&] {
        for (int c = 0; c < cols; ++c) cpu->from_float(columns[c], xq.data() + c * dot_row, s.n);
        for (int64_t r = 0; r < s.rows; ++r)
          for (int c = 0; c < cols; ++c)
            cpu->vec_dot(static_cast<int>(s.n), &y[c * s.rows + r], 0, q.data() + r * row_bytes, 0,
                         xq.data() + c * dot_row, 0, 1);
      });
      const double generic = BestMicros(reps, [&] {
        for (int64_t r = 0; r < s.rows; ++r) {
          traits->to_float(q.data() + r * row_bytes, row.data(), s.n);
          for (int c = 0; c < cols; ++c)
            ggml_vec_dot_f32(static_cast<int>(s.n), &y[c * s.rows + r], 0, row.data(), 0, columns[c], 0, 1);
        }
      });
      std::vector<float*> outs(cols);
      const double fused = BestMicros(reps, [&] {
        if (cols <= kFusedCols) {
          for (int64_t r = 0; r < s.rows; r += kRowsPerCall) {  // as ggml-cpu calls it: a chunk of rows
            for (int c = 0; c < cols; ++c) outs[c] = &y[c * s.rows + r];
            ggml_f32_activations_dot_rows(s.type, s.n, q.data() + r * row_bytes, row_bytes,
                                          std::min<int64_t>(kRowsPerCall, s.rows - r), columns.data(), cols,
                                          outs.data());
          }
          return;
        }
        for (int64_t r = 0; r < s.rows; ++r) {
          {
            ggml_f32_activations_to_float(s.type, q.data() + r * row_bytes, row.data(), s.n);
            for (int c = 0; c < cols; ++c)
              ggml_vec_dot_f32(static_cast<int>(s.n), &y[c * s.rows + r], 0, row.data(), 0, columns[c], 0, 1);
          }
        }
      });
      const double per = 1000.0 / (static_cast<double>(s.n) * s.rows * cols);
      std::printf("{\"type\": \"%s\", \"n\": %lld, \"rows\": %lld, \"cols\": %d, \"quantized_ns\": %.4f, "
                  "\"generic_ns\": %.4f, \"fused_ns\": %.4f, \"fused_vs_generic\": %.2f, "
                  "\"fused_vs_quantized\": %.2f}\n",
                  ggml_type_name(s.type), static_cast<long long>(s.n), static_cast<long long>(s.rows), cols,
                  quantized * per, generic * per, fused * per, generic / fused, quantized / fused);
    }
  }
  return 0;
}
