#include "cpp/wire/tensor.h"

#include <cstring>
#include <utility>

namespace meshnet::protocol {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint64_t ElementCount(const std::vector<uint64_t>& shape) {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  return count;
}

void StoreLittle16(uint16_t value, uint8_t* out) {
  out[0] = static_cast<uint8_t>(value);
  out[1] = static_cast<uint8_t>(value >> 8);
}

uint16_t LoadLittle16(const uint8_t* in) {
  return static_cast<uint16_t>(in[0] | (in[1] << 8));
}

}  // namespace

size_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    default: return 0;
  }
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "dtype(" + std::to_string(static_cast<int32_t>(dtype)) + ")";
  }
}

uint16_t FloatToHalfBits(float value) {
  const uint32_t f = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t exponent = f & 0x7f800000u;
  const uint32_t mantissa = f & 0x007fffffu;

  if (exponent == 0x7f800000u) {  // inf or NaN; a NaN keeps its top 10 payload bits
    if (mantissa == 0) return sign | 0x7c00u;
    uint16_t nan = static_cast<uint16_t>(0x7c00u | (mantissa >> 13));
    if (nan == 0x7c00u) nan = 0x7c01u;  // payload only in dropped bits: stay a NaN
    return sign | nan;
  }
  if (exponent >= 0x47800000u) return sign | 0x7c00u;  // |value| >= 65536: overflow to inf
  if (exponent < 0x33000000u) return sign;  // |value| < 2^-25: rounds to zero

  // Keep 10 mantissa bits after a shift of 13 (normal) or more (half subnormal); round the
  // dropped bits to nearest, ties to even. A carry into the exponent is the correct result
  // (subnormal -> smallest normal, max finite -> inf).
  uint32_t significand;
  uint32_t shift;
  uint32_t base;
  if (exponent <= 0x38000000u) {  // half subnormal: exponent field 0
    significand = mantissa | 0x00800000u;
    shift = 13 + (113 - (exponent >> 23));  // 14..24
    base = 0;
  } else {
    significand = mantissa;
    shift = 13;
    base = (exponent - 0x38000000u) >> 13;  // rebias 127 -> 15, in place at bit 10
  }
  const uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  uint32_t half = base + kept;
  if (dropped > halfway || (dropped == halfway && (kept & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t f = FloatBits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
  const uint32_t rounding_bias = 0x7fffu + ((f >> 16) & 1u);
  return static_cast<uint16_t>((f + rounding_bias) >> 16);
}

float HalfBitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);
  // Subnormal half: normalise into an f32 normal.
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return BitsFloat(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

float BFloat16BitsToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

Tensor TensorFromFloats(std::string name, DType dtype, std::vector<uint64_t> shape,
                        const float* values) {
  Tensor tensor;
  tensor.name = std::move(name);
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  const size_t item = ItemSize(dtype);
  if (item == 0) return tensor;
  const uint64_t count = ElementCount(tensor.shape);
  tensor.bytes.resize(count * item);
  uint8_t* out = tensor.bytes.data();
  for (uint64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32: {
        const uint32_t f = FloatBits(values[i]);
        for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(f >> (8 * b));
        break;
      }
      case DType::kF16:
        StoreLittle16(FloatToHalfBits(values[i]), out + 2 * i);
        break;
      default:
        StoreLittle16(FloatToBFloat16Bits(values[i]), out + 2 * i);
        break;
    }
  }
  return tensor;
}

std::vector<float> TensorToFloats(const Tensor& tensor) {
  const size_t item = ItemSize(tensor.dtype);
  if (item == 0) return {};
  const size_t count = tensor.bytes.size() / item;
  std::vector<float> values(count);
  const uint8_t* in = tensor.bytes.data();
  for (size_t i = 0; i < count; ++i) {
    switch (tensor.dtype) {
      case DType::kF32: {
        const uint8_t* p = in + 4 * i;
        values[i] = BitsFloat(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
        break;
      }
      case DType::kF16:
        values[i] = HalfBitsToFloat(LoadLittle16(in + 2 * i));
        break;
      default:
        values[i] = BFloat16BitsToFloat(LoadLittle16(in + 2 * i));
        break;
    }
  }
  return values;
}

}  // namespace meshnet::protocol
