// Patch 0012's fused F32-activation kernels (ggml/src/ggml-cpu/f32-activations.h in the patched
// tree) against patch 0010's generic path: the type's to_float, then ggml_vec_dot_f32. Bit for
// bit, per type, for odd shapes and any number of columns, and through ggml's MUL_MAT and
// MUL_MAT_ID with the CPU backend's F32 activations on (fused up to 4 columns, the unpacked row
// buffer above), so a row computes the same in any batch.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "f32-activations.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

extern "C" void ggml_vec_dot_f32(int n, float* s, size_t bs, const float* x, size_t bx, const float* y,
                                 size_t by, int nrc);

namespace {

const ggml_type kTypes[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                            GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

// Normal values with one in ten scaled by 8, as weights with outliers are.
std::vector<float> Values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> out(count);
  for (float& v : out) v = normal(rng) * (rng() % 10 == 0 ? 8.0f : 1.0f);
  return out;
}

struct Matrix {
  ggml_type type;
  int64_t n, rows;
  size_t row_bytes;
  std::vector<char> data;
  const void* row(int64_t r) const { return data.data() + r * row_bytes; }
};

Matrix Quantized(ggml_type type, int64_t n, int64_t rows, uint32_t seed) {
  Matrix m{type, n, rows, ggml_row_size(type, n), {}};
  m.data.resize(m.row_bytes * rows);
  const std::vector<float> w = Values(static_cast<size_t>(n * rows), seed);
  ggml_quantize_chunk(type, w.data(), m.data.data(), 0, rows, n, nullptr);
  return m;
}

// Patch 0010's arithmetic for one row and one column.
float Reference(const Matrix& m, int64_t r, const float* x) {
  std::vector<float> row(m.n);
  ggml_get_type_traits(m.type)->to_float(m.row(r), row.data(), m.n);
  float out = 0;
  ggml_vec_dot_f32(static_cast<int>(m.n), &out, 0, row.data(), 0, x, 0, 1);
  return out;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void RequireKernels() {
  if (!ggml_f32_activations_has_kernels(GGML_TYPE_Q8_0)) {
    GTEST_SKIP() << "this build has no fused kernels (no AVX2/FMA/F16C, or AVX-512: patch 0010's path only)";
  }
}

TEST(F32ActivationKernelsTest, OnlyTheTypesWithKernelsSayTheyHaveThem) {
  RequireKernels();
  for (ggml_type type : kTypes) EXPECT_TRUE(ggml_f32_activations_has_kernels(type)) << ggml_type_name(type);
  for (ggml_type type : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q8_K}) {
    EXPECT_FALSE(ggml_f32_activations_has_kernels(type)) << ggml_type_name(type);
  }
}

TEST(F32ActivationKernelsTest, ToFloatWritesWhatTheTypesToFloatWrites) {
  RequireKernels();
  for (ggml_type type : kTypes) {
    const bool k_quant = ggml_blck_size(type) == 256;
    for (int64_t n : k_quant ? std::vector<int64_t>{256, 768, 2048} : std::vector<int64_t>{32, 96, 576, 1536}) {
      const Matrix m = Quantized(type, n, 3, static_cast<uint32_t>(n) + type);
      for (int64_t r = 0; r < m.rows; ++r) {
        std::vector<float> want(n), got(n);
        ggml_get_type_traits(type)->to_float(m.row(r), want.data(), n);
        ggml_f32_activations_to_float(type, m.row(r), got.data(), n);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(float)))
            << ggml_type_name(type) << " n=" << n << " row " << r;
      }
    }
  }
}

TEST(F32ActivationKernelsTest, DotsAreTheGenericPathsBitForBitForAnyNumberOfColumns) {
  RequireKernels();
  for (ggml_type type : kTypes) {
    const bool k_quant = ggml_blck_size(type) == 256;
    for (int64_t n : k_quant ? std::vector<int64_t>{256, 768, 2048} : std::vector<int64_t>{32, 96, 576, 1536}) {
      const Matrix m = Quantized(type, n, 5, static_cast<uint32_t>(n) * 3 + type);
      for (int cols : {1, 2, 3, 4, 5, 8, 17}) {
        const std::vector<float> x = Values(static_cast<size_t>(n * cols), static_cast<uint32_t>(cols));
        std::vector<const float*> columns(cols);
        for (int c = 0; c < cols; ++c) columns[c] = x.data() + c * n;
        for (int64_t r = 0; r < m.rows; ++r) {
          std::vector<float> got(cols);
          ggml_f32_activations_dot(type, n, m.row(r), columns.data(), cols, got.data());
          for (int c = 0; c < cols; ++c) {
            const float want = Reference(m, r, columns[c]);
            ASSERT_TRUE(SameBits(want, got[c])) << ggml_type_name(type) << " n=" << n << " cols=" << cols
                                                << " row " << r << " col " << c << ": " << want << " vs " << got[c];
            float alone = 0;  // the same column on its own
            ggml_f32_activations_dot(type, n, m.row(r), &columns[c], 1, &alone);
            ASSERT_TRUE(SameBits(alone, got[c]));
          }
        }
      }
    }
  }
}

// The call ggml-cpu makes: a chunk of rows at a stride, each with the row 4 ahead prefetched (so
// chunks shorter and longer than that, and a stride wider than the row, as a tensor view has).
TEST(F32ActivationKernelsTest, ChunksOfRowsAreEachRowsDot) {
  RequireKernels();
  for (ggml_type type : kTypes) {
    const int64_t n = ggml_blck_size(type) == 256 ? 512 : 160;
    const Matrix m = Quantized(type, n, 17, static_cast<uint32_t>(type) * 7);
    for (size_t pad : {size_t{0}, size_t{64}}) {
      const size_t stride = m.row_bytes + pad;
      std::vector<char> strided(stride * m.rows);
      for (int64_t r = 0; r < m.rows; ++r) std::memcpy(strided.data() + r * stride, m.row(r), m.row_bytes);
      for (int cols = 1; cols <= 4; ++cols) {
        const std::vector<float> x = Values(static_cast<size_t>(n * cols), static_cast<uint32_t>(cols) + 40);
        std::vector<const float*> columns(cols);
        for (int c = 0; c < cols; ++c) columns[c] = x.data() + c * n;
        for (int64_t nrows : {1, 2, 4, 5, 8, 16, 17}) {
          std::vector<float> y(static_cast<size_t>(cols * nrows), -1.0f);
          std::vector<float*> outs(cols);
          for (int c = 0; c < cols; ++c) outs[c] = y.data() + c * nrows;
          ggml_f32_activations_dot_rows(type, n, strided.data(), stride, nrows, columns.data(), cols, outs.data());
          for (int c = 0; c < cols; ++c) {
            for (int64_t r = 0; r < nrows; ++r) {
              ASSERT_TRUE(SameBits(Reference(m, r, columns[c]), y[c * nrows + r]))
                  << ggml_type_name(type) << " pad=" << pad << " cols=" << cols << " nrows=" << nrows << " row " << r
                  << " col " << c;
            }
          }
        }
      }
    }
  }
}

// ggml's MUL_MAT and MUL_MAT_ID on the CPU backend with F32 activations, 2 threads.
class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RequireKernels();
    backend_ = ggml_backend_cpu_init();
    ASSERT_NE(backend_, nullptr);
    ggml_backend_cpu_set_n_threads(backend_, 2);
    ggml_backend_cpu_set_f32_activations(backend_, true);
    ggml_init_params params = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    ctx_ = ggml_init(params);
  }
  void TearDown() override {
    if (buffer_ != nullptr) ggml_backend_buffer_free(buffer_);
    if (ctx_ != nullptr) ggml_free(ctx_);
    if (backend_ != nullptr) ggml_backend_free(backend_);
  }
  void Compute(ggml_tensor* result) {
    ggml_cgraph* graph = ggml_new_graph(ctx_);
    ggml_build_forward_expand(graph, result);
    buffer_ = ggml_backend_alloc_ctx_tensors(ctx_, backend_);
    ASSERT_NE(buffer_, nullptr);
    for (const auto& [tensor, bytes] : inputs_) ggml_backend_tensor_set(tensor, bytes.data(), 0, bytes.size());
    ASSERT_EQ(ggml_backend_graph_compute(backend_, graph), GGML_STATUS_SUCCESS);
  }
  template <typename T>
  void Input(ggml_tensor* tensor, const std::vector<T>& values) {
    const char* p = reinterpret_cast<const char*>(values.data());
    inputs_.push_back({tensor, std::vector<char>(p, p + values.size() * sizeof(T))});
  }
  std::vector<float> Read(ggml_tensor* tensor) {
    std::vector<float> out(ggml_nelements(tensor));
    ggml_backend_tensor_get(tensor, out.data(), 0, out.size() * sizeof(float));
    return out;
  }

  ggml_backend_t backend_ = nullptr;
  ggml_context* ctx_ = nullptr;
  ggml_backend_buffer_t buffer_ = nullptr;
  std::vector<std::pair<ggml_tensor*, std::vector<char>>> inputs_;
};

class MulMatTest : public GraphTest, public ::testing::WithParamInterface<std::tuple<ggml_type, int, int>> {};

TEST_P(MulMatTest, EveryOutputIsTheGenericPathsDot) {
  const auto [type, cols, rows] = GetParam();  // rows: one, a half chunk, not a multiple of 16
  const int64_t n = ggml_blck_size(type) == 256 ? 768 : 576;
  const Matrix m = Quantized(type, n, rows, 11);
  const std::vector<float> x = Values(static_cast<size_t>(n * cols), 5);
  ggml_tensor* w = ggml_new_tensor_2d(ctx_, type, n, rows);
  ggml_tensor* a = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, n, cols);
  ggml_tensor* y = ggml_mul_mat(ctx_, w, a);
  Input(w, m.data);
  Input(a, x);
  Compute(y);
  const std::vector<float> got = Read(y);
  for (int c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(SameBits(Reference(m, r, x.data() + c * n), got[c * rows + r]))
          << ggml_type_name(type) << " cols=" << cols << " row " << r << " col " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TypesAndColumns, MulMatTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::Values(1, 3, 4, 5, 8, 128),
                                            ::testing::Values(1, 8, 37)));

class MulMatIdTest : public GraphTest, public ::testing::WithParamInterface<ggml_type> {};

TEST_P(MulMatIdTest, EveryExpertsOutputIsTheGenericPathsDot) {
  const ggml_type type = GetParam();
  // expert 0 takes every token's first slot (10 columns: the row buffer path), experts 1-3 the
  // second slots (3 or 4 columns each: the fused path)
  const int64_t n = ggml_blck_size(type) == 256 ? 256 : 96, rows = 21, experts = 4, used = 2, tokens = 10;
  std::vector<Matrix> mats;
  std::vector<char> all;
  for (int e = 0; e < experts; ++e) {
    mats.push_back(Quantized(type, n, rows, 100 + e));
    all.insert(all.end(), mats.back().data.begin(), mats.back().data.end());
  }
  std::vector<int32_t> ids(used * tokens);
  for (int t = 0; t < tokens; ++t) {
    ids[t * used] = 0;
    ids[t * used + 1] = 1 + t % 3;
  }
  const std::vector<float> x = Values(static_cast<size_t>(n * used * tokens), 9);
  ggml_tensor* w = ggml_new_tensor_3d(ctx_, type, n, rows, experts);
  ggml_tensor* b = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, n, used, tokens);
  ggml_tensor* chosen = ggml_new_tensor_2d(ctx_, GGML_TYPE_I32, used, tokens);
  ggml_tensor* y = ggml_mul_mat_id(ctx_, w, b, chosen);
  Input(w, all);
  Input(b, x);
  Input(chosen, ids);
  Compute(y);
  const std::vector<float> got = Read(y);  // [rows, used, tokens]
  for (int t = 0; t < tokens; ++t) {
    for (int u = 0; u < used; ++u) {
      const Matrix& m = mats[ids[t * used + u]];
      const float* column = x.data() + (t * used + u) * n;
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(SameBits(Reference(m, r, column), got[(t * used + u) * rows + r]))
            << ggml_type_name(type) << " token " << t << " slot " << u << " row " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MulMatIdTest, ::testing::ValuesIn(kTypes));

}  // namespace
